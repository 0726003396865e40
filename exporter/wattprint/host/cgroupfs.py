"""CPU time and memory of job cgroups (Kubernetes pods, Slurm jobs), read from the
cgroup filesystem instead of from every process's /proc files.

A job's cgroup counts the CPU time and memory of all its processes, so two small reads
per job replace one read per process: a node with 2,000 processes in 100 pods costs
200 reads a sample instead of 2,000. Each process's /proc/PID/cgroup is read once, at
first sight, to learn which job cgroup holds it; a process whose cgroup is not a job's,
or whose job cgroup cannot be found or read, is read from /proc as before.

What counts as a job's memory: anonymous memory plus mapped file pages (cgroup v2
memory.stat `anon` + `file_mapped`; v1 `total_rss` + `total_mapped_file`): the
resident memory of its processes, the same thing /proc/PID/stat's RSS counts, with
pages shared between its processes counted once. Page cache that no process maps
(files read once) is the kernel's to reclaim and does not count, as in RSS.

memory.stat is the costly read (the kernel formats some 40 lines and, in v1, sums them
over the job's descendants: ~9 us, against ~2.5 us for the CPU time or the charge). It
is read again when it may have changed: when the job's CPU time has moved (its
processes ran: they grow its resident memory by faulting pages in) or, for a job whose
CPU time has not, when its charged memory (memory.current, v1 memory.usage_in_bytes)
has (the kernel reclaimed some of it); and at least every MEMORY_REFRESH_S seconds
whatever they say. That bound is for what neither shows: a process elsewhere mapping
page cache charged to the job (file_mapped grows, the charge does not), or the
kernel's per-CPU statistics catching up late (up to 64 pages a CPU on some kernels).

A still job's charge is looked at every CHARGE_EVERY_S seconds, not every sample: on a
node of a hundred mostly still jobs that read was a third of what the job cgroups cost
each sample (a tenth of all a job costs the exporter), and what it catches, a reclaim
of memory whose processes are not running (swapped out, or mapped page cache dropped
under pressure), then shows in the job's share of memory energy at the first sample
CHARGE_EVERY_S after the last look. A busy job costs the two reads it always did (CPU
time, memory.stat) each sample; a still one its CPU time, its charge every
CHARGE_EVERY_S and memory.stat every MEMORY_REFRESH_S (and once after it last ran). A
cgroup without a charge file (a test's tree) has its memory.stat read every time.

Parsing is pure (the parse_* functions); CgroupFs and CgroupAccounting do the I/O.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from wattprint.host.fs import fs_type, held_files, read_small
from wattprint.host.identity.cgroup import JobCgroup, job_cgroup

# Deeper than any layout we know of (kind nested in Docker: 6); bounds a walk of a
# strange tree.
_MAX_DEPTH = 10
_MAX_DIRS = 50_000
# memory.stat is read at least this often, even for a job whose CPU time and charge are
# still: a bound on what a change neither of them shows could leave stale.
MEMORY_REFRESH_S = 10.0
# A still job's charge is looked at this often, not every sample (module docstring).
CHARGE_EVERY_S = 5.0
_SIZE = 8192  # larger than any cpu.stat, memory.stat or charge file


@dataclass(frozen=True, slots=True)
class JobUsage:
    """A job cgroup's CPU time and resident memory at one scan."""

    job: JobCgroup
    cpu_usec: int  # cumulative CPU time of the job's processes, microseconds
    memory_bytes: int  # resident: see the module docstring
    new: bool  # the job appeared since the previous scan: all of its CPU time is new


def parse_cpu_stat(data: bytes) -> int:
    """usage_usec from a cgroup v2 cpu.stat (ValueError if absent)."""
    value = _stat_value(data, b"usage_usec")
    if value is None:
        raise ValueError("no usage_usec in cpu.stat")
    return value


def parse_cpuacct_usage(data: bytes) -> int:
    """Microseconds from a cgroup v1 cpuacct.usage (nanoseconds)."""
    return int(data) // 1000


_MEMORY_V2 = (b"anon", b"file_mapped")
_MEMORY_V1 = (b"total_rss", b"total_mapped_file")
_MEMORY_V1_FLAT = (b"rss", b"mapped_file")  # use_hierarchy=0: no total_ lines


def _stat_value(data: bytes, name: bytes) -> int | None:
    """The value of the "name N" line of a flat-keyed cgroup file, or None."""
    # Only the few lines needed, found by search: memory.stat has some 50 lines, and
    # splitting them all for every job every second costs more than reading the file.
    if data.startswith(name + b" "):
        start = len(name) + 1
    else:
        at = data.find(b"\n" + name + b" ")
        if at < 0:
            return None
        start = at + len(name) + 2
    end = data.find(b"\n", start)
    return int(data[start : end if end >= 0 else len(data)])


