"""procs.ProcReader on the real /proc: files kept open, new PIDs probed between listings."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from fakecgroup import FakeCgroupFs
from idle_children import end_idle, spawn_idle
from wattprint.host import procfs as procs
from wattprint.host.cgroupfs import CgroupAccounting, CgroupFs
from wattprint.host.fs import HeldFiles, held_files
from wattprint.host.procfs import ProcReader


@pytest.fixture
def reader() -> ProcReader:
    reader = ProcReader("/proc")
    if not reader.live:
        pytest.skip("/proc is not a procfs here")
    return reader


def test_new_processes_are_found_between_listings_and_threads_are_not(
    reader: ProcReader,
) -> None:
    reader.table()  # the listing
    (pid,), w = spawn_idle(1)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        table = reader.table()  # probed, not listed
        assert reader._listed_at > float("-inf")
        assert pid in table.procs and table.procs[pid].ppid == os.getpid()
        assert thread.native_id not in table.procs  # a thread id answers too, but is no process
        assert table.procs[os.getpid()].pid == os.getpid()
    finally:
        stop.set()
        thread.join()
        end_idle([pid], w)
    assert pid not in reader.table().procs  # gone: its kept file answers ESRCH


def test_probing_matches_a_listing(reader: ProcReader, monkeypatch: pytest.MonkeyPatch) -> None:
    reader.table()
    children, w = spawn_idle(5)
    try:
        probed = reader.table()
        monkeypatch.setattr(procs, "LIST_EVERY_S", 0.0)
        listed = reader.table()
        mine = set(children)
        assert mine <= set(probed.procs) and mine <= set(listed.procs)
        assert probed.procs[os.getpid()].start_ticks == listed.procs[os.getpid()].start_ticks
    finally:
        end_idle(children, w)


def test_job_processes_are_listed_not_read_through_probes_exits_and_listings(
    reader: ProcReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FakeCgroupFs(tmp_path / "cgroup")
    job = "/system.slice/slurmstepd.scope/job_7"
    fs.set(job, 1_000_000, anon=4096, charge=4096)
    # What /proc/PID/cgroup says of the children placed in the job; of every other
    # process, nothing: it is outside job cgroups.
    names = tmp_path / "proc"
    accounting = CgroupAccounting(CgroupFs(fs.path), str(names))

    def place(pids: list[int]) -> None:
        for pid in pids:
            (names / str(pid)).mkdir(parents=True)
            (names / str(pid) / "cgroup").write_text(f"0::{job}/step_0\n")

    reader.table(accounting)  # the listing
    # A child holds the pipes of those forked before it: each ends before them.
    workers, w = spawn_idle(2)
    (other,), w_other = spawn_idle(1)
    (outsider,), w_out = spawn_idle(1)
    try:
        place(workers)
        first = reader.table(accounting)  # probed, or listed if the node forked a lot
        (key,) = first.jobs
        assert {first.in_job.get(pid) for pid in workers} == {key}
        assert first.live_jobs == {key} and first.jobs[key].cpu_usec == 1_000_000
        assert not set(workers) & set(first.procs) and {other, outsider} <= set(first.procs)

        end_idle([outsider], w_out)
        second = reader.table(accounting)
        assert outsider not in second.procs and second.in_job == first.in_job

        monkeypatch.setattr(procs, "LIST_EVERY_S", 0.0)
        listed = reader.table(accounting)
        assert listed.in_job == first.in_job and outsider not in listed.procs
        assert {other, os.getpid()} <= set(listed.procs)
        monkeypatch.setattr(procs, "LIST_EVERY_S", 60.0)

        # The job ends (slurmstepd removes its cgroup) while its processes linger:
        # they are read from /proc from then on.
        fs.remove(job)
        ended = reader.table(accounting)
        assert not ended.jobs and not ended.in_job and ended.live_jobs == frozenset()
        assert set(workers) <= set(ended.procs) and other in ended.procs
        assert {first.in_job.get(pid) for pid in workers} == {key}  # a table stays as made
    finally:
        end_idle([other], w_other)
        end_idle(workers, w)
    after = reader.table(accounting)
    assert not {other, *workers} & set(after.procs)


def kernel_threads() -> set[int]:
    """The kernel threads in the root cgroup now (those the reader may skip), found
    without the reader's own code: flags are stat's 9th field, PF_KTHREAD 0x200000."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:  # bytes: a process may name itself anything (prctl), UTF-8 or not
            stat = Path(f"/proc/{name}/stat").read_bytes().decode(errors="replace")
            lines = Path(f"/proc/{name}/cgroup").read_bytes().decode(errors="replace")
        except OSError:
            continue
        flags = int(stat.rsplit(")", 1)[1].split()[6])
        paths = [line.split(":", 2)[2] for line in lines.splitlines()]
        # "/" or, in a cgroup namespace of our own, "/../.." up to the node's root
        if flags & 0x200000 and paths and all(set(p.split("/")) <= {"", ".."} for p in paths):
            found.add(int(name))
    if Path("/proc/2/stat").exists() and b"(kthreadd)" in Path("/proc/2/stat").read_bytes():
        assert 2 in found  # kthreadd is always in the root cgroup
    return found


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if os.path.exists(f"/proc/{pid}")}


