"""CPU time and resident memory of every process, read straight from /proc.

One read of /proc/PID/stat per process gives everything the sampler needs (parent,
start time, CPU ticks, resident pages); psutil would open several files per process.
With a CgroupAccounting, processes in job cgroups are not read at all: their job's
cgroup counts them (see cgroupfs.py).

On a real procfs a reader lives as long as the exporter (ProcReader) and does less
each sample: it keeps each read process's stat file open and reads it again at offset
0 (the kernel formats it afresh; a process that exited answers ESRCH, even when its PID
has been reused), keeps the parsed ProcInfo while the file's bytes do not change, and
lists /proc only every LIST_EVERY_S seconds: in between, the processes that are new are
those with a PID the kernel handed out since (/proc/loadavg names the last one,
/proc/stat counts the forks), probed one by one. A kernel thread in the root cgroup is
read at first sight and then only after each listing: a node has a few per CPU (~60 on
a 2-core machine, hundreds on a GPU node), each read as costly as a process's, and no
workload owns one (its CPU time is the system's, unattributed through the node's ticks;
it has no resident memory). One in a job's cgroup (vhost workers of a VM pod, before
Linux 6.4) is read as a process, its cgroup checked once per listing too. Checking
again after each listing bounds what a wrong guess costs: a usermode helper still
flagged a kernel thread before its exec, or a PID handed out again unseen, is read
again within LIST_EVERY_S. Until then its CPU time is in the node's ticks, unattributed;
then all of it lands in the sample it is next read in (sampler/usage.py counts a process new
to the table from its start), where its share can take at most that sample's CPU
energy, from the other workloads and the unattributed alike; if it exits before the
next listing, that time stays unattributed. A fixture tree
(tests) is read the plain way, every file opened, /proc listed every time.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wattprint.host.cgroupfs import CgroupAccounting, JobUsage
from wattprint.host.fs import fs_type, held_files, read_small

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")

# Indices into the fields that follow the ")" closing comm in /proc/PID/stat
# (proc(5) numbers fields from 1, and the first two are pid and comm).
_PPID = 4 - 3
_FLAGS = 9 - 3
_UTIME = 14 - 3
_STIME = 15 - 3
_STARTTIME = 22 - 3
_RSS = 24 - 3
_STARTSTACK = 28 - 3
_EXIT_SIGNAL = 38 - 3  # -1 for a thread that is not its group's leader

# The flag of a kernel thread (include/linux/sched.h).
_PF_KTHREAD = 0x00200000

# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice.
# guest and guest_nice are already counted in user and nice, so only the first eight add
# up to the elapsed CPU time.
_CPU_FIELDS = 8

# What reading an exited process's stat answers (a reused PID's old file: ESRCH).
_GONE = (errno.ENOENT, errno.ESRCH)
# A full listing of /proc at least this often; in between, new PIDs are probed (a listing
# is made whenever probing could miss one, and a PID not yet in /proc is probed again
# once), and the processes read each sample show their own exits. What only a listing
# shows is that a process in a job cgroup, never read, has exited: that matters only to
# an ended job whose cgroup lingers, to stop refreshing its series (a 10-minute
# retention), and a listing of thousands of processes costs milliseconds of CPU
# (benchmarks/bench_procs.py).
LIST_EVERY_S = 60.0
# Probing costs about a read per PID handed out (threads included): past this many per
# process known, a listing is cheaper.
_PROBE_SHARE = 16
# After a listing, this many of the newest PIDs not listed are looked for once more.
_RETRY_NEWEST = 64


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """What the sampler uses of one process's /proc/PID/stat."""

    pid: int
    ppid: int
    start_ticks: int  # with pid, names one process across PID reuse
    cpu_ticks: int  # utime + stime of all its threads, in clock ticks
    rss_bytes: int
    # What exec() sets afresh: its name, and where its stack starts (randomized at each
    # exec; 0 to a reader without ptrace access to it). A change says it ran a program.
    comm: bytes = b""
    start_stack: int = 0
    kernel: bool = False  # a kernel thread (kthreadd's children, and kthreadd)

    @property
    def program(self) -> tuple[bytes, int]:
        return (self.comm, self.start_stack)


