"""The state file that lets a restarted exporter continue its counters, and the node
lock beside it that keeps a second exporter off the node.

Files only: what the state means, and whether it is safe to resume from, is the
sampler's business (sampler/restarts.py). A state file that cannot be read, parsed or written
never stops the exporter: the caller gets one line saying why and starts fresh.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from typing import Any, Literal, get_args

from wattprint.durability.nodelock import NOFOLLOW, make_parent

STATE_FORMAT = "wattprint-state/v1"

# A node's state is tens of kilobytes (hundreds of series, thousands of processes); the
# parsed document takes about three times the file's size in memory, and the chart's
# limit is 256 MiB. A larger file is not ours to trust: refused unread.
MAX_STATE_BYTES = 16 * 1024 * 1024

# No symlink is followed (NOFOLLOW): whoever can write the state directory must not make
# the exporter write through a link to another file.


# The reason label of wattprint_state_errors_total, every value the exporter counts
# (docs/metrics.md lists them, tests/test_exposition.py holds the two together): the file's
# own here, and the sampler's (sampler/restarts.py: a save that failed, a gap unknown).
StateErrorReason = Literal["corrupt", "foreign", "gap_unknown", "too_large", "unreadable", "write"]
STATE_ERROR_REASONS: tuple[StateErrorReason, ...] = get_args(StateErrorReason)


class StateError(Exception):
    """The state file cannot be used; str() is one line naming the file and why."""

    def __init__(self, reason: StateErrorReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # label value for wattprint_state_errors_total


def read_boot_id(procfs_root: str) -> str:
    """The kernel's id of this boot ("" if unreadable): raw counters are only
    comparable within one boot."""
    try:
        with open(f"{procfs_root}/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class StateFile:
    """One JSON document, replaced atomically (write beside it, then rename)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._tmp = f"{path}.tmp"

    def load(self) -> dict[str, Any] | None:
        """The saved state; None if there is none; StateError if it is unusable."""
        try:
            # Non-blocking: a FIFO planted as the state file must not hang the start.
            fd = os.open(self.path, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise StateError(
                "unreadable", f"cannot read state file {self.path}: {err.strerror}"
            ) from None
        try:
            with os.fdopen(fd, "rb") as handle:
                info = os.fstat(handle.fileno())
                size = info.st_size
                if not stat.S_ISREG(info.st_mode):
                    raise StateError("unreadable", f"state file {self.path} is not a file")
                if size > MAX_STATE_BYTES:
                    raise StateError(
                        "too_large",
                        f"state file {self.path} is {size} bytes, over the "
                        f"{MAX_STATE_BYTES} a state file can be",
                    )
                raw = handle.read(MAX_STATE_BYTES + 1)
        except OSError as err:
            raise StateError(
                "unreadable", f"cannot read state file {self.path}: {err.strerror}"
            ) from None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            # (RecursionError: nested deeper than the parser goes.)
            raise StateError("corrupt", f"state file {self.path} is not valid JSON") from None
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise StateError("foreign", f"state file {self.path} is not a {STATE_FORMAT} document")
        return data

    def save(self, data: dict[str, Any] | bytes, sync: bool = False) -> None:
        """Write the state (a document, or its JSON text); raises OSError or StateError
        (the caller counts it and goes on)."""
        body = data if isinstance(data, bytes) else json.dumps(data, separators=(",", ":")).encode()
        if len(body) > MAX_STATE_BYTES:
            # It would be refused at the restart: say so now, and keep the last one.
            raise StateError(
                "too_large",
                f"the state is over the {MAX_STATE_BYTES} bytes a state file can be: "
                "not saved (fewer --workload.max-series?)",
            )
        # A new file, never an existing one: a link planted as the tmp file is removed,
        # not written through.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)
        try:
            fd = os.open(self._tmp, flags, 0o644)
        except FileNotFoundError:
            make_parent(self.path)
            fd = os.open(self._tmp, flags, 0o644)
        try:
            try:
                _write_all(fd, body)
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            # A short write (a nearly full disk) leaves a truncated tmp file: the old
            # state stays, whole.
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            raise
        os.replace(self._tmp, self.path)
        if sync:
            _sync_directory(self.path)


def _write_all(fd: int, body: bytes) -> None:
    """All of `body`, or OSError: os.write may write less than asked (a disk with less
    room than the file), and the next write then says why."""
    view = memoryview(body)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _sync_directory(path: str) -> None:
    """The rename on disk too, for a power cut."""
    with contextlib.suppress(OSError):
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
