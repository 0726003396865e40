"""Job cgroups: a pod's or Slurm job's CPU time and memory come from its cgroup, its
processes are not read one by one, and the split is what /proc gave, exactly."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakeapiserver import NODE, TOKEN, FakeApiServer
from fakecgroup import FIXTURES as CGROUPFS
from fakecgroup import FakeCgroupFs
from procfs_fixture import PAGE, FakeProc
from test_attribution import assert_conserved
from wattprint.core.model import DeviceReading, Snapshot, SourceResult, Workload
from wattprint.durability.statefile import StateFile
from wattprint.host.cgroupfs import (
    CHARGE_EVERY_S,
    MEMORY_REFRESH_S,
    CgroupAccounting,
    CgroupFs,
    parse_cpu_stat,
    parse_cpuacct_usage,
    parse_memory_stat,
)
from wattprint.host.identity.cgroup import JobCgroup, job_cgroup
from wattprint.host.identity.kubernetes import KubernetesPods
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import ProcTable, read_proc_table
from wattprint.sampler.loop import Sampler, SamplerParts

CGROUP = Path(__file__).parent / "fixtures" / "cgroup"
GIB = 1 << 30
B = Workload("env", "job-b")

# /proc/PID/cgroup fixture -> (the job's cgroup, as the kernel names it; its workload)
LAYOUTS = {
    "v2-systemd-containerd.txt": (
        "/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-podd2a7a51b_8257_4172_8276_eaa2845be93e.slice",
        "resnet-train",
    ),
    "v2-systemd-crio.txt": (
        "/kubepods.slice/kubepods-podeb2bc7cc_6405_4ff5_bd2f_59e27635c743.slice",
        "debug-shell",
    ),
    "v2-cgroupfs-docker.txt": (
        "/kubepods/burstable/pod61d0c7fd-ad4a-4cac-8ee7-15a4530df8b9",
        "wattprint",
    ),
    "v1-cgroupfs-containerd.txt": (
        "/kubepods/besteffort/pod7e93e1f5-0aa6-4394-a7f8-d4afc6864c09",
        "llama-ft",
    ),
    "v1-systemd-crio.txt": (
        "/kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod7309dba1_ae00_414f_a43f_d41c85d7cbf9.slice",
        "vllm-prod",
    ),
    "v2-slurm.txt": ("/system.slice/slurmstepd.scope/job_4243", "4243"),
}


# -- parsing --------------------------------------------------------------------------


def test_cpu_time_files_parse_to_microseconds() -> None:
    assert parse_cpu_stat((CGROUPFS / "v2-cpu.stat").read_bytes()) == 1_523_077_411
    assert parse_cpuacct_usage((CGROUPFS / "v1-cpuacct.usage").read_bytes()) == 1_523_077_411
    with pytest.raises(ValueError):
        parse_cpu_stat(b"user_usec 5\n")


@pytest.mark.parametrize("name,v1", [("v2-memory.stat", False), ("v1-memory.stat", True)])
def test_memory_counts_anonymous_and_mapped_pages_not_page_cache(name: str, v1: bool) -> None:
    # 2 GiB anonymous + 256 MiB mapped; the 6 GiB of page cache it read is not its.
    assert parse_memory_stat((CGROUPFS / name).read_bytes(), v1) == 2 * GIB + 256 * 2**20
    with pytest.raises(ValueError, match="anon"):
        parse_memory_stat(b"file 5\n", v1=False)


def test_v1_without_hierarchy_totals_uses_the_cgroup_own_lines() -> None:
    assert parse_memory_stat(b"cache 9\nrss 4096\nmapped_file 8192\n", v1=True) == 12288


# -- which cgroup holds a job -----------------------------------------------------------


@pytest.mark.parametrize("fixture", sorted(LAYOUTS))
def test_every_layout_names_its_job_cgroup(fixture: str) -> None:
    path, _ = LAYOUTS[fixture]
    job = job_cgroup((CGROUP / fixture).read_text())
    assert job is not None
    assert (job.cpu_path, job.memory_path, job.v1) == (path, path, fixture.startswith("v1"))
    assert job.scheduler == ("slurm" if "slurm" in fixture else "kubernetes")


def test_jobs_whose_cpu_time_is_not_in_their_cgroup_are_read_per_process() -> None:
    # Slurm's task/cgroup plugin alone: memory in the job's cgroup, cpuacct at slurmd's.
    assert job_cgroup((CGROUP / "v1-slurm.txt").read_text()) is None
    assert job_cgroup((CGROUP / "v2-user-session.txt").read_text()) is None
    # Pods are jobs only where the exporter knows pods.
    assert job_cgroup((CGROUP / "v2-systemd-containerd.txt").read_text(), False) is None
    v1_slurm = "9:memory:/slurm/uid_0/job_7/step_0\n4:cpu,cpuacct:/slurm/uid_0/job_7/step_0\n"
    assert job_cgroup(v1_slurm) == JobCgroup(
        "slurm", "7", "/slurm/uid_0/job_7", "/slurm/uid_0/job_7", v1=True
    )


# -- the sampler on a node --------------------------------------------------------------


class Cpu:
    """CPU and memory at 1 J per sample each."""

    name = "cpu_model"

    def __init__(self) -> None:
        self.energy = 0

    def read(self) -> SourceResult:
        self.energy += 1_000_000
        return SourceResult(
            devices=[
                DeviceReading("cpu", "0", self.energy, 1.0, "model"),
                DeviceReading("memory", "", self.energy, 1.0, "model"),
            ]
        )

    def explain(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[KubernetesPods]:
    with FakeApiServer() as server:
        token = tmp_path / "token"
        token.write_text(TOKEN)
        pods = KubernetesPods(server.url, NODE, token_path=str(token), ca_path=None, timeout_s=2)
        assert pods.refresh()
        yield pods


class Node:
    """Two processes of a job in its cgroup, one env-tagged job, one unclaimed process."""

    def __init__(self, tmp_path: Path, fixture: str, pods: KubernetesPods, cgroups: bool):
        self.job_path, self.job_name = LAYOUTS[fixture]
        self.proc = FakeProc(tmp_path / "proc", mem_total_kb=64 * 1024 * 1024)
        self.fs = FakeCgroupFs(tmp_path / "cgroup", v1=fixture.startswith("v1"))
        content = (CGROUP / fixture).read_text()
        for pid in (100, 101):
            self.proc.add(pid, start=10, cgroup=content, rss_bytes=2 * GIB)
        self.proc.add(200, start=20, environ={"WATTPRINT_WORKLOAD": "job-b"}, rss_bytes=GIB)
        self.proc.add(300, start=30, rss_bytes=GIB)
        self.job_usec = 0
        self.set_job()
        root = self.proc.root
        self.accounting = CgroupAccounting(CgroupFs(self.fs.path), str(root)) if cgroups else None
        self.tables: list[ProcTable] = []

        def read() -> ProcTable:
            table = read_proc_table(str(root), self.accounting)
            self.tables.append(table)
            return table

        self.read = read
        self.resolver = IdentityResolver(procfs_root=str(root), kubernetes=pods)

    def set_job(self) -> None:
        # The cgroup counts each shared page once: less than the processes' RSS sum.
        self.fs.set(
            self.job_path, self.job_usec, anon=3 * GIB // 2, file_mapped=GIB // 2, page_cache=GIB
        )

    def sampler(self, state: StateFile | None = None) -> Sampler:
        return Sampler(
            SamplerParts(
                sources=[Cpu()],
                read_procs=self.read,
                resolver=self.resolver,
                state=state,
                boot_id="b",
            )
        )

    def step(self, job_ticks: int, b_ticks: int, cpu: dict[int, int]) -> None:
        for pid in (100, 101):
            cpu[pid] += job_ticks // 2
            self.proc.set_cpu(pid, cpu[pid], start=10, rss_bytes=2 * GIB)
        cpu[200] += b_ticks
        self.proc.set_cpu(200, cpu[200], start=20, rss_bytes=GIB)
        self.job_usec += job_ticks // 2 * 2 * 10_000  # what its processes' ticks add
        self.set_job()
        self.proc.tick(800)


def energy(snapshot: Snapshot) -> dict[tuple[str, str | None], int]:
    by: dict[tuple[str, str | None], int] = defaultdict(int)
    for s in snapshot.energy:
        by[(s.component, s.workload.workload if s.workload else None)] += s.energy_uj
    return dict(by)


@pytest.mark.parametrize("fixture", sorted(LAYOUTS))
def test_a_job_cgroup_supplies_its_cpu_and_memory(
    tmp_path: Path, fixture: str, pods: KubernetesPods
) -> None:
    node = Node(tmp_path, fixture, pods, cgroups=True)
    sampler = node.sampler()
    cpu = {100: 0, 101: 0, 200: 0}
    sampler.sample_once()
    for _ in range(10):
        node.step(job_ticks=300, b_ticks=100, cpu=cpu)
        snapshot = sampler.sample_once()
        assert_conserved(snapshot)

    got = energy(snapshot)
    assert got[("cpu", node.job_name)] == 10 * 1_000_000 * 300 // 800
    assert got[("cpu", "job-b")] == 10 * 1_000_000 * 100 // 800
    # Memory: the cgroup's 2 GiB resident of 64 GiB, not the 4 GiB its RSS lines add
    # (pages its two processes share) nor its page cache.
    assert got[("memory", node.job_name)] == 10 * 1_000_000 // 32
    assert got[("memory", "job-b")] == 10 * 1_000_000 // 64
    # The job's processes were listed, not read.
    table = node.tables[-1]
    assert set(table.in_job) == {100, 101} and set(table.procs) == {200, 300}


@pytest.mark.parametrize("fixture", sorted(LAYOUTS))
def test_cpu_split_is_what_proc_gave(tmp_path: Path, fixture: str, pods: KubernetesPods) -> None:
    got = {}
    for cgroups in (False, True):
        node = Node(tmp_path / str(cgroups), fixture, pods, cgroups)
        sampler = node.sampler()
        cpu = {100: 0, 101: 0, 200: 0}
        sampler.sample_once()
        for job_ticks in (300, 7, 0, 555, 1, 800 - 101):
            node.step(job_ticks=job_ticks, b_ticks=101, cpu=cpu)
            snapshot = sampler.sample_once()
        got[cgroups] = {k: v for k, v in energy(snapshot).items() if k[0] == "cpu"}
    assert got[True] == got[False]


def test_a_job_that_starts_between_samples_counts_from_zero(
    tmp_path: Path, pods: KubernetesPods
) -> None:
    node = Node(tmp_path, "v2-slurm.txt", pods, cgroups=True)
    node.job_usec = 5_000_000  # 500 ticks before the exporter started: not this run's
    node.set_job()
    sampler = node.sampler()
    sampler.sample_once()
    # A second job starts and ends its first interval with 200 ticks used.
    node.proc.add(400, start=40, cgroup="0::/system.slice/slurmstepd.scope/job_9/step_0\n")
    node.fs.set("/system.slice/slurmstepd.scope/job_9", 2_000_000)
    node.proc.tick(800)
    got = energy(sampler.sample_once())
    assert got[("cpu", "9")] == 1_000_000 * 200 // 800
    assert ("cpu", "4243") not in got


def test_a_process_that_joins_its_job_cgroup_later_is_not_counted_twice(
    tmp_path: Path, pods: KubernetesPods
) -> None:
    node = Node(tmp_path, "v2-slurm.txt", pods, cgroups=True)
    # First seen before slurmstepd moved it into the job's cgroup; it carries the id.
    node.proc.add(500, start=50, environ={"SLURM_JOB_ID": "4243"})
    sampler = node.sampler()
    sampler.sample_once()
    (node.proc.root / "500" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_4243\n")
    node.proc.set_cpu(500, 200, start=50)  # the cgroup counts these 200 ticks too
    node.job_usec += 2_000_000
    node.set_job()
    node.proc.tick(800)
    got = energy(sampler.sample_once())
    assert got[("cpu", "4243")] == 1_000_000 * 200 // 800


def test_processes_of_a_removed_job_cgroup_are_read_from_proc(
    tmp_path: Path, pods: KubernetesPods
) -> None:
    node = Node(tmp_path, "v2-slurm.txt", pods, cgroups=True)
    sampler = node.sampler()
    sampler.sample_once()
    node.fs.remove(node.job_path)
    node.proc.tick(800)
    snapshot = sampler.sample_once()
    assert_conserved(snapshot)
    table = node.tables[-1]
    assert table.in_job == {} and {100, 101} <= set(table.procs)


def test_a_process_that_outlives_its_jobs_cgroup_is_no_longer_the_jobs(
    tmp_path: Path, pods: KubernetesPods
) -> None:
    """It left the cgroup (root can) but still carries SLURM_JOB_ID: once the job's
    cgroup is gone the job has ended, and its CPU time is nobody's, as in sacct."""
    node = Node(tmp_path, "v2-slurm.txt", pods, cgroups=True)
    node.proc.add(600, start=60, environ={"SLURM_JOB_ID": "4243"})
    sampler = node.sampler()
    sampler.sample_once()
    cpu = {100: 0, 101: 0, 200: 0}
    node.step(job_ticks=300, b_ticks=100, cpu=cpu)
    job = energy(sampler.sample_once())[("cpu", "4243")]
    assert job == 1_000_000 * 300 // 800  # the cgroup's ticks; not process 600's (none)
    node.fs.remove(node.job_path)
    for pid in (100, 101):
        node.proc.remove(pid)
    for ticks in (200, 400):
        node.proc.set_cpu(600, ticks, start=60)
        node.proc.tick(800)
        snapshot = sampler.sample_once()
        assert_conserved(snapshot)
        got = energy(snapshot)
        assert got[("cpu", "4243")] == job
        assert got[("cpu", None)] > 0


