"""Attribution: every device's energy is split among workloads and unattributed, and the
parts add up to the device counters exactly, at every sample (docs/metrics.md, "Invariants")."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fake_nvml import FakeNvml, load_trace_samples
from procfs_fixture import FakeProc
from wattprint.attribution.split import attribute_by_share, attribute_gpu, split
from wattprint.core.model import DeviceReading, GpuProcess, Snapshot, SourceResult, Workload
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import read_proc_table
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources.counters import MonotonicCounter
from wattprint.sources.nvml import NvmlSource
from wattprint.sources.replay import ReplaySource

A = Workload("env", "job-a")
B = Workload("env", "job-b")


def totals(snapshot: Snapshot) -> dict[tuple[str, str], int]:
    """Per (component, gpu): device counters minus the sum of their parts."""
    residual: dict[tuple[str, str], int] = defaultdict(int)
    for d in snapshot.devices:
        residual[(d.component, d.device if d.component == "gpu" else "")] += d.energy_uj
    for s in snapshot.energy:
        residual[(s.component, s.gpu)] -= s.energy_uj
    return residual


def assert_conserved(snapshot: Snapshot) -> None:
    assert all(v == 0 for v in totals(snapshot).values()), totals(snapshot)


# -- pure functions -----------------------------------------------------------------


@given(st.integers(0, 10**12), st.dictionaries(st.integers(0, 20), st.floats(0, 1e6), max_size=12))
def test_split_parts_sum_exactly(total: int, weights: dict[int, float]) -> None:
    parts = split(total, weights)
    if any(w > 0 for w in weights.values()):
        assert sum(parts.values()) == total
        assert all(v >= 0 for v in parts.values())
    else:
        assert parts == {}


def test_gpu_policy_by_sm_util_then_equal_then_unattributed() -> None:
    resolve = {1: A, 2: B, 3: None}.get

    def by(p: GpuProcess) -> Workload | None:
        return resolve(p.pid)

    busy = [GpuProcess(1, sm_util=75), GpuProcess(2, sm_util=25)]
    assert attribute_gpu(1000, busy, by) == {A: 750, B: 250}
    no_samples = [GpuProcess(1), GpuProcess(2)]
    assert attribute_gpu(1000, no_samples, by) == {A: 500, B: 500}
    assert attribute_gpu(1000, [], by) == {None: 1000}
    # A process nobody claims pays into unattributed.
    assert attribute_gpu(900, [GpuProcess(1), GpuProcess(3)], by) == {A: 450, None: 450}
    # Processes of one workload add up to one part.
    assert attribute_gpu(999, [GpuProcess(1), GpuProcess(1)], by) == {A: 999}


def test_mig_instances_share_by_slices_and_idle_slices_are_unattributed() -> None:
    def by(p: GpuProcess) -> Workload | None:
        return {1: A, 2: B}.get(p.pid)

    slices = {1: 3, 2: 2, 3: 2}  # 7 slices; instance 3 unused
    procs = [GpuProcess(1, gpu_instance_id=1), GpuProcess(2, gpu_instance_id=2)]
    assert attribute_gpu(7000, procs, by, slices) == {A: 3000, B: 2000, None: 2000}
    active = [
        GpuProcess(1, sm_util=10, gpu_instance_id=1),
        GpuProcess(2, sm_util=60, gpu_instance_id=2),
    ]
    parts = attribute_gpu(7000, active, by, slices)
    assert parts[None] == 2000 and parts[A] + parts[B] == 5000
    assert parts[A] == round(5000 * 30 / (30 + 120))


def test_cpu_and_memory_shares_leave_idle_unattributed() -> None:
    assert attribute_by_share(1000, {A: 30, B: 10}, 100) == {A: 300, B: 100, None: 600}
    assert attribute_by_share(1000, {}, 100) == {None: 1000}
    # Clock skew between /proc reads can make usage exceed capacity; still exact.
    assert sum(attribute_by_share(1001, {A: 80, B: 40}, 100).values()) == 1001


# -- property test over the sampler -------------------------------------------------


@dataclass
class ScriptedGpus:
    """Raw hardware counters driven by the test, corrected like a real source does."""

    name: str = "nvml"
    raw: dict[int, int] = field(default_factory=dict)
    counters: dict[int, MonotonicCounter] = field(default_factory=dict)
    processes: dict[int, tuple[GpuProcess, ...]] = field(default_factory=dict)

    def read(self) -> SourceResult:
        devices = []
        for gpu, raw in sorted(self.raw.items()):
            counter = self.counters.setdefault(gpu, MonotonicCounter())
            counter.update(raw)
            devices.append(
                DeviceReading(
                    "gpu",
                    str(gpu),
                    counter.total,
                    100.0,
                    "nvml_energy_counter",
                    processes=self.processes.get(gpu, ()),
                )
            )
        return SourceResult(devices=devices)

    def explain(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


workloads = st.sampled_from([A, B, Workload("slurm", "42"), None])
process = st.builds(
    lambda pid, util, who: (GpuProcess(pid, sm_util=util), who),
    st.integers(1, 30),
    st.one_of(st.none(), st.integers(0, 100)),
    workloads,
)
step = st.tuples(
    st.lists(st.one_of(st.integers(0, 5_000_000), st.just(-1)), min_size=3, max_size=3),
    st.lists(st.lists(process, max_size=4), min_size=3, max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=25))
def test_conservation_and_monotonicity_at_every_step(steps: list) -> None:
    gpus = ScriptedGpus(raw={0: 10**9, 1: 5, 2: 0})
    identities: dict[int, Workload | None] = {}

    class Resolver:
        def resolve(self, pid: int, start_ticks: int, table: object = None) -> Workload | None:
            return identities.get(pid)

    sampler = Sampler(SamplerParts(sources=[gpus], resolver=Resolver(), retention=1e9))
    previous = sampler.sample_once()
    for increments, holders in steps:
        for gpu, inc in enumerate(increments):
            # -1: a driver reload resets the raw counter to a small value.
            gpus.raw[gpu] = 7 if inc < 0 else gpus.raw[gpu] + inc
        for gpu, procs in enumerate(holders):
            gpus.processes[gpu] = tuple(p for p, _ in procs)
            identities.update({p.pid: who for p, who in procs})
        snapshot = sampler.sample_once()
        assert_conserved(snapshot)
        before = {(s.component, s.gpu, s.workload): s.energy_uj for s in previous.energy}
        after = {(s.component, s.gpu, s.workload): s.energy_uj for s in snapshot.energy}
        assert all(after.get(k, 0) >= v for k, v in before.items())
        assert all(a.energy_uj >= b.energy_uj for a, b in zip(snapshot.devices, previous.devices))
        previous = snapshot


# -- scenarios through the real readers ---------------------------------------------


def test_multi_rank_job_gets_exactly_its_gpus_and_cpu_memory_once(tmp_path: Path) -> None:
    """Job A: 8 ranks on 8 GPUs. Job B: 2 processes sharing GPU 0 with A."""
    proc = FakeProc(tmp_path / "proc")
    for rank in range(8):
        proc.add(
            1000 + rank,
            start=10 + rank,
            rss_bytes=2 << 30,
            environ={"WATTPRINT_WORKLOAD": "job-a", "RANK": str(rank)},
        )
    for i in range(2):
        proc.add(2000 + i, start=50 + i, rss_bytes=1 << 30, environ={"WATTPRINT_WORKLOAD": "job-b"})
    proc.add(3000, start=5, rss_bytes=1 << 30)  # a system daemon: nobody's job

    fake = FakeNvml.from_trace(copies=8)
    for gpu in fake.gpus:
        for entry in gpu.samples:
            entry["processes"] = [{"pid": 1000 + gpu.index, "sm_util": 60}]
            if gpu.index == 0:
                entry["processes"] += [{"pid": 2000, "sm_util": 20}, {"pid": 2001, "sm_util": 20}]

    class NodeCpu:
        """CPU and memory at a known constant power, 1 J per sample each."""

        name = "cpu_model"
        energy = 0

        def read(self) -> SourceResult:
            self.energy += 1_000_000
            return SourceResult(
                devices=[
                    DeviceReading("cpu", "0", self.energy, 1.0, "model"),
                    DeviceReading("memory", "all", self.energy, 1.0, "model"),
                ]
            )

        def explain(self) -> list[str]:
            return []

        def close(self) -> None:
            pass

    root = str(tmp_path / "proc")
    sampler = Sampler(
        SamplerParts(
            sources=[NvmlSource(nvml=fake), NodeCpu()],
            read_procs=lambda: read_proc_table(root),
            resolver=IdentityResolver(procfs_root=root),
        )
    )
    sampler.sample_once()
    start = fake.position
    cpu_a = cpu_b = 0
    for _ in range(100):
        fake.advance()
        cpu_a += 8 * 40
        cpu_b += 2 * 10
        for rank in range(8):
            proc.set_cpu(1000 + rank, cpu_a // 8, start=10 + rank, rss_bytes=2 << 30)
        for i in range(2):
            proc.set_cpu(2000 + i, cpu_b // 2, start=50 + i, rss_bytes=1 << 30)
        proc.tick(800)  # 8 CPUs x 100 ticks
        snapshot = sampler.sample_once()
        assert_conserved(snapshot)

    per_gpu_delta = (fake.trace_energy_mj(0) - fake.trace_energy_mj(0, start)) * 1000
    by = defaultdict(int)
    for s in snapshot.energy:
        by[(s.component, s.workload)] += s.energy_uj
    gpu0 = {
        s.workload: s.energy_uj for s in snapshot.energy if s.component == "gpu" and s.gpu == "0"
    }
    # GPU 0: A 60 %, B 2 x 20 % of SM time.
    assert gpu0[A] == round(per_gpu_delta * 0.6)
    assert gpu0[B] == per_gpu_delta - gpu0[A]
    assert by[("gpu", A)] == 7 * per_gpu_delta + gpu0[A]
    assert by[("gpu", A)] + by[("gpu", B)] + by[("gpu", None)] == 8 * per_gpu_delta
    # Each GPU counted once: the node's GPU total is 8 GPUs, not 8 x 8 or 10 x 8.
    assert sum(d.energy_uj for d in snapshot.devices if d.component == "gpu") == 8 * per_gpu_delta
    # CPU: A used 320 of 800 ticks per sample, B 20, over 100 intervals of 1 J.
    cpu_total = 100 * 1_000_000
    assert by[("cpu", A)] == round(cpu_total * 320 / 800)
    assert by[("cpu", B)] == round(cpu_total * 20 / 800)
    # Memory by resident share of 64 GiB: A 16 GiB, B 2 GiB.
    mem_total = 100 * 1_000_000
    assert by[("memory", A)] == round(mem_total * 16 / 64)
    assert by[("memory", B)] == round(mem_total * 2 / 64)
    holders = {(w.workload, gpu) for w, gpu, _ in snapshot.gpu_holders}
    assert holders == {("job-a", str(i)) for i in range(8)} | {("job-b", "0")}


def test_replayed_trace_goes_to_the_workload_only_while_it_holds_the_gpu(
    trace_path: Path,
) -> None:
    samples = load_trace_samples(trace_path)
    clock = [0.0]
    source = ReplaySource(str(trace_path), speed=1.0, clock=lambda: clock[0])
    sampler = Sampler(SamplerParts(sources=[source]))
    sampler.sample_once()
    while not source.finished:
        clock[0] += 1.0
        snapshot = sampler.sample_once()
        assert_conserved(snapshot)
    expected: dict[str | None, int] = defaultdict(int)
    for prev, cur in itertools.pairwise(samples):
        delta = (cur["gpus"][0]["energy_mj"] - prev["gpus"][0]["energy_mj"]) * 1000
        procs = cur["gpus"][0]["processes"]
        expected["phased-load" if procs else None] += delta
    got = {s.workload.workload if s.workload else None: s.energy_uj for s in snapshot.energy}
    assert got == dict(expected)
    assert got[None] > 0  # the idle time before pid 426 appears


def test_cpu_time_of_a_process_that_started_mid_interval_counts(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(10, start=1, environ={"WATTPRINT_WORKLOAD": "job-a"})

    class Cpu:
        name = "cpu_model"
        energy = 0

        def read(self) -> SourceResult:
            self.energy += 800_000
            return SourceResult(devices=[DeviceReading("cpu", "0", self.energy, 0.8, "model")])

        def explain(self) -> list[str]:
            return []

        def close(self) -> None:
            pass

    root = str(tmp_path / "proc")
    sampler = Sampler(
        SamplerParts(
            sources=[Cpu()],
            read_procs=lambda: read_proc_table(root),
            resolver=IdentityResolver(procfs_root=root),
        )
    )
    sampler.sample_once()
    # A short-lived worker of job B starts and uses 200 of the interval's 800 ticks.
    proc.add(11, start=500, cpu_ticks=200, environ={"WATTPRINT_WORKLOAD": "job-b"})
    proc.tick(800)
    snapshot = sampler.sample_once()
    cpu = {s.workload: s.energy_uj for s in snapshot.energy if s.component == "cpu"}
    assert cpu == {B: 200_000, None: 600_000}
