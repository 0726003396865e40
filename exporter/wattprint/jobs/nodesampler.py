"""The node's one sampler for trackers: found through the node lock, or started by the
one tracker that wins an election, never by a race of all of them.

The ranks of a job start their trackers at once. Each takes the election lock
(`<node lock>.start`, flock) in turn: the first finds no sampler and starts one
(`python -m wattprint.jobs.nodesampler`, the exporter's own code with its flags), holds
the election until the sampler names its address in the node lock or exits, and writes
the outcome into the election file; the others, when their turn comes, find the sampler
running, or read the error it died of and raise it at once. The sampler's stderr goes
to `<node lock>.start.log`; it exits once no tracker is left.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from wattprint.core.safeio import flock_within, printable
from wattprint.durability.nodelock import make_parent
from wattprint.host.identity.tracked import process_of, registry_dir
from wattprint.host.procfs import read_proc
from wattprint.jobs.discovery import NOFOLLOW, is_private, lock_candidates
from wattprint.jobs.meter import MeterError, Reading, reading_from_snapshot, sampler_url

if TYPE_CHECKING:  # imported where used: a tracker's import stays light
    from wattprint.app import Exporter
    from wattprint.config.options import Config
    from wattprint.durability.nodelock import NodeLock

SAMPLER_WAIT_S = 30.0
IDLE_EXIT_S = 5.0


def find_or_start(state_file: str, flags: Mapping[str, str]) -> tuple[str, str]:
    """(node lock, /metrics URL) of the node's sampler, started here if none runs.

    Found under the election lock, and the election file touched: the sampler, which
    exits once idle, takes the same lock and stays while the file is fresh, so a
    tracker never registers with a sampler that is going away (issue 45).
    Raises MeterError with the sampler's own error line where it cannot start."""
    if not state_file:
        raise MeterError(
            "a tracker needs a node lock to find the node's sampler: set --state.file "
            "(WATTPRINT_STATE_FILE) or exporter_url"
        )
    asked = time.time()
    try:
        path = _election_path(state_file)
    except MeterError:
        running = sampler_url(state_file)  # a site's exporter, beside a lock we cannot write
        if running is not None:
            return running
        raise
    fd = _open(path, os.O_RDWR, _mode(path))
    try:
        _lock(fd, path, SAMPLER_WAIT_S + 5)
        running = sampler_url(state_file)
        if running is not None:
            os.utime(fd)  # handed out: its sampler waits for our registration
            return running
        outcome = _read(fd)
        if outcome.get("error") and float(str(outcome.get("time", 0))) >= asked:
            # The one ahead of us started it meanwhile and it failed: its error, at once.
            raise MeterError(f"the node's sampler did not start: {outcome['error']}")
        return _start(state_file, flags, fd, path)
    finally:
        os.close(fd)  # drops the flock


def _mode(path: str) -> int:
    # In this user's own directory, this user's alone; else every user's trackers on the
    # node elect through it.
    return 0o600 if is_private(os.path.dirname(path)) else 0o666


def _election_path(state_file: str) -> str:
    """Beside the first node lock this user can write (as the sampler takes it)."""
    candidates = lock_candidates(state_file)
    for lock in candidates:
        try:
            make_parent(lock)
            if os.access(os.path.dirname(lock) or ".", os.W_OK):
                return lock + ".start"
        except OSError:
            continue
    raise MeterError(f"cannot write beside the node lock: {', '.join(candidates)}")


def _open(path: str, flags: int, mode: int, chmod: bool = True) -> int:
    """A regular file beside the lock, never through a link planted there, never waiting
    on a FIFO or a device (a FIFO opened to write would block until a reader came)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise MeterError(f"{path} is a symbolic link: not followed") from None
        if err.errno == errno.ENXIO:
            raise MeterError(f"{path} is a FIFO, not a regular file") from None
        raise MeterError(f"cannot open {path}: {err.strerror}") from None
    kind = os.fstat(fd).st_mode
    if not stat.S_ISREG(kind):
        os.close(fd)
        what = "a FIFO" if stat.S_ISFIFO(kind) else "not a regular file"
        raise MeterError(f"{path} is {what}: remove it") from None
    os.set_blocking(fd, True)
    if chmod:
        with contextlib.suppress(OSError):
            os.fchmod(fd, mode)  # not this user's file: left as its owner made it
    return fd


def _lock(fd: int, path: str, patience: float) -> None:
    if not flock_within(fd, patience):
        raise MeterError(f"{path}: another tracker held it {patience:.0f} s")


def _read(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, 8192, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(fd: int, outcome: dict[str, object]) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(outcome) + "\n").encode(), 0)


def _start(state_file: str, flags: Mapping[str, str], fd: int, path: str) -> tuple[str, str]:
    log_path = path + ".log"
    mode = 0o600 if is_private(os.path.dirname(path)) else 0o644
    fd_log = _open(log_path, os.O_WRONLY | os.O_TRUNC, mode)
    with os.fdopen(fd_log, "w", encoding="utf-8") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "wattprint.jobs.nodesampler", *_argv(flags)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # outlives this rank if it ends first
        )
    deadline = time.monotonic() + SAMPLER_WAIT_S
    while True:
        running = sampler_url(state_file)
        if running is not None:
            _write(fd, {"started": child.pid, "time": time.time()})
            # Reaped when it exits while this rank lives: no zombie.
            threading.Thread(target=child.wait, name="wattprint-reaper", daemon=True).start()
            return running
        status = child.poll()
        if status is not None:
            running = sampler_url(state_file)  # it lost to a `wattprint run` meanwhile
            if running is not None:
                return running
            error = _last_line(log_path).removeprefix("wattprint sampler: ")
            error = error or f"it exited with status {status}"
        elif time.monotonic() > deadline:
            child.kill()
            child.wait()
            error = f"it named no address within {SAMPLER_WAIT_S:.0f} s (its log: {log_path})"
        else:
            time.sleep(0.02)
            continue
        _write(fd, {"error": error, "time": time.time()})
        raise MeterError(f"the node's sampler did not start: {error}")


def _argv(flags: Mapping[str, str]) -> list[str]:
    return [f"--{k}={v}" for k, v in flags.items()]


def _last_line(path: str) -> str:
    """The last line of the sampler's log (its error), read as _open() opens it."""
    try:
        fd = _open(path, os.O_RDONLY, 0o600, chmod=False)
    except MeterError:
        return ""
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, 8192, max(0, size - 8192))
    except OSError:
        return ""
    finally:
        os.close(fd)
    lines = tail.decode("utf-8", "replace").strip().splitlines()
    return printable(lines[-1].strip()) if lines else ""


