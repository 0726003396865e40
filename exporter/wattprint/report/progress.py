"""The progress line on a terminal while the queries run."""

from __future__ import annotations

import threading
import time
from typing import TextIO

from wattprint.report.common import PROGRESS_AFTER_S

# -- progress --------------------------------------------------------------------------


class Progress:
    """One self-rewriting line on a terminal once the queries take over a second.

    Nothing on a pipe or in a log: there a progress line is noise, and an error must
    stay the only line on stderr.
    """

    def __init__(self, stream: TextIO, enabled: bool, after: float = PROGRESS_AFTER_S) -> None:
        self._stream = stream
        self._enabled = enabled
        self._after = after
        self._what = "asking Prometheus"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False
        self._started = 0.0

    def say(self, what: str) -> None:
        self._what = what

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self._enabled:
            self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()

    def _run(self) -> None:
        if self._stop.wait(self._after):
            return
        while not self._stop.is_set():
            elapsed = time.monotonic() - self._started
            self._stream.write(f"\r\x1b[Kwattprint: {self._what} ({elapsed:.0f} s)")
            self._stream.flush()
            self._shown = True
            self._stop.wait(0.25)
