"""`wattprint doctor`: what will be measured, what estimated, and why."""

from __future__ import annotations

import os

from .config import Config


def diagnose(config: Config) -> str:
    from .app import build_carbon, build_sources

    carbon = build_carbon(config)
    sources, notes = build_sources(config)
    lines = ["Wattprint doctor", "", "Devices:"]
    try:
        for source in sources:
            lines.extend(f"  {line}" for line in source.explain())
        lines.extend(f"  {note}" for note in notes)
    finally:
        for source in sources:
            source.close()
    lines += ["", "Carbon:"]
    if config.carbon_provider != "static":
        carbon.poll_once()  # one bounded request, so doctor shows a live answer or why not
    lines.extend(f"  {line}" for line in carbon.explain())
    lines += ["", "Workload identity:"]
    if config.kubernetes_node_name:
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        lines.append(
            f"  kubernetes: pods of node {config.kubernetes_node_name}"
            + ("" if in_cluster else " (not in a cluster: KUBERNETES_SERVICE_HOST unset)")
        )
    else:
        lines.append("  kubernetes: off (no --kubernetes.node-name or $NODE_NAME)")
    lines.append("  slurm: job id from the process cgroup or SLURM_JOB_ID")
    lines.append(f"  env: {', '.join(config.workload_env_vars)} (inherited by child processes)")
    lines.append(f"  reading processes from {config.procfs_root}")
    return "\n".join(lines)
