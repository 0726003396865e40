"""The only module that speaks HTTP: /metrics, /healthz and a landing page.

A thread per connection (so a slow client never blocks a scrape), a deadline for each
request to arrive whole (so an idle or trickling one goes away), a bound on connections
at once, small limits on request size, and no stack trace ever reaches a client.

HTTP/1.1 is parsed here, not by http.server: it pulls in http.client, email, html,
mimetypes and urllib (~60 ms on a small node, most of the time to the first scrape).
Accepted on purpose is little: GET and HEAD, headers, at most a small Content-Length
body; anything else gets a clear 4xx/5xx, and a closed connection.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from wattprint._version import __version__
from wattprint.export.budget import ConnectionBudget
from wattprint.export.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    accepts_gzip,
    accepts_openmetrics,
)
from wattprint.export.scraper import LIVE, SCRAPER, scraper_identity

if TYPE_CHECKING:  # ssl is imported (by webconfig.py) only when TLS is configured
    import ssl

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 8192
MAX_HEADERS = 64
MAX_BODY_BYTES = 4096
CLIENT_TIMEOUT_S = 10.0
# After refusing a request, how long (and how much) to read what the client still sends
# before closing: closing with unread bytes makes the kernel send a reset, which can
# destroy the error answer before the client reads it.
LINGER_S = 1.0
LINGER_BYTES = 65536

LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>Wattprint exporter</title></head>
<body><h1>Wattprint exporter</h1>
<p>Energy and carbon per device and per job, version {version}.</p>
<ul><li><a href="metrics">metrics</a></li><li><a href="healthz">healthz</a></li></ul>
</body></html>
"""

TEXT = "text/plain; charset=utf-8"
SERVER = f"wattprint/{__version__}"

Authorize = Callable[[str | None], bool]

# fmt: off
_REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
    413: "Content Too Large", 414: "URI Too Long", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
