"""The replay's processes: starting and stopping them (``children``, ``processes``) and the messages between them (``messages``)."""
