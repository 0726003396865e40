"""The node's input energy from HPE Cray's pm_counters (/sys/cray/pm_counters).

`energy` ("12345 J") is the node's energy since the power controller started, `power`
("540 W") its power, `freshness` a count the controller bumps each time it updates them
(about 10 times a second) and `startup` when it started. A read is taken between two
reads of `freshness` that agree, so the values belong to one update; a freshness that
has not moved since the last sample means the controller stopped updating: the reading
is stale, said in collector_success and held out of the platform split. The counter is
read like RAPL's (sources/counters.py): it never goes down across a controller reset
or a node reboot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from wattprint.core.model import DeviceReading, SourceResult
from wattprint.sources.counters import MonotonicCounter
from wattprint.sources.registry import METHOD_PM_COUNTERS

# Above any server shipped so far (a DGX B200 is specified at 14.3 kW): only a reading
# no node could produce is taken for a glitch.
NODE_MAX_POWER_W = 20_000.0
_TORN_RETRIES = 3


def pm_counters_dir(sysfs_root: str | Path) -> Path:
    return Path(sysfs_root) / "cray" / "pm_counters"


def _read_number(path: Path) -> int:
    with open(path, "rb") as f:
        text = f.read(256).split()
    if not text:
        raise ValueError(f"{path.name} is empty")
    return int(text[0])


class PmCountersSource:
    """The node's input energy (component "node") from pm_counters."""

    name = "pm_counters"

    def __init__(
        self, sysfs_root: str | Path = "/sys", clock: Callable[[], float] = time.monotonic
    ):
        self.path = pm_counters_dir(sysfs_root)
        self._clock = clock
        self._counter = MonotonicCounter(max_power_w=NODE_MAX_POWER_W)
        self._freshness: int | None = None
        self._startup: int | None = None
        self._read_at: float | None = None
        self.failure = ""

    def _read_once(self) -> tuple[int, int, int, int]:
        """(freshness, energy J, power W, startup), from one update of the controller."""
        for _ in range(_TORN_RETRIES):
            before = _read_number(self.path / "freshness")
            energy = _read_number(self.path / "energy")
            power = _read_number(self.path / "power")
            startup = _read_number(self.path / "startup")
            if _read_number(self.path / "freshness") == before:
                return before, energy, power, startup
        raise ValueError("the values changed under every read (torn)")

    def _restarted(self, raw: int, now: float) -> None:
        """The controller restarted (a new `startup`): its counter began again from 0,
        so all it counts now is new, where the node could have drawn that much since
        the last read (else only what follows counts)."""
        old = self._counter
        self._counter = MonotonicCounter(max_power_w=NODE_MAX_POWER_W)
        self._counter.total = old.total
        self._counter.update(raw, now)
        elapsed = None if self._read_at is None else now - self._read_at
        if old.plausible(raw, elapsed):
            self._counter.total += raw
        self._counter.resets = old.resets + 1

    def read(self) -> SourceResult:
        result = SourceResult()
        now = self._clock()
        try:
            freshness, energy_j, power_w, startup = self._read_once()
        except (OSError, ValueError) as err:
            self.failure = getattr(err, "strerror", None) or str(err)
            result.errors.append(f"pm_counters {self.path}: {self.failure}")
            return result
        if freshness == self._freshness and startup == self._startup:
            self.failure = f"stale: freshness {freshness} has not moved since the last read"
            result.errors.append(f"pm_counters: {self.failure}")
            return result
        raw = energy_j * 1_000_000
        if self._startup is not None and startup != self._startup:
            self._restarted(raw, now)
        self._freshness, self._startup = freshness, startup
        counter = self._counter
        errors = counter.errors
        counter.update(raw, now)
        self._read_at = now
        if counter.errors != errors:
            result.errors.append(f"pm_counters: energy {counter.last_error}")
        self.failure = ""
        result.devices.append(
            DeviceReading(
                component="node",
                device="node",
                energy_uj=counter.total,
                power_w=float(power_w),
                method=METHOD_PM_COUNTERS,
                raw_uj=counter.raw,
                max_power_w=NODE_MAX_POWER_W,
            )
        )
        return result

    def explain(self) -> list[str]:
        line = f"node: pm_counters ({self.path}/energy)"
        return [line + (f"; last read failed: {self.failure}" if self.failure else "")]

    def close(self) -> None:
        pass
