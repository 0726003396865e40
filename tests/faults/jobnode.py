"""A node for the job tools' fault tests: the live fake NVML (tests/livenvml.py), a
state directory of the test's own, and helpers to run `wattprint run` and trackers in
real processes, as a user would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import wattprint
from fake_nvml import TRACE

TESTS = Path(__file__).resolve().parents[1]
# The package these tests import, for the processes they start too.
PACKAGE = Path(wattprint.__file__).resolve().parents[1]


@dataclass
class JobNode:
    tmp: Path
    env: dict[str, str]

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    @property
    def out(self) -> Path:
        return self.tmp / "out"

    def run(
        self, *args: str, command: tuple[str, ...] = ("true",), timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`wattprint run ARGS -- COMMAND`, waited for."""
        return subprocess.run(
            [sys.executable, "-m", "wattprint", "run", *args, "--", *command],
            env=self.env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python(self, code: str, *args: str) -> subprocess.Popen[str]:
        """A Python process running `code` (with os, sys, time, wattprint imported)."""
        prelude = "import os, sys, time\nimport wattprint\n"
        return subprocess.Popen(
            [sys.executable, "-c", prelude + textwrap.dedent(code), *args],
            env=self.env,
            cwd=self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture
def job_node(tmp_path: Path) -> Iterator[JobNode]:
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    nvml_dir = tmp_path / "nvml"
    nvml_dir.mkdir()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS / "livefake"), str(PACKAGE)]),
        WATTPRINT_TEST_NVML_DIR=str(nvml_dir),
        WATTPRINT_TEST_NVML_T0=str(time.time()),
        WATTPRINT_STATE_FILE=str(tmp_path / "state" / "state.json"),
        # The per-user fallback lock of this test alone: a sampler another session left
        # there would otherwise be found (and read) by every tracker of this user.
        XDG_RUNTIME_DIR=str(tmp_path),
        WATTPRINT_GPU_SOURCE="nvml",
        WATTPRINT_CPU_SOURCE="model",
        WATTPRINT_MEMORY_SOURCE="model",
        WATTPRINT_SAMPLE_INTERVAL="100ms",
        WATTPRINT_CARBON_ZONE="DE",
        WATTPRINT_OUTPUT_DIR=str(tmp_path / "out"),
    )
    for name in ("WATTPRINT_WORKLOAD", "WATTPRINT_EXPORTER_URL", "RANK", "LOCAL_RANK"):
        env.pop(name, None)
    yield JobNode(tmp_path, env)


def one_line(stderr: str, prefix: str, contains: str = "") -> str:
    """The one line of stderr that starts with `prefix` (and holds `contains`); no
    traceback anywhere."""
    assert "Traceback" not in stderr, stderr
    lines = [x for x in stderr.splitlines() if x.startswith(prefix) and contains in x]
    assert len(lines) == 1, stderr
    return lines[0]


class Trickle:
    """A local HTTP server that answers every request one byte every `every` seconds."""

    def __init__(self, every: float = 2.0) -> None:
        self.every = every
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        body = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"# " * 10_000
        with conn:
            for byte in body:
                if self.closed.wait(self.every):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
