"""Memory power estimated from installed size, where RAPL has no dram zone.

    P = MemTotal (GiB, from /proc/meminfo) x WATTS_PER_GIB

A constant: DRAM power follows capacity (refresh, background) more than load, and
nothing cheaper than RAPL tells how busy memory is. The figure and its sources are in
docs/power-models.md. One device for all installed memory, labelled "all": an empty
label would read as a missing value, and Prometheus stores it as no label at all.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from wattprint.core.model import DeviceReading, SourceResult
from wattprint.sources.counters import PowerIntegrator
from wattprint.sources.registry import METHOD_MODEL

# 3 W per 8 GB, codecarbon v2 (codecarbon/external/ram.py); Cloud Carbon Footprint
# uses 0.392 W/GB from independent sources, so the two agree within 5 %.
WATTS_PER_GIB = 3.0 / 8
DEVICE = "all"


def read_mem_total_gib(procfs_root: str | Path) -> float:
    text = (Path(procfs_root) / "meminfo").read_text()
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    if not match:
        raise ValueError("no MemTotal line")
    return int(match.group(1)) / (1024 * 1024)


class MemoryModelSource:
    """Memory energy estimated from the installed size, where RAPL has no dram zone."""

    name = "memory_model"

    def __init__(
        self,
        procfs_root: str | Path = "/proc",
        clock: Callable[[], float] = time.monotonic,
        reason: str = "",
        watts_per_gib: float = WATTS_PER_GIB,
    ) -> None:
        self._meminfo = Path(procfs_root) / "meminfo"
        self._clock = clock
        self.reason = reason
        # Read once: hot-added memory is rare, and the estimate is coarse anyway.
        self.total_gib = read_mem_total_gib(procfs_root)
        self.watts_per_gib = watts_per_gib
        self.power = self.total_gib * watts_per_gib
        self._energy = PowerIntegrator()
        self._last_time: float | None = None

    def read(self) -> SourceResult:
        now = self._clock()
        power_w: float | None = None
        if self._last_time is not None:
            power_w = self.power
            self._energy.add(self.power, now - self._last_time)
        self._last_time = now
        reading = DeviceReading(
            component="memory",
            device=DEVICE,
            energy_uj=self._energy.total,
            power_w=power_w,
            method=METHOD_MODEL,
        )
        return SourceResult(devices=[reading])

    def explain(self) -> list[str]:
        head = f"memory: model ({self.reason})" if self.reason else "memory: model"
        return [
            head,
            f"memory: {self.total_gib:.1f} GiB ({self._meminfo} MemTotal) x "
            f"{self.watts_per_gib:g} W/GiB = {self.power:.1f} W",
        ]

    def close(self) -> None:
        pass
