"""The configuration of a replay: its options (``options``) and network design files (``design``)."""
