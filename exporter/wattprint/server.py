"""The only module that speaks HTTP: /metrics, /healthz and a landing page.

A thread per connection (so a slow client never blocks a scrape), a deadline for each
request to arrive whole (so an idle or trickling one goes away), a bound on connections
at once, small limits on request size, and no stack trace ever reaches a client.
"""

from __future__ import annotations

import contextlib
import email.message
import gzip
import http.client
import io
import logging
import math
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import __version__
from .exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE
from .scrape import SCRAPER

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 8192
MAX_HEADERS = 64
MAX_BODY_BYTES = 4096
CLIENT_TIMEOUT_S = 10.0
# Each connection holds a thread and a file descriptor; a flood of idle connections
# must not use up the descriptors the sampler needs to read /proc and sysfs.
MAX_CONNECTIONS = 512
SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"
MAX_PRODUCT_CHARS = 64

LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>Wattprint exporter</title></head>
<body><h1>Wattprint exporter</h1>
<p>Energy and carbon per device and per job, version {version}.</p>
<ul><li><a href="metrics">metrics</a></li><li><a href="healthz">healthz</a></li></ul>
</body></html>
"""

Authorize = Callable[[str | None], bool]

# http.server reads headers through http.client, whose only knob is this module
# global; the default (100) is more than any scraper sends.
http.client._MAXHEADERS = MAX_HEADERS  # type: ignore[attr-defined]


class _DeadlineReader(io.RawIOBase):
    """Socket reads that must all be done by a deadline.

    A timeout per recv alone lets a client that sends a byte every few seconds hold its
    connection forever; this bounds the whole request instead.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = math.inf

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request not received in time")
        self._sock.settimeout(min(remaining, CLIENT_TIMEOUT_S))
        return self._sock.recv_into(buffer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stopping must not wait for idle clients to time out
    request_queue_size = 256

    def __init__(
        self,
        address: tuple[str, int],
        family: socket.AddressFamily,
        app: ExporterApp,
        tls: ssl.SSLContext | None,
    ) -> None:
        self.address_family = family
        self.app = app
        self.tls = tls
        self.max_connections = MAX_CONNECTIONS
        self._active = 0
        self._active_lock = threading.Lock()
        self._warned_full = False
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            # Listen on IPv4 too when bound to "::", as Go exporters do for ":port".
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        sock.settimeout(CLIENT_TIMEOUT_S)
        # Headers and body go out in two writes; with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms per keep-alive scrape).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            # The handshake happens in the connection's own thread (see _Handler.setup),
            # so a client that never completes it cannot stall the accept loop.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._active_lock:
            full = self._active >= self.max_connections
            if not full:
                self._active += 1
        if full:
            if not self._warned_full:
                self._warned_full = True
                log.warning(
                    "%d connections open at once: closing new ones until some end",
                    self.max_connections,
                )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._active_lock:
            self._active -= 1

    @property
    def active_connections(self) -> int:
        return self._active

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)


