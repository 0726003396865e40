"""One exporter per node: the lock file beside the state file, and who holds it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from dataclasses import dataclass
from typing import Any


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

    @classmethod
    def acquire(cls, path: str, listen_address: str) -> NodeLock:
        make_parent(path)
        # Never through a symlink: the lock is truncated and written, and a link planted
        # in the state directory would have it overwrite another file.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _describe(_read_json_fd(fd))
            os.close(fd)
            raise NodeLockHeld(
                f"another wattprint exporter holds {path} ({who}); one exporter per "
                "node counts each device once: stop the other one, or give this one "
                "another --state.file",
                path,
            ) from None
        except OSError:
            os.close(fd)
            raise
        lock = cls(path, fd)
        lock.announce(listen_address)
        return lock

    def announce(self, listen_address: str) -> None:
        """Name this process and where it listens in the lock, for the one turned away
        and for the job meters that read from it."""
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
    """Who holds the node lock at `path`, or None when nobody does."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_json_fd(fd) or {}
        return None
    finally:
        os.close(fd)


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
