"""End to end, carbon per unit of work: the real exporter replays the H200 trace, a
fake job serves a token counter over HTTP, a real Prometheus scrapes both and
evaluates the rules tools/gen_sci_rules.py made from rules/sci-units-style data, and
both the recorded grams per token and `wattprint report --per=tokens` agree within
1 % with energy x intensity / tokens computed from the trace and the tokens served.

The replayed GPU has no embodied figure (the H200 has no published one) and CPU and
memory are off, so the job's SCI is exactly its GPU energy x intensity / tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from conftest import require_tool
from prom_harness import free_port, run_prometheus, stop_process
from test_dashboards import load, substitute, targets
from test_e2e_prometheus import TRACE, WORKLOAD, baseline_sample, held_energy, trace_gpu
from test_rules import RULE_FILES

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SPEED = 4.0
SCRAPE = "250ms"
TOKENS_PER_TICK = 37  # every 50 ms while the job runs
UNITS = {
    "units": [
        {"name": "tokens", "metric": "vllm:generation_tokens_total", "labels": {"workload": "app"}}
    ]
}
GRAMS_RULE = "namespace_workload:wattprint_sci_grams_per_tokens:ratio_increase1h"


class FakeJob:
    """A job's /metrics: a token counter that grows only while `serving` is set."""

    def __init__(self) -> None:
        self.tokens = 0
        self.serving = threading.Event()
        self.done = threading.Event()
        job = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (
                    "# TYPE vllm:generation_tokens_total counter\n"
                    f'vllm:generation_tokens_total{{app="{WORKLOAD}",model_name="tiny"}} '
                    f"{job.tokens}\n"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        threading.Thread(target=self._count, daemon=True).start()

    def _count(self) -> None:
        while not self.done.is_set():
            if self.serving.is_set():
                self.tokens += TOKENS_PER_TICK
            time.sleep(0.05)

    def close(self) -> None:
        self.done.set()
        self.server.shutdown()
        self.server.server_close()


def query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    reply = requests.get(f"{url}/api/v1/query", params=params, timeout=10)
    assert reply.status_code == 200, f"{expr}: {reply.text}"
    result: list[dict[str, Any]] = reply.json()["data"]["result"]
    return result


def value(url: str, expr: str, at: float | None = None) -> float:
    result = query(url, expr, at)
    assert len(result) == 1, f"{expr}: {result}"
    return float(result[0]["value"][1])


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    prometheus = require_tool("prometheus")
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    tmp = tmp_path_factory.mktemp("e2e-sci")
    units = tmp / "units.yaml"
    units.write_text(yaml.safe_dump(UNITS))
    sci_rules = tmp / "sci.rules.yml"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "gen_sci_rules.py"),
            str(units),
            "-o",
            str(sci_rules),
        ],
        check=True,
    )
    job = FakeJob()
    target = f"127.0.0.1:{free_port()}"
    config = {
        "global": {
            "scrape_interval": SCRAPE,
            "evaluation_interval": SCRAPE,
            "scrape_timeout": SCRAPE,
        },
        "rule_files": [*map(str, RULE_FILES), str(sci_rules)],
        "scrape_configs": [
            {"job_name": "wattprint", "static_configs": [{"targets": [target]}]},
            {"job_name": "fake-vllm", "static_configs": [{"targets": [job.target]}]},
        ],
    }
    exporter: subprocess.Popen[bytes] | None = None
    try:
        with run_prometheus(prometheus, tmp, yaml.safe_dump(config)) as url:
            wait_until(lambda: query(url, f'up{{instance="{target}"}}'), 30, "the first scrape")
            wait_until(lambda: query(url, f'up{{instance="{job.target}"}} == 1'), 30, "the job")
            log = (tmp / "exporter.log").open("wb")
            exporter = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "wattprint",
                    f"--web.listen-address={target}",
                    "--gpu.source=replay",
                    f"--gpu.replay-file={TRACE}",
                    f"--replay.speed={SPEED}",
                    "--cpu.source=none",
                    "--memory.source=none",
                    "--carbon.provider=static",
                    "--carbon.zone=DE",
                    "--sample.interval=250ms",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            started = time.monotonic()
            samples = trace_gpu(TRACE)
            length = (samples[-1]["t"] - samples[0]["t"]) / SPEED
            counter = f'wattprint_workload_energy_joules_total{{workload="{WORKLOAD}"}}'

            def job_running() -> bool:
                # Through Prometheus, not /metrics: the exporter serves a new series
                # at 0 to its first scraper only, and that must be Prometheus.
                assert exporter is not None and exporter.poll() is None, "exporter died"
                return bool(query(url, f"{counter} > 0"))

            wait_until(job_running, 30, "the replayed job")
            # Serve tokens only while the job holds the GPU, well inside its life.
            time.sleep(0.5)
            job.serving.set()
            time.sleep(max(0.0, length - (time.monotonic() - started) - 2.0))
            job.serving.clear()
            time.sleep(2.5)  # the replay ends
            wait_until(
                lambda: query(url, f"{counter} - {counter} offset 1s == 0"), 20, "the replay's end"
            )
            # Flat counters for a while: increase() then sees long series, and its
            # extrapolation to the window's end (under one scrape) stays far below 1 %.
            time.sleep(25)
            yield {"url": url, "units": units, "tokens": job.tokens, "target": target}
    finally:
        if exporter is not None:
            stop_process(exporter)
        job.close()


