"""`wattprint report`: what a job used and emitted, asked from a Prometheus server.

For every job (scheduler, namespace, workload) in the range: duration, energy per
component and per GPU, emissions, the intensity it ran under, PUE, the share that was
estimated rather than measured, and its emission budget where one is recorded.

Energy is the exact rise of the exporter's counters over (since, until], not
increase(): increase() extrapolates, and a job's series is born inside the range with
a first value that already holds the energy drawn before the first scrape, which
increase() leaves out. Here the counters are read at a grid of steps that ends
exactly at `until` (last_over_time over max(step, 5m), so a scrape gap does not break
the chain), a series absent before counts from zero, and where resets() sees an
exporter restart the raw samples are added up. docs/report.md has the details.

The package: arguments (flags), queries (time grid, selectors), ledger (counter
arithmetic), jobs (a job put together), render (the formats), command (the entry point).
"""
