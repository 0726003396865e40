"""A cgroup filesystem in a temporary directory, in the kernel's file formats.

v2: one unified hierarchy (cgroup.controllers at its root). v1: a "cpu,cpuacct" and a
"memory" hierarchy, as systemd mounts them. Each job cgroup gets its CPU-time and
memory files from tests/fixtures/cgroupfs with the values a test sets.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "cgroupfs"


def _with(template: str, values: dict[str, int]) -> str:
    for name, value in values.items():
        template, n = re.subn(rf"^{name} \d+$", f"{name} {value}", template, flags=re.M)
        assert n == 1, name
    return template


class FakeCgroupFs:
    def __init__(self, root: Path, v1: bool = False) -> None:
        self.root = root
        self.v1 = v1
        if v1:
            (root / "cpu,cpuacct").mkdir(parents=True)
            (root / "memory").mkdir()
            (root / "cpuset").mkdir()
        else:
            root.mkdir(parents=True)
            controllers = "cpuset cpu io memory hugetlb pids rdma misc\n"
            (root / "cgroup.controllers").write_text(controllers)

    @property
    def path(self) -> str:
        return str(self.root)

    def _dirs(self, path: str) -> list[Path]:
        rel = path.strip("/")
        if self.v1:
            return [self.root / "cpu,cpuacct" / rel, self.root / "memory" / rel]
        return [self.root / rel]

    def set(
        self,
        path: str,
        cpu_usec: int,
        anon: int = 0,
        file_mapped: int = 0,
        page_cache: int = 0,
        charge: int | None = None,
    ) -> None:
        """The job cgroup at path (as /proc/PID/cgroup names it) now shows these;
        charge: its memory.current (v1 memory.usage_in_bytes), None: no such file."""
        for d in self._dirs(path):
            d.mkdir(parents=True, exist_ok=True)
        if charge is not None:
            name = "memory.usage_in_bytes" if self.v1 else "memory.current"
            (self._dirs(path)[-1] / name).write_text(f"{charge}\n")
        if self.v1:
            cpu, memory = self._dirs(path)
            (cpu / "cpuacct.usage").write_text(f"{cpu_usec * 1000 + 123}\n")
            (memory / "memory.stat").write_text(
                _with(
                    (FIXTURES / "v1-memory.stat").read_text(),
                    {
                        "total_rss": anon,
                        "total_mapped_file": file_mapped,
                        "total_cache": page_cache + file_mapped,
                    },
                )
            )
        else:
            (d,) = self._dirs(path)
            (d / "cpu.stat").write_text(
                _with((FIXTURES / "v2-cpu.stat").read_text(), {"usage_usec": cpu_usec})
            )
            (d / "memory.stat").write_text(
                _with(
                    (FIXTURES / "v2-memory.stat").read_text(),
                    {"anon": anon, "file_mapped": file_mapped, "file": page_cache + file_mapped},
                )
            )

    def remove(self, path: str) -> None:
        for d in self._dirs(path):
            shutil.rmtree(d)
