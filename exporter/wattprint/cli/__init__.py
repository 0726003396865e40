"""Command line: argv to the exporter, `doctor`, `report` and `run`."""
