"""Everything behind /metrics: collector, self-metrics, exposition, HTTP server, web config."""
