"""The HTTP server under abuse: many idle, partial and trickling clients, unknown paths,
oversized requests, a failing collector, and what all of that leaves behind (threads,
file descriptors)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import requests

from conftest import seconds_until_cut_off
from wattprint.core.model import DeviceReading, SourceResult
from wattprint.export import server as server_module
from wattprint.export.collector import SnapshotCollector
from wattprint.export.server import ExporterApp, ExporterServer
from wattprint.sampler.loop import Sampler, SamplerParts


class Steady:
    """A source drawing 100 W, so that the sampler has something to do."""

    name = "steady"

    def __init__(self) -> None:
        self.energy_uj = 0

    def read(self) -> SourceResult:
        self.energy_uj += 5_000_000
        return SourceResult([DeviceReading("cpu", "0", self.energy_uj, 100.0, "rapl")])

    def explain(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


@dataclass
class Exporter:
    server: ExporterServer
    sampler: Sampler

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.server.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


def start_exporter(render: Callable[[bool], bytes] | None = None) -> Exporter:
    sampler = Sampler(SamplerParts(sources=[Steady()], interval=0.05))
    render = render or SnapshotCollector(lambda: sampler.latest).render
    server = ExporterServer("127.0.0.1:0", ExporterApp(render, sampler.healthy))
    sampler.start()
    server.start()
    return Exporter(server, sampler)


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    running = start_exporter()
    yield running
    running.server.stop()
    running.sampler.stop()


def scrape(url: str) -> tuple[requests.Response, float]:
    started = time.monotonic()
    with requests.Session() as session:
        session.trust_env = False
        response = session.get(f"{url}/metrics", timeout=5)
    return response, time.monotonic() - started


def raw_request(address: tuple[str, int], data: bytes, timeout: float = 5.0) -> bytes:
    """Send bytes, return everything the server answers before it closes or goes quiet."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and b"Connection: close" not in chunks[0]:
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def settle(exporter: Exporter) -> None:
    """Wait until the server has let go of every connection."""
    deadline = time.monotonic() + 5
    while exporter.server._server.active_connections:
        assert time.monotonic() < deadline, "connections still open"
        time.sleep(0.01)


def test_200_idle_and_partial_clients_do_not_block_a_scrape(exporter: Exporter) -> None:
    clients = []
    try:
        for i in range(200):
            sock = socket.create_connection(exporter.address, timeout=5)
            if i % 2:  # half of them start a request and never finish it
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/")
            clients.append(sock)
        sampled = exporter.sampler.latest.time  # type: ignore[union-attr]
        response, took = scrape(exporter.url)
        assert response.status_code == 200
        assert "wattprint_cpu_energy_joules_total" in response.text
        assert took < 1.0
        time.sleep(0.2)
        # ... and the sampler went on meanwhile.
        assert exporter.sampler.latest.time > sampled  # type: ignore[union-attr]
        assert exporter.sampler.healthy()
    finally:
        for sock in clients:
            sock.close()


def test_a_trickling_client_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # A timeout per read alone would let a byte every 200 ms hold the connection forever.
    monkeypatch.setattr(server_module, "CLIENT_TIMEOUT_S", 1.0)
    running = start_exporter()
    try:
        closed_after = seconds_until_cut_off(
            running.address, b"GET /metrics HTTP/1.1\r\n" + b"X" * 100
        )
        assert closed_after is not None, "the trickling client was never cut off"
        assert 0.8 <= closed_after < 2.5
        # The server itself is fine.
        assert scrape(running.url)[0].status_code == 200
    finally:
        running.server.stop()
        running.sampler.stop()


