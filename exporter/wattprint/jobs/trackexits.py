"""What a tracker does beside its rows: every tracker of this process that has not
stopped is stopped at exit (atexit, SIGTERM), so a rank that dies still writes its final
row; and its log lines reach stderr, and the `codecarbon` logger's handlers."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from wattprint.jobs.discovery import MeterError

log = logging.getLogger("wattprint.tracker")


class _AlsoCodecarbon(logging.Handler):
    """A tracker's records to the handlers a user gave the `codecarbon` logger too, so
    that logging set up for codecarbon still applies (not through its parents: a record
    reaches the root's handlers once)."""

    def emit(self, record: logging.LogRecord) -> None:
        theirs = logging.getLogger("codecarbon")
        if record.levelno >= theirs.getEffectiveLevel():
            for handler in theirs.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)


def say_by_default() -> None:
    """A tracker's lines reach stderr without any logging set up, as codecarbon's do."""
    if not any(isinstance(h, _AlsoCodecarbon) for h in log.handlers):
        log.addHandler(_AlsoCodecarbon())
    if not [h for h in log.handlers if not isinstance(h, _AlsoCodecarbon)]:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("wattprint: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)


def one_line(err: BaseException) -> str:
    """An error as one line: its message, or its kind where it has none."""
    text = " ".join(str(err).split())
    return (
        text
        if isinstance(err, (MeterError, OSError)) and text
        else (f"{type(err).__name__}: {text}" if text else type(err).__name__)
    )


class Exits:
    """Every tracker of this process that has not written its final row: at exit (atexit,
    SIGTERM) each is stopped, so a rank that dies still writes it."""

    def __init__(self) -> None:
        self.active: set[Any] = set()  # jobs/tracker.py's Tracker
        self.made = 0  # trackers this process made
        self._hooked = False
        self._previous: Any = signal.SIG_DFL

    def add(self, tracker: Any) -> None:
        self.active.add(tracker)
        if not self._hooked:
            self._hooked = True
            atexit.register(self.finish)
            if threading.current_thread() is threading.main_thread():
                self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def discard(self, tracker: Any) -> None:
        self.active.discard(tracker)

    def finish(self) -> None:
        for tracker in [t for t in list(self.active) if t._pid == os.getpid()]:
            for stop in tracker.at_exit or [tracker.stop]:
                stop()  # never raises

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.finish()
        previous = self._previous
        if callable(previous):
            previous(signum, frame)  # the launcher's or the framework's own handler
        elif previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)  # dies of SIGTERM, as it would have


EXITS = Exits()
