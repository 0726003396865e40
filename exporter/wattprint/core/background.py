"""One background daemon thread per service (carbon intensity, the pod list): started
once, stopped with an event its loop waits on."""

from __future__ import annotations

import threading


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
