"""CPU packages and their DRAM from RAPL energy counters under /sys/class/powercap.

Intel and AMD expose the same powercap interface: top-level zones intel-rapl:N named
"package-N" (or "package-N-die-M" on multi-die parts), with subzones intel-rapl:N:M
named "core", "uncore" or "dram". Only package and dram zones are read: core and
uncore are already inside the package figure, and psys (the whole platform on some
laptops) would overlap both. The intel-rapl-mmio zones duplicate the MSR package
zones, so they are skipped too.

energy_uj wraps at max_energy_range_uj (about 262 kJ: every ~12 min at 350 W), so it
is read every sample and the wrap corrected. Since Linux 5.10 energy_uj is readable
by root only (CVE-2020-8694), hence the explicit messages.
"""

from __future__ import annotations

import errno
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wattprint.core.model import DeviceReading, SourceResult
from wattprint.core.units import UJ_PER_J
from wattprint.sources.counters import DEFAULT_MAX_POWER_W, MonotonicCounter
from wattprint.sources.registry import METHOD_RAPL

log = logging.getLogger(__name__)

_TOP_ZONE = re.compile(r"intel-rapl:(\d+)")
_SUB_ZONE = re.compile(r"intel-rapl:(\d+):(\d+)")
_PACKAGE_NAME = re.compile(r"package-(\d+(?:-die-\d+)?)")
PERMISSION_HINT = "run as root or grant read access"
NOT_READABLE = "RAPL energy_uj not readable"


def _read_int(path: Path) -> int:
    # The one place that touches sysfs files: tests replace it to simulate EACCES,
    # which chmod cannot do for root.
    with open(path, "rb") as f:
        return int(f.read().strip())


def describe_error(err: Exception) -> str:
    """A short reason for a failed read, with the fix where there is one."""
    if isinstance(err, PermissionError):
        return f"permission denied; {PERMISSION_HINT}"
    if isinstance(err, FileNotFoundError):
        return "no longer present"
    if isinstance(err, OSError):
        return err.strerror or errno.errorcode.get(err.errno or 0, str(err))
    return f"unexpected content: {err}"


@dataclass
class Zone:
    """One RAPL zone that Wattprint reads: a package or the dram under a package."""

    component: str  # cpu (package zone) | memory (dram zone)
    device: str  # package index, as in the zone name "package-N"
    path: Path

    @property
    def label(self) -> str:
        return f"{self.component} {self.device} ({self.path.name})"


