"""Small kernel files read cheaply, and the ones kept open between samples."""

from __future__ import annotations

import os


def read_small(path: str, size: int = 4096) -> bytes:
    """A small kernel file in one read (/proc/PID/stat, a cgroup's cpu.stat)."""
    # os.open/os.read skip the io object that open() builds: measurably cheaper when
    # repeated for every process every second.
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


# -- files kept open ---------------------------------------------------------------------


def fs_type(path: str) -> str:
    """The type of the filesystem mounted where `path` lies ("proc", "cgroup2", ...),
    from /proc/self/mountinfo; "" if unknown."""
    try:
        real = os.path.realpath(path)
        with open("/proc/self/mountinfo", "rb") as f:
            mounts = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    best, kind = "", ""
    for line in mounts:
        left, _, right = line.partition(" - ")
        parts = left.split(" ")
        if len(parts) < 5 or not right:
            continue
        point = parts[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, right.split(" ", 1)[0]
    return kind


class HeldFiles:
    """Kernel files kept open to be read again with pread at offset 0, within a share
    of the open-file limit that leaves the HTTP server its connections."""

    def __init__(self) -> None:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        # Each held /proc file pins its kernel buffer (~4.5 KB, charged to the exporter's
        # memory cgroup): 8,192 is ~37 MB at most, whatever the limit allows.
        self.budget = min(max(soft - 1024, soft // 4), 8192)
        self.held = 0

    def open(self, path: str) -> int | None:
        """An open file, or None when the budget is spent (read it the plain way)."""
        if self.held >= self.budget:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.held += 1
        return fd

    def close(self, fd: int) -> None:
        self.held -= 1
        os.close(fd)


_held: HeldFiles | None = None


def held_files() -> HeldFiles:
    global _held
    if _held is None:
        _held = HeldFiles()
    return _held
