"""Which sampler a job meter reads: the node's exporter, found through the node lock."""

from __future__ import annotations

import os
from typing import Any

from wattprint.durability.nodelock import lock_holder, lock_path


def fallback_lock() -> str:
    """Where an unprivileged user's run and trackers meet when the node's lock directory
    is not writable for them (/var/lib/wattprint belongs to root)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/wattprint-{os.getuid()}"
    return lock_path(os.path.join(base, "wattprint", "state.json"))


def lock_candidates(state_file: str) -> list[str]:
    if not state_file:
        return []
    primary = lock_path(state_file)
    fallback = fallback_lock()
    return [primary] if primary == fallback else [primary, fallback]


def find_sampler(state_file: str) -> tuple[str, dict[str, Any]] | None:
    """(lock path, holder) of the sampler this node already has, if any."""
    for lock in lock_candidates(state_file):
        holder = lock_holder(lock)
        if holder is not None:
            return lock, holder
    return None
