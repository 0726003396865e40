"""Which sampler a job meter reads: the node's exporter, found through the node lock."""

from __future__ import annotations

import os
import stat
from typing import Any

from wattprint.durability.nodelock import lock_holder, lock_path, make_parent

# Never through a symlink: a link planted beside the lock would have a tracker write
# (or truncate) the file it points to.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class MeterError(Exception):
    """The counters cannot be read; str() is one line."""


def fallback_lock() -> str:
    """Where an unprivileged user's run and trackers meet when the node's lock directory
    is not writable for them (/var/lib/wattprint belongs to root): a directory of this
    user's alone, made 0700 where missing and refused where another user could write."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = private_dir(runtime) if runtime else private_dir(f"/tmp/wattprint-{os.getuid()}")
    return lock_path(os.path.join(private_dir(os.path.join(base, "wattprint")), "state.json"))


def private_dir(path: str) -> str:
    """`path`, made 0700 where missing; MeterError where it is no directory of this user's
    alone (another user made it, could write in it, or it is a link)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise MeterError(f"cannot make {path}: {err.strerror}") from None
    info = os.lstat(path)
    why = ""
    if stat.S_ISLNK(info.st_mode):
        why = "a symlink"
    elif not stat.S_ISDIR(info.st_mode):
        why = "not a directory"
    elif info.st_uid != os.getuid():
        why = f"owned by uid {info.st_uid}"
    elif info.st_mode & 0o022:
        why = f"mode {stat.S_IMODE(info.st_mode):04o}"
    if why:
        raise MeterError(
            f"{path} is not a directory of this user's alone ({why}): another user could "
            "plant files in it; remove it, or set XDG_RUNTIME_DIR or --state.file"
        )
    return path


def is_private(directory: str) -> bool:
    """Whether only this user can write in `directory` (its files can be 0600)."""
    try:
        info = os.lstat(directory)
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def lock_candidates(state_file: str) -> list[str]:
    """The node lock, then this user's fallback; a fallback that is not this user's
    alone is left out where the node lock's directory can be written, else the error."""
    if not state_file:
        return []
    primary = lock_path(state_file)
    try:
        fallback = fallback_lock()
    except MeterError:
        if _writable_parent(primary):
            return [primary]
        raise
    return [primary] if primary == fallback else [primary, fallback]


def _writable_parent(path: str) -> bool:
    try:
        make_parent(path)
    except OSError:
        return False
    return os.access(os.path.dirname(path) or ".", os.W_OK)


def find_sampler(state_file: str) -> tuple[str, dict[str, Any]] | None:
    """(lock path, holder) of the sampler this node already has, if any."""
    for lock in lock_candidates(state_file):
        holder = lock_holder(lock)
        if holder is not None:
            return lock, holder
    return None
