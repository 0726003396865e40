"""`wattprint report` across an exporter restart: the restarted series' steps and raw
samples are read for all of them at once, not with two more queries per series (issue
33: 3,000 series of a node that restarted made about 6,000 requests). Counted at a
proxy in front of a real Prometheus and a real VictoriaMetrics."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from conftest import require_tool
from prom_harness import import_openmetrics, require_vm_tool, run_prometheus, run_victoriametrics

SCRAPE = 15
START, RESTART, STOP, END = 300, 1500, 2700, 3000  # s after t0; restarted after a scrape
WATTS = 50.0
JOBS = {"small": 2, "big": 40}  # workload -> its series (pods), all on one node


def counter(t: int) -> float | None:
    """A pod's counter at scrape t: from 0 again after its exporter restarted."""
    if t <= START or t > STOP + 600:
        return None
    born = RESTART if t > RESTART else START
    return WATTS * (min(t, STOP) - born)


def openmetrics(t0: int) -> str:
    lines = ["# TYPE wattprint_workload_energy_joules counter"]
    for workload, pods in JOBS.items():
        for n in range(pods):
            labels = (
                f'component="gpu",gpu="{n % 8}",scheduler="kubernetes",namespace="ml",'
                f'workload="{workload}",pod="{workload}-{n}",instance="node-a:9950",'
                'job="wattprint"'
            )
            lines += [
                f"wattprint_workload_energy_joules_total{{{labels}}} {v!r} {t0 + t}"
                for t in range(0, END + 1, SCRAPE)
                if (v := counter(t)) is not None
            ]
    return "\n".join([*lines, "# EOF"]) + "\n"


class Counting(http.server.ThreadingHTTPServer):
    """A proxy to `target` that keeps the PromQL of every query it passes on."""

    daemon_threads = True

    def __init__(self, target: str) -> None:
        self.target = target
        self.queries: list[str] = []
        super().__init__(("127.0.0.1", 0), _Forward)


class _Forward(http.server.BaseHTTPRequestHandler):
    server: Counting

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        params = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        params.update(urllib.parse.parse_qs(body.decode()))
        self.server.queries += params.get("query", [])
        request = urllib.request.Request(
            self.server.target + self.path,
            data=body if self.command == "POST" else None,
            # (not Accept-Encoding: the answer goes back as plain bytes)
            headers={
                k: v
                for k, v in self.headers.items()
                if k.lower() not in ("host", "accept-encoding")
            },
            method=self.command,
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                status, headers, data = answer.status, answer.headers, answer.read()
        except urllib.error.HTTPError as err:
            status, headers, data = err.code, err.headers, err.read()
        self.send_response(status)
        if headers.get("Content-Type"):
            self.send_header("Content-Type", headers["Content-Type"])
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _forward

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module", params=["prometheus", "victoriametrics"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    """The two jobs in a real Prometheus (promtool blocks) or VictoriaMetrics: (URL, t0)."""
    tmp = tmp_path_factory.mktemp("resets")
    t0 = (int(time.time()) // 60) * 60 - 3 * 3600
    source = tmp / "resets.om"
    source.write_text(openmetrics(t0))
    if request.param == "victoriametrics":
        with run_victoriametrics(require_vm_tool("victoria-metrics"), tmp) as url:
            import_openmetrics(url, source.read_text())
            yield url, t0
        return
    tsdb = tmp / "tsdb"
    subprocess.run(
        [
            require_tool("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(source),
            str(tsdb),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    with run_prometheus(require_tool("prometheus"), tmp, tsdb=tsdb) as url:
        yield url, t0


def report(target: str, t0: int, workload: str) -> tuple[dict[str, object], list[str]]:
    """The report of one job, through a counting proxy: its document and its queries."""
    proxy = Counting(target)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "wattprint",
                "report",
                f"--prometheus.url=http://127.0.0.1:{proxy.server_address[1]}",
                f"--since={t0}",
                f"--until={t0 + END}",
                f"--workload={workload}",
                "--format=json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ},
            check=False,
        )
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), proxy.queries


@pytest.mark.slow
def test_a_restart_costs_the_same_requests_for_forty_series_as_for_two(
    store: tuple[str, int],
) -> None:
    url, t0 = store
    requests = {}
    for workload, pods in JOBS.items():
        document, queries = report(url, t0, workload)
        (job,) = document["jobs"]  # type: ignore[index]
        # Exact across the restart: every pod's whole draw, none of it lost or doubled.
        joules = job["energy_kwh"]["gpu"] * 3.6e6
        assert joules == pytest.approx(pods * WATTS * (STOP - START), rel=1e-9), workload
        requests[workload] = len(queries)
    # Before: two more per series that reset (its steps with a reset, its raw samples),
    # 104 for the 40 series against 28 for the 2 (Prometheus; now 25 for each).
    assert requests["big"] == requests["small"], requests
