"""The node's input energy from HPE Cray's pm_counters (/sys/cray/pm_counters).

`energy` ("12345 J 1764769990123456 us": joules, then when the controller took it, in
microseconds) is the node's energy since the power controller started, `power`
("540 W ...") its power, `freshness` a count the controller bumps each time it updates
them (about 10 times a second) and `startup` when it started. A read is taken between
two reads of `freshness` that agree, so the values belong to one update. An `energy`
whose own timestamp (or, in a file without one, `freshness`) has not moved since the
last counted read is the value counted already: the sample is held (no new node
energy, the platform's share waits for the next reading) rather than read as 0 W then
a burst, and said as nothing wrong while that lasts under STALE_AFTER_S (a late update
is not a failure); past it the reading is stale, said in collector_success and held
out of the platform split. The counter is read like RAPL's (sources/counters.py): it
never goes down across a controller reset or a node reboot.
"""

from __future__ import annotations

import re
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
# No update for this long (30 of the controller's at 10 Hz): stale.
STALE_AFTER_S = 3.0
_PART_COUNTER = re.compile(r"(accel\d*|cpu\d*|memory)_energy")


def pm_counters_dir(sysfs_root: str | Path) -> Path:
    return Path(sysfs_root) / "cray" / "pm_counters"


def _read_stamped(path: Path) -> tuple[int, int | None]:
    """A file's value and, where it has one ("N U T us"), the controller's timestamp."""
    with open(path, "rb") as f:
        text = f.read(256).split()
    if not text:
        raise ValueError(f"{path.name} is empty")
    try:
        stamp = int(text[2]) if len(text) >= 4 and text[3] == b"us" else None
        return int(text[0]), stamp
    except ValueError:
        value = text[0].decode(errors="replace")
        raise ValueError(f"{path.name} is not a number: {value!r}") from None


def _read_number(path: Path) -> int:
    return _read_stamped(path)[0]


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
        self._stamp: int | None = None  # the energy's own timestamp, counted last
        self._startup: int | None = None
        self._read_at: float | None = None  # the source's clock when it counted the last
        self.failure = ""

    def _read_once(self) -> tuple[int, int, int | None, int, int]:
        """(freshness, energy J, its timestamp, power W, startup), from one update."""
        for _ in range(_TORN_RETRIES):
            before = _read_number(self.path / "freshness")
            energy, stamp = _read_stamped(self.path / "energy")
            power = _read_number(self.path / "power")
            startup = _read_number(self.path / "startup")
            if _read_number(self.path / "freshness") == before:
                return before, energy, stamp, power, startup
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
            freshness, energy_j, stamp, power_w, startup = self._read_once()
        except (OSError, ValueError) as err:
            self.failure = getattr(err, "strerror", None) or str(err)
            result.errors.append(f"pm_counters {self.path}: {self.failure}")
            return result
        moved = freshness != self._freshness if stamp is None else stamp != self._stamp
        if not moved and startup == self._startup:
            assert self._read_at is not None  # a value was counted before
            if now - self._read_at > STALE_AFTER_S:
                what = "freshness" if stamp is None else "the energy's timestamp"
                self.failure = f"stale: {what} has not moved for {now - self._read_at:.0f} s"
                result.errors.append(f"pm_counters: {self.failure}")
            elif not result.errors:
                result.held.append(("node", "node"))
            return result  # the value counted already: held, not 0 W
        raw = energy_j * 1_000_000
        if self._startup is not None and startup != self._startup:
            self._restarted(raw, now)
        self._freshness, self._stamp, self._startup = freshness, stamp, startup
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
        lines = [line + (f"; last read failed: {self.failure}" if self.failure else "")]
        # The controller's counters of the parts, for a cross-check with the GPUs',
        # CPUs' and memory's own sources, which measure them.
        parts = []
        for path in sorted(self.path.glob("*_energy")):
            if _PART_COUNTER.fullmatch(path.name):
                try:
                    parts.append(f"{path.name} {_read_number(path)} J")
                except (OSError, ValueError) as err:
                    parts.append(
                        f"{path.name} unreadable ({getattr(err, 'strerror', None) or err})"
                    )
        if parts:
            lines.append(
                "  beside it (not read: the components' sources measure them): " + ", ".join(parts)
            )
        return lines

    def close(self) -> None:
        pass
