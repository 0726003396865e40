"""The exporter as `wattprint` builds it (app.build_exporter), on a fake node, driven one
sample at a time, and the checks every injected fault must pass.

The node: two GPUs from the fake pynvml (the recorded H200 trace, pynvml's real
exception classes), RAPL package and dram zones in a sysfs tree, and a /proc tree with a
GPU job, a CPU job with an inheriting child, and an untagged process. Faults are
injected by changing those trees, the fake NVML, or local HTTP servers between samples.

After every sample Rig.step() checks, through a real scrape of /metrics:
- sampling goes on (sample_once returns a snapshot) and the scrape answers 200;
- no counter went down since the previous scrape;
- conservation (docs/metrics.md, invariant 1): per component and GPU, what the workload and
  unattributed counters gained since the previous sample is exactly what the device
  counters gained (in the snapshot, in micro-joules), and in the exported text the
  parts add up to the devices (ScrapeLedger).
Each test then checks that its error is counted in a metric and logged once.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from clock_fakes import DISCIPLINED
from fake_nvml import FakeNvml
from procfs_fixture import FakeProc
from wattprint import parts as exporter_parts
from wattprint.app import Exporter, build_exporter
from wattprint.config.options import build_config
from wattprint.core.model import Snapshot
from wattprint.sampler.clock import StampClock

TESTS = Path(__file__).resolve().parents[1]
SYS_FIXTURE = TESTS / "fixtures" / "sys" / "intel-2pkg"
POWERCAP = Path("class") / "powercap"
NODE_CPUS = 64
CLK_TCK = 100
STEP_S = 1.0  # node time per step: CPU ticks and RAPL energy advance by this much

GPU_PID = 426  # the load process of the recorded trace
CPU_JOB_PID, CPU_CHILD_PID, UNTAGGED_PID = 500, 501, 600

Labels = tuple[tuple[str, str], ...]
Series = dict[tuple[str, Labels], float]


class FaultyNvml(FakeNvml):
    """The trace fake, plus faults for one call on one GPU: call_faults[(call, gpu)]."""

    call_faults: dict[tuple[str, int], type[pynvml.NVMLError]]

    def _fail(self, call: str, handle: int) -> None:
        fault = self.call_faults.get((call, handle))
        if fault is not None:
            raise fault()

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._fail("power", handle)
        return super().nvmlDeviceGetPowerUsage(handle)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self._fail("energy", handle)
        return super().nvmlDeviceGetTotalEnergyConsumption(handle)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        self._fail("processes", handle)
        return super().nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen: int) -> list[Any]:
        self._fail("utilization", handle)
        return super().nvmlDeviceGetProcessUtilization(handle, last_seen)


@dataclass
class Node:
    """What the exporter reads, and the means to move it on and break it."""

    root: Path
    nvml: FaultyNvml
    proc: FakeProc
    cpu_ticks: int = 1_000_000
    busy: dict[int, int] = field(default_factory=dict)  # pid -> CPU ticks used so far
    frozen: set[str] = field(default_factory=set)  # RAPL zones whose counter stands still

    @property
    def sysfs(self) -> Path:
        return self.root / "sys"

    @property
    def procfs(self) -> Path:
        return self.proc.root

    def zone(self, name: str) -> Path:
        return self.sysfs / POWERCAP / name

    def raw(self, zone: str) -> int:
        return int((self.zone(zone) / "energy_uj").read_text())

    def set_raw(self, zone: str, value: int) -> None:
        (self.zone(zone) / "energy_uj").write_text(f"{value}\n")

    def add_process(self, pid: int, ppid: int = 1, start: int = 1000, **kwargs: Any) -> None:
        self.proc.add(pid, ppid=ppid, start=start, **kwargs)
        self.busy[pid] = 0

    def remove_process(self, pid: int) -> None:
        self.proc.remove(pid)
        self.busy.pop(pid, None)

    def advance(self) -> None:
        """One step of node time: the trace moves on, CPUs and RAPL counters rise."""
        self.nvml.advance()
        self.cpu_ticks += NODE_CPUS * CLK_TCK
        for pid in list(self.busy):
            directory = self.procfs / str(pid)
            if not (directory / "stat").is_file():
                continue
            self.busy[pid] += 50  # half a CPU each
            text = (directory / "stat").read_text()
            head, tail = text.rsplit(")", 1)
            fields = tail.split()
            fields[11] = str(self.busy[pid])  # utime (field 14)
            (directory / "stat").write_text(f"{head}) {' '.join(fields)}\n")
        busy = sum(self.busy.values())
        (self.procfs / "stat").write_text(
            f"cpu  {busy} 0 0 {self.cpu_ticks - busy} 0 0 0 0 0 0\nbtime 1764400000\n"
        )
        for zone, watts in (
            ("intel-rapl:0", 180),
            ("intel-rapl:1", 150),
            ("intel-rapl:0:2", 20),
            ("intel-rapl:1:0", 18),
        ):
            path = self.zone(zone) / "energy_uj"
            if zone in self.frozen or not path.is_file():
                continue
            wrap = int((self.zone(zone) / "max_energy_range_uj").read_text())
            self.set_raw(zone, (self.raw(zone) + int(watts * STEP_S * 1e6)) % wrap)


def make_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    root = tmp_path / "node"
    shutil.copytree(SYS_FIXTURE, root / "sys")
    nvml = FaultyNvml(gpus=FakeNvml.from_trace(copies=2).gpus)
    nvml.call_faults = {}
    nvml.position = 150  # in the steady phase: the GPU job holds the GPU and draws power
    # The exporter imports pynvml when it builds its NVML source: it gets the fake.
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    node = Node(root, nvml, FakeProc.snapshot(root / "proc"))
    node.add_process(GPU_PID, environ={"WATTPRINT_WORKLOAD": "phased-load"}, rss_pages=50_000)
    node.add_process(CPU_JOB_PID, environ={"WATTPRINT_WORKLOAD": "job-a"}, rss_pages=200_000)
    node.add_process(CPU_CHILD_PID, ppid=CPU_JOB_PID, start=1200, rss_pages=100_000)
    node.add_process(UNTAGGED_PID, rss_pages=10_000)
    return node


def parse(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(series: Series, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(
        v for (n, ls), v in series.items() if n == name and labels.items() <= dict(ls).items()
    )


def _component(name: str, labels: Mapping[str, str]) -> tuple[str, str] | None:
    if name == "wattprint_gpu_energy_joules_total":
        return ("gpu", labels["gpu"])
    if name in ("wattprint_cpu_energy_joules_total", "wattprint_memory_energy_joules_total"):
        return (name.split("_")[1], "")
    if name in (
        "wattprint_workload_energy_joules_total",
        "wattprint_unattributed_energy_joules_total",
    ):
        return (labels["component"], labels["gpu"])
    return None


def _is_part(name: str) -> bool:
    return name.startswith(("wattprint_workload_", "wattprint_unattributed_"))


class ScrapeLedger:
    """Checks a sequence of scrapes of /metrics, as Prometheus would see them.

    No counter may go down. Per component and GPU, the workload and unattributed series
    must add up to the device counters, counting the last value of series that expired.
    A series is served at 0 on its first scrape (so that increase() sees its first
    energy), which hides its value for that one scrape: a component with a newborn
    series is checked again at the next scrape.
    """

    def __init__(self) -> None:
        self.previous: Series = {}
        self.expired: dict[tuple[str, str], float] = defaultdict(float)

    def check(self, current: Series) -> list[str]:
        problems = [
            f"{name}{dict(labels)} went down: {self.previous[(name, labels)]} -> {v}"
            for (name, labels), v in current.items()
            if name.endswith("_total") and v < self.previous.get((name, labels), v)
        ]
        for (name, labels), v in self.previous.items():
            key = _component(name, dict(labels))
            if key is not None and _is_part(name) and (name, labels) not in current:
                self.expired[key] += v
        devices: dict[tuple[str, str], float] = defaultdict(float)
        parts: dict[tuple[str, str], float] = defaultdict(float)
        newborn: set[tuple[str, str]] = set()
        for (name, labels), v in current.items():
            key = _component(name, dict(labels))
            if key is None:
                continue
            if not _is_part(name):
                devices[key] += v
                continue
            parts[key] += v
            if (name, labels) not in self.previous:
                newborn.add(key)
        for key, device in devices.items():
            total = parts[key] + self.expired[key]
            if key not in newborn and abs(total - device) > 1e-9 * abs(device) + 1e-6:
                problems.append(f"{key}: devices {device!r} J, parts {total!r} J")
        self.previous = current
        return problems


def check_snapshot(prev: Snapshot | None, cur: Snapshot) -> None:
    """Exact, in micro-joules: per component and GPU, what the workload and unattributed
    series gained since the previous sample is what the devices gained. (A series that
    expired gained nothing in its last retention period, so it is left out.)"""
    before = {s.key: s.energy_uj for s in prev.devices} if prev else {}
    gained: dict[tuple[str, str], int] = defaultdict(int)
    for d in cur.devices:
        key = (d.component, d.device if d.component == "gpu" else "")
        gained[key] += d.energy_uj - before.get(d.key, 0)
    parts = {(s.component, s.gpu, s.workload): s.energy_uj for s in prev.energy} if prev else {}
    for s in cur.energy:
        gained[(s.component, s.gpu)] -= s.energy_uj - parts.get((s.component, s.gpu, s.workload), 0)
    assert all(v == 0 for v in gained.values()), dict(gained)


class Rig:
    """An exporter built from flags, its HTTP server and background threads running,
    its sampler stepped by the test."""

    def __init__(self, node: Node, **flags: str) -> None:
        self.node = node
        values = {
            "web.listen-address": "127.0.0.1:0",
            "gpu.source": "nvml",
            "cpu.source": "rapl",
            "memory.source": "rapl",
            "path.sysfs": str(node.sysfs),
            "path.procfs": str(node.procfs),
            "carbon.zone": "DE",
            "state.file": "",
        }
        values.update(flags)
        self.config = build_config(values, environ={}, config_file="")
        self.exporter: Exporter = build_exporter(self.config)
        # A time daemon keeps the node's clock, whatever the machine running the test.
        self.exporter.sampler.parts.stamp_clock = StampClock(kernel=lambda: DISCIPLINED)
        assert self.exporter.server is not None
        self.exporter.carbon.start()
        if self.exporter.kubernetes is not None:
            self.exporter.kubernetes.start()
        self.exporter.server.start()
        self.url = f"http://127.0.0.1:{self.exporter.server.port}"
        self.session = requests.Session()
        self.session.trust_env = False
        # Scrape as Prometheus does: a scraper's first scrape of a series gets its 0.
        self.session.headers["X-Prometheus-Scrape-Timeout-Seconds"] = "10"
        self.series: Series = {}
        self.ledger = ScrapeLedger()
        self.snapshot: Snapshot | None = None
        self.killed = False

    def step(self, advance: bool = True) -> Series:
        """One sample and one scrape, with the checks of the module docstring."""
        if advance:
            self.node.advance()
        previous, self.snapshot = self.snapshot, self.exporter.sampler.sample_once()
        check_snapshot(previous, self.snapshot)
        response = self.session.get(f"{self.url}/metrics", timeout=5)
        assert response.status_code == 200, response.text
        current = parse(response.text)
        problems = self.ledger.check(current)
        assert not problems, problems
        self.series = current
        return current

    def steps(self, count: int) -> Series:
        for _ in range(count):
            self.step()
        return self.series

    def errors(self, collector: str) -> float:
        return value(self.series, "wattprint_collector_errors_total", collector=collector)

    def success(self, collector: str) -> float:
        return value(self.series, "wattprint_collector_success", collector=collector)

    def energy(self, name: str, **labels: str) -> float:
        return value(self.series, f"wattprint_{name}_energy_joules_total", **labels)

    def close(self) -> None:
        if self.killed:
            return
        self.session.close()
        self.exporter.stop()

    def kill(self) -> None:
        """Gone as with SIGKILL: no shutdown, no final save; only its port is freed."""
        self.killed = True
        self.session.close()
        assert self.exporter.server is not None
        self.exporter.server.stop()
        self.exporter.carbon.stop()


RigFactory = Callable[..., Rig]


@pytest.fixture(name="node")
def node_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    return make_node(tmp_path, monkeypatch)


@pytest.fixture(name="rig_factory")
def rig_factory_fixture(node: Node) -> Iterator[RigFactory]:
    rigs: list[Rig] = []

    def build(**flags: str) -> Rig:
        rig = Rig(node, **flags)
        rigs.append(rig)
        return rig

    yield build
    for rig in rigs:
        rig.close()


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and text in r.getMessage()
    ]


def wait_for(condition: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)


def use_app_part(monkeypatch: pytest.MonkeyPatch, name: str, replacement: object) -> None:
    """Swap one thing app.build_exporter builds from (parts.py: a seam to a network service)."""
    monkeypatch.setattr(exporter_parts, name, replacement)