def test_a_pod_seen_from_inside_a_cgroup_namespace_is_found(
    tmp_path: Path, pods: KubernetesPods
) -> None:
    fs = FakeCgroupFs(tmp_path / "cgroup")
    pod = "kubepods-besteffort-podd2a7a51b_8257_4172_8276_eaa2845be93e.slice"
    fs.set(f"/kubepods.slice/kubepods-besteffort.slice/{pod}", 4_000_000, anon=PAGE)
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, cgroup=f"0::/../../kubepods-besteffort.slice/{pod}/cri-containerd-1.scope\n")
    accounting = CgroupAccounting(CgroupFs(fs.path), str(proc.root))
    in_job, jobs, _, _ = accounting.scan([100])
    (usage,) = jobs.values()
    assert in_job == {100: next(iter(jobs))}
    assert (usage.job.ident, usage.cpu_usec, usage.memory_bytes) == (
        "d2a7a51b-8257-4172-8276-eaa2845be93e",
        4_000_000,
        PAGE,
    )


def test_a_pid_handed_out_again_is_classified_afresh_at_a_listing(tmp_path: Path) -> None:
    fs = FakeCgroupFs(tmp_path / "cgroup")
    job = "/system.slice/slurmstepd.scope/job_7"
    fs.set(job, 1_000_000, anon=PAGE)
    proc = FakeProc(tmp_path / "proc")
    for pid in (100, 101):
        proc.add(pid, cgroup=f"0::{job}/step_0\n")
    accounting = CgroupAccounting(CgroupFs(fs.path), str(proc.root))
    assert set(accounting.scan([100, 101]).in_job) == {100, 101}
    # Both job processes exit; their PIDs go to processes outside any job.
    for pid in (100, 101):
        (proc.root / str(pid) / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    # A listing that knows 101 was handed out since: only 101 is read again.
    scan = accounting.scan([100, 101], None, reused=range(101, 102))
    assert set(scan.in_job) == {100} and scan.outside == {101}
    # The PIDs wrapped around (reused None): any may be another process now.
    scan = accounting.scan([100, 101], None, reused=None)
    assert scan.in_job == {} and scan.outside == {100, 101} and scan.live == frozenset()


@pytest.mark.parametrize("v1", [False, True])
def test_memory_stat_is_read_again_when_the_job_ran_its_charge_moved_or_it_is_old(
    tmp_path: Path, v1: bool
) -> None:
    # memory.stat is the costly file (host/cgroupfs.py): a job whose CPU time and charged
    # memory are still has the resident memory it had. Anything else reads it again.
    # The clock moves 1 s a scan.
    fs = FakeCgroupFs(tmp_path / "cgroup", v1=v1)
    job = "/slurm/uid_0/job_7" if v1 else "/system.slice/slurmstepd.scope/job_7"
    lines = f"9:memory:{job}/step_0\n4:cpu,cpuacct:{job}/step_0\n" if v1 else f"0::{job}/step_0\n"
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, cgroup=lines)
    now = [0.0]
    accounting = CgroupAccounting(CgroupFs(fs.path), str(proc.root), clock=lambda: now[0])

    def memory(cpu_usec: int, anon: int, charge: int | None) -> int:
        fs.set(job, cpu_usec, anon=anon, charge=charge)
        now[0] += 1.0
        (usage,) = accounting.scan([100])[1].values()
        return usage.memory_bytes

    assert memory(1_000, anon=10 * PAGE, charge=50 * PAGE) == 10 * PAGE
    # Still: the kernel's figure cannot have moved (a test can make it, to see it kept).
    assert memory(1_000, anon=11 * PAGE, charge=50 * PAGE) == 10 * PAGE
    assert memory(2_000, anon=12 * PAGE, charge=50 * PAGE) == 12 * PAGE  # it ran
    assert memory(2_000, anon=13 * PAGE, charge=50 * PAGE) == 12 * PAGE  # still since
    # A still job is looked at every CHARGE_EVERY_S. Its charge was not read while it
    # ran: the first look after reads it all.
    now[0] += CHARGE_EVERY_S - 2
    assert memory(2_000, anon=13 * PAGE, charge=50 * PAGE) == 13 * PAGE
    # A reclaim shows at the next look, not before.
    assert memory(2_000, anon=9 * PAGE, charge=47 * PAGE) == 13 * PAGE
    now[0] += CHARGE_EVERY_S - 2
    assert memory(2_000, anon=9 * PAGE, charge=47 * PAGE) == 9 * PAGE  # reclaimed
    now[0] += CHARGE_EVERY_S - 1
    assert memory(2_000, anon=8 * PAGE, charge=47 * PAGE) == 9 * PAGE  # looked: still
    now[0] += MEMORY_REFRESH_S - CHARGE_EVERY_S - 1
    assert memory(2_000, anon=8 * PAGE, charge=47 * PAGE) == 8 * PAGE  # old: read anyway
    # That read took its charge too: the next look finds it still, and reads no more.
    now[0] += CHARGE_EVERY_S - 1
    assert memory(2_000, anon=5 * PAGE, charge=47 * PAGE) == 8 * PAGE
    # Without a charge file, every scan reads memory.stat.
    (tmp_path / "cgroup" / ("memory" if v1 else "") / job.strip("/")).joinpath(
        "memory.usage_in_bytes" if v1 else "memory.current"
    ).unlink()
    accounting = CgroupAccounting(CgroupFs(fs.path), str(proc.root), clock=lambda: now[0])
    assert memory(2_000, anon=7 * PAGE, charge=None) == 7 * PAGE
    assert memory(2_000, anon=6 * PAGE, charge=None) == 6 * PAGE