class ExporterApp:
    """What the handler needs: the exposition (render(openmetrics) -> body), the health
    check, and access control."""

    def __init__(
        self,
        render: Callable[[bool], bytes],
        healthy: Callable[[], bool],
        authorize: Authorize | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.render = render
        self.healthy = healthy
        self.authorize = authorize
        self.headers = dict(headers or {})  # --web.config.file http_server_config.headers


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    raw_requestline: bytes
    server_version = f"wattprint/{__version__}"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    # Until the request line is parsed, http.server assumes HTTP/0.9 and answers errors
    # (a bad or too long request line) with a bare body: no status line, no headers.
    default_request_version = "HTTP/1.0"

    def setup(self) -> None:
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        self.rfile.close()
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        # Also bounds how long a kept-alive connection may sit idle between requests.
        self._reader.deadline = time.monotonic() + CLIENT_TIMEOUT_S
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def parse_request(self) -> bool:
        if len(self.raw_requestline) > MAX_HEADER_BYTES:
            # What http.server sets before parsing, and needs for logging the answer.
            self.requestline, self.command = "", ""
            self.request_version = self.default_request_version
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
            return False
        if not super().parse_request():
            return False
        size = sum(len(k) + len(v) + 4 for k, v in self.headers.items())
        if size > MAX_HEADER_BYTES:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
            return False
        length = self.headers.get("Content-Length")
        if length is not None:
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
                return False
            if int(length):
                self.rfile.read(int(length))
        return True

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in {**self.server.app.headers, **(extra or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        try:
            self._route()
        except (ConnectionError, TimeoutError, ssl.SSLError):
            self.close_connection = True
        except Exception:  # never a stack trace to the client
            log.exception("error serving %s", self.path)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", "text/plain")

    def do_POST(self) -> None:
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED,
            b"method not allowed\n",
            "text/plain",
            {"Allow": "GET, HEAD"},
        )

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    def _route(self) -> None:
        path = self.path.split("?", 1)[0]
        app = self.server.app
        if path == "/healthz":
            if app.healthy():
                self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            else:
                self._send(
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    b"sampler stalled\n",
                    "text/plain; charset=utf-8",
                )
            return
        if path not in ("/", "/metrics"):
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
            return
        if app.authorize is not None and not app.authorize(self.headers.get("Authorization")):
            self._send(
                HTTPStatus.UNAUTHORIZED,
                b"unauthorized\n",
                "text/plain; charset=utf-8",
                {"WWW-Authenticate": 'Basic realm="wattprint"'},
            )
            return
        if path == "/":
            body = LANDING.format(version=__version__).encode()
            self._send(HTTPStatus.OK, body, "text/html; charset=utf-8")
            return
        openmetrics = accepts_openmetrics(self.headers.get("Accept", ""))
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        scraper = SCRAPER.set(scraper_identity(str(self.client_address[0]), self.headers))
        try:
            body = app.render(openmetrics)
        finally:
            SCRAPER.reset(scraper)
        extra = {}
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            extra["Content-Encoding"] = "gzip"
        self._send(HTTPStatus.OK, body, content_type, extra)


def accepts_openmetrics(accept: str) -> bool:
    """OpenMetrics 1.0.0 for a client that lists it (Prometheus does, first), with no
    version or a 1.x one, as prometheus_client decides; the text format otherwise."""
    for part in accept.split(","):
        media, *params = (token.strip() for token in part.split(";"))
        if media != "application/openmetrics-text":
            continue
        versions = [p[len("version=") :] for p in params if p.startswith("version=")]
        if not versions or versions[0].split(".")[0] == "1":
            return True
    return False


def scraper_identity(address: str, headers: email.message.Message) -> str | None:
    """Who is scraping, for the collector's first 0 of each new series; None for a
    client that is not a scraper.

    Prometheus and the scrapers built like it (vmagent, Grafana Agent, the OpenTelemetry
    Collector's Prometheus receiver) send X-Prometheus-Scrape-Timeout-Seconds with every
    scrape; a person's curl, a health probe or a browser does not, and must not take a
    0 that Prometheus needs. Scrapers are told apart by address and by the product in
    their User-Agent (not its version, which an upgrade changes), so that Prometheus
    and vmagent on one host each get theirs, and the two replicas of an HA pair too.
    """
    if SCRAPE_TIMEOUT_HEADER not in headers:
        return None
    product = headers.get("User-Agent", "").split("/", 1)[0].strip()
    return f"{address} {product[:MAX_PRODUCT_CHARS]}"


def parse_listen_address(address: str) -> tuple[str, int, socket.AddressFamily]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host:
        return "::", int(port), socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return host, int(port), family


class ExporterServer:
    def __init__(self, address: str, app: ExporterApp, tls: ssl.SSLContext | None = None) -> None:
        host, port, family = parse_listen_address(address)
        try:
            self._server = _Server((host, port), family, app, tls)
        except OSError:
            if family != socket.AF_INET6 or host != "::":
                raise
            self._server = _Server(("0.0.0.0", port), socket.AF_INET, app, tls)
        self._thread: threading.Thread | None = None
        self._serving = False

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._serving = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="wattprint-http", daemon=True
        )
        self._thread.start()

    def serve_forever(self) -> None:
        self._serving = True
        self._server.serve_forever()

    def stop(self) -> None:
        # shutdown() waits for serve_forever() to return: forever, if it never ran
        # (an exporter stopped because something after building it failed).
        if self._serving:
            self._server.shutdown()
        self._server.server_close()
