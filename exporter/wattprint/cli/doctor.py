"""`wattprint doctor`: what will be measured, what estimated, and why."""

from __future__ import annotations

import os

from wattprint.attribution import embodied
from wattprint.carbon import registry as carbon_registry
from wattprint.config.options import Config
from wattprint.core.model import Source
from wattprint.sources import registry


def _gpu_models(source: Source) -> list[str]:
    """The GPU models as the source names them: the key to their embodied figures."""
    try:
        result = source.read()
    except Exception:  # doctor explains what it can; the source said why above
        return []
    return [d.model for d in result.devices if d.component == "gpu"]


def diagnose(config: Config) -> str:
    from wattprint.parts import build_carbon, build_sources, embodied_settings

    carbon = build_carbon(config)
    sources, notes = build_sources(config)
    lines = ["Wattprint doctor", "", "Devices:"]
    gpu_models: list[str] = []
    try:
        for source in sources:
            lines.extend(f"  {line}" for line in source.explain())
            gpu_models.extend(_gpu_models(source))
        lines.extend(f"  {note}" for note in notes)
        if len(gpu_models) < config.gpu_expect:
            lines.append(
                f"  MISSING: {config.gpu_expect} GPUs expected (--gpu.expect), "
                f"{len(gpu_models)} read: the others' energy would not be measured"
            )
    finally:
        for source in sources:
            source.close()
    lines += ["", "Carbon:"]
    if carbon_registry.provider(config.carbon_provider).live:
        carbon.poll_once()  # one bounded request, so doctor shows a live answer or why not
    lines.extend(f"  {line}" for line in carbon.explain())
    lines += ["", "Embodied emissions (Scope 3):"]
    lines.extend(f"  {line}" for line in embodied.explain(embodied_settings(config), gpu_models))
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
    lines += ["", "Available sources and providers:"]
    lines.extend(f"  {line}" for line in registry.explain())
    lines.extend(f"  {line}" for line in carbon_registry.explain())
    return "\n".join(lines)
