"""A fixture /proc tree in a temporary directory, in the kernel's file formats."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"

# /proc/stat "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice
DEFAULT_CPU_LINE = "cpu  4705 356 584 3699176 2300 0 131 7 900 10"
DEFAULT_MEM_TOTAL_KB = 16_303_428


def stat_line(
    pid: int, comm: str, ppid: int, utime: int, stime: int, start: int, rss_pages: int
) -> str:
    """A /proc/PID/stat line with all 52 fields, as Linux 5.x/6.x writes it."""
    fields = [
        "S", ppid, pid, pid, 0, -1, 4194560, 2270, 0, 0, 0,  # state .. cmajflt
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
    def __init__(
        self,
        root: Path,
        cpu_line: str = DEFAULT_CPU_LINE,
        mem_total_kb: int = DEFAULT_MEM_TOTAL_KB,
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "stat").write_text(
            f"{cpu_line}\ncpu0 1 0 1 1 0 0 0 0 0 0\nintr 12 0 0\nctxt 99\nbtime 1764400000\n"
        )
        (root / "meminfo").write_text(
            f"MemTotal:       {mem_total_kb} kB\nMemFree:         1201136 kB\n"
            "MemAvailable:    9120440 kB\n"
        )
        (root / "self").mkdir(exist_ok=True)  # real /proc has non-numeric entries too

    @property
    def path(self) -> str:
        return str(self.root)

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
    ) -> None:
        d = self.root / str(pid)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        (d / "stat").write_text(stat_line(pid, comm, ppid, utime, stime, start, rss_pages))
        if cgroup_fixture is not None:
            cgroup = (FIXTURES / "cgroup" / cgroup_fixture).read_text()
        (d / "cgroup").write_text(cgroup)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/root", **(environ or {})}
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))
