"""The one fake /proc of the tests and benchmarks: small trees in a temporary directory,
in the kernel's own file formats."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
FIXTURES = Path(__file__).parent / "fixtures"

# /proc/stat "cpu" line of a real machine: user nice system idle iowait irq softirq
# steal guest guest_nice.
DEFAULT_CPU_LINE = "cpu  4705 356 584 3699176 2300 0 131 7 900 10"
DEFAULT_MEM_TOTAL_KB = 16_303_428


# /proc/PID/stat flags of a user process and of a kernel thread (kthreadd's, and those of
# the workers it starts: PF_KTHREAD among them).
USER_FLAGS = 4194560
KERNEL_FLAGS = 2129984


def stat_line(
    pid: int,
    comm: str,
    ppid: int,
    utime: int,
    stime: int,
    start: int,
    rss_pages: int,
    flags: int = USER_FLAGS,
) -> str:
    """A /proc/PID/stat line with all 52 fields, as Linux 5.x/6.x writes it."""
    fields = [
        "S", ppid, pid, pid, 0, -1, flags, 2270, 0, 0, 0,  # state .. cmajflt
        utime, stime, 0, 0, 20, 0, 4, 0, start,  # utime .. starttime
        1_213_816_832, rss_pages, 18446744073709551615,  # vsize, rss, rsslim
        94_000_000_000_000, 94_000_000_100_000, 140_730_000_000_000, 0, 0, 0, 0,
        16781312, 134235650, 0, 0, 0, 17, 3, 0, 0, 0, 0, 0,
        94_000_000_200_000, 94_000_000_210_000, 94_000_100_000_000,
        140_730_000_100_000, 140_730_000_100_100, 140_730_000_100_100, 140_730_000_200_000, 0,
    ]  # fmt: skip
    assert len(fields) == 50
    return f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + "\n"


class FakeProc:
    """A /proc tree. Its "cpu" line is `cpu_line` as given (a node caught at one
    moment), or by default counts from 0 as tick() moves the node's clock."""

    def __init__(
        self,
        root: Path,
        mem_total_kb: int = 64 * 1024 * 1024,
        cpus: int = 8,
        cpu_line: str | None = None,
    ) -> None:
        self.root = root
        self.cpu_ticks_total = 0
        self.cpus = cpus
        self.cpu_line = cpu_line
        root.mkdir(parents=True, exist_ok=True)
        (root / "meminfo").write_text(
            f"MemTotal:       {mem_total_kb} kB\nMemFree:        {mem_total_kb // 2} kB\n"
            f"MemAvailable:   {mem_total_kb // 2} kB\n"
        )
        (root / "self").mkdir(exist_ok=True)  # real /proc has non-numeric entries too
        self.write_stat()

    @classmethod
    def snapshot(cls, root: Path) -> FakeProc:
        """A real machine's cpu line and memory size, that no tick() moves."""
        return cls(root, DEFAULT_MEM_TOTAL_KB, cpus=1, cpu_line=DEFAULT_CPU_LINE)

    @property
    def path(self) -> str:
        return str(self.root)

    def write_stat(self, busy: int = 0) -> None:
        if self.cpu_line is not None:
            (self.root / "stat").write_text(
                f"{self.cpu_line}\ncpu0 1 0 1 1 0 0 0 0 0 0\nintr 12 0 0\nctxt 99\n"
                "btime 1764400000\n"
            )
            return
        idle = self.cpu_ticks_total - busy
        (self.root / "stat").write_text(
            f"cpu  {busy} 0 0 {max(idle, 0)} 0 0 0 0 0 0\n"
            + "".join(f"cpu{i} 0 0 0 0 0 0 0 0 0 0\n" for i in range(self.cpus))
            + "intr 0\nctxt 0\nbtime 1700000000\n"
        )

    def tick(self, ticks: int, busy: int = 0) -> None:
        """The node's clock moves: `ticks` CPU ticks elapse over all CPUs."""
        self.cpu_ticks_total += ticks
        self.write_stat(busy)

    def add(
        self,
        pid: int,
        ppid: int = 1,
        start: int = 1000,
        utime: int = 0,
        stime: int = 0,
        rss_pages: int = 0,
        comm: str = "python3",
        cgroup: str = "0::/user.slice/user-1000.slice/session-3.scope\n",
        cgroup_fixture: str | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        cpu_ticks: int = 0,
        rss_bytes: int = 0,
        kernel: bool = False,
    ) -> None:
        """A process (a kernel thread with kernel); its CPU time is utime + stime +
        cpu_ticks, its memory rss_pages pages plus rss_bytes."""
        d = self.root / str(pid)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        pages = rss_pages + rss_bytes // PAGE
        flags = KERNEL_FLAGS if kernel else USER_FLAGS
        line = stat_line(pid, comm, ppid, utime + cpu_ticks, stime, start, pages, flags)
        (d / "stat").write_text(line)
        if cgroup_fixture is not None:
            cgroup = (FIXTURES / "cgroup" / cgroup_fixture).read_text()
        (d / "cgroup").write_text(cgroup)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/root", **(environ or {})}
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))

    def set_cpu(
        self,
        pid: int,
        cpu_ticks: int,
        *,
        ppid: int = 1,
        start: int = 1000,
        rss_bytes: int = 0,
        comm: str = "python3",
    ) -> None:
        """The process's CPU time (and memory) now; its cgroup and environment stay."""
        line = stat_line(pid, comm, ppid, cpu_ticks, 0, start, rss_bytes // PAGE)
        (self.root / str(pid) / "stat").write_text(line)

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))