def discover_zones(sysfs_root: str | Path, component: str) -> list[Zone]:
    """The package (component="cpu") or dram (component="memory") zones, by package."""
    base = Path(sysfs_root) / "class" / "powercap"
    try:
        entries = sorted(base.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    names: dict[str, str] = {}
    for entry in entries:
        try:
            names[entry.name] = (entry / "name").read_text().strip()
        except OSError:
            continue
    # A dram zone is labelled by the package it sits under, so resolve packages first.
    packages: dict[str, str] = {}
    for dirname, name in names.items():
        top = _TOP_ZONE.fullmatch(dirname)
        pkg = _PACKAGE_NAME.fullmatch(name)
        if top and pkg:
            device = pkg.group(1)
            if device in packages.values():  # two zones claim one name: keep both apart
                device = top.group(1)
            packages[top.group(1)] = device
    zones: list[Zone] = []
    for dirname, name in names.items():
        if component == "cpu":
            top = _TOP_ZONE.fullmatch(dirname)
            if top and top.group(1) in packages:
                zones.append(Zone("cpu", packages[top.group(1)], base / dirname))
        elif component == "memory":
            sub = _SUB_ZONE.fullmatch(dirname)
            if sub and name == "dram":
                device = packages.get(sub.group(1), sub.group(1))
                zones.append(Zone("memory", device, base / dirname))
    return sorted(zones, key=lambda z: _natural(z.device))


def _natural(device: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", device)]


def probe(sysfs_root: str | Path, component: str) -> tuple[list[Zone], str]:
    """The zones RAPL would read and "", or no zones and why RAPL cannot be used."""
    base = Path(sysfs_root) / "class" / "powercap"
    kind = "package" if component == "cpu" else "dram"
    zones = discover_zones(sysfs_root, component)
    if not zones:
        return [], f"no RAPL {kind} zone under {base}"
    for zone in zones:
        try:
            _read_int(zone.path / "energy_uj")
        except (OSError, ValueError) as err:
            return [], f"{NOT_READABLE}: {describe_error(err)}"
    return zones, ""


@dataclass
class _ZoneState:
    zone: Zone
    counter: MonotonicCounter
    last_time: float | None = None
    power_w: float | None = None
    failure: str = ""  # the current failure, "" while reads succeed
    warned: bool = False
    stale: bool = False  # a read failed since the last good one
    glitches_logged: bool = False


class RaplSource:
    """Energy of every package (component="cpu") or dram zone (component="memory").

    energy_uj of each device starts at 0 at the first read and never decreases: wraps
    are corrected through max_energy_range_uj, and a zone that fails or disappears
    keeps its cumulative value while each failed read counts as an error.
    """

    def __init__(
        self,
        component: str = "cpu",
        sysfs_root: str | Path = "/sys",
        clock: Callable[[], float] = time.monotonic,
        zones: list[Zone] | None = None,
    ) -> None:
        if component not in ("cpu", "memory"):
            raise ValueError(f"RAPL covers cpu and memory, not {component!r}")
        self.component = component
        # Two RAPL sources can run side by side (packages, dram): distinct labels.
        self.name = "rapl" if component == "cpu" else "rapl_dram"
        self._clock = clock
        found = zones if zones is not None else discover_zones(sysfs_root, component)
        self._zones = [_ZoneState(z, self._counter(z)) for z in found]

    def _counter(self, zone: Zone) -> MonotonicCounter:
        return MonotonicCounter(wrap_at=self._max_range(zone), max_power_w=self._max_power(zone))

    @staticmethod
    def _max_power(zone: Zone) -> float:
        try:
            value = _read_int(zone.path / "constraint_0_max_power_uw")
        except (OSError, ValueError):
            value = 0
        return value / 1e6 if value > 0 else DEFAULT_MAX_POWER_W[zone.component]

    @staticmethod
    def _max_range(zone: Zone) -> int | None:
        try:
            value = _read_int(zone.path / "max_energy_range_uj")
        except (OSError, ValueError):
            return None
        return value if value > 0 else None

    def read(self) -> SourceResult:
        result = SourceResult()
        for state in self._zones:
            now = self._clock()
            try:
                raw = _read_int(state.zone.path / "energy_uj")
            except (OSError, ValueError) as err:
                self._failed(state, err, result)
            else:
                self._update(state, raw, now, result)
            result.devices.append(
                DeviceReading(
                    component=state.zone.component,
                    device=state.zone.device,
                    energy_uj=state.counter.total,
                    power_w=state.power_w,
                    method=METHOD_RAPL,
                    raw_uj=None if state.stale else state.counter.raw,
                    raw_wrap_uj=state.counter.wrap_at,
                    max_power_w=state.counter.max_power_w,
                )
            )
        return result

    def _update(self, state: _ZoneState, raw: int, now: float, result: SourceResult) -> None:
        if state.stale:
            # Nothing tells how often the counter wrapped, or whether it restarted,
            # while it was unreadable: start again from here rather than invent energy.
            total = state.counter.total
            state.counter = self._counter(state.zone)
            state.counter.total = total
            state.last_time = None
            state.stale = False
            state.warned = False  # a later failure is news again
            log.info("RAPL %s readable again", state.zone.label)
        errors_before = state.counter.errors
        delta = state.counter.update(raw, now)
        if state.counter.errors != errors_before:
            message = f"RAPL {state.zone.label}: energy {state.counter.last_error}"
            result.errors.append(message)
            if not state.glitches_logged:
                log.warning("%s (logged once per zone; counted in errors)", message)
                state.glitches_logged = True
        if state.last_time is None or now <= state.last_time:
            state.power_w = None
        else:
            state.power_w = delta / UJ_PER_J / (now - state.last_time)
        state.last_time = now
        state.failure = ""

    def _failed(self, state: _ZoneState, err: Exception, result: SourceResult) -> None:
        state.failure = describe_error(err)
        state.stale = True
        state.power_w = None
        message = f"RAPL {state.zone.label}: energy_uj not readable: {state.failure}"
        result.errors.append(message)
        if not state.warned:
            state.warned = True
            log.warning("%s; its energy stays at the last value read", message)

    def explain(self) -> list[str]:
        if not self._zones:
            return [f"{self.component}: rapl (no zones found)"]
        lines = []
        for state in self._zones:
            zone = state.zone
            line = f"{zone.component} {zone.device}: rapl ({zone.path}/energy_uj)"
            if state.failure:
                line += f"; last read failed: {state.failure}"
            lines.append(line)
        return lines

    def close(self) -> None:
        pass
