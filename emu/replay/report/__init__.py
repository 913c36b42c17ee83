"""The replay's report: its records (``model``), building it from what the processes measured (``build``), the parallelism section."""
