"""One exporter per node: the state file's lock turns a second one away with one line
naming the first (two exporters on a node count every job twice)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
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