def expected_grams_per_token(url: str, tokens: float, at: float) -> float:
    samples = trace_gpu(TRACE)
    device = value(url, "wattprint_gpu_energy_joules_total", at)
    joules = held_energy(samples, baseline_sample(samples, device))
    intensity = value(url, 'wattprint_grid_carbon_intensity_grams_per_kwh{signal="average"}', at)
    pue = value(url, "wattprint_pue_ratio", at)
    return joules / 3.6e6 * intensity * pue / tokens


def test_generated_rules_give_grams_per_token_of_the_trace(run: dict[str, Any]) -> None:
    url, tokens = run["url"], run["tokens"]
    assert tokens > 1000
    at = value(url, f'timestamp(up{{instance="{run["target"]}"}})')
    want = expected_grams_per_token(url, tokens, at)
    assert value(
        url,
        f'namespace_workload:wattprint_functional_units_tokens:increase1h{{workload="{WORKLOAD}"}}',
    ) == pytest.approx(tokens, rel=0.01)
    recorded = value(url, f'{GRAMS_RULE}{{workload="{WORKLOAD}"}}')
    assert recorded == pytest.approx(want, rel=0.01)
    joules = value(
        url,
        f'namespace_workload:wattprint_joules_per_tokens:ratio_increase1h{{workload="{WORKLOAD}"}}',
    )
    assert joules / 3.6e6 * value(
        url, 'wattprint_grid_carbon_intensity_grams_per_kwh{signal="average"}'
    ) == pytest.approx(want, rel=0.01)


def test_report_per_tokens_gives_the_same_sci(run: dict[str, Any]) -> None:
    url, tokens = run["url"], run["tokens"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattprint",
            "report",
            f"--prometheus.url={url}",
            f"--workload={WORKLOAD}",
            "--per=tokens",
            f"--units={run['units']}",
            "--format=json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    (row,) = doc["jobs"]
    assert row["workload"] == WORKLOAD and row["embodied_g"] == 0
    assert row["tokens"] == tokens  # every token, from the raw samples
    want = expected_grams_per_token(url, tokens, time.time())
    assert row["sci_g_per_tokens"] == pytest.approx(want, rel=0.01)
    # the table names the unit and the figure
    table = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattprint",
            "report",
            f"--prometheus.url={url}",
            f"--workload={WORKLOAD}",
            "--per=tokens",
            f"--units={run['units']}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert table.returncode == 0, table.stderr
    assert "gCO2e per tokens" in table.stdout and WORKLOAD in table.stdout


def test_workload_dashboard_shows_the_sci(run: dict[str, Any]) -> None:
    url, tokens = run["url"], run["tokens"]
    board = load(REPO / "dashboards" / "workload.json")
    (target,) = [t for p, t in targets(board) if p["title"].startswith("Carbon per unit of work")]
    values = {"datasource": "", "namespace": ".*", "workload": WORKLOAD, "node": ".*"}
    result = query(url, substitute(target["expr"], values))
    assert [r["metric"]["__name__"] for r in result] == [GRAMS_RULE]
    want = expected_grams_per_token(url, tokens, time.time())
    assert float(result[0]["value"][1]) == pytest.approx(want, rel=0.01)


def test_report_per_unknown_unit_is_one_line(run: dict[str, Any]) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattprint",
            "report",
            f"--prometheus.url={run['url']}",
            "--per=steps",
            f"--units={run['units']}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"wattprint: unit 'steps' is not in {run['units']} (it has: tokens)"
    )
