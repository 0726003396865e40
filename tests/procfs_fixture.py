"""Builds small /proc trees in a temporary directory, in the kernel's own formats."""

from __future__ import annotations

import os
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


class FakeProc:
    def __init__(self, root: Path, mem_total_kb: int = 64 * 1024 * 1024, cpus: int = 8) -> None:
        self.root = root
        self.cpu_ticks_total = 0
        self.cpus = cpus
        root.mkdir(parents=True, exist_ok=True)
        (root / "meminfo").write_text(
            f"MemTotal:       {mem_total_kb} kB\nMemFree:        {mem_total_kb // 2} kB\n"
        )
        self.write_stat()

    def write_stat(self, busy: int = 0) -> None:
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
        *,
        ppid: int = 1,
        start: int = 100,
        cpu_ticks: int = 0,
        rss_bytes: int = 0,
        environ: dict[str, str] | None = None,
        cgroup: str = "0::/user.slice\n",
        comm: str = "python3",
    ) -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        self.set_cpu(pid, cpu_ticks, ppid=ppid, start=start, rss_bytes=rss_bytes, comm=comm)
        env = environ or {}
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        (d / "cgroup").write_text(cgroup)

    def set_cpu(
        self,
        pid: int,
        cpu_ticks: int,
        *,
        ppid: int = 1,
        start: int = 100,
        rss_bytes: int = 0,
        comm: str = "python3",
    ) -> None:
        fields = (
            ["S", str(ppid)]
            + ["0"] * 9
            + [
                str(cpu_ticks),
                "0",
                "0",
                "0",
                "20",
                "0",
                "1",
                "0",
                str(start),
                "0",
                str(rss_bytes // PAGE),
            ]
        )
        fields += ["0"] * 20
        (self.root / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")

    def remove(self, pid: int) -> None:
        d = self.root / str(pid)
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