def test_a_job_cgroup_is_resolved_once_and_forgotten_when_it_ends(
    tmp_path: Path, pods: KubernetesPods
) -> None:
    node = Node(tmp_path, "v2-slurm.txt", pods, cgroups=True)
    asked: list[JobCgroup] = []
    resolve_job = node.resolver.resolve_job
    unknown = {"9"}  # a job the resolver cannot name yet (a pod not in the pod list)

    def counted(job: JobCgroup) -> Workload | None:
        asked.append(job)
        return None if job.ident in unknown else resolve_job(job)

    node.resolver.resolve_job = counted  # type: ignore[method-assign]
    node.proc.add(400, start=40, cgroup="0::/system.slice/slurmstepd.scope/job_9/step_0\n")
    node.fs.set("/system.slice/slurmstepd.scope/job_9", 0)
    sampler = node.sampler()
    for _ in range(3):
        node.proc.tick(800)
        sampler.sample_once()
    assert [j.ident for j in asked].count("4243") == 1  # named once
    assert [j.ident for j in asked].count("9") >= 3  # asked again until it has a name
    unknown.clear()
    node.proc.tick(800)
    sampler.sample_once()
    assert sampler.usage.job_workloads.keys() == {k for k in node.tables[-1].jobs}
    node.fs.remove("/system.slice/slurmstepd.scope/job_9")
    node.proc.remove(400)
    node.proc.tick(800)
    sampler.sample_once()
    assert [w.workload for w in sampler.usage.job_workloads.values()] == ["4243"]


