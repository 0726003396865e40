"""Environment variables of a process, from /proc/PID/environ.

The file holds the environment the process was started (exec'd) with, NUL-separated.
Reading another user's needs ptrace read access (same uid, or CAP_SYS_PTRACE); an
unreadable environment is treated as an empty one, never as an error.
"""

from __future__ import annotations

from collections.abc import Iterable

# Large enough for any sane environment; a process with a bigger one is read in full.
_CHUNK = 65536


def read_environ(pid: int, procfs_root: str = "/proc") -> bytes:
    """Raw environ of pid; b"" if it cannot be read (gone, no permission, kernel thread)."""
    try:
        with open(f"{procfs_root}/{pid}/environ", "rb", buffering=0) as f:
            data = f.read(_CHUNK)
            if len(data) < _CHUNK:
                return data
            return data + f.read()
    except OSError:
        return b""


def first_value(environ: bytes, names: Iterable[str]) -> str | None:
    """Value of the first of names (in the given order) set to a non-empty value.

    Like getenv, the first definition of a repeated name counts.
    """
    if not environ:
        return None
    padded = b"\0" + environ
    for name in names:
        key = b"\0" + name.encode() + b"="
        start = padded.find(key)
        if start < 0:
            continue
        start += len(key)
        end = padded.find(b"\0", start)
        value = padded[start:] if end < 0 else padded[start:end]
        if value:
            return value.decode("utf-8", "replace")
    return None
