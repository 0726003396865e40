"""Job identity: which workload a process belongs to (Kubernetes, Slurm, env, trackers)."""
