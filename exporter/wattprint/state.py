"""The state file that lets a restarted exporter continue its counters, and the node
lock beside it that keeps a second exporter off the node.

Files only: what the state means, and whether it is safe to resume from, is the
sampler's business (resume.py). A state file that cannot be read, parsed or written
never stops the exporter: the caller gets one line saying why and starts fresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from dataclasses import dataclass
from typing import Any

STATE_FORMAT = "wattprint-state/v1"


class StateError(Exception):
    """The state file cannot be used; str() is one line naming the file and why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # label value for wattprint_state_errors_total


class NodeLockHeld(Exception):
    """Another exporter holds the node lock; str() is one line naming it."""


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
        _make_parent(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _describe(_read_json_fd(fd))
            os.close(fd)
            raise NodeLockHeld(
                f"another wattprint exporter holds {path} ({who}); one exporter per "
                "node counts each device once: stop the other one, or give this one "
                "another --state.file"
            ) from None
        except OSError:
            os.close(fd)
            raise
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "listen_address": listen_address,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        return cls(path, fd)

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
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise StateError(
                "unreadable", f"cannot read state file {self.path}: {err.strerror}"
            ) from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise StateError("corrupt", f"state file {self.path} is not valid JSON") from None
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise StateError("foreign", f"state file {self.path} is not a {STATE_FORMAT} document")
        return data

    def save(self, data: dict[str, Any] | bytes, sync: bool = False) -> None:
        """Write the state (a document, or its JSON text); raises OSError (the caller
        counts it and goes on)."""
        body = data if isinstance(data, bytes) else json.dumps(data, separators=(",", ":")).encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        try:
            fd = os.open(self._tmp, flags, 0o644)
        except FileNotFoundError:
            _make_parent(self.path)
            fd = os.open(self._tmp, flags, 0o644)
        try:
            os.write(fd, body)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self._tmp, self.path)


def _make_parent(path: str) -> None:
    # os, not pathlib: this module is loaded for the node lock before the exporter
    # listens, and pathlib's imports are a noticeable part of that.
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
