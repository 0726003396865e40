"""One exporter per node: the state file's lock turns a second one away with one line
naming the first (two exporters on a node count every job twice)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests

from test_cli import free_port


def start(state_file: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wattprint",
            f"--web.listen-address=127.0.0.1:{port}",
            "--gpu.source=none",
            "--carbon.zone=DE",
            f"--state.file={state_file}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_healthy(port: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, "exporter did not become healthy"
        time.sleep(0.1)


def test_a_second_exporter_on_the_node_exits_2_naming_the_first(tmp_path: Path) -> None:
    state_file = tmp_path / "wattprint" / "state.json"
    first_port = free_port()
    first = start(state_file, first_port)
    try:
        wait_healthy(first_port)
        second = start(state_file, free_port())
        _, err = second.communicate(timeout=30)
        assert second.returncode == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert f"pid {first.pid}" in lines[0] and f"127.0.0.1:{first_port}" in lines[0]
        holder = json.loads((tmp_path / "wattprint" / "state.json.lock").read_text())
        assert holder["pid"] == first.pid
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    assert first.returncode == 0
    # The state was saved at shutdown, and the lock went with the process.
    assert json.loads(state_file.read_text())["format"] == "wattprint-state/v1"
    third_port = free_port()
    third = start(state_file, third_port)
    try:
        wait_healthy(third_port)
        metrics = requests.get(f"http://127.0.0.1:{third_port}/metrics", timeout=5).text
        assert 'wattprint_restarts_total{outcome="resumed"} 1.0' in metrics
    finally:
        third.send_signal(signal.SIGTERM)
        third.communicate(timeout=30)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _holder_pid(lock: Path) -> int | None:
    try:
        return int(json.loads(lock.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def test_a_lock_file_removed_under_the_exporter_is_taken_back(tmp_path: Path) -> None:
    """An rm or a tmp cleaner must not let a second exporter start on the same state."""
    state_file = tmp_path / "wattprint" / "state.json"
    lock = tmp_path / "wattprint" / "state.json.lock"
    port = free_port()
    first = start(state_file, port)
    try:
        wait_healthy(port)
        lock.unlink()
        _wait_for(lambda: _holder_pid(lock) == first.pid, "the lock taken back", 5.0)
        second = start(state_file, free_port())
        _, err = second.communicate(timeout=30)
        assert second.returncode == 2, err
        assert f"pid {first.pid}" in err
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=30)
    assert first.returncode == 0
    assert "was removed or replaced: taken back" in err


def test_an_exporter_whose_lock_another_took_stops_without_saving(tmp_path: Path) -> None:
    """The lock file replaced by one another process holds: that one owns the state now,
    so this one stops with one line instead of writing the state under it."""
    state_file = tmp_path / "wattprint" / "state.json"
    lock = tmp_path / "wattprint" / "state.json.lock"
    port = free_port()
    first = start(state_file, port)
    try:
        wait_healthy(port)
        time.sleep(1.5)  # a save or two
        other = tmp_path / "wattprint" / "other.lock"
        fd = os.open(other, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({"pid": 4242, "host": "h", "listen_address": ":1"}).encode())
        saved = state_file.read_bytes()
        os.rename(other, lock)  # at once: no moment without a lock file to take back
        _, err = first.communicate(timeout=10)
        os.close(fd)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 1, err
    [line] = [x for x in err.splitlines() if "level=error" in x]
    assert "pid 4242" in line
    assert state_file.read_bytes() == saved  # nothing written under the new owner


def test_a_fifo_at_the_lock_path_hangs_neither_run_nor_the_exporter(tmp_path: Path) -> None:
    state_file = tmp_path / "S" / "state.json"
    state_file.parent.mkdir()
    os.mkfifo(tmp_path / "S" / "state.json.lock")
    command = [sys.executable, "-m", "wattprint", "run", "--gpu.source=none", "--carbon.zone=DE"]
    done = subprocess.run(
        [*command, f"--state.file={state_file}", f"--output.dir={tmp_path / 'out'}", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    port = free_port()
    exporter = start(state_file, port)
    try:
        wait_healthy(port)
    finally:
        exporter.send_signal(signal.SIGTERM)
        _, err = exporter.communicate(timeout=30)
    assert "cannot take the node lock" in err and "not a regular file" in err
