"""Which processes a tracker stands for.

A tracker (one per rank, `wattprint.track()`) registers its process in a directory
beside the node lock (jobs/discovery.py finds the node's one sampler through that
lock); the sampler then books the energy of that process and its descendants under the
job's workload with the tracker's id in the `pod` label, so each rank's series are its
own share and the ranks add up to the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wattprint.core.model import Workload
from wattprint.host.identity.cgroup import JobCgroup
from wattprint.host.procfs import ProcTable, read_proc

ENV_SCHEDULER = "env"
_MAX_DEPTH = 64
_REFRESH_S = 0.1


def registry_dir(lock: str) -> str:
    return f"{lock}.trackers"


@dataclass(frozen=True)
class Registration:
    """A tracker's process as announced to the sampler, with the workload it books under."""

    pid: int
    start_ticks: int
    workload: str
    tracker: str
    uid: int = -1  # its file's owner, as the sampler read it


def register(directory: str, registration: Registration, previous: str | None = None) -> str:
    """Announce a tracker's process to the sampler; returns the file to remove later
    (`previous`, this process's file, is replaced)."""
    path = Path(trackers_dir(directory))
    _remove_gone(path)
    name = previous or str(path / f"{registration.pid}-{registration.start_ticks}.json")
    # A new file of a name nobody could plant (O_EXCL, never through a link), renamed
    # over the registration: another user's file or link there is never written.
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(name)}.", suffix=".tmp", dir=path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o644)  # the sampler may be another user (root)
            data = {"workload": registration.workload, "tracker": registration.tracker}
            handle.write(json.dumps(data))
        try:
            os.replace(tmp, name)
        except OSError:
            if previous is not None:
                raise
            # Another user's file of that name (the sticky directory keeps it theirs):
            # a name of this process's own beside it, which no one could guess. The
            # sampler honours only the file whose owner runs the process.
            name = str(
                path / f"{registration.pid}-{registration.start_ticks}.{secrets.token_hex(8)}.json"
            )
            os.replace(tmp, name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return name


def trackers_dir(directory: str) -> str:
    """The shared trackers' directory, made where missing; one line of OSError where it
    is a link or no directory (never followed: another user may have put it there)."""
    try:
        os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
        os.mkdir(directory)
        # Shared by every user's ranks on the node, like /tmp; a file only counts for a
        # process of the same user (TrackedResolver checks).
        os.chmod(directory, 0o1777)
    except FileExistsError:
        pass
    except OSError as err:
        raise OSError(f"cannot make the trackers' directory {directory}: {err.strerror}") from None
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode):
        raise OSError(f"{directory} is a symbolic link, not the trackers' directory: not followed")
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{directory} is not a directory: it cannot hold the trackers' files")
    return directory


def process_of(name: str) -> tuple[int, int] | None:
    """(pid, start ticks) a registration's file name stands for: <pid>-<ticks>.json, or
    <pid>-<ticks>.<token>.json where another user's file held the first name."""
    if not name.endswith(".json") or name.startswith("."):
        return None
    try:
        pid, ticks = (int(x) for x in name.split(".", 1)[0].split("-", 1))
    except ValueError:
        return None
    return pid, ticks


def _remove_gone(directory: Path) -> None:
    """Remove this user's registrations (and temporary files) of processes that no longer
    run (a rank SIGKILLed before its tracker stopped): they would pile up."""
    for entry in os.scandir(directory):
        name = entry.name.lstrip(".").split(".", 1)[0]
        try:
            pid, ticks = (int(x) for x in name.split("-", 1))
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except (OSError, ValueError):
            continue
        info = read_proc(pid)
        if info is None or info.start_ticks != ticks:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


class Registrations:
    """The process's one registration file per sampler, shared by its trackers: it names
    the newest active one; when that one stops, the one before it again; it is removed
    when the last one stops (the sampler runs while it is there)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], list[tuple[object, Registration]]] = {}
        self._files: dict[tuple[str, int], str] = {}
        self._lock = threading.RLock()  # SIGTERM's handler may unregister mid-add

    def add(self, directory: str, tracker: object, registration: Registration) -> None:
        with self._lock:
            key = (directory, os.getpid())
            self._files[key] = register(directory, registration, self._files.get(key))
            self._held.setdefault(key, []).append((tracker, registration))

    def directories(self) -> list[str]:
        """The trackers' directories this process is registered in."""
        with self._lock:
            return [directory for directory, pid in self._held if pid == os.getpid()]

    def remove(self, directory: str, tracker: object) -> None:
        with self._lock:
            key = (directory, os.getpid())
            held = self._held.get(key, [])
            named = bool(held) and held[-1][0] is tracker  # the file names it
            held[:] = [entry for entry in held if entry[0] is not tracker]
            path = self._files.get(key)
            if held and named and path is not None:
                register(directory, held[-1][1], path)  # the process is its tracker's again
            elif not held:
                if path is not None:
                    Path(path).unlink(missing_ok=True)
                self._held.pop(key, None)
                self._files.pop(key, None)