def parse_memory_stat(data: bytes, v1: bool) -> int:
    """Resident bytes from memory.stat (ValueError if the needed lines are absent)."""
    for names in (_MEMORY_V1, _MEMORY_V1_FLAT) if v1 else (_MEMORY_V2,):
        values = [_stat_value(data, n) for n in names]
        if None not in values:
            return sum(v for v in values if v is not None)
    raise ValueError("memory.stat lacks " + " and ".join(n.decode() for n in names))


class _Located:
    """A job cgroup's files; on a real cgroupfs kept open and read again at offset 0
    (the kernel formats them afresh; a removed cgroup's answer ENODEV). Remembers what
    it read last, to tell whether memory.stat must be read again (module docstring)."""

    __slots__ = (
        "charge",
        "charge_fd",
        "charge_file",
        "checked_at",
        "cpu",
        "cpu_fd",
        "cpu_file",
        "job",
        "memory_fd",
        "memory_file",
        "stat_at",
        "usage",
    )

    def __init__(
        self, job: JobCgroup, cpu_file: str, memory_file: str, charge_file: str, hold: bool
    ) -> None:
        self.job = job
        self.cpu_file = cpu_file
        self.memory_file = memory_file
        # "" without one: then nothing says memory.stat is unchanged.
        self.charge_file = charge_file if os.path.exists(charge_file) else ""
        self.cpu = b""
        self.charge = b""
        self.stat_at = -MEMORY_REFRESH_S
        self.checked_at = -CHARGE_EVERY_S  # when its memory was last known current
        self.usage: JobUsage | None = None
        # -1: not held, read by path (a test's tree, or the budget is spent).
        self.cpu_fd = self.memory_fd = self.charge_fd = -1
        if hold:
            files = held_files()
            fds: list[int] = []
            try:
                for path in (cpu_file, memory_file, self.charge_file):
                    fd = files.open(path) if path else -1
                    if fd is None:  # the budget is spent: read the plain way
                        break
                    fds.append(fd)
                else:
                    self.cpu_fd, self.memory_fd, self.charge_fd = fds
            finally:  # also when an open fails (the cgroup went meanwhile)
                if self.cpu_fd < 0:
                    for held in fds:
                        if held >= 0:
                            files.close(held)

    def read_memory(self) -> bytes:
        fd = self.memory_fd
        return os.pread(fd, _SIZE, 0) if fd >= 0 else read_small(self.memory_file, _SIZE)

    def read_charge(self) -> bytes:
        fd = self.charge_fd
        if fd >= 0:
            return os.pread(fd, _SIZE, 0)
        return read_small(self.charge_file, _SIZE) if self.charge_file else b""

    def close(self) -> None:
        if self.cpu_fd >= 0:
            files = held_files()
            for fd in (self.cpu_fd, self.memory_fd, self.charge_fd):
                if fd >= 0:
                    files.close(fd)
            self.cpu_fd = self.memory_fd = self.charge_fd = -1


class CgroupFs:
    """The cgroup hierarchies under one root (/sys/fs/cgroup, or the host's seen
    through a mount): the v2 unified one, and v1's cpuacct and memory ones."""

    def __init__(self, root: str = "/sys/fs/cgroup") -> None:
        self.root = root
        self.unified: str | None = None
        self.cpuacct: str | None = None
        self.memory: str | None = None
        if os.path.exists(f"{root}/cgroup.controllers"):
            self.unified = root
        else:
            try:
                names = os.listdir(root)
            except OSError:
                names = []
            for name in names:
                controllers = name.split(",")
                if name == "unified" and os.path.exists(f"{root}/unified/cgroup.controllers"):
                    self.unified = f"{root}/unified"
                elif "cpuacct" in controllers:
                    self.cpuacct = f"{root}/{name}"
                elif name == "memory":
                    self.memory = f"{root}/{name}"
        # Real cgroup mounts (not a test's tree): their files can be kept open.
        self.live = {
            mount: fs_type(mount) in ("cgroup", "cgroup2")
            for mount in (self.unified, self.cpuacct, self.memory)
            if mount is not None
        }
        # name of a cgroup directory -> its path, per mount; built on demand for paths
        # seen from inside a cgroup namespace, which are relative to the reader's own.
        self._index: dict[str, dict[str, str]] = {}
        self._walked: set[str] = set()

    @property
    def usable(self) -> bool:
        return self.unified is not None or (self.cpuacct is not None and self.memory is not None)

    def locate(self, job: JobCgroup, now: float) -> _Located | None:
        """The files holding the job's CPU time and memory, if they can be read."""
        if job.v1:
            mounts = (self.cpuacct, self.memory)
            cpu_dir = self._dir(self.cpuacct, job.cpu_path)
            memory_dir = self._dir(self.memory, job.memory_path)
            cpu_file, charge_name = "cpuacct.usage", "memory.usage_in_bytes"
        else:
            mounts = (self.unified, self.unified)
            cpu_dir = memory_dir = self._dir(self.unified, job.cpu_path)
            cpu_file, charge_name = "cpu.stat", "memory.current"
        if cpu_dir is None or memory_dir is None:
            return None
        hold = all(self.live.get(m or "", False) for m in mounts)
        try:
            located = _Located(
                job,
                f"{cpu_dir}/{cpu_file}",
                f"{memory_dir}/memory.stat",
                f"{memory_dir}/{charge_name}",
                hold,
            )
        except OSError:
            return None
        try:
            read_usage(located, new=False, now=now)
        except (OSError, ValueError):
            located.close()
            return None
        return located

    def _dir(self, mount: str | None, path: str) -> str | None:
        if mount is None:
            return None
        components = [c for c in path.split("/") if c]
        if ".." not in components:
            direct = f"{mount}/{'/'.join(components)}"
            if os.path.isdir(direct):
                return direct
        name = components[-1] if components else ""
        index = self._index.get(mount)
        if index is None or (name not in index and mount not in self._walked):
            # At most one walk per mount and scan, and only for a job not seen before.
            index = self._index[mount] = _walk(mount)
            self._walked.add(mount)
        return index.get(name)

    def forget_index(self) -> None:
        """Allow a new walk: new jobs have made new directories since."""
        self._walked.clear()


