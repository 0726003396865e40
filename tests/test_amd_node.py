"""An AMD node through the sampler: the 8-board trace of tests/fake_amdsmi.py with jobs on
it. Jobs + unattributed = each device's energy exactly, at every sample, through the
accumulator's wrap, a driver reload, a process leaving, partitions and a dual-die board."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from fake_amdsmi import FakeProcess, eight_gpu_node
from procfs_fixture import FakeProc
from wattprint.core.model import Snapshot, Workload
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import read_proc_table
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources.amdsmi import AmdSmiSource

A = Workload("env", "job-a")
B = Workload("env", "job-b")
C = Workload("env", "job-c")


def residuals(snapshot: Snapshot) -> dict[str, int]:
    """Per GPU: the device counter minus the sum of its parts (jobs and unattributed)."""
    left: dict[str, int] = defaultdict(int)
    for d in snapshot.devices:
        left[d.device] += d.energy_uj
    for s in snapshot.energy:
        left[s.gpu] -= s.energy_uj
    return dict(left)


def gpu_parts(snapshot: Snapshot, gpu: str) -> dict[Workload | None, int]:
    return {s.workload: s.energy_uj for s in snapshot.energy if s.gpu == gpu}


def test_amd_node_conserves_energy_per_sample_and_splits_by_busy_time(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    jobs = {101: "job-a", 102: "job-b", 103: "job-c", 104: "job-a", 105: "job-b"}
    for pid, job in jobs.items():
        proc.add(pid, start=pid, environ={"WATTPRINT_WORKLOAD": job})
    fake = eight_gpu_node()
    boards = fake.boards
    boards[0].procs = {0: [FakeProcess(101, 0.6), FakeProcess(102, 0.2)]}
    boards[1].procs = {0: [FakeProcess(103, 0.5)]}  # leaves half-way
    boards[2].busy_reported = False  # VRAM weighs: 96 and 48 of 192 GiB
    boards[2].procs = {0: [FakeProcess(101, 0.9, 96 << 30), FakeProcess(102, 0.9, 48 << 30)]}
    boards[5].procs = {0: [FakeProcess(104, 0.7)]}  # the MI100 whose counter wraps
    boards[6].procs = {0: [FakeProcess(101, 0.5)], 3: [FakeProcess(102, 0.25)]}  # CPX
    boards[7].procs = {0: [FakeProcess(104, 0.8)], 1: [FakeProcess(105, 0.8)]}  # MI250X dies

    clock = [5000.0]
    root = str(tmp_path / "proc")
    sampler = Sampler(
        SamplerParts(
            sources=[AmdSmiSource(amdsmi=fake, clock=lambda: clock[0])],
            read_procs=lambda: read_proc_table(root),
            resolver=IdentityResolver(procfs_root=root),
            monotonic=lambda: clock[0],
        )
    )
    sampler.sample_once()
    after_leave: dict[Workload | None, int] = {}
    for second in range(1, 81):
        fake.step()
        clock[0] += 1.0
        proc.tick(800)
        if second == 30:
            boards[1].procs = {}  # job-c's process exits
        if second == 40:
            fake.reload()
        snapshot = sampler.sample_once()
        assert all(v == 0 for v in residuals(snapshot).values()), (second, residuals(snapshot))
        if second == 31:
            after_leave = gpu_parts(snapshot, "1")

    # Each sample's split rounds to whole µJ (parts still add up exactly): ratios hold
    # to a few µJ per sample.
    slack = 4 * 80
    devices = {d.device: d for d in snapshot.devices}
    assert sorted(devices, key=int) == ["0", "1", "2", "3", "4", "5", "6", "14"]
    # Board 0: 60 % and 20 % GFX busy: 3 to 1, nothing unattributed.
    gpu0 = gpu_parts(snapshot, "0")
    assert set(gpu0) == {A, B}
    assert abs(gpu0[A] - 3 * gpu0[B]) <= slack
    # Board 1: job-c's share stopped when it left; the rest is unattributed.
    gpu1 = gpu_parts(snapshot, "1")
    assert gpu1[C] == after_leave[C] and gpu1[None] > after_leave.get(None, 0)
    # Board 2: by VRAM where the kernel gives no busy time.
    gpu2 = gpu_parts(snapshot, "2")
    assert abs(gpu2[A] - 2 * gpu2[B]) <= slack
    # The MI100 through its wrap and the reload: all of it to job-a.
    assert set(gpu_parts(snapshot, "5")) == {A}
    # CPX: 2 of 8 partitions held; their share by busy time 50:25; 6/8 idle, unattributed.
    cpx = gpu_parts(snapshot, "6")
    total = devices["6"].energy_uj
    assert abs(cpx[None] - total * 6 // 8) <= slack
    assert abs(cpx[A] - 2 * cpx[B]) <= slack
    # MI250X: the second die's job pays its half of the board's energy.
    dies = gpu_parts(snapshot, "14")
    assert set(dies) == {A, B} and abs(dies[A] - dies[B]) <= slack