def test_a_restart_splits_the_gap_by_the_job_cgroup_cpu_time(
    tmp_path: Path, pods: KubernetesPods
) -> None:
    node = Node(tmp_path, "v2-systemd-containerd.txt", pods, cgroups=True)
    state = StateFile(str(tmp_path / "state.json"))
    cpu = {100: 0, 101: 0, 200: 0}
    first = node.sampler(state)
    first.sample_once()
    node.step(job_ticks=400, b_ticks=0, cpu=cpu)
    before = energy(first.sample_once())[("cpu", "resnet-train")]
    # Down for one interval in which the job used 600 of 800 ticks; a new process
    # (a new exporter) with an accounting of its own starts.
    node.step(job_ticks=600, b_ticks=0, cpu=cpu)
    # A Slurm job starts while it is down and uses 100 ticks: all of them in the gap.
    node.proc.add(600, start=60, cgroup="0::/system.slice/slurmstepd.scope/job_77/step_0\n")
    node.fs.set("/system.slice/slurmstepd.scope/job_77", 1_000_000)
    node.accounting = CgroupAccounting(CgroupFs(node.fs.path), str(node.proc.root))
    second = node.sampler(state)
    snapshot = second.sample_once()
    (gap,) = (uj for component, _, uj in snapshot.restart_gap if component == "cpu")
    assert gap > 0
    assert abs(energy(snapshot)[("cpu", "77")] - gap * 100 / 800) <= 1
    # Its share of the gap, to the micro-joule the split rounds to.
    assert abs(energy(snapshot)[("cpu", "resnet-train")] - before - gap * 600 / 800) <= 1


