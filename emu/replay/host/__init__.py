"""The host runtime: a host process's loop (``loop``), its endpoints and links (``runtime``), the fake workers (``worker``), the aggregation and point-to-point endpoints, the leaves' links."""
