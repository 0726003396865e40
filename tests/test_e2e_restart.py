"""End to end: an exporter killed with SIGKILL in the middle of a job and started again
5 s later, scraped by a real Prometheus every second. With its state file, the job's
and the device's energy come out as the trace's own counter says; before the state
file, the job lost 5.9 % of its energy here and nothing said so."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from clock_fakes import kept_clock_exporter
from conftest import TRACE, require_tool
from prom_harness import free_port, run_prometheus
from test_report import JOULES_PER_KWH, report_json, trace_truth

pytestmark = pytest.mark.slow

SPEED = 2.0
KILL_AT_TRACE_S = 26.0  # 20 s into the job, which starts 6 s into the trace
DOWN_S = 5.0


def trace_span() -> tuple[float, float, float]:
    """First and last sample time, and the GPU counter's rise between them (J)."""
    lines = [json.loads(line) for line in TRACE.read_text().splitlines()[1:] if line.strip()]
    first, last = lines[0], lines[-1]
    rise = (last["gpus"][0]["energy_mj"] - first["gpus"][0]["energy_mj"]) / 1000
    return first["t"], last["t"], rise


def start_exporter(
    target: str, state_file: Path, log: Path, launcher: list[str]
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                *launcher,
                f"--web.listen-address={target}",
                f"--gpu.replay-file={TRACE}",
                f"--replay.speed={SPEED}",
                "--carbon.zone=DE",
                "--sample.interval=250ms",
                f"--state.file={state_file}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def query(url: str, expr: str, at: float | None = None) -> float:
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    reply = requests.get(f"{url}/api/v1/query", params=params, timeout=10).json()
    (result,) = reply["data"]["result"]
    return float(result["value"][1])


def wait_healthy(target: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, "the exporter exited"
        try:
            if requests.get(f"http://{target}/healthz", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, "the exporter did not become healthy"
        time.sleep(0.1)


@pytest.mark.parametrize("clock", ["kept", "unsynchronized"])
def test_a_job_loses_nothing_when_its_exporter_is_killed_and_restarted(
    tmp_path: Path, clock: str
) -> None:
    """With a time daemon the samples carry their read times; without one (this VM's
    kernel, say) they do not: the restart loses nothing either way."""
    prometheus = require_tool("prometheus")
    launcher = [sys.executable, "-m", "wattprint"]
    if clock == "kept":
        launcher = kept_clock_exporter(tmp_path)
    target = f"127.0.0.1:{free_port()}"
    config = (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: wattprint\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    first_t, last_t, device_truth = trace_span()
    truth = trace_truth(TRACE)
    log = tmp_path / "exporter.log"
    state_file = tmp_path / "state" / "state.json"
    with run_prometheus(prometheus, tmp_path / "prom", config) as url:
        first = start_exporter(target, state_file, log, launcher)
        started = time.monotonic()
        wait_healthy(target, first)
        time.sleep(max(KILL_AT_TRACE_S / SPEED - (time.monotonic() - started), 0))
        first.send_signal(signal.SIGKILL)
        first.wait()
        time.sleep(DOWN_S)
        second = start_exporter(target, state_file, log, launcher)
        try:
            wait_healthy(target, second)
            end = started + (last_t - first_t) / SPEED + 3
            time.sleep(max(end - time.monotonic(), 0))
            job = 'wattprint_workload_energy_joules_total{workload="phased-load",component="gpu"}'
            device = query(url, "wattprint_gpu_energy_joules_total")
            # Over the job's life: up to its last sample, so that PromQL does not
            # extrapolate past it (a window ending later adds up to 1.1 mean intervals).
            last_sample = query(url, f"timestamp({job})")
            increase = query(url, f"increase({job}[10m])", at=last_sample)
            document = report_json(url, f"--workload={truth.workload}")
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=30)
    assert second.returncode == 0, log.read_text()[-2000:]
    # The device counter the exporter serves is the trace's counter delta, gap and all.
    assert device == pytest.approx(device_truth, rel=0.01)
    (reported,) = document["jobs"]
    assert reported["energy_kwh"]["gpu"] * JOULES_PER_KWH == pytest.approx(
        truth.held_energy_j, rel=0.01
    )
    assert increase == pytest.approx(truth.held_energy_j, rel=0.01)
    assert any("restarted 1 time(s) and resumed" in note for note in reported["notes"])
