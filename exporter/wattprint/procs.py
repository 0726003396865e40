"""CPU time and resident memory of every process, read straight from /proc.

One read of /proc/PID/stat per process gives everything the sampler needs (parent,
start time, CPU ticks, resident pages); psutil would open several files per process.
With a CgroupAccounting, processes in job cgroups are not read at all: their job's
cgroup counts them (see cgroups.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cgroups import CgroupAccounting, JobUsage

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")

# Indices into the fields that follow the ")" closing comm in /proc/PID/stat
# (proc(5) numbers fields from 1, and the first two are pid and comm).
_PPID = 4 - 3
_UTIME = 14 - 3
_STIME = 15 - 3
_STARTTIME = 22 - 3
_RSS = 24 - 3

# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice.
# guest and guest_nice are already counted in user and nice, so only the first eight add
# up to the elapsed CPU time.
_CPU_FIELDS = 8


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    ppid: int
    start_ticks: int  # with pid, names one process across PID reuse
    cpu_ticks: int  # utime + stime of all its threads, in clock ticks
    rss_bytes: int


@dataclass(frozen=True)
class ProcTable:
    procs: Mapping[int, ProcInfo]  # the processes no job cgroup accounts for
    cpu_ticks_total: int  # elapsed CPU time of the node, all CPUs, idle included
    mem_total_bytes: int
    in_job: Mapping[int, str] = field(default_factory=dict)  # pid -> key in jobs
    jobs: Mapping[str, JobUsage] = field(default_factory=dict)


def parse_stat(pid: int, data: bytes) -> ProcInfo:
    """Parse the content of /proc/PID/stat; raises ValueError or IndexError if malformed."""
    # comm may hold spaces and parentheses: the last ")" ends it.
    fields = data[data.rindex(b")") + 2 :].split(maxsplit=_RSS + 1)
    return ProcInfo(
        pid=pid,
        ppid=int(fields[_PPID]),
        start_ticks=int(fields[_STARTTIME]),
        cpu_ticks=int(fields[_UTIME]) + int(fields[_STIME]),
        rss_bytes=int(fields[_RSS]) * PAGE_SIZE,
    )


def _read(path: str, size: int = 4096) -> bytes:
    """A small kernel file in one read (/proc/PID/stat, a cgroup's cpu.stat)."""
    # os.open/os.read skip the io object that open() builds: measurably cheaper when
    # repeated for every process every second.
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def read_proc(pid: int, procfs_root: str = "/proc") -> ProcInfo | None:
    """One process, or None if it is gone or its stat cannot be parsed."""
    try:
        return parse_stat(pid, _read(f"{procfs_root}/{pid}/stat"))
    except (OSError, ValueError, IndexError):
        return None


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
    cpu_ticks_total = read_cpu_ticks_total(procfs_root)
    mem_total_bytes = read_mem_total_bytes(procfs_root)
    pids = [int(name) for name in os.listdir(procfs_root) if name.isdigit()]
    in_job: Mapping[int, str] = {}
    jobs: Mapping[str, JobUsage] = {}
    if cgroups is not None:
        in_job, jobs = cgroups.scan(pids)
    procs: dict[int, ProcInfo] = {}
    prefix = f"{procfs_root}/"
    for pid in pids:
        if pid in in_job:
            continue
        try:
            procs[pid] = parse_stat(pid, _read(f"{prefix}{pid}/stat"))
        except (OSError, ValueError, IndexError):
            continue
    return ProcTable(procs, cpu_ticks_total, mem_total_bytes, in_job, jobs)
