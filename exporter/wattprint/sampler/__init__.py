"""The engine: reads the devices each interval, attributes, accrues and hands out a Snapshot."""
