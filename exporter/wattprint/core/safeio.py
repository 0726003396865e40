"""Files and answers that others wrote, read and written so that none of them can hang,
flood or redirect a tool running beside a user's job (tracker, `run`, `report`, the
Slurm epilog): no link followed, no FIFO or device waited on, every read bounded in
size and in time, every number checked before it is added.

Every refusal is one line naming the file, URL or field, raised as `Refused` (an
OSError, so the callers' existing `except OSError` already keeps the job running) or
`BadDocument` (a ValueError) for content.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import json
import math
import os
import socket
import ssl
import stat
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from wattprint.core.deadline import within

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# Deeper than any document these tools write (a job file is 4 levels deep).
MAX_DEPTH = 64
# Digits in a JSON integer: a counter in micro-joules has under 20.
MAX_INT_DIGITS = 40


class Refused(OSError):
    """A file or an answer not read or written, and why, in one line."""


class BadDocument(ValueError):
    """A document or a field whose content cannot be trusted, in one line."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open(path: str, flags: int, mode: int = 0o644) -> int:
    """An fd of a regular file opened without following a link or waiting on a FIFO."""
    try:
        fd = os.open(path, flags | NOFOLLOW | NONBLOCK | CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Refused(err.errno, f"{path} is a symbolic link: not followed") from None
        if err.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing
            raise Refused(err.errno, f"{path} is a FIFO: not written") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Refused(errno.EINVAL, f"{path} is {_kind(info.st_mode)}, not a regular file")
    return fd


def read_regular(path: str, limit: int) -> bytes:
    """The whole of a regular file of at most `limit` bytes; Refused otherwise."""
    fd = _open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise Refused(errno.EFBIG, f"{path} is {size} bytes, over the {limit} it may be")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # grew while read
                raise Refused(errno.EFBIG, f"{path} is over the {limit} bytes it may be")
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_append(path: str, mode: int = 0o644) -> int:
    """An fd appending to a regular file (created if absent), never through a link."""
    return _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)


