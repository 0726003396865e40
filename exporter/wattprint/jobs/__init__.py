"""One job's number without Prometheus: the meter, `wattprint run` and `wattprint.track()`."""