def _walk(mount: str) -> dict[str, str]:
    index: dict[str, str] = {}
    level = [mount]
    for _ in range(_MAX_DEPTH):
        below = []
        for directory in level:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    index.setdefault(entry.name, entry.path)
                    below.append(entry.path)
            if len(index) > _MAX_DIRS:
                return index
        if not below:
            break
        level = below
    return index


def read_usage(located: _Located, new: bool, now: float) -> JobUsage:
    """The job's usage now (now: monotonic seconds, for MEMORY_REFRESH_S)."""
    fd = located.cpu_fd
    cpu = os.pread(fd, _SIZE, 0) if fd >= 0 else read_small(located.cpu_file, _SIZE)
    previous = located.usage
    if (
        previous is not None
        and cpu == located.cpu
        and now - located.stat_at < MEMORY_REFRESH_S
        and located.charge_file
    ):
        # Its processes did not run: only a reclaim can have moved its memory, and a
        # reclaim moves its charge, looked at every CHARGE_EVERY_S. Read first: a
        # change after it shows next time.
        still = now - located.checked_at < CHARGE_EVERY_S
        if not still:
            charge = located.read_charge()
            if charge and charge == located.charge:
                still, located.checked_at = True, now
        if still:
            if previous.new != new:
                previous = located.usage = JobUsage(
                    previous.job, previous.cpu_usec, previous.memory_bytes, new
                )
            return previous  # nothing moved: the same usage, from one or two small reads
    elif previous is None or cpu == located.cpu:
        # A new job's charge, or a still one's whose memory.stat is old: its next look
        # compares with it, and need not read memory.stat again.
        charge = located.read_charge()
    else:
        charge = b""  # a busy job's is not needed: unknown, so its next look reads all
    job = located.job
    memory = parse_memory_stat(located.read_memory(), job.v1)
    located.stat_at = located.checked_at = now
    cpu_usec = parse_cpuacct_usage(cpu) if job.v1 else parse_cpu_stat(cpu)
    usage = located.usage = JobUsage(job, cpu_usec, memory, new)
    located.cpu, located.charge = cpu, charge
    return usage


class JobScan(NamedTuple):
    """What a scan found (CgroupAccounting.scan)."""

    in_job: dict[int, str]  # pid -> the key of the job cgroup that accounts for it
    jobs: dict[str, JobUsage]  # key -> usage now, for every job cgroup tracked
    live: frozenset[str]  # the keys with a listed process (an ended job's cgroup lingers)
    outside: set[int]  # the listed PIDs no job cgroup accounts for: the caller's to read


