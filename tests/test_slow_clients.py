"""Slow clients against the real HTTP server (issue 33): 600 connections from one address,
each trickling a byte every 3 s and reopened when closed, must not starve scrapes from
another address (before: 57 of 62 scrapes failed over 60 s). Nor must 600 from 20
addresses (issue 39: before, 52 of 61 scrapes from a fresh address failed)."""

from __future__ import annotations

import resource
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from test_http_abuse import Exporter, start_exporter

ATTACKER, SCRAPER = "127.0.0.1", "127.0.0.2"
SLOW_CONNECTIONS = 600
BYTE_EVERY_S = 3.0
ATTACK_S = 15.0
SCRAPE_TIMEOUT_S = 2.0
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # never finished


@pytest.fixture(name="exporter")
def exporter_fixture() -> Iterator[Exporter]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard or (hard == resource.RLIM_INFINITY and soft < 4096):
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    running = start_exporter()
    yield running
    running.server.stop()
    running.sampler.stop()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Trickle:
    """The slow clients: each sends a byte every BYTE_EVERY_S, and reconnects when closed."""

    def __init__(self, address: tuple[str, int], sources: tuple[str, ...] = (ATTACKER,)) -> None:
        self.address = address
        self.sources = sources
        self.stop = threading.Event()
        self.reconnects = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, i: int) -> socket.socket:
        """A new slow connection (an unconnected socket where the connect failed: its
        next byte fails and it is tried again)."""
        source = self.sources[i % len(self.sources)]
        try:
            sock = socket.create_connection(self.address, timeout=1, source_address=(source, 0))
            sock.sendall(REQUEST[:1])
        except OSError:
            return socket.socket()
        return sock

    def _run(self) -> None:
        socks = [self._open(i) for i in range(SLOW_CONNECTIONS)]
        sent = [1] * SLOW_CONNECTIONS
        start = time.monotonic()
        try:
            while not self.stop.is_set():
                for i in range(SLOW_CONNECTIONS):  # staggered over the 3 s
                    due = start + BYTE_EVERY_S * (sent[i] + i / SLOW_CONNECTIONS)
                    if time.monotonic() < due:
                        continue
                    sent[i] += 1
                    try:
                        socks[i].sendall(
                            REQUEST[sent[i] % len(REQUEST) : sent[i] % len(REQUEST) + 1]
                        )
                    except OSError:  # closed by the server: back at once, as the attacker was
                        socks[i].close()
                        self.reconnects += 1
                        socks[i] = self._open(i)
                self.stop.wait(0.05)
        finally:
            for sock in socks:
                sock.close()


def scrape_from(address: tuple[str, int], source: str, header: bytes = b"") -> int:
    """One scrape from `source`; its status, or 0 if it failed or took too long."""
    try:
        with socket.create_connection(
            address, timeout=SCRAPE_TIMEOUT_S, source_address=(source, 0)
        ) as sock:
            sock.sendall(
                b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + header + b"Connection: close\r\n\r\n"
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError:
        return 0
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def test_slow_clients_from_one_address_do_not_starve_scrapes_from_another(
    exporter: Exporter,
) -> None:
    address = (ATTACKER, exporter.server.port)
    trickle = Trickle(address)
    trickle.thread.start()
    held = 0
    results = []
    try:
        deadline = time.monotonic() + ATTACK_S
        while time.monotonic() < deadline:
            started = time.monotonic()
            results.append(scrape_from(address, SCRAPER))
            held = max(held, exporter.server._server.active_connections)
            time.sleep(max(0.25 - (time.monotonic() - started), 0))
    finally:
        trickle.stop.set()
        trickle.thread.join(timeout=30)
    assert held >= 64  # the attack was on: the slow clients held what they were let
    assert trickle.reconnects > 0  # and were closed and came back
    assert len(results) >= 30
    failed = [r for r in results if r != 200]
    assert not failed, f"{len(failed)} of {len(results)} scrapes failed"


MANY = tuple(f"127.0.0.{n}" for n in range(10, 30))  # 20 addresses, 30 connections each
PROMETHEUS = b"X-Prometheus-Scrape-Timeout-Seconds: 10\r\nUser-Agent: Prometheus/2.42.0\r\n"


@pytest.mark.parametrize("known", [False, True], ids=["fresh-address", "known-scraper"])
def test_slow_clients_from_many_addresses_do_not_starve_a_scraper(
    exporter: Exporter, known: bool
) -> None:
    """Each address under its own limit, 600 connections in all: a share is kept for
    addresses seen scraping, and one for addresses holding few connections."""
    address = (ATTACKER, exporter.server.port)
    if known:  # Prometheus scraped before the attack began
        assert scrape_from(address, SCRAPER, PROMETHEUS) == 200
    trickle = Trickle(address, MANY)
    trickle.thread.start()
    held = 0
    results = []
    try:
        deadline = time.monotonic() + ATTACK_S
        while time.monotonic() < deadline:
            started = time.monotonic()
            results.append(scrape_from(address, SCRAPER, PROMETHEUS))
            held = max(held, exporter.server._server.active_connections)
            time.sleep(max(0.25 - (time.monotonic() - started), 0))
    finally:
        trickle.stop.set()
        trickle.thread.join(timeout=30)
    assert held >= 400  # the attack was on: the slow clients held what they were let
    assert len(results) >= 30
    failed = [r for r in results if r != 200]
    assert not failed, f"{len(failed)} of {len(results)} scrapes failed"
