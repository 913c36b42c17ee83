"""The switch runtime: the switch process (``daemon``), which aggregates or forwards and keeps the synchronized clock."""
