"""A call that must be done within a deadline, however the peer it waits on trickles."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def within(seconds: float, call: Callable[[], T], on_expiry: Callable[[], Any] | None = None) -> T:
    """call()'s result, or TimeoutError after `seconds`: the call runs in a daemon thread,
    left behind (after `on_expiry()`, to cut its socket) and never keeping the process up.
    A socket's own timeout bounds each read, not the whole: a byte every few seconds
    would hold a caller for as long as the peer likes."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # handed to the caller's thread
            outcome["error"] = err

    worker = threading.Thread(target=work, name="deadline", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        if on_expiry is not None:
            on_expiry()
        raise TimeoutError(f"not done within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value
