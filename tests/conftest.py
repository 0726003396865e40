from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

REPO = TESTS.parent
TRACE = TESTS / "fixtures" / "h200" / "phased-load.jsonl"


def require_tool(name: str) -> str:
    """The path of a tool the test needs: skip without it locally, fail under CI=true."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def trace_path() -> Path:
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE} (tests/fixtures/h200/README.md)")
    return TRACE


def seconds_until_cut_off(
    address: tuple[str, int], data: bytes, limit: float = 4.0
) -> float | None:
    """Send `data` a byte at a time (one every 0.2 s); return when the server closed
    the connection, or None if it still held it after `limit` seconds."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.settimeout(0.2)
        started = time.monotonic()
        for byte in data:
            if time.monotonic() - started > limit:
                return None
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(1024) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started
    return None


# Every exporter a test starts (in this process or as a child) keeps no state file and
# takes no node lock unless the test asks: tests run exporters side by side, and none
# may touch /var/lib/wattprint on the machine running them.
os.environ["WATTPRINT_STATE_FILE"] = ""

MACHINE_STATE = Path("/var/lib/wattprint")


def private_namespace(*kinds: str) -> list[str]:
    """The command prefix that runs a command in new namespaces of `kinds` ("mount",
    "net"), as root in them: where a test may mount a tmpfs over /var/lib and take the
    node's default lock, or listen on the default port, without touching the machine."""
    tool = shutil.which("unshare")
    if tool is None:
        message = "unshare is not installed (Debian package util-linux)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    # Unprivileged: root in a user namespace of its own may mount and configure there.
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [tool, *user, *(f"--{kind}" for kind in kinds), "--propagation", "private"]


def machine_state() -> dict[str, object]:
    """What the machine's own exporter keeps: which files, and (unless an exporter holds
    the lock and so rewrites its state file every sample) their size and mtime."""
    if not MACHINE_STATE.exists():
        return {}
    from wattprint.durability.nodelock import lock_holder

    holder = lock_holder(str(MACHINE_STATE / "state.json.lock"))
    files: dict[str, object] = {"holder": holder}
    for path in sorted(MACHINE_STATE.rglob("*")):
        name = str(path.relative_to(MACHINE_STATE))
        if holder is not None and name.startswith("state.json"):
            if name in ("state.json", "state.json.lock"):
                files[name] = "held"
            continue  # the holder's own writes (and its temporary files)
        stat = path.lstat()
        files[name] = (stat.st_size, stat.st_mtime_ns)
    return files


@pytest.fixture(autouse=True, scope="session")
def machine_state_untouched() -> Iterator[None]:
    """The suite leaves the machine's /var/lib/wattprint (and whoever holds its lock) as
    it found them."""
    before = machine_state()
    yield
    after = machine_state()
    if before.get("holder") is not None or after.get("holder") is not None:
        # The machine's own exporter ran during the suite: it writes its state file, and
        # may start or stop meanwhile. The tests still add or change nothing beside it.
        before, after = (
            {k: v for k, v in d.items() if k != "holder" and not k.startswith("state.json")}
            for d in (before, after)
        )
    assert after == before, f"the tests changed {MACHINE_STATE}: {before} -> {after}"
