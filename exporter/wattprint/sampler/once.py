"""Warnings logged once, until their message changes: a fault that lasts is said once."""

from __future__ import annotations

import logging

log = logging.getLogger("wattprint.sampler")


class LogOnce:
    """One warning per key while its message stays the same."""

    def __init__(self, said: dict[str, str]) -> None:
        self._said = said  # key -> the message last logged

    def __contains__(self, key: str) -> bool:
        return key in self._said

    def warn(self, key: str, message: str) -> None:
        if self._said.get(key) != message:
            log.warning("%s", message)
            self._said[key] = message

    def clear(self, key: str) -> None:
        """The fault is over: say it again if it comes back."""
        self._said.pop(key, None)
