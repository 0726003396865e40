"""How many connections the HTTP server holds at once, in all and per client address,
and the share kept for scrapers."""

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
# Many addresses under that limit each (20 holding 30: 600 connections from one
# machine) still filled all 512, and 52 of 61 scrapes from a fresh address failed. So
# the last connections are kept: SCRAPER_SHARE for the addresses seen scraping (the
# first MAX_KNOWN_SCRAPERS that sent a scrape with Prometheus's header, never
# forgotten: a flood of new addresses cannot push Prometheus out), and FEW_SHARE below
# it for addresses holding fewer than FEW connections (a fresh scraper holds one).
SCRAPER_SHARE = 32
FEW_SHARE = 64
FEW = 4
MAX_KNOWN_SCRAPERS = 16


class ConnectionBudget:
    """Connections taken and given back, by client address; each refusal said once."""

    def __init__(self) -> None:
        self.max_connections = MAX_CONNECTIONS
        self.max_per_address = MAX_CONNECTIONS_PER_ADDRESS
        self.scraper_share = SCRAPER_SHARE
        self.few_share = FEW_SHARE
        self.active = 0
        self._per_address: dict[str, int] = {}
        self._scrapers: set[str] = set()
        self._lock = threading.Lock()
        self._warned_full = False
        self._warned: set[str] = set()

    def scraped(self, host: str) -> None:
        """`host` sent a scrape: one of the first few, it keeps a share of connections."""
        if host not in self._scrapers and len(self._scrapers) < MAX_KNOWN_SCRAPERS:
            with self._lock:
                if len(self._scrapers) < MAX_KNOWN_SCRAPERS:
                    self._scrapers.add(host)

    def _room(self, host: str) -> bool:
        held = self._per_address.get(host, 0)
        if self.active >= self.max_connections // 2 and held >= self.max_per_address:
            return False
        if host in self._scrapers:
            return self.active < self.max_connections
        kept = self.scraper_share + (self.few_share if held >= FEW else 0)
        return self.active < self.max_connections - kept

    def take(self, host: str) -> bool:
        """Room for one more connection from `host` (taken), or False (warned once)."""
        with self._lock:
            if self._room(host):
                self.active += 1
                self._per_address[host] = self._per_address.get(host, 0) + 1
                return True
            full = self._per_address.get(host, 0) < self.max_per_address
            first = not self._warned_full if full else host not in self._warned
            if full:
                self._warned_full = True
            elif len(self._warned) < 1024:  # (bounded: addresses can be many)
                self._warned.add(host)
        if first and full:
            log.warning(
                "%d connections open at once: closing new ones, but for scrapers and "
                "addresses holding fewer than %d, until some end",
                self.active,
                FEW,
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