@dataclass(frozen=True)
class ProcTable:
    """One scan of the node: processes outside job cgroups, job cgroups' usage, node totals."""

    procs: Mapping[int, ProcInfo]  # the processes no job cgroup accounts for
    cpu_ticks_total: int  # elapsed CPU time of the node, all CPUs, idle included
    mem_total_bytes: int
    in_job: Mapping[int, str] = field(default_factory=dict)  # pid -> key in jobs
    jobs: Mapping[str, JobUsage] = field(default_factory=dict)
    live_jobs: Collection[str] = frozenset()  # the keys of jobs with a process in in_job


def parse_stat(pid: int, data: bytes) -> ProcInfo:
    """Parse the content of /proc/PID/stat; raises ValueError or IndexError if malformed."""
    # comm may hold spaces and parentheses: the last ")" ends it.
    end = data.rindex(b")")
    fields = data[end + 2 :].split(maxsplit=_STARTSTACK + 1)
    return ProcInfo(
        pid=pid,
        ppid=int(fields[_PPID]),
        start_ticks=int(fields[_STARTTIME]),
        cpu_ticks=int(fields[_UTIME]) + int(fields[_STIME]),
        rss_bytes=int(fields[_RSS]) * PAGE_SIZE,
        comm=data[data.find(b"(") + 1 : end],
        start_stack=int(fields[_STARTSTACK]),
        kernel=(int(fields[_FLAGS]) & _PF_KTHREAD) != 0,
    )


def _is_thread(data: bytes) -> bool:
    """Whether a /proc/N/stat is a thread's (not a process's): N is a thread id."""
    fields = data[data.rindex(b")") + 2 :].split(maxsplit=_EXIT_SIGNAL + 1)
    return fields[_EXIT_SIGNAL] == b"-1"


def read_proc(pid: int, procfs_root: str = "/proc") -> ProcInfo | None:
    """One process, or None if it is gone or its stat cannot be parsed."""
    try:
        return parse_stat(pid, read_small(f"{procfs_root}/{pid}/stat"))
    except (OSError, ValueError, IndexError):
        return None


def _cpu_ticks_total(stat: bytes, root: str) -> int:
    line = stat[: stat.find(b"\n")]  # the kernel writes the "cpu" line first
    if not line.startswith(b"cpu "):
        raise ValueError(f"no cpu line in {root}/stat")
    return sum(int(v) for v in line.split()[1 : 1 + _CPU_FIELDS])


def read_cpu_ticks_total(procfs_root: str = "/proc") -> int:
    with open(f"{procfs_root}/stat", "rb") as f:
        for line in f:
            if line.startswith(b"cpu "):
                return sum(int(v) for v in line.split()[1 : 1 + _CPU_FIELDS])
    raise ValueError(f"no cpu line in {procfs_root}/stat")