class CgroupAccounting:
    """Which processes a job cgroup accounts for, and the usage of those cgroups.

    Keyed by the job's CPU-time file: one per job cgroup on the node. A process is
    classified once, at first sight: job cgroups are made before their processes
    (runc, slurmstepd) and processes do not leave them.
    """

    def __init__(
        self,
        fs: CgroupFs,
        procfs_root: str = "/proc",
        kubernetes: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fs = fs
        self._clock = clock
        self.procfs_root = procfs_root
        self.kubernetes = kubernetes
        self._pids: dict[int, str | None] = {}  # pid -> its job's key, None: outside
        self._jobs: dict[str, _Located] = {}
        self._keys: dict[JobCgroup, str] = {}
        # Jobs whose cgroup could not be read any more: should one be found again, its
        # CPU time so far is not new.
        self._ended: set[str] = set()
        self._in_job: dict[int, str] = {}
        self._outside: set[int] = set()
        # What the last scan handed out, while nothing changed: most samples of a node
        # see no process start or end in a job, and need not copy 2,000 entries again.
        self._handed: tuple[dict[int, str], frozenset[str]] | None = None
        self._fresh: set[str] = set()  # jobs first seen in this scan, after the first
        self._scanned = False

    def scan(
        self,
        pids: Iterable[int],
        changed: Iterable[int] | None = None,
        reused: Collection[int] | None = (),
    ) -> JobScan:
        """Split the listed processes: those a job cgroup accounts for and the others,
        and read the usage of every tracked job cgroup.

        changed: the PIDs handed out since the previous scan, when pids is not a fresh
        listing but the previous one with them (procfs.ProcReader): only they are
        classified, again if they were known (a new process took the PID). The caller
        says which of the others it found gone (forget). reused, for a listing (changed
        None): the PIDs that may have been handed out again since the previous scan,
        classified afresh; None: any may have (the PIDs wrapped around).

        outside is the accounting's own set, valid until the next scan or forget."""
        self._fresh.clear()
        if changed is None:
            self.fs.forget_index()
            previous = self._pids
            self._pids, self._in_job, self._outside = {}, {}, set()
            keep = previous if reused is not None else {}
            again = reused or ()
            for pid in pids:
                key = keep[pid] if pid in keep and pid not in again else self._classify(pid)
                self._pids[pid] = key
                if key is None:
                    self._outside.add(pid)
                else:
                    self._in_job[pid] = key
            self._handed = None
        else:
            alive = pids if isinstance(pids, (set, frozenset, dict)) else set(pids)
            first = True
            for pid in changed:
                if self._in_job.pop(pid, None) is not None:
                    self._handed = None
                self._outside.discard(pid)
                if pid not in alive:
                    self._pids.pop(pid, None)
                    continue
                if first:
                    self.fs.forget_index()
                    first = False
                key = self._pids[pid] = self._classify(pid)
                if key is None:
                    self._outside.add(pid)
                else:
                    self._in_job[pid] = key
                    self._handed = None
        usage: dict[str, JobUsage] = {}
        ended: list[str] = []
        now = self._clock()
        fresh = self._fresh
        for key, located in self._jobs.items():
            # A job first seen after the first scan started since the previous one: all
            # of its CPU time belongs to this interval (short jobs must count too).
            try:
                usage[key] = read_usage(located, key in fresh, now)
            except (OSError, ValueError):
                ended.append(key)
        for key in ended:
            # The job ended (its cgroup is removed): its processes, if any are left,
            # are read from /proc from now on.
            located = self._jobs.pop(key)
            located.close()
            del self._keys[located.job]
            if len(self._ended) > 100_000:
                self._ended.clear()
            self._ended.add(key)
            for pid in [p for p, k in self._in_job.items() if k == key]:
                self._pids[pid] = None
                del self._in_job[pid]
                self._outside.add(pid)
            self._handed = None
        self._scanned = True
        if self._handed is None:
            self._handed = (dict(self._in_job), frozenset(self._in_job.values()))
        in_job, live = self._handed
        return JobScan(in_job, usage, live, self._outside)

    def forget(self, pids: Iterable[int]) -> None:
        """The caller found these processes (outside job cgroups) gone."""
        for pid in pids:
            self._pids.pop(pid, None)
            self._outside.discard(pid)

    def close(self) -> None:
        """Give back the job cgroups' files (the exporter stops). A later scan starts
        over, as the first one: the jobs it finds again are not new."""
        for located in self._jobs.values():
            located.close()
        self._jobs, self._keys = {}, {}
        self._pids, self._in_job, self._outside = {}, {}, set()
        self._handed = None
        self._scanned = False

    def _classify(self, pid: int) -> str | None:
        try:
            with open(f"{self.procfs_root}/{pid}/cgroup", "rb") as f:
                content = f.read().decode("utf-8", "replace")
        except OSError:
            return None
        job = job_cgroup(content, self.kubernetes)
        if job is None:
            return None
        key = self._keys.get(job)
        if key is not None:
            return key
        found = self.fs.locate(job, self._clock())
        if found is None:
            return None
        key = found.cpu_file
        self._jobs[key] = found
        self._keys[job] = key
        if self._scanned and key not in self._ended:
            self._fresh.add(key)
        return key