REGISTRATIONS = Registrations()


def _read_own_file(path: str) -> tuple[str, int]:
    """A registration's text and owner: a regular file, never through a link or a FIFO
    another user planted in the shared directory (OSError for those)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path}: not a regular file")
        return os.read(fd, 65536).decode("utf-8", "replace"), info.st_uid
    finally:
        os.close(fd)


class TrackedResolver:
    """Wraps the identity resolver: a tracked process and its descendants get the
    tracker's id as `pod` (and, if nothing else claims them, its workload)."""

    def __init__(self, inner: Any, directory: str, procfs_root: str = "/proc") -> None:
        self.inner = inner
        self.directory = directory
        self.procfs_root = procfs_root
        self._listing: tuple[int, frozenset[tuple[str, int]]] | None = None
        self._checked = 0.0
        self._tracked: dict[tuple[int, int], Registration] = {}

    # Spelled out, not forwarded by __getattr__: the sampler probes these with
    # runtime-checkable Protocols, which look attributes up statically from 3.12 on.
    @property
    def errors_total(self) -> int:
        return int(getattr(self.inner, "errors_total", 0))

    def resolve_job(self, job: JobCgroup) -> Workload | None:
        resolve_job = getattr(self.inner, "resolve_job", None)
        return resolve_job(job) if resolve_job is not None else None

    def forget_missing(self, alive: Iterable[tuple[int, int]]) -> None:
        forget = getattr(self.inner, "forget_missing", None)
        if forget is not None:
            forget(alive)

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < _REFRESH_S:
            return
        self._checked = now
        # The names and inodes, not the directory's mtime alone: a registration renamed
        # in within the clock tick of the last read leaves the mtime as it was.
        try:
            mtime = os.stat(self.directory).st_mtime_ns
            entries = list(os.scandir(self.directory))
        except OSError:
            self._tracked, self._listing = {}, None
            return
        listing = (mtime, frozenset((e.name, e.inode()) for e in entries))
        if listing == self._listing:
            return
        self._listing = listing
        tracked: dict[tuple[int, int], Registration] = {}
        for entry in entries:
            process = process_of(entry.name)
            if process is None:
                continue
            pid, ticks = process
            try:
                text, owner = _read_own_file(entry.path)
                # Only the process's own user may speak for it.
                if os.stat(f"{self.procfs_root}/{pid}").st_uid != owner:
                    continue
                data = json.loads(text)
                tracked[(pid, ticks)] = Registration(
                    pid, ticks, str(data["workload"]), str(data["tracker"]), owner
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
        self._tracked = tracked

    def registrants(self, workload: Workload) -> frozenset[int]:
        """The users whose trackers or `wattprint run` registered this workload (none:
        not registered): it asked to be measured, so the workload cap admits it, within
        each user's share (attribution/cardinality.py)."""
        self._refresh()
        tracker = workload.pod.rsplit("/", 1)[-1]
        return frozenset(
            r.uid
            for r in self._tracked.values()
            if r.workload == workload.workload or (r.tracker and r.tracker == tracker)
        )

    def _tracker_of(
        self, pid: int, start_ticks: int, table: ProcTable | None
    ) -> Registration | None:
        key = (pid, start_ticks)
        for _ in range(_MAX_DEPTH):
            found = self._tracked.get(key)
            if found is not None:
                return found
            info = table.procs.get(key[0]) if table is not None else None
            if info is None:
                info = read_proc(key[0], self.procfs_root)
            if info is None or info.ppid <= 0:
                return None
            parent = table.procs.get(info.ppid) if table is not None else None
            if parent is None:
                parent = read_proc(info.ppid, self.procfs_root)
            if parent is None or parent.start_ticks > info.start_ticks:
                return None
            key = (parent.pid, parent.start_ticks)
        return None

    def resolve(
        self, pid: int, start_ticks: int, table: ProcTable | None = None
    ) -> Workload | None:
        workload = self.inner.resolve(pid, start_ticks, table)
        self._refresh()
        if not self._tracked:
            return workload
        tracker = self._tracker_of(pid, start_ticks, table)
        if tracker is None:
            return workload
        if not tracker.tracker:  # `wattprint run` keeping the sampler: it books nothing
            return workload
        if workload is None:
            return Workload(ENV_SCHEDULER, tracker.workload, pod=tracker.tracker)
        pod = f"{workload.pod}/{tracker.tracker}" if workload.pod else tracker.tracker
        return workload._replace(pod=pod)
