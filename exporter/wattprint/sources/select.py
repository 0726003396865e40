"""Choosing a component's source: --<component>.source = auto|<registered source>|none.

auto tries the registered sources in their auto order (GPU: replay when a trace is
given, then NVML and AMD SMI; CPU and memory: RAPL where it is present and readable,
else the model) and says why it fell back through the next source's explain(). Sources
of one rank run side by side, each where it is available: a node with NVIDIA and AMD
GPUs gets both, the later-registered one's devices labelled with its side_prefix. A
source named explicitly that cannot work is a configuration error: SourceUnavailable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from wattprint.core.model import Source, SourceResult
from wattprint.sources import registry
from wattprint.sources.registry import (
    SourceContext,
    SourceError,
    SourceSpec,
    SourceUnavailable,
)

__all__ = ["SourceUnavailable", "build_cpu_source", "build_memory_source", "choose", "choose_all"]


class Prefixed:
    """A source whose device labels carry a prefix, beside another of its component."""

    def __init__(self, source: Source, prefix: str) -> None:
        self.source = source
        self.prefix = prefix
        self.name = source.name

    def read(self) -> SourceResult:
        result = self.source.read()
        result.devices = [replace(d, device=self.prefix + d.device) for d in result.devices]
        return result

    def explain(self) -> list[str]:
        lines = self.source.explain()
        return [
            f"gpu {self.prefix}{line[4:]}" if line.startswith("gpu ") else line for line in lines
        ]

    def close(self) -> None:
        self.source.close()


def choose(mode: str, ctx: SourceContext) -> tuple[Source | None, str]:
    """The (first) source for ctx.component, or None and why (for doctor)."""
    chosen, notes = choose_all(mode, ctx)
    return (chosen[0] if chosen else None), ("" if chosen else notes[0])


def choose_all(mode: str, ctx: SourceContext) -> tuple[list[Source], list[str]]:
    """The sources for ctx.component, and doctor's lines on those auto left out (or
    why there is none)."""
    component = ctx.component
    flag = f"--{component}.source"
    choices = registry.source_choices(component)
    if mode not in choices:
        raise SourceUnavailable(f"{flag}={mode}: must be one of {', '.join(choices)}")
    if mode == "none":
        return [], [f"{component}: none ({flag}=none)"]
    if mode != "auto":
        try:
            return [registry.source(mode, component).factory(replace(ctx, explicit=True))], []
        except SourceError as err:
            raise SourceUnavailable(str(err)) from None
        except SourceUnavailable as err:
            raise SourceUnavailable(f"{flag}={mode}: {err}") from None
    candidates = [s for s in registry.sources(component) if s.auto_rank is not None]
    reason = ""
    for rank in sorted({s.auto_rank or 0 for s in candidates}):
        chosen: list[tuple[SourceSpec, Source]] = []
        missing: list[tuple[str, str]] = []
        for spec in (s for s in candidates if (s.auto_rank or 0) == rank):
            try:
                chosen.append((spec, spec.factory(replace(ctx, explicit=False, reason=reason))))
            except SourceError as err:
                for _, source in chosen:
                    source.close()
                raise SourceUnavailable(str(err)) from None
            except SourceUnavailable as err:
                missing.append((spec.name, str(err)))
        if chosen:
            first, *beside = chosen
            sources = [first[1]] + [
                Prefixed(source, spec.side_prefix) if spec.side_prefix else source
                for spec, source in beside
            ]
            # One line each: a library that is not there is not an error.
            return sources, [f"{component}: {name} not used ({why})" for name, why in missing]
        reason = "; ".join(why for _, why in missing)
    return [], [f"{component}: none ({reason or 'no source registered'})"]


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
