"""The exporter listens before it has built anything: a scrape or a probe during start-up
gets a clear answer (build info; /healthz 503) instead of a refused connection, and the
same server then serves the measurements."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

# The real CLI, with the building of the exporter's parts (what app.build_exporter
# builds once it listens) held until a file appears: what a slow first start (thousands
# of processes, a slow driver) looks like from outside.
HELD = """
import os, sys, time
import wattprint.parts as parts
from wattprint.cli.main import main

built = parts.build_carbon

def held(*args, **kwargs):
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    return built(*args, **kwargs)

parts.build_carbon = held
sys.exit(main(sys.argv[2:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(check: object, timeout: float = 30.0) -> requests.Response:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            response = check()  # type: ignore[operator]
            if response is not None:
                return response  # type: ignore[no-any-return]
        except requests.ConnectionError:
            pass
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_metrics_answers_before_the_exporter_is_built_and_measures_after(
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HELD,
            str(release),
            "--gpu.source=none",
            "--carbon.zone=DE",
            f"--state.file={tmp_path / 'state.json'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        early = until(lambda: requests.get(f"{url}/metrics", timeout=5))
        assert early.status_code == 200
        assert 'wattprint_build_info{version="' in early.text
        assert "wattprint_measurement_info" not in early.text
        assert requests.get(f"{url}/healthz", timeout=5).status_code == 503

        release.touch()
        until(lambda: r if (r := requests.get(f"{url}/healthz", timeout=5)).ok else None)
        later = requests.get(f"{url}/metrics", timeout=5)
        assert 'wattprint_measurement_info{component="cpu"' in later.text
        assert "wattprint_cpu_energy_joules_total" in later.text
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_a_bad_flag_found_while_building_still_exits_2_and_frees_the_port(
    tmp_path: Path,
) -> None:
    port = free_port()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattprint",
            "--gpu.source=none",
            "--carbon.zone=NOWHERE",  # refused by the carbon service, after listening
            "--state.file=",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("wattprint: ") and "NOWHERE" in result.stderr
    assert "Traceback" not in result.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nothing holds it any more
