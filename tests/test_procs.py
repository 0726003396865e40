from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from procfs_fixture import DEFAULT_CPU_LINE, DEFAULT_MEM_TOTAL_KB, FakeProc
from wattprint.host import procfs as procs
from wattprint.host.procfs import PAGE_SIZE, read_proc, read_proc_table


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    return FakeProc.snapshot(tmp_path / "proc")


def test_reads_every_process_from_stat(fake: FakeProc) -> None:
    fake.add(1, ppid=0, start=5, utime=300, stime=120, rss_pages=3000, comm="systemd")
    fake.add(4242, ppid=1, start=91_000, utime=7_000, stime=500, rss_pages=250_000)

    table = read_proc_table(fake.path)

    assert set(table.procs) == {1, 4242}
    p = table.procs[4242]
    assert (p.pid, p.ppid, p.start_ticks) == (4242, 1, 91_000)
    assert p.cpu_ticks == 7_500
    assert p.rss_bytes == 250_000 * PAGE_SIZE
    assert table.mem_total_bytes == DEFAULT_MEM_TOTAL_KB * 1024


def test_cpu_total_counts_guest_time_once(fake: FakeProc) -> None:
    # The kernel already includes guest and guest_nice in user and nice.
    values = [int(v) for v in DEFAULT_CPU_LINE.split()[1:]]
    assert values[8] > 0  # the fixture has guest time, or this test proves nothing

    table = read_proc_table(fake.path)

    assert table.cpu_ticks_total == sum(values) - values[8] - values[9]


@pytest.mark.parametrize("comm", ["tmux: server", "weird) (name", ")", "kworker/3:1-events"])
def test_command_names_with_spaces_and_parentheses(fake: FakeProc, comm: str) -> None:
    fake.add(77, ppid=12, start=4000, utime=3, stime=4, rss_pages=10, comm=comm)

    p = read_proc_table(fake.path).procs[77]

    assert (p.ppid, p.start_ticks, p.cpu_ticks, p.rss_bytes) == (12, 4000, 7, 10 * PAGE_SIZE)
    assert p.comm == comm.encode()  # the whole name, however odd: exec shows as a new one