def write_all(fd: int, body: bytes) -> None:
    """All of `body`, or OSError: a nearly full disk writes less than asked."""
    view = memoryview(body)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def write_atomic(path: str, body: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `body` whole: a new temp file of an unguessable name in the
    same directory (O_EXCL, so a planted link is never written through), then a rename."""
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name[:200]}.", suffix=".tmp", dir=directory)
    try:
        try:
            write_all(fd, body)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- documents ---------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise BadDocument(f"{name} is not a number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadDocument(f"{text[:20]} is out of range")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise BadDocument(f"a number of {len(text)} digits")
    return int(text)


def loads_json(raw: bytes | str, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """JSON with finite numbers only, nested at most `max_depth` deep; BadDocument
    naming `what` otherwise."""
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_float, parse_int=_int)
    except BadDocument as err:
        raise BadDocument(f"{what}: {err}") from None
    except RecursionError:
        raise BadDocument(f"{what} is nested too deep") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise BadDocument(f"{what} is not valid JSON ({str(err)[:80]})") from None
    if _depth(data) > max_depth:
        raise BadDocument(f"{what} is nested over {max_depth} deep")
    return data


def _depth(data: Any) -> int:
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(node, dict):
            stack.extend((v, level + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, level + 1) for v in node)
    return deepest


def number(
    value: Any, what: str, minimum: float | None = None, maximum: float | None = None
) -> float:
    """A finite number within bounds, or BadDocument naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadDocument(f"{what} is not a number")
    result = float(value)
    if not math.isfinite(result):
        raise BadDocument(f"{what} is not a finite number")
    if minimum is not None and result < minimum:
        raise BadDocument(f"{what} is {result:g}, below {minimum:g}")
    if maximum is not None and result > maximum:
        raise BadDocument(f"{what} is {result:g}, over {maximum:g}")
    return result


def printable(text: str, limit: int = 200) -> str:
    """Text from others, safe for a terminal: no escape codes, at most `limit` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


# -- HTTP --------------------------------------------------------------------------------


def http_get(
    url: str,
    deadline: float,
    limit: int,
    headers: Mapping[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> bytes:
    """The body of a GET that must be whole within `deadline` seconds and `limit` bytes
    (a server that trickles or floods is cut off); Refused with one line otherwise.
    tls: how an https server is checked (None: against the system's CAs)."""
    return http_fetch(url, deadline, limit, headers, tls)[0]


def http_fetch(
    url: str,
    deadline: float,
    limit: int,
    headers: Mapping[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> tuple[bytes, http.client.HTTPMessage]:
    """http_get's body and the answer's headers. The deadline covers the whole call:
    the name's resolution, the connection, the TLS handshake, the request and the answer."""
    ends = time.monotonic() + deadline
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise Refused(errno.EINVAL, f"{url} is not an http(s) URL")
    host = parts.hostname
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=deadline, context=tls)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=deadline)
    expired = threading.Event()
    # Every socket opened, from before it connects: for an answer that ends when the
    # server closes (HTTP/1.0, `Connection: close`) http.client hands it to the
    # response and sets conn.sock to None.
    opened: list[socket.socket] = []

    def cut() -> None:
        expired.set()
        for sock in opened:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # unblocks a recv waiting on a trickle

    timer = threading.Timer(deadline, cut)
    timer.daemon = True
    timer.start()
    try:
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn.sock = _connect(host, port or conn.default_port, ends, opened)
        if isinstance(conn, http.client.HTTPSConnection):
            context = tls or ssl.create_default_context()
            secure = context.wrap_socket(
                conn.sock, server_hostname=host, do_handshake_on_connect=False
            )
            opened.append(secure)
            conn.sock = secure
            # CPython bounds a handshake as a whole by the socket's timeout.
            secure.settimeout(_left(ends))
            secure.do_handshake()
        if expired.is_set():  # the deadline passed while connecting
            raise TimeoutError
        conn.sock.settimeout(_left(ends))
        conn.request("GET", target, headers=dict(headers or {}))
        response = conn.getresponse()
        body = bytearray()
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            body += chunk
            if len(body) > limit:
                raise Refused(errno.EFBIG, f"{url} answered over {limit} bytes: cut off")
        if expired.is_set():  # cut: the end of the body is the deadline's, not the server's
            raise TimeoutError
        if response.status != 200:
            raise Refused(errno.EPROTO, f"{url} answered HTTP {response.status}")
        return bytes(body), response.headers
    except (OSError, http.client.HTTPException, UnicodeError) as err:
        if expired.is_set() or time.monotonic() >= ends:
            raise Refused(
                errno.ETIMEDOUT, f"{url} did not answer in full within {deadline:g} s"
            ) from None
        if isinstance(err, Refused):
            raise
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise Refused(getattr(err, "errno", None) or errno.EIO, f"{url}: {reason}") from None
    finally:
        timer.cancel()
        conn.close()
        for sock in opened:
            sock.close()


def _left(ends: float) -> float:
    """Seconds until `ends` (monotonic); TimeoutError once none are left."""
    left = ends - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _connect(host: str, port: int, ends: float, opened: list[socket.socket]) -> socket.socket:
    """A TCP connection to `host`, resolved on a thread of its own (getaddrinfo has no
    timeout: a resolver that never answers would hold the caller) and connected to
    each of its addresses in turn, all by `ends`."""
    try:  # an address already (a tracker's 127.0.0.1): nothing to look up
        addresses = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )
    except socket.gaierror:
        addresses = within(
            _left(ends), lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        )
    error: OSError = OSError(errno.EHOSTUNREACH, f"{host} has no address")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        opened.append(sock)
        try:
            sock.settimeout(_left(ends))
            sock.connect(address)
            return sock
        except TimeoutError:
            raise
        except OSError as err:
            error = err
    raise error


def flock_within(fd: int, patience: float) -> bool:
    """An exclusive flock on `fd`, waited for at most `patience` s; False if never got:
    a lock held longer is someone else's (a stopped process, a hung NFS lock)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
