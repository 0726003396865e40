"""One background daemon thread per service (carbon intensity, the pod list): started
once, stopped with an event its loop waits on."""

from __future__ import annotations

import threading
from typing import Generic, TypeVar


class DaemonLoop:
    """start() and stop() for a class whose `_run` loops until `_stop` is set."""

    thread_name = "wattprint"
    stop_timeout_s = 1.0
    _stop: threading.Event
    _thread: threading.Thread | None

    def _run(self) -> None:
        raise NotImplementedError

    def _startable(self) -> bool:
        return True

    def _interrupt(self) -> None:
        """Cut short whatever the loop waits on besides _stop."""

    def start(self) -> None:
        if not self._startable() or (self._thread is not None and self._thread.is_alive()):
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the thread; one still busy after the timeout is abandoned (a daemon)."""
        self._stop.set()
        self._interrupt()
        if self._thread is not None:
            self._thread.join(self.stop_timeout_s if timeout_s is None else timeout_s)
            self._thread = None


A = TypeVar("A")


class Poller(DaemonLoop, Generic[A]):
    """A DaemonLoop asking a slow device (a BMC) every `_poll` s on its own thread, so
    that no sample waits on it: its latest answer, or why the last ask failed."""

    def __init__(self, poll_s: float) -> None:
        self._poll = poll_s
        self._lock = threading.Lock()
        self._answer: A | None = None
        self.failure = "no answer yet"
        self._polled = threading.Event()  # the first ask is over, answered or not
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> tuple[A | None, str]:
        """The latest answer and why the last ask failed ("" if it did not)."""
        with self._lock:
            return self._answer, self.failure

    def poll_once(self) -> A:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                answer = self.poll_once()
            except (OSError, ValueError) as err:
                why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
                with self._lock:
                    self.failure = why
            else:
                with self._lock:
                    self._answer, self.failure = answer, ""
            self._polled.set()
            self._stop.wait(self._poll)
