"""What runs on the node and for whom: /proc, cgroups, and job identity."""
