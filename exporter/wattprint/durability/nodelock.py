"""One exporter per node: the lock file beside the state file, and who holds it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import stat
from dataclasses import dataclass
from typing import Any

# The logger cli and jobs log under (app.py's): the lock's warnings keep source=wattprint.
log = logging.getLogger("wattprint")
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class NodeLockHeld(Exception):
    """Another exporter holds the node lock at `path`; str() is one line naming it."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def lock_path(state_file: str) -> str:
    return state_file + ".lock"


@dataclass
class NodeLock:
    """An exclusive flock on `<state file>.lock`, held for the exporter's life.

    flock works on the file, not the path, so it also holds between a DaemonSet pod
    and a systemd unit on the same node when both see /var/lib/wattprint (hostPath,
    StateDirectory=). The file names the holder for the one that is turned away.
    """

    path: str
    fd: int
    _address: str = ""  # the listen address announced, announced again when retaken

    @classmethod
    def acquire(cls, path: str, listen_address: str) -> NodeLock:
        make_parent(path)
        fd = _open_lock(path)
        try:
            _flock(fd, path)
        except OSError:
            os.close(fd)
            raise
        lock = cls(path, fd)
        lock.announce(listen_address)
        return lock

    def check(self) -> str | None:
        """None while this process holds the lock at its path; a lock file removed or
        replaced under it (an rm, a tmp cleaner) is taken back at once, else a second
        exporter could start on the same state file. Where another process took the new
        file first: one line saying so, and this one must stop writing the state."""
        if self.fd < 0:
            return f"node lock {self.path} released: the state is no longer this process's"
        try:
            here = os.stat(self.path, follow_symlinks=False)
            held = os.fstat(self.fd)
            if (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino):
                return None
        except FileNotFoundError:
            pass
        except OSError:
            return None  # cannot tell: the flock we hold still turns away what it can
        try:
            make_parent(self.path)
            fd = _open_lock(self.path)
        except OSError as err:
            log.warning("node lock %s was removed and cannot be made again: %s", self.path, err)
            return None
        try:
            _flock(fd, self.path)
        except NodeLockHeld as held_by:
            os.close(fd)
            return f"the node lock was removed under this exporter and retaken: {held_by}"
        except OSError:
            os.close(fd)
            return None
        old, self.fd = self.fd, fd
        os.close(old)
        self.announce(self._address)
        log.warning("node lock %s was removed or replaced: taken back", self.path)
        return None

    def announce(self, listen_address: str) -> None:
        """Name this process and where it listens in the lock, for the one turned away
        and for the job meters that read from it."""
        self._address = listen_address
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "listen_address": listen_address,
        }
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, (json.dumps(holder) + "\n").encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def lock_holder(path: str) -> dict[str, Any] | None:
    """Who holds the node lock at `path`, or None when nobody does (or it is not a lock
    file: a FIFO planted there must not hang a job's meter)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_json_fd(fd) or {}
        except OSError:
            return None
        return None
    finally:
        os.close(fd)


def _open_lock(path: str) -> int:
    """The lock file, made if missing; never through a symlink (the lock is truncated and
    written: a link planted in the state directory would have it overwrite another file),
    never blocking on a FIFO, nothing but a regular file."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | NOFOLLOW, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def _flock(fd: int, path: str) -> None:
    """Take the lock on `fd`; NodeLockHeld naming the holder where another has it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = _describe(_read_json_fd(fd))
        raise NodeLockHeld(
            f"another wattprint exporter holds {path} ({who}); one exporter per "
            "node counts each device once: stop the other one, or give this one "
            "another --state.file",
            path,
        ) from None


def _read_json_fd(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
        f"listening on {holder.get('listen_address', '?')}"
    )


def make_parent(path: str) -> None:
    # os, not pathlib: this module is loaded for the node lock before the exporter
    # listens, and pathlib's imports are a noticeable part of that.
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
