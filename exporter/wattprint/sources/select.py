"""Choosing the CPU and memory sources: --cpu.source / --memory.source = auto|rapl|model|none.

auto reads RAPL where it is present and readable, else falls back to the model, and
says why in one log line (and in `wattprint doctor` through the source's explain()).
An explicit rapl that cannot work is a configuration error: SourceUnavailable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from ..model import Source
from . import rapl
from .cpu_model import CpuModelSource
from .memory_model import WATTS_PER_GIB, MemoryModelSource

log = logging.getLogger(__name__)

MODES = ("auto", "rapl", "model", "none")


class SourceUnavailable(ValueError):
    """The requested source cannot run here; the message is one line for the user."""


def _check_mode(flag: str, mode: str) -> None:
    if mode not in MODES:
        raise SourceUnavailable(f"{flag}={mode}: must be one of {', '.join(MODES)}")


def _why(err: Exception) -> str:
    if isinstance(err, OSError) and err.filename:
        return f"cannot read {err.filename}: {err.strerror}"
    return str(err)


def _rapl_or_reason(
    component: str, mode: str, sysfs_root: str | Path, clock: Callable[[], float]
) -> tuple[rapl.RaplSource | None, str]:
    flag = f"--{component}.source"
    zones, reason = rapl.probe(sysfs_root, component)
    if zones:
        return rapl.RaplSource(component, sysfs_root, clock, zones=zones), ""
    if mode == "rapl":
        raise SourceUnavailable(f"{flag}=rapl: {reason}")
    # Zones that exist but cannot be read can be fixed by the operator: say it louder.
    level = logging.WARNING if reason.startswith(rapl.NOT_READABLE) else logging.INFO
    log.log(level, "%s: %s; estimating with the model instead", component, reason)
    return None, reason


def build_cpu_source(
    mode: str,
    sysfs_root: str | Path = "/sys",
    procfs_root: str | Path = "/proc",
    tdp_watts: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> Source | None:
    _check_mode("--cpu.source", mode)
    if mode == "none":
        return None
    reason = "selected by --cpu.source=model"
    if mode in ("auto", "rapl"):
        source, reason = _rapl_or_reason("cpu", mode, sysfs_root, clock)
        if source is not None:
            return source
    try:
        return CpuModelSource(procfs_root, tdp_watts=tdp_watts, clock=clock, reason=reason)
    except (OSError, ValueError) as err:
        raise SourceUnavailable(f"--cpu.source={mode}: CPU model: {_why(err)}") from err


def build_memory_source(
    mode: str,
    sysfs_root: str | Path = "/sys",
    procfs_root: str | Path = "/proc",
    clock: Callable[[], float] = time.monotonic,
    watts_per_gib: float = 0.0,
) -> Source | None:
    _check_mode("--memory.source", mode)
    if mode == "none":
        return None
    reason = "selected by --memory.source=model"
    if mode in ("auto", "rapl"):
        source, reason = _rapl_or_reason("memory", mode, sysfs_root, clock)
        if source is not None:
            return source
    try:
        return MemoryModelSource(
            procfs_root, clock=clock, reason=reason, watts_per_gib=watts_per_gib or WATTS_PER_GIB
        )
    except (OSError, ValueError) as err:
        raise SourceUnavailable(f"--memory.source={mode}: memory model: {_why(err)}") from err
