"""Pure arithmetic, no I/O and no clocks: energy and embodied emissions split among workloads."""