@dataclass
class LocalSampler:
    """Our own sampler, for a node without an exporter."""

    exporter: Exporter

    @property
    def lock(self) -> NodeLock | None:
        return self.exporter.lock

    @property
    def address(self) -> str:
        return self.exporter.address

    def read(self) -> Reading:
        # A fresh sample, so the job's interval ends where it ends, not up to one
        # sample interval earlier.
        return reading_from_snapshot(self.exporter.sampler.sample_once())

    def stop(self) -> None:
        self.exporter.stop()  # gives back the node lock last


def start_local_sampler(config: Config, listen_address: str) -> LocalSampler | str:
    """Take the node lock and start sampling; or, if another one took the lock
    meanwhile, the /metrics URL to read from instead."""
    from wattprint.app import LockPlan, build_exporter
    from wattprint.config.options import ConfigError
    from wattprint.durability.nodelock import NodeLockHeld

    # The exporter's own state file is no business of a job's: it keeps no state.
    own = replace(config, state_file="", listen_address=listen_address)
    try:
        exporter = build_exporter(own, lock=LockPlan.for_job(lock_candidates(config.state_file)))
    except NodeLockHeld as held:
        running = sampler_url(config.state_file)
        if running is not None:
            return running[1]
        raise MeterError(f"{held.path} is held by a sampler that names no address") from None
    except OSError as err:
        raise ConfigError(
            f"cannot listen on --web.listen-address={listen_address}: {err.strerror}"
        ) from None
    exporter.start()
    return LocalSampler(exporter)


def serve(argv: list[str]) -> int:
    """The node's sampler for trackers: exits once no tracker is registered."""
    import argparse
    import logging

    from wattprint.config.flags import exporter_flags, load
    from wattprint.config.options import ConfigError

    logging.basicConfig(level=logging.WARNING, format="wattprint sampler: %(message)s")
    parser = argparse.ArgumentParser(prog="wattprint sampler")
    exporter_flags(parser)
    args = parser.parse_args(argv)  # a bad flag: argparse's one line, status 2
    try:
        config = load(args)
        started = start_local_sampler(config, "127.0.0.1:0")
    except (ConfigError, MeterError) as err:
        print(f"wattprint sampler: {err}", file=sys.stderr)
        return 1
    if isinstance(started, str):
        return 0  # another sampler won the node lock meanwhile: trackers read that one
    if started.lock is None:
        started.stop()
        print(
            "wattprint sampler: cannot take the node lock; trackers would not find it",
            file=sys.stderr,
        )
        return 1
    directory = Path(registry_dir(started.lock.path))
    election = started.lock.path + ".start"
    idle_s = idle_exit_s()
    idle_since = time.monotonic()
    stopped: list[bool] = []

    def stop() -> None:
        if not stopped:
            stopped.append(True)
            started.stop()

    try:
        while True:
            time.sleep(min(0.5, idle_s / 2))
            if _tracked(directory):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > idle_s and _exit_if_idle(
                election, directory, idle_s, stop
            ):
                return 0
    finally:
        stop()


def idle_exit_s() -> float:
    """How long the sampler waits for a tracker once none is left (tests shorten it)."""
    try:
        return max(0.05, float(os.environ.get("WATTPRINT_SAMPLER_IDLE_EXIT_S", IDLE_EXIT_S)))
    except ValueError:
        return IDLE_EXIT_S


def _tracked(directory: Path) -> bool:
    return any(_alive(p.name) for p in directory.glob("*.json"))


def _exit_if_idle(election: str, directory: Path, idle_s: float, stop: Callable[[], None]) -> bool:
    """Stop, holding the election, where no tracker is registered and none was handed
    this sampler within idle_s; a tracker electing now waits, then finds none and
    starts another. False (not idle) otherwise."""
    try:
        fd = _open(election, os.O_RDWR, _mode(election), chmod=False)
    except MeterError:
        fd = -1  # no election file to hold (removed): trackers start another anyway
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a tracker is finding the sampler right now
            if time.time() - os.fstat(fd).st_mtime < idle_s:
                return False  # handed out lately: its registration is on its way
        if _tracked(directory):
            return False
        stop()  # the node lock given back while the election is held
        return True
    finally:
        if fd >= 0:
            os.close(fd)


def _alive(name: str) -> bool:
    process = process_of(name)
    if process is None:
        return False
    info = read_proc(process[0])
    return info is not None and info.start_ticks == process[1]


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(serve(sys.argv[1:]))
