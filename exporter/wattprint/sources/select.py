"""Choosing a component's source: --<component>.source = auto|<registered source>|none.

auto tries the registered sources in their auto order (GPU: replay when a trace is
given, then NVML; CPU and memory: RAPL where it is present and readable, else the
model) and says why it fell back through the next source's explain(). A source named
explicitly that cannot work is a configuration error: SourceUnavailable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from wattprint.core.model import Source
from wattprint.sources import registry
from wattprint.sources.registry import SourceContext, SourceError, SourceUnavailable

__all__ = ["SourceUnavailable", "build_cpu_source", "build_memory_source", "choose"]


def choose(mode: str, ctx: SourceContext) -> tuple[Source | None, str]:
    """The source for ctx.component, or None and why (for doctor)."""
    component = ctx.component
    flag = f"--{component}.source"
    choices = registry.source_choices(component)
    if mode not in choices:
        raise SourceUnavailable(f"{flag}={mode}: must be one of {', '.join(choices)}")
    if mode == "none":
        return None, f"{component}: none ({flag}=none)"
    if mode != "auto":
        try:
            return registry.source(mode, component).factory(replace(ctx, explicit=True)), ""
        except SourceError as err:
            raise SourceUnavailable(str(err)) from None
        except SourceUnavailable as err:
            raise SourceUnavailable(f"{flag}={mode}: {err}") from None
    candidates = sorted(
        (s for s in registry.sources(component) if s.auto_rank is not None),
        key=lambda s: s.auto_rank or 0,
    )
    reason = ""
    for spec in candidates:
        try:
            return spec.factory(replace(ctx, explicit=False, reason=reason)), ""
        except SourceError as err:
            raise SourceUnavailable(str(err)) from None
        except SourceUnavailable as err:
            reason = str(err)
    return None, f"{component}: none ({reason or 'no source registered'})"


def build_cpu_source(
    mode: str,
    sysfs_root: str | Path = "/sys",
    procfs_root: str | Path = "/proc",
    tdp_watts: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> Source | None:
    ctx = SourceContext("cpu", False, "", sysfs_root, procfs_root, clock, cpu_tdp_watts=tdp_watts)
    return choose(mode, ctx)[0]


def build_memory_source(
    mode: str,
    sysfs_root: str | Path = "/sys",
    procfs_root: str | Path = "/proc",
    clock: Callable[[], float] = time.monotonic,
    watts_per_gib: float = 0.0,
) -> Source | None:
    ctx = SourceContext(
        "memory", False, "", sysfs_root, procfs_root, clock, memory_watts_per_gib=watts_per_gib
    )
    return choose(mode, ctx)[0]