# fmt: on
# Methods that exist but are not served: 405 with Allow; any other is 501, as before.
_NOT_ALLOWED = {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# "HTTP/" DIGIT "." DIGIT (RFC 9112 2.3), spelled out: str.isdigit also takes "²".
_VERSIONS = frozenset(f"HTTP/{major}.{minor}" for major in range(10) for minor in range(10))
# RFC 9110's IMF-fixdate, spelled out: strftime's names follow the locale.
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class Headers(Mapping[str, str]):
    """Request headers, looked up case-insensitively; repeated fields are joined by
    ", " (RFC 9110 5.3)."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}

    def add(self, name: str, value: str) -> None:
        key = name.lower()
        self._fields[key] = f"{self._fields[key]}, {value}" if key in self._fields else value

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


class _Refused(Exception):
    """A request answered with an error, after which the connection is closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Gone(Exception):
    """The client closed the connection, or it went quiet between requests."""


class ExporterApp:
    """What the HTTP layer needs: the exposition, the health check, access control."""

    def __init__(
        self,
        render: Callable[[bool], bytes],
        healthy: Callable[[], bool],
        authorize: Authorize | None = None,
        headers: Mapping[str, str] | None = None,
        note: Callable[[], str] | None = None,
        fresh: Callable[[], bool] | None = None,
    ) -> None:
        self.render = render  # render(openmetrics) -> the exposition body
        self.healthy = healthy
        self.note = note  # a line /healthz adds to its "ok" ("" for none)
        # /metrics?fresh: a sample begun after the request first (a tracker's flush/stop)
        self.fresh = fresh
        self.authorize = authorize
        self.headers = dict(headers or {})  # --web.config.file http_server_config.headers


class _Request:
    def __init__(self, method: str, target: str, version: tuple[int, int]) -> None:
        self.method, self.target, self.version = method, target, version
        self.headers = Headers()


class _Connection:
    """One client: requests read one after another, each by its own deadline."""

    def __init__(
        self,
        sock: socket.socket,
        address: Any,
        app: ExporterApp,
        budget: ConnectionBudget | None = None,
    ) -> None:
        self.sock, self.address, self.app = sock, address, app
        self.budget = budget  # told who scrapes: they keep a share of connections
        self.buffer = bytearray()  # read and not yet parsed; pipelined requests wait here
        self.deadline = 0.0
        self.received = False  # any byte of the current request seen

    def serve(self) -> None:
        while True:
            # Also bounds how long a kept-alive connection may sit idle between requests.
            self.deadline = time.monotonic() + CLIENT_TIMEOUT_S
            self.received = bool(self.buffer)
            try:
                request = self._read_request()
            except _Gone:
                return
            except _Refused as refused:
                log.debug("%s refused: %d %s", self.address[0], refused.status, refused)
                self._answer(refused.status, f"{refused}\n".encode(), TEXT, close=True)
                self._linger()
                return
            if not self._respond(request):
                return

    # -- reading ---------------------------------------------------------------------

    def _fill(self) -> None:
        """Read more of the request, or raise when the client is gone or out of time.

        A timeout per recv alone would let a client that sends a byte every few seconds
        hold its connection forever; the deadline bounds the whole request instead."""
        remaining = self.deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
        except TimeoutError:
            if self.received:
                raise _Refused(408, "request not received in time") from None
            raise _Gone from None
        if not chunk:
            raise _Gone
        self.received = True
        self.buffer += chunk

    def _line(self, limit: int, status: int, what: str) -> str:
        """The next line without its CRLF (a bare LF is accepted), at most limit bytes."""
        start = 0
        while (end := self.buffer.find(b"\n", start)) < 0:
            if len(self.buffer) > limit:
                raise _Refused(status, f"{what} longer than {limit} bytes")
            start = len(self.buffer)
            self._fill()
        if end + 1 > limit:
            raise _Refused(status, f"{what} longer than {limit} bytes")
        line = bytes(self.buffer[:end]).removesuffix(b"\r")
        del self.buffer[: end + 1]
        if b"\r" in line:
            # A bare CR: some proxies end a line there, so two parsers would disagree
            # on where a request ends (RFC 9112 2.2 allows refusing it).
            raise _Refused(400, f"bare CR in {what}")
        return line.decode("latin-1")

    def _read_request(self) -> _Request:
        while not self.buffer:
            self._fill()
        if chr(self.buffer[0]) not in _TOKEN and self.buffer[0] not in b"\r\n":
            # Say so now rather than wait for a newline that may never come.
            raise _Refused(400, "not an HTTP request (TLS to a plain HTTP port?)")
        line = ""
        while not line:  # RFC 9112 2.2: empty lines before a request line are ignored
            line = self._line(MAX_HEADER_BYTES, 414, "request line")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN or not parts[1]:
            raise _Refused(400, "bad request line")
        method, target, protocol = parts
        if protocol not in _VERSIONS:
            raise _Refused(400, "bad HTTP version")
        if protocol[5] != "1":
            raise _Refused(505, "only HTTP/1.0 and HTTP/1.1 are served")
        request = _Request(method, target, (1, int(protocol[7])))
        budget = MAX_HEADER_BYTES  # for all header lines together, CRLFs included
        while field := self._line(budget + 2, 431, "headers"):  # + the closing CRLF
            budget -= len(field) + 2
            if len(request.headers) >= MAX_HEADERS:
                raise _Refused(431, f"more than {MAX_HEADERS} headers")
            name, colon, value = field.partition(":")
            # No space before the colon, no obsolete line folding (RFC 9112 5.1, 5.2).
            if not colon or not name or not set(name) <= _TOKEN:
                raise _Refused(400, "bad header line")
            request.headers.add(name, value.strip(" \t"))
        self._discard_body(request.headers)
        return request

    def _discard_body(self, headers: Headers) -> None:
        """Read and drop a small body, so the next request on the connection starts
        where it should. Chunked bodies are refused: with a scrape endpoint nobody
        needs them, and guessing where one ends is how requests get smuggled."""
        if "Transfer-Encoding" in headers:
            raise _Refused(411, "Transfer-Encoding not accepted: send Content-Length")
        length = headers.get("Content-Length")
        if length is None:
            return
        # isascii: str.isdigit takes "²"; len: int() refuses 4,300 digits and more.
        if not (length.isascii() and length.isdigit()):
            raise _Refused(400, f"bad Content-Length {length[:32]!r}")
        if len(length) >= 16 or int(length) > MAX_BODY_BYTES:
            raise _Refused(413, f"body must be at most {MAX_BODY_BYTES} bytes")
        if int(length) and headers.get("Expect", "").lower() == "100-continue":
            self.sock.settimeout(CLIENT_TIMEOUT_S)
            self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        while len(self.buffer) < int(length):
            self._fill()
        del self.buffer[: int(length)]

    def _linger(self) -> None:
        """Close after an error without a reset: stop sending, read (and drop) what the
        client still sends, for a moment."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(LINGER_S)
            ends = time.monotonic() + LINGER_S
            drained = 0
            while drained < LINGER_BYTES and time.monotonic() < ends:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass

    # -- answering -------------------------------------------------------------------

    def _respond(self, request: _Request) -> bool:
        """Answer one request; True if the connection stays open for the next."""
        tokens = {t.strip().lower() for t in request.headers.get("Connection", "").split(",")}
        # HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 the other way round.
        old = request.version < (1, 1)
        keep = "keep-alive" in tokens if old else "close" not in tokens
        alive = {"Connection": "keep-alive"} if keep and old else {}
        method = request.method
        if method not in ("GET", "HEAD"):
            if method not in _NOT_ALLOWED:
                self._answer(501, b"method not implemented\n", TEXT, close=True)
                return False
            allow = {"Allow": "GET, HEAD", **alive}
            self._answer(405, b"method not allowed\n", TEXT, allow, close=not keep)
            return keep
        try:
            status, body, content_type, extra = self._route(request)
        except Exception:  # never a stack trace to the client
            log.exception("error serving %s", request.target[:200])
            self._answer(500, b"internal error\n", TEXT, close=True)
            return False
        self._answer(status, body, content_type, {**extra, **alive}, not keep, method == "HEAD")
        log.debug('%s "%s %s" %d', self.address[0], method, request.target[:200], status)
        return keep

    def _route(self, request: _Request) -> tuple[int, bytes, str, dict[str, str]]:
        app, headers = self.app, request.headers
        path = request.target.split("?", 1)[0]
        if path == "/healthz":
            if app.healthy():
                note = app.note() if app.note is not None else ""
                return 200, f"ok{'; ' if note else ''}{note}\n".encode(), TEXT, {}
            return 503, b"sampler stalled\n", TEXT, {}
        if path not in ("/", "/metrics"):
            return 404, b"not found\n", TEXT, {}
        if app.authorize is not None and not app.authorize(headers.get("Authorization")):
            return 401, b"unauthorized\n", TEXT, {"WWW-Authenticate": 'Basic realm="wattprint"'}
        if path == "/":
            return 200, LANDING.format(version=__version__).encode(), "text/html; charset=utf-8", {}
        openmetrics = accepts_openmetrics(headers.get("Accept", ""))
        # A HEAD gets no body, so it must not take a new series' first 0 from its scraper.
        who = None if request.method == "HEAD" else scraper_identity(str(self.address[0]), headers)
        extra = {}
        query = request.target.partition("?")[2]
        # A job meter's reading (no scraper: those are served the saved counters) is of
        # the latest sample, saved or not, so that its readings never go back. Any client
        # may ask, from a pod as from the host: the sampler's rate cap bounds the cost.
        meter = who is None and "fresh" in query.split("&")
        fresh = meter and app.fresh is not None and app.fresh()
        if fresh:
            extra["X-Wattprint-Fresh"] = "1"  # an older exporter says nothing: not fresh
        if who is not None and self.budget is not None:
            self.budget.scraped(str(self.address[0]))
        scraper, live = SCRAPER.set(who), LIVE.set(meter)
        try:
            body = app.render(openmetrics)
        finally:
            SCRAPER.reset(scraper)
            LIVE.reset(live)
        if accepts_gzip(headers.get("Accept-Encoding", "")):
            # wbits 31: a gzip member; level 1 as before, a scrape is CPU-bound not I/O-bound.
            packer = zlib.compressobj(1, zlib.DEFLATED, 31)
            body = packer.compress(body) + packer.flush()
            extra["Content-Encoding"] = "gzip"
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        return 200, body, content_type, extra

    def _answer(
        self,
        status: int,
        body: bytes,
        content_type: str,
        extra: Mapping[str, str] | None = None,
        close: bool = False,
        head_only: bool = False,
    ) -> None:
        now = time.gmtime()
        date = time.strftime(f"{_DAYS[now.tm_wday]}, %d {_MONTHS[now.tm_mon - 1]} %Y %T GMT", now)
        head = f"HTTP/1.1 {status} {_REASONS[status]}\r\nServer: {SERVER}\r\nDate: {date}\r\n"
        head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in {**self.app.headers, **(extra or {})}.items())
        head += "Connection: close\r\n\r\n" if close else "\r\n"
        # One write: headers and body in one segment (TCP_NODELAY is on as well).
        self.sock.settimeout(CLIENT_TIMEOUT_S)  # sendall's limit for the whole answer
        self.sock.sendall(head.encode("latin-1") + (b"" if head_only else body))


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False  # stopping must not wait for idle clients to time out
    request_queue_size = 256
    allow_reuse_address = True  # a restarted exporter rebinds while old sockets linger

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
        self.budget = ConnectionBudget()
        super().__init__(address, socketserver.BaseRequestHandler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            # Listen on IPv4 too when bound to "::", as Go exporters do for ":port".
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        # Until the connection's own thread sets a deadline, this bounds the handshake:
        # CPython applies a socket's timeout to the whole handshake, not to each read.
        sock.settimeout(CLIENT_TIMEOUT_S)
        # With Nagle on, a small answer can wait for the client's delayed ACK (~40 ms).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            # The handshake happens in the connection's own thread (finish_request), so
            # a client that never completes it cannot stall the accept loop.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def process_request(self, request: Any, client_address: Any) -> None:
        host = str(client_address[0])
        if not self.budget.take(host):
            self.shutdown_request(request)  # at once: no thread, no descriptor kept
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.budget.give_back(host)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.budget.give_back(str(client_address[0]))

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            if self.tls is not None:
                cast("ssl.SSLSocket", request).do_handshake()
            _Connection(request, client_address, self.app, self.budget).serve()
        except OSError:  # reset, timed out, TLS failure (ssl.SSLError is an OSError)
            log.debug("connection from %s failed", client_address, exc_info=True)

    @property
    def active_connections(self) -> int:
        return self.budget.active

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)


def parse_listen_address(address: str) -> tuple[str, int, socket.AddressFamily]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host:
        return "::", int(port), socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return host, int(port), family


class ExporterServer:
    """The listening socket and the thread that serves an ExporterApp on it."""

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