def counting_reads(reader: ProcReader, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    real_read = reader._read

    def counted(pid: int) -> procs.ProcInfo | None:
        reads.append(pid)
        return real_read(pid)

    monkeypatch.setattr(reader, "_read", counted)
    return reads


def always_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples after the next are probed, not listed, whatever forks elsewhere (the
    fork count is the node's, the last PID our PID namespace's) and however many."""
    monkeypatch.setattr(procs, "_forks", lambda stat: 0)
    monkeypatch.setattr(procs, "_PROBE_SHARE", 0)


@pytest.fixture
def kernel() -> set[int]:
    found = kernel_threads()
    if not found:
        pytest.skip("no kernel thread in this PID namespace")
    return found


def cgroup_files(pids: set[int]) -> set[str]:
    return {f"/proc/{pid}/cgroup" for pid in pids}


def test_kernel_threads_are_read_at_first_sight_and_after_each_listing_only(
    reader: ProcReader, kernel: set[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    always_probe(monkeypatch)
    first = reader.table()  # the listing: every process read once
    assert not kernel & set(first.procs)  # no workload's: not in the table
    assert kernel & {pid for pid, skip in reader._kernel.items() if skip}
    assert not kernel & set(reader._fds)  # and their files not kept
    reads = counting_reads(reader, monkeypatch)
    listed_at = reader._listed_at
    probed = reader.table()
    assert reader._listed_at == listed_at
    assert not kernel & set(reads)  # not read again
    assert os.getpid() in reads and os.getpid() in probed.procs  # processes are
    reads.clear()
    monkeypatch.setattr(procs, "LIST_EVERY_S", 0.0)
    listed = reader.table()
    assert reader._listed_at > listed_at
    assert kernel & set(reads)  # each listing reads them once more
    assert not kernel & set(listed.procs)


def test_a_kernel_thread_in_a_jobs_cgroup_is_read_as_a_process_and_checked_once_a_listing(
    reader: ProcReader, kernel: set[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a VM pod's vhost worker: every kernel thread here seen outside the root cgroup.
    checked: list[str] = []

    def in_a_job(path: str) -> bool:
        checked.append(path)
        return False

    monkeypatch.setattr(procs, "_in_root_cgroup", in_a_job)
    always_probe(monkeypatch)
    first = reader.table()
    kernel = alive(kernel)  # a kworker may end meanwhile
    assert kernel <= set(first.procs)
    assert all(first.procs[pid].kernel for pid in kernel)
    assert cgroup_files(kernel) <= set(checked)
    checked.clear()
    listed_at = reader._listed_at
    probed = reader.table()
    kernel = alive(kernel)
    assert reader._listed_at == listed_at
    assert kernel <= set(probed.procs)  # read each sample, as processes are
    assert not cgroup_files(kernel) & set(checked)  # not checked again
    monkeypatch.setattr(procs, "LIST_EVERY_S", 0.0)
    reader.table()
    kernel = alive(kernel)
    assert cgroup_files(kernel) <= set(checked)  # after a listing, again


def test_a_pid_taken_for_a_kernel_thread_is_read_when_handed_out_again(
    reader: ProcReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stale entry (the kernel thread ended, its PID went to a new process) must not
    # hide the new process: probed PIDs are forgotten, and a listing starts afresh.
    always_probe(monkeypatch)
    reader.table()
    (pid,), w = spawn_idle(1)
    try:
        reader._kernel[pid] = True
        listed_at = reader._listed_at
        assert pid in reader.table().procs  # probed: handed out since the last sample
        assert reader._listed_at == listed_at
        reader._kernel[pid] = True
        monkeypatch.setattr(procs, "LIST_EVERY_S", 0.0)
        assert pid in reader.table().procs  # listed
        reader._kernel[pid] = True
        reader.close()
        assert not reader._kernel
    finally:
        end_idle([pid], w)


def test_kept_files_are_given_back(reader: ProcReader) -> None:
    files = held_files()
    before = files.held
    (pid,), w = spawn_idle(1)
    reader.table()
    assert files.held > before or files.held >= files.budget
    end_idle([pid], w)
    reader.table()
    assert pid not in reader._fds


def test_out_of_file_descriptors_is_not_gone(
    reader: ProcReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process whose stat cannot be opened for want of descriptors (the HTTP server
    # holding its 512 connections) is skipped this sample, not forgotten: forgotten, it
    # would be missed until the next listing, its CPU share billed to nobody.
    reader.table()
    (pid,), w = spawn_idle(1)
    try:
        real_open = HeldFiles.open

        def exhausted(self: HeldFiles, path: str) -> int | None:
            if path.endswith(f"/{pid}/stat"):
                raise OSError(24, "Too many open files")  # EMFILE
            return real_open(self, path)

        monkeypatch.setattr(HeldFiles, "open", exhausted)
        assert pid not in reader.table().procs
        monkeypatch.setattr(HeldFiles, "open", real_open)
        assert pid in reader.table().procs  # still known: probed once, read now
    finally:
        end_idle([pid], w)


def test_a_stopped_exporter_gives_its_files_back() -> None:
    # `wattprint run` and the tests build and stop exporters inside one process: each
    # would otherwise keep one descriptor per process on the node, and its share of
    # the held-file budget, for the rest of that process's life.
    from wattprint.app import build_exporter
    from wattprint.config.options import build_config

    if not ProcReader("/proc").live:
        pytest.skip("/proc is not a procfs here")
    flags = {"gpu.source": "none", "carbon.zone": "DE", "state.file": ""}
    files = held_files()
    before_fds, before_held = len(os.listdir("/proc/self/fd")), files.held
    exporter = build_exporter(build_config(flags, {}), serve=False)
    exporter.start()
    assert files.held > before_held or files.held >= files.budget
    exporter.stop()
    assert files.held == before_held
    assert len(os.listdir("/proc/self/fd")) <= before_fds
