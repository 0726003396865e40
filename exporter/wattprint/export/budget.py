"""How many connections the HTTP server holds at once, in all and per client address."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("wattprint.export.server")

# Each connection holds a thread and a file descriptor; a flood of idle connections
# must not use up the descriptors the sampler needs to read /proc and sysfs.
MAX_CONNECTIONS = 512
# And once half of them are open, an address holding this many gets no more: 600
# connections trickling a byte every 3 s from one client took all 512 and most scrapes
# from Prometheus failed. So one address never holds more than half, and the others
# keep the rest. A scraper keeps one connection per target; 64 leaves room for several
# behind one address (NAT).
MAX_CONNECTIONS_PER_ADDRESS = 64


class ConnectionBudget:
    """Connections taken and given back, by client address; each refusal said once."""

    def __init__(self) -> None:
        self.max_connections = MAX_CONNECTIONS
        self.max_per_address = MAX_CONNECTIONS_PER_ADDRESS
        self.active = 0
        self._per_address: dict[str, int] = {}
        self._lock = threading.Lock()
        self._warned_full = False
        self._warned: set[str] = set()

    def take(self, host: str) -> bool:
        """Room for one more connection from `host` (taken), or False (warned once)."""
        with self._lock:
            full = self.active >= self.max_connections
            crowded = (
                self.active >= self.max_connections // 2
                and self._per_address.get(host, 0) >= self.max_per_address
            )
            if not full and not crowded:
                self.active += 1
                self._per_address[host] = self._per_address.get(host, 0) + 1
                return True
            first = not self._warned_full if full else host not in self._warned
            if full:
                self._warned_full = True
            elif len(self._warned) < 1024:  # (bounded: addresses can be many)
                self._warned.add(host)
        if first and full:
            log.warning(
                "%d connections open at once: closing new ones until some end",
                self.max_connections,
            )
        elif first:
            log.warning(
                "%s holds %d connections: closing its new ones until some end; other "
                "clients are still served",
                host,
                self.max_per_address,
            )
        return False

    def give_back(self, host: str) -> None:
        with self._lock:
            self.active -= 1
            left = self._per_address.get(host, 1) - 1
            if left > 0:
                self._per_address[host] = left
            else:
                self._per_address.pop(host, None)