def test_connections_beyond_the_limit_are_closed(
    exporter: Exporter, caplog: pytest.LogCaptureFixture
) -> None:
    budget = exporter.server._server.budget
    budget.max_connections, budget.scraper_share, budget.few_share = 20, 0, 0
    caplog.set_level(logging.WARNING)
    idle = [socket.create_connection(exporter.address, timeout=5) for _ in range(20)]
    try:
        deadline = time.monotonic() + 5
        while exporter.server._server.active_connections < 20:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(3):
            answer = raw_request(exporter.address, b"GET /metrics HTTP/1.1\r\n\r\n", timeout=2)
            assert answer == b""  # closed at once: no thread, no descriptor kept
        said = [r.getMessage() for r in caplog.records if "connections open" in r.getMessage()]
        assert len(said) == 1
    finally:
        for sock in idle:
            sock.close()
    settle(exporter)
    assert scrape(exporter.url)[0].status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/metrics/extra",
        "/metricsx",
        "/../../etc/passwd",
        "/healthz/",
        "/favicon.ico",
        "http://example.com/admin",
    ],
)
def test_unknown_paths_are_404(exporter: Exporter, path: str) -> None:
    answer = raw_request(exporter.address, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status_of(answer) == 404


REFUSED = {
    "request line over 8 KiB": (b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n", 414),
    "header over 8 KiB": (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n", 431),
    "100 headers": (
        b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(100)),
        431,
    ),
    "1 GB body": (b"GET /metrics HTTP/1.1\r\nContent-Length: 1000000000\r\n\r\n", 413),
    "negative length": (b"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    "two lengths": (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
    "POST": (b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi", 405),
    "garbage": (b"GARBAGE\r\n\r\n", 400),
    "HTTP/9.9": (b"GET /metrics HTTP/9.9\r\n\r\n", 505),
    "HTTP/0.9": (b"GET /metrics\r\n\r\n", 400),
    "header without a colon": (b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n", 400),
    "folded header": (b"GET /metrics HTTP/1.1\r\nX-A: b\r\n c\r\n\r\n", 400),
    "chunked body": (b"POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
    "5,000-digit length": (b"GET / HTTP/1.1\r\nContent-Length: " + b"1" * 5000 + b"\r\n\r\n", 413),
    "TRACE": (b"TRACE / HTTP/1.1\r\n\r\n", 501),
    "bare CR in a header": (b"GET /metrics HTTP/1.1\r\nX-A: b\rc\r\n\r\n", 400),
    "TLS to the HTTP port": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
}


@pytest.mark.parametrize(("request_bytes", "status"), REFUSED.values(), ids=REFUSED.keys())
def test_oversized_and_malformed_requests_are_refused(
    exporter: Exporter, request_bytes: bytes, status: int
) -> None:
    answer = raw_request(exporter.address, request_bytes)
    assert status_of(answer) == status
    assert b"Traceback" not in answer and b".py" not in answer


def test_keep_alive_pipelining_and_http_1_0(exporter: Exporter) -> None:
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"  # read, then 405
    with socket.create_connection(exporter.address, timeout=5) as sock:
        sock.sendall(health + body + health)
        answers = b""
        while answers.count(b"HTTP/1.1 ") < 3:
            chunk = sock.recv(65536)
            assert chunk, answers
            answers += chunk
        sock.sendall(health)  # still open
        assert status_of(sock.recv(65536)) == 200
    assert answers.count(b"HTTP/1.1 200 OK") == 2 and b"HTTP/1.1 405" in answers
    for request, stays_open in [
        (b"GET /healthz HTTP/1.0\r\n\r\n", False),
        (b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", True),
        (b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", False),
    ]:
        with socket.create_connection(exporter.address, timeout=1) as sock:
            sock.sendall(request)
            answer = sock.recv(65536)
            assert status_of(answer) == 200
            try:
                closed = sock.recv(65536) == b""
            except TimeoutError:
                closed = False
            assert closed is not stays_open, request


def test_format_gzip_and_head(exporter: Exporter) -> None:
    url = f"{exporter.url}/metrics"
    text = requests.get(url, timeout=5)
    assert text.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    om = requests.get(url, headers={"Accept": "application/openmetrics-text;q=0.5"}, timeout=5)
    assert om.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.text.endswith("# EOF\n") and not text.text.endswith("# EOF\n")
    assert om.headers["Content-Encoding"] == "gzip"  # requests asks for it
    head = requests.head(url, timeout=5, headers={"Accept-Encoding": "identity"})
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["Content-Length"]) > 1000 and "Content-Encoding" not in head.headers


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("gzip", True),
        ("gzip, deflate", True),
        ("deflate, GZIP;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("identity", False),
        ("gzipx", False),
        ("gzip;q=bad", False),
        # RFC 9110 12.5.3: a parameter besides q does not hide gzip's weight; `*` stands
        # for gzip when gzip is not listed, and gzip's own weight wins over it.
        ("gzip;q=0.5;x=1", True),
        ("gzip;x=1;q=0", False),
        ("*", True),
        ("identity;q=1, *;q=0.1", True),
        ("*;q=0", False),
        ("gzip;q=0, *", False),
        ("*;q=0, gzip;q=0.001", True),
        ("X-GZIP", True),
        ("gzip;q=2", False),
        ("gzip;q=1.5", False),
        ("gzip;q=nan", False),
        ("gzip;q=inf", False),
        ("", False),
        (" , ;, gzip ;q=1.000 ,", True),
    ],
)
def test_gzip_only_where_it_is_accepted(
    exporter: Exporter, accept_encoding: str, gzipped: bool
) -> None:
    request = f"GET /metrics HTTP/1.1\r\nAccept-Encoding: {accept_encoding}\r\n\r\n"
    answer = raw_request(exporter.address, request.encode())
    assert status_of(answer) == 200
    assert (b"Content-Encoding: gzip" in answer.split(b"\r\n\r\n")[0]) is gzipped


def test_a_failing_collector_gives_500_without_a_stack_trace() -> None:
    def broken(openmetrics: bool) -> bytes:
        raise RuntimeError("internal detail in /srv/wattprint/collector.py")

    running = start_exporter(broken)
    try:
        response, _ = scrape(running.url)
        assert response.status_code == 500
        assert response.text == "internal error\n"
        # /healthz tells about the sampler, which is fine.
        assert requests.get(f"{running.url}/healthz", timeout=5).status_code == 200
    finally:
        running.server.stop()
        running.sampler.stop()


def test_no_thread_or_descriptor_leak(exporter: Exporter) -> None:
    scrape(exporter.url)  # warm up whatever is created once
    settle(exporter)
    threads, fds = threading.active_count(), open_fds()
    for _ in range(200):
        assert scrape(exporter.url)[0].status_code == 200
    for i in range(100):
        with socket.create_connection(exporter.address, timeout=5) as sock:
            if i % 3 == 1:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost:")  # and hang up
            elif i % 3 == 2:
                sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
                sock.recv(1024)
    raw_request(exporter.address, b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n")
    deadline = time.monotonic() + 5
    while (threading.active_count(), open_fds()) != (threads, fds):
        assert time.monotonic() < deadline, (
            f"threads {threads} -> {threading.active_count()}, fds {fds} -> {open_fds()}"
        )
        time.sleep(0.05)
    assert exporter.server._server.active_connections == 0


def test_a_server_that_never_started_stops_at_once() -> None:
    server = ExporterServer("127.0.0.1:0", ExporterApp(lambda om: b"", lambda: True))
    stopper = threading.Thread(target=server.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=2)
    assert not stopper.is_alive(), "stop() hangs on a server that was never started"
