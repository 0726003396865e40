"""The state file that lets a restarted exporter continue its counters, and the node
lock beside it that keeps a second exporter off the node.

Files only: what the state means, and whether it is safe to resume from, is the
sampler's business (sampler/restarts.py). A state file that cannot be read, parsed or written
never stops the exporter: the caller gets one line saying why and starts fresh.
"""

from __future__ import annotations

import json
import os
from typing import Any

from wattprint.durability.nodelock import make_parent

STATE_FORMAT = "wattprint-state/v1"


class StateError(Exception):
    """The state file cannot be used; str() is one line naming the file and why."""

    def __init__(self, reason: str, message: str) -> None:
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
            make_parent(self.path)
            fd = os.open(self._tmp, flags, 0o644)
        try:
            os.write(fd, body)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self._tmp, self.path)