def test_process_gone_between_listing_and_reading_is_skipped(
    fake: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.add(10)
    fake.add(11)
    fake.add(12)
    # 11 exits after the directory was listed: its stat read fails as on a real /proc.
    real_read = procs.read_small

    def racing_read(path: str) -> bytes:
        if path.endswith("/11/stat"):
            fake.remove(11)
        if path.endswith("/12/stat"):
            raise ProcessLookupError(3, "No such process")
        return real_read(path)

    monkeypatch.setattr(procs, "read_small", racing_read)

    table = read_proc_table(fake.path)

    assert set(table.procs) == {10}


def test_kernel_threads_in_the_root_cgroup_are_no_processes_of_the_table(
    fake: FakeProc,
) -> None:
    # kthreadd and its workers: their CPU time is the system's (unattributed through
    # the node's ticks), and no workload owns them, so the table leaves them out; but
    # not one the kernel placed in a pod's cgroup (a VM pod's vhost worker, before
    # Linux 6.4), which identity gives to the pod.
    pod = "0::/kubepods.slice/kubepods-pod0f1c2d3e_4b5a_6978_8899_aabbccddeeff.slice\n"
    fake.add(1, ppid=0, start=5, utime=300, comm="systemd")
    fake.add(2, ppid=0, start=5, comm="kthreadd", cgroup="0::/\n", kernel=True)
    v1 = "12:cpuset:/\n4:memory:/\n1:name=systemd:/\n0::/\n"
    fake.add(14, ppid=2, start=6, utime=900, comm="ksoftirqd/0", cgroup=v1, kernel=True)
    fake.add(77, ppid=2, start=9, utime=500, comm="vhost-4242", cgroup=pod, kernel=True)
    fake.add(4242, ppid=1, start=91_000, utime=7_000)

    table = read_proc_table(fake.path)

    assert set(table.procs) == {1, 77, 4242}
    assert table.procs[77].kernel and not table.procs[4242].kernel


def test_kernel_threads_seen_from_a_pods_cgroup_namespace(fake: FakeProc) -> None:
    # The chart's pod has a cgroup namespace of its own (cgroup v2): the node's root
    # cgroup shows as the way up to it, and a VM pod's vhost worker as a path beside
    # the exporter's own (a recorded /proc/PID/cgroup).
    fake.add(1, ppid=0, start=5, utime=300, comm="systemd", cgroup="0::/../../..\n")
    fake.add(2, ppid=0, start=5, comm="kthreadd", cgroup="0::/../../..\n", kernel=True)
    fake.add(14, ppid=2, start=6, utime=900, comm="ksoftirqd/0", cgroup="0::/../..\n", kernel=True)
    fake.add(
        77,
        ppid=2,
        start=9,
        utime=500,
        comm="vhost-4242",
        kernel=True,
        cgroup_fixture="v2-cgroupns-relative.txt",
    )
    fake.add(78, ppid=2, start=9, utime=5, comm="kworker/0:1", cgroup="0::/../x/..\n", kernel=True)

    table = read_proc_table(fake.path)

    assert set(table.procs) == {1, 77, 78}


@pytest.mark.parametrize("cgroup", ["", "0::\n", "garbage\n", None])
def test_a_kernel_thread_of_no_known_cgroup_is_read_as_a_process(
    fake: FakeProc, cgroup: str | None
) -> None:
    # Empty, unparseable or missing (it exited between its stat and its cgroup): no
    # proof it is in the root cgroup, and a process read needlessly costs only time.
    fake.add(2, ppid=0, start=5, comm="kthreadd", cgroup="0::/\n", kernel=True)
    fake.add(14, ppid=2, start=6, utime=900, comm="ksoftirqd/0", cgroup=cgroup or "", kernel=True)
    if cgroup is None:
        (fake.root / "14" / "cgroup").unlink()

    table = read_proc_table(fake.path)

    assert set(table.procs) == {14}


def test_the_kernel_flag_is_read_from_stat() -> None:
    own = Path("/proc/self/stat").read_bytes()
    assert not procs.parse_stat(os.getpid(), own).kernel
    try:
        kthreadd = Path("/proc/2/stat").read_bytes()
    except OSError:
        pytest.skip("no kthreadd in this PID namespace")
    if b"(kthreadd)" not in kthreadd:
        pytest.skip("PID 2 is not kthreadd in this PID namespace")
    assert procs.parse_stat(2, kthreadd).kernel


def test_unparseable_stat_skips_only_that_process(fake: FakeProc) -> None:
    fake.add(20)
    fake.add(21)
    (fake.root / "21" / "stat").write_text("21 (truncat")
    (fake.root / "22").mkdir()  # listed, but without a stat file

    assert set(read_proc_table(fake.path).procs) == {20}
    assert read_proc(21, fake.path) is None
    assert read_proc(20, fake.path) is not None


def test_missing_node_files_raise(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        read_proc_table(str(tmp_path))


def test_real_proc_matches_psutil() -> None:
    me = psutil.Process()
    table = read_proc_table()
    p = table.procs[os.getpid()]

    assert p.ppid == os.getppid()
    assert table.mem_total_bytes == psutil.virtual_memory().total
    # psutil reads the same fields; RSS moves a little between the two reads.
    assert abs(p.rss_bytes - me.memory_info().rss) < 64 * 1024 * 1024
    ticks = os.sysconf("SC_CLK_TCK")
    assert p.start_ticks / ticks + psutil.boot_time() == pytest.approx(me.create_time(), abs=2)
    assert 0 < p.cpu_ticks <= table.cpu_ticks_total
    assert p.comm == me.name().encode()[:15]
    # Where its stack starts, which exec() moves: shown to a reader with ptrace access.
    assert p.start_stack > 0