def read_mem_total_bytes(procfs_root: str = "/proc") -> int:
    with open(f"{procfs_root}/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemTotal:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB (KiB)
    raise ValueError(f"no MemTotal in {procfs_root}/meminfo")


# -- the process table -----------------------------------------------------------------


class ProcReader:
    """The process table of one procfs, read once a sample (see the module docstring)."""

    def __init__(self, procfs_root: str = "/proc") -> None:
        self.root = procfs_root
        self._prefix = f"{procfs_root}/"
        self.live = fs_type(procfs_root) == "proc"
        self._files = held_files()
        self._fds: dict[int, int] = {}  # pid -> its open stat file
        self._parsed: dict[int, tuple[bytes, ProcInfo]] = {}  # pid -> last bytes, parsed
        self._node: dict[str, int] = {}  # /proc/stat, /proc/meminfo, /proc/loadavg
        self._node_size: dict[str, int] = {}
        self._known: set[int] = set()  # the processes as of the last sample
        # Kernel threads until the next listing: True, in the root cgroup (not read);
        # False, in a job's (read as a process, its cgroup not checked again).
        self._kernel: dict[int, bool] = {}
        self._last_pid = -1
        self._forks = -1
        self._retry: list[int] = []  # PIDs to probe again: see _pids
        self._listed_at = float("-inf")
        self._lock = threading.Lock()

    def table(self, cgroups: CgroupAccounting | None = None) -> ProcTable:
        if not self.live:
            return _plain_table(self.root, cgroups)
        with self._lock:  # its open files are one set, whoever asks
            return self._table(cgroups)

    def _table(self, cgroups: CgroupAccounting | None) -> ProcTable:
        stat = self._node_file("stat")
        cpu_ticks_total = _cpu_ticks_total(stat, self.root)
        mem_total_bytes = _mem_total(self._node_file("meminfo"), self.root)
        pids, changed, reused = self._pids(stat)
        scan = cgroups.scan(pids, changed, reused) if cgroups is not None else None
        procs: dict[int, ProcInfo] = {}
        gone = []
        kernel = self._kernel
        for pid in scan.outside if scan is not None else pids:
            skip = kernel.get(pid)
            if skip:
                continue
            try:
                info = self._read(pid)
            except OSError:  # out of file descriptors or the like: not gone, unread now
                continue
            if info is None:
                gone.append(pid)
                continue
            if info.kernel and skip is None:
                # A cgroup file that cannot be read counts as a job's: the thread is
                # read each sample until the next listing, never hidden.
                skip = kernel[pid] = _in_root_cgroup(f"{self._prefix}{pid}/cgroup")
                if skip:
                    self._close(pid)  # not read again before the next listing
                    continue
            procs[pid] = info
        for pid in gone:
            self._forget(pid)
        if scan is None:
            return ProcTable(procs, cpu_ticks_total, mem_total_bytes)
        if gone and cgroups is not None:
            cgroups.forget(gone)
        return ProcTable(procs, cpu_ticks_total, mem_total_bytes, scan.in_job, scan.jobs, scan.live)

    def close(self, cgroups: CgroupAccounting | None = None) -> None:
        """Give back the files it holds, and cgroups' (the exporter stops): under its
        lock, so not in the middle of a table. A later table lists /proc again and
        opens what it needs."""
        with self._lock:
            if cgroups is not None:
                cgroups.close()
            for pid in list(self._fds):
                self._close(pid)
            for fd in self._node.values():
                os.close(fd)
            self._node = {}
            self._known = set()
            self._kernel = {}
            self._forks = -1  # the next table lists /proc
            self._retry = []

    def _node_file(self, name: str) -> bytes:
        fd = self._node.get(name)
        if fd is None:
            fd = self._node[name] = os.open(f"{self._prefix}{name}", os.O_RDONLY | os.O_CLOEXEC)
        size = self._node_size.get(name, 16384)
        while True:
            data = os.pread(fd, size, 0)
            if len(data) < size:
                return data
            size = self._node_size[name] = size * 2  # /proc/stat of a big machine

    def _pids(self, stat: bytes) -> tuple[set[int], Collection[int] | None, Collection[int] | None]:
        """Every process now; the PIDs handed out since the previous sample, when they
        were probed (None after a listing); and after a listing, the PIDs that may have
        been handed out again since the previous one (None: any may have)."""
        forks = _forks(stat)
        last_pid = int(self._node_file("loadavg").rsplit(None, 1)[-1])
        span = last_pid - self._last_pid
        now = time.monotonic()
        # Fewer forks than PIDs handed out: the PIDs did not wrap around.
        unwrapped = self._forks >= 0 and 0 <= forks - self._forks <= span
        probe = (
            unwrapped
            and now - self._listed_at < LIST_EVERY_S
            and span * _PROBE_SHARE <= max(len(self._known), _PROBE_SHARE)
        )
        first = self._last_pid + 1
        self._last_pid, self._forks = last_pid, forks
        # A PID is handed out (loadavg names it) a little before its process shows in
        # /proc: the last few not found are looked for again at the next sample.
        retry, self._retry = self._retry, []
        if not probe:
            listed = {int(name) for name in os.listdir(self.root) if name.isdigit()}
            for pid in self._known - listed:
                self._forget(pid)
            self._kernel.clear()  # each read once more (module docstring)
            self._listed_at = now
            self._known = listed
            newest = range(max(first, last_pid - _RETRY_NEWEST + 1), last_pid + 1)
            self._retry = [pid for pid in newest if pid not in listed]
            return listed, None, range(first, last_pid + 1) if unwrapped else None
        changed = [*retry, *range(first, last_pid + 1)]
        for pid in changed:
            self._forget(pid)  # a PID handed out again: what was known of it is stale
            try:
                data = read_small(f"{self._prefix}{pid}/stat")
                if not _is_thread(data):
                    self._known.add(pid)
            except OSError:
                if pid >= first:  # not there yet, or gone already: once more next time
                    self._retry.append(pid)
            except (ValueError, IndexError):
                continue  # not a process
        return self._known, changed, None

    def _open(self, pid: int) -> bytes:
        path = f"{self._prefix}{pid}/stat"
        fd = self._files.open(path)
        if fd is None:
            return read_small(path)
        self._fds[pid] = fd
        return os.pread(fd, 4096, 0)

    def _read(self, pid: int) -> ProcInfo | None:
        fd = self._fds.get(pid)
        try:
            if fd is None:
                data = self._open(pid)
            else:
                try:
                    data = os.pread(fd, 4096, 0)
                except OSError:
                    # The process the file was opened on is gone; the PID may be
                    # another's by now.
                    self._close(pid)
                    data = self._open(pid)
        except OSError as err:
            if err.errno in _GONE:
                return None
            raise
        cached = self._parsed.get(pid)
        if cached is not None and cached[0] == data:
            return cached[1]
        try:
            info = parse_stat(pid, data)
        except (ValueError, IndexError):
            return None
        self._parsed[pid] = (data, info)
        return info

    def _forget(self, pid: int) -> None:
        self._known.discard(pid)
        self._kernel.pop(pid, None)
        self._close(pid)

    def _close(self, pid: int) -> None:
        self._parsed.pop(pid, None)
        fd = self._fds.pop(pid, None)
        if fd is not None:
            self._files.close(fd)


def _in_root_cgroup(path: str) -> bool:
    """Whether /proc/PID/cgroup puts the process in the root cgroup of every hierarchy
    (False if it cannot be read: then it is read as any process)."""
    try:
        lines = read_small(path).splitlines()
    except OSError:
        return False
    # hierarchy-ID:controllers:path, and a path may hold ":" too.
    return bool(lines) and all(_is_root(line.split(b":", 2)[-1]) for line in lines)


def _is_root(path: bytes) -> bool:
    # "/" is the node's root cgroup, but in a private cgroup namespace (a pod's, cgroup
    # v2) it is the exporter's own container, where no kernel thread is, and the node's
    # root shows as the way up from there, "/.." once for each level. A path of ".."
    # only could also be a cgroup between the two: the kubelet's slices, which enable
    # controllers for their children and so, on cgroup v2, hold no process; a kernel
    # thread in a pod's cgroup (a vhost worker) shows that pod's path.
    return path == b"/" or (path.startswith(b"/..") and not path.replace(b"/..", b""))


def _forks(stat: bytes) -> int:
    at = stat.find(b"\nprocesses ")
    if at < 0:
        return -1
    end = stat.find(b"\n", at + 1)
    return int(stat[at + 11 : end if end >= 0 else len(stat)])


def _mem_total(meminfo: bytes, root: str) -> int:
    if meminfo.startswith(b"MemTotal:"):
        return int(meminfo.split(None, 2)[1]) * 1024
    raise ValueError(f"no MemTotal in {root}/meminfo")


_readers: dict[str, ProcReader] = {}


def read_proc_table(
    procfs_root: str = "/proc", cgroups: CgroupAccounting | None = None
) -> ProcTable:
    """Every process on the node (every thread group: threads are counted in theirs).

    With cgroups, the processes in job cgroups are only listed (in_job) and their jobs'
    usage read (jobs); the others are read one by one. A process that exits between
    the listing and its read, or whose stat cannot be parsed, is left out. Raises
    OSError or ValueError only when the node-wide files (/proc/stat, /proc/meminfo)
    cannot be read.
    """
    reader = _readers.get(procfs_root)
    if reader is None:
        reader = ProcReader(procfs_root)
        if reader.live:
            _readers[procfs_root] = reader  # one per procfs, for the exporter's life
    return reader.table(cgroups)


def _plain_table(procfs_root: str, cgroups: CgroupAccounting | None) -> ProcTable:
    cpu_ticks_total = read_cpu_ticks_total(procfs_root)
    mem_total_bytes = read_mem_total_bytes(procfs_root)
    pids = [int(name) for name in os.listdir(procfs_root) if name.isdigit()]
    scan = cgroups.scan(pids) if cgroups is not None else None
    procs: dict[int, ProcInfo] = {}
    prefix = f"{procfs_root}/"
    for pid in pids:
        if scan is not None and pid in scan.in_job:
            continue
        try:
            info = parse_stat(pid, read_small(f"{prefix}{pid}/stat"))
        except (OSError, ValueError, IndexError):
            continue
        if not (info.kernel and _in_root_cgroup(f"{prefix}{pid}/cgroup")):
            procs[pid] = info
    if scan is None:
        return ProcTable(procs, cpu_ticks_total, mem_total_bytes)
    return ProcTable(procs, cpu_ticks_total, mem_total_bytes, scan.in_job, scan.jobs, scan.live)
