"""core/safeio: what the job tools read and write cannot hang, flood or redirect them."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wattprint.core import safeio


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    began = time.monotonic()
    with pytest.raises(safeio.Refused, match="a FIFO, not a regular file"):
        safeio.read_regular(str(fifo), 1000)
    with pytest.raises(safeio.Refused, match="FIFO"):
        os.close(safeio.open_append(str(fifo)))
    assert time.monotonic() - began < 1


def test_links_are_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "out.csv"
    link.symlink_to(victim)
    with pytest.raises(safeio.Refused, match="symbolic link"):
        safeio.read_regular(str(link), 1000)
    with pytest.raises(safeio.Refused, match="symbolic link"):
        safeio.open_append(str(link))
    assert victim.read_text() == "keep"


def test_reads_are_bounded(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 2000)
    with pytest.raises(safeio.Refused, match="2000 bytes, over the 1000"):
        safeio.read_regular(str(big), 1000)
    assert safeio.read_regular(str(big), 2000) == b"x" * 2000
    with pytest.raises(safeio.Refused, match="character device"):
        safeio.read_regular("/dev/zero", 1000)


def test_an_atomic_write_replaces_a_planted_link_without_writing_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "job.json"
    target.symlink_to(victim)
    safeio.write_atomic(str(target), b"{}", 0o600)
    assert victim.read_text() == "keep"
    assert not target.is_symlink() and target.read_text() == "{}"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.json", "victim"]


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
        ("[" * 70 + "]" * 70, "nested over 64 deep"),
        ('{"energy": NaN}', "NaN is not a number"),
        ('{"energy": 1e400}', "out of range"),
        ('{"start": ' + "9" * 400 + "}", "400 digits"),
        ("{", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_documents_from_others_are_refused_in_one_line(raw: str | bytes, said: str) -> None:
    with pytest.raises(safeio.BadDocument, match=said) as caught:
        safeio.loads_json(raw, "f.json")
    assert str(caught.value).startswith("f.json")
    assert "\n" not in str(caught.value)


def test_numbers_are_checked_for_what_they_mean() -> None:
    assert safeio.number(3, "energy", minimum=0) == 3.0
    for bad, said in [(-1, "below 0"), (True, "not a number"), ("1", "not a number")]:
        with pytest.raises(safeio.BadDocument, match=said):
            safeio.number(bad, "energy", minimum=0)
    with pytest.raises(safeio.BadDocument, match="not a finite"):
        safeio.number(float("nan"), "energy")


def test_text_from_others_is_printed_without_escape_codes() -> None:
    shown = safeio.printable("job\x1b[2J\x07" + "x" * 500, 50)
    assert "\x1b" not in shown and "\x07" not in shown
    assert len(shown) == 50 and shown.endswith("…")


@pytest.fixture
def trickle() -> Iterator[str]:
    """A server that sends its answer one byte every 0.5 s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.recv(4096)
            with conn:
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100:
                    if stop.wait(0.5):
                        return
                    try:
                        conn.send(bytes([byte]))
                    except OSError:
                        break

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/metrics"
    stop.set()
    server.close()
    thread.join(5)


def test_a_trickling_server_is_cut_off_at_the_deadline(trickle: str) -> None:
    began = time.monotonic()
    with pytest.raises(safeio.Refused, match=r"did not answer in full within 1\.5 s"):
        safeio.http_get(trickle, 1.5, 1000)
    assert time.monotonic() - began < 3


def test_a_refused_connection_is_one_line() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(safeio.Refused, match="Connection refused"):
        safeio.http_get(f"http://127.0.0.1:{port}/metrics", 2, 1000)


def test_a_flooding_server_is_cut_off_at_the_limit() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        conn, _ = server.accept()
        conn.recv(4096)
        with conn:
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
            try:
                while True:
                    conn.sendall(b"x" * 65536)
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        with pytest.raises(safeio.Refused, match="over 100000 bytes: cut off"):
            safeio.http_get(f"http://127.0.0.1:{server.getsockname()[1]}/", 10, 100_000)
    finally:
        server.close()


@pytest.fixture
def stalled_tls() -> Iterator[str]:
    """A server that accepts connections and never says a word: a TLS handshake with it
    never completes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"https://localhost:{server.getsockname()[1]}/redfish/v1/"
    server.close()
    for conn in held:
        conn.close()
    thread.join(5)


def _slow_resolver(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    resolve = socket.getaddrinfo

    def slow(*args: object, **kwargs: object) -> object:
        if not int(kwargs.get("flags", 0)) & socket.AI_NUMERICHOST:  # type: ignore[call-overload]
            time.sleep(seconds)  # a name: the resolver asks a DNS server
        return resolve(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", slow)


def test_a_handshake_that_never_completes_is_cut_off_at_the_deadline(stalled_tls: str) -> None:
    began = time.monotonic()
    with pytest.raises(safeio.Refused, match=r"did not answer in full within 1\.5 s"):
        safeio.http_get(stalled_tls, 1.5, 1000)
    assert time.monotonic() - began < 2.0


def test_the_deadline_covers_resolving_connecting_and_the_handshake(
    stalled_tls: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A resolver that takes most of the deadline, then a handshake that never ends:
    # each bounded alone by the deadline, the call took both (2.2 s for 1.5 s).
    _slow_resolver(monkeypatch, 1.0)
    began = time.monotonic()
    with pytest.raises(safeio.Refused, match=r"did not answer in full within 1\.5 s"):
        safeio.http_get(stalled_tls, 1.5, 1000)
    assert time.monotonic() - began < 2.0


def test_a_resolver_that_never_answers_holds_no_caller(
    trickle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_resolver(monkeypatch, 30.0)
    began = time.monotonic()
    with pytest.raises(safeio.Refused, match=r"did not answer in full within 1 s"):
        safeio.http_get(trickle.replace("127.0.0.1", "localhost"), 1, 1000)
    assert time.monotonic() - began < 1.5
