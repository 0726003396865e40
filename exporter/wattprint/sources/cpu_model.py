"""CPU power estimated from TDP and utilization, where RAPL cannot be read.

    P(package) = TDP x (IDLE_FRACTION + (1 - IDLE_FRACTION) x utilization)

utilization is the busy share of the package's logical CPUs between two reads of
/proc/stat. TDP comes from, in order: the --cpu.tdp-watts flag, a small table of
server CPUs (vendor TDPs), or WATTS_PER_THREAD x logical CPUs. The constants and
their sources are in docs/power-models.md. Energy integrates the power of each
interval over the source's own clock, so the result is marked method="model".
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wattprint.core.model import DeviceReading, SourceResult
from wattprint.sources.counters import PowerIntegrator
from wattprint.sources.registry import METHOD_MODEL

log = logging.getLogger(__name__)

# Cloud Carbon Footprint's coefficients from SPECpower_ssj2008 (AWS average): a
# logical CPU draws 0.74 W idle and 3.5 W at full load. With an unknown CPU the
# model therefore reduces to CCF's own estimate, threads x (0.74 + 2.76 x u).
WATTS_PER_THREAD = 3.5
IDLE_FRACTION = 0.74 / 3.5

# Vendor TDP in watts per package (Intel ARK, AMD product pages), for CPUs common in
# GPU servers. Keys match the model name in /proc/cpuinfo as whole product numbers,
# so "EPYC 7543" does not claim an "EPYC 7543P".
TDP_TABLE: dict[str, float] = {
    "Xeon Platinum 8592+": 350,
    "Xeon Platinum 8480+": 350,
    "Xeon Platinum 8480C": 350,
    "Xeon Platinum 8470": 350,
    "Xeon Platinum 8468": 350,
    "Xeon Platinum 8462Y+": 300,
    "Xeon Platinum 8380": 270,
    "Xeon Platinum 8358": 250,
    "Xeon Platinum 8280": 205,
    "Xeon Gold 6338": 205,
    "Xeon Gold 6248R": 205,
    "Xeon Gold 6248": 150,
    "EPYC 9754": 360,
    "EPYC 9654": 360,
    "EPYC 9554": 360,
    "EPYC 9474F": 360,
    "EPYC 7763": 280,
    "EPYC 7742": 225,
    "EPYC 7713": 225,
    "EPYC 7543": 225,
}


def _normalise(text: str) -> str:
    text = re.sub(r"\((?:r|tm)\)", "", text.lower())
    return " ".join(text.split())


def lookup_tdp(model_name: str) -> tuple[str, float] | None:
    """The table entry whose product number appears whole in the model name."""
    name = _normalise(model_name)
    for key, watts in sorted(TDP_TABLE.items(), key=lambda kv: -len(kv[0])):
        pattern = re.escape(_normalise(key)) + r"(?![\w+])"
        if re.search(pattern, name):
            return key, watts
    return None


@dataclass(frozen=True)
class CpuTopology:
    """Logical CPUs grouped by physical package, with the model name of each package."""

    packages: dict[str, tuple[int, ...]]  # "physical id" -> logical CPU numbers
    model_names: dict[str, str]
    by_package: bool  # False: no physical ids, one device "0" from the aggregate line


def read_topology(procfs_root: str | Path) -> CpuTopology:
    text = (Path(procfs_root) / "cpuinfo").read_text()
    packages: dict[str, list[int]] = {}
    names: dict[str, str] = {}
    any_name = ""
    complete = True
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" not in fields or not fields["processor"].isdigit():
            continue
        any_name = any_name or fields.get("model name", "")
        package = fields.get("physical id")
        if package is None:
            complete = False
            package = "0"
        packages.setdefault(package, []).append(int(fields["processor"]))
        names.setdefault(package, fields.get("model name", ""))
    if not packages or not complete:
        count = sum(len(cpus) for cpus in packages.values())
        return CpuTopology({"0": tuple(range(count))}, {"0": any_name}, by_package=False)
    ordered = sorted(packages, key=lambda p: (len(p), p))
    return CpuTopology(
        {p: tuple(packages[p]) for p in ordered}, {p: names[p] for p in ordered}, by_package=True
    )


def read_cpu_times(procfs_root: str | Path) -> dict[str, tuple[int, int]]:
    """busy and total jiffies per line of /proc/stat ("cpu" and "cpuN")."""
    times: dict[str, tuple[int, int]] = {}
    for line in (Path(procfs_root) / "stat").read_text().splitlines():
        if not line.startswith("cpu"):
            continue
        name, *values = line.split()
        v = [int(x) for x in values] + [0] * (8 - len(values))
        user, nice, system, idle, iowait, irq, softirq = v[:7]
        # Guest time is already inside user and nice; steal is time the hypervisor
        # gave to someone else, so it is neither our work nor our idle.
        busy = user + nice + system + irq + softirq
        times[name] = (busy, busy + idle + iowait)
    return times


@dataclass
class _Package:
    device: str
    cpus: tuple[int, ...]
    tdp_w: float
    tdp_source: str
    energy: PowerIntegrator
    power_w: float | None = None


class CpuModelSource:
    """One device per physical package (device "0" when cpuinfo has no physical id)."""

    name = "cpu_model"

    def __init__(
        self,
        procfs_root: str | Path = "/proc",
        tdp_watts: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        reason: str = "",
    ) -> None:
        self._procfs = Path(procfs_root)
        self._clock = clock
        self.reason = reason
        topology = read_topology(procfs_root)
        self._by_package = topology.by_package
        self._packages = []
        for device, cpus in topology.packages.items():
            tdp, source = self._tdp(topology.model_names[device], len(cpus), tdp_watts)
            self._packages.append(_Package(device, cpus, tdp, source, PowerIntegrator()))
        read_cpu_times(procfs_root)  # fail now, where the caller can say why
        self._last: dict[str, tuple[int, int]] | None = None
        self._last_time = 0.0

    @staticmethod
    def _tdp(model_name: str, threads: int, flag_watts: float) -> tuple[float, str]:
        if flag_watts > 0:
            return flag_watts, "--cpu.tdp-watts"
        found = lookup_tdp(model_name)
        if found:
            return found[1], f"table: {found[0]}"
        label = model_name or "unknown CPU"
        return WATTS_PER_THREAD * threads, f"{label}: {WATTS_PER_THREAD} W x {threads} threads"

    def _utilization(
        self,
        package: _Package,
        before: dict[str, tuple[int, int]],
        after: dict[str, tuple[int, int]],
    ) -> float:
        lines = [f"cpu{n}" for n in package.cpus] if self._by_package else ["cpu"]
        busy = total = 0
        for line in lines:
            if line in before and line in after:
                busy += max(after[line][0] - before[line][0], 0)
                total += max(after[line][1] - before[line][1], 0)
        return min(busy / total, 1.0) if total else 0.0

    def read(self) -> SourceResult:
        result = SourceResult()
        now = self._clock()
        try:
            times: dict[str, tuple[int, int]] | None = read_cpu_times(self._procfs)
        except (OSError, ValueError) as err:
            times = None
            result.errors.append(f"cpu model: cannot read {self._procfs / 'stat'}: {err}")
        for package in self._packages:
            if times is None or self._last is None:
                package.power_w = None
            else:
                util = self._utilization(package, self._last, times)
                package.power_w = package.tdp_w * (IDLE_FRACTION + (1 - IDLE_FRACTION) * util)
                package.energy.add(package.power_w, now - self._last_time)
            result.devices.append(
                DeviceReading(
                    component="cpu",
                    device=package.device,
                    energy_uj=package.energy.total,
                    power_w=package.power_w,
                    method=METHOD_MODEL,
                )
            )
        if times is not None:
            self._last, self._last_time = times, now
        return result

    def explain(self) -> list[str]:
        lines = [f"cpu: model ({self.reason})" if self.reason else "cpu: model"]
        for p in self._packages:
            lines.append(
                f"cpu {p.device}: TDP {p.tdp_w:g} W ({p.tdp_source}) x "
                f"({IDLE_FRACTION:.2f} + {1 - IDLE_FRACTION:.2f} x utilization from "
                f"{self._procfs / 'stat'})"
            )
        return lines

    def close(self) -> None:
        pass