def test_a_restarted_exporter_keeps_one_workload_per_job_and_warns_of_nothing(
    tmp_path: Path, pods: KubernetesPods, caplog: pytest.LogCaptureFixture
) -> None:
    # The state file gives back the job's workload as an object of its own; the
    # resolver hands out another, equal one. The series must go on under the one kept,
    # and nothing is wrong with its labels (short ones) to warn about.
    node = Node(tmp_path, "v2-slurm.txt", pods, cgroups=True)
    state = StateFile(str(tmp_path / "state.json"))
    cpu = {100: 0, 101: 0, 200: 0}
    first = node.sampler(state)
    first.sample_once()
    node.step(job_ticks=400, b_ticks=100, cpu=cpu)
    before = energy(first.sample_once())
    node.accounting = CgroupAccounting(CgroupFs(node.fs.path), str(node.proc.root))
    second = node.sampler(state)
    with caplog.at_level("WARNING"):
        second.sample_once()
        for _ in range(3):
            node.step(job_ticks=400, b_ticks=100, cpu=cpu)
            snapshot = second.sample_once()
    assert not [r for r in caplog.records if "label" in r.getMessage()]
    assert_conserved(snapshot)
    after = energy(snapshot)
    assert after[("cpu", node.job_name)] > before[("cpu", node.job_name)]
    (job,) = second.usage.job_workloads.values()
    kept = {s.workload for s in snapshot.energy if s.workload == job}
    assert len(kept) == 1 and next(iter(kept)) is job
