"""The deadlines of the tools beside a job hold against a server that trickles a byte
at a time, whether its answer has a length or ends when it closes (HTTP/1.0,
`Connection: close`): a trickle resets a socket's timeout at every byte."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from wattprint.core import safeio
from wattprint.core.deadline import within


@pytest.fixture(name="trickle")
def trickle_fixture() -> Iterator[str]:
    """A server that answers 200 without a length, then a byte every 0.3 s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                while not stop.is_set():
                    try:
                        conn.sendall(b"#")
                    except OSError:
                        break
                    time.sleep(0.3)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/metrics"
    stop.set()
    thread.join(timeout=5)
    server.close()


def test_http_get_cuts_an_answer_without_a_length_at_its_deadline(trickle: str) -> None:
    began = time.monotonic()
    with pytest.raises(safeio.Refused, match=r"did not answer in full within 1 s"):
        safeio.http_get(trickle, 1.0, 1 << 20)  # never a cut body returned as whole
    assert time.monotonic() - began < 3


def test_within_returns_at_its_deadline_whatever_the_call_waits_on() -> None:
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        within(0.5, lambda: time.sleep(30))
    assert time.monotonic() - began < 2
    assert within(5, lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        within(5, lambda: 1 / 0)
