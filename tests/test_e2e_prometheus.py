"""End to end: the real exporter replays a recorded H200 trace, a real Prometheus 2.42
scrapes it every second and evaluates rules/ (and a generated tiny budget), and the
numbers people look at come out right:

- the GPU's energy from the recording rules matches the trace's energy counter within
  1 %, and the workload's matches the energy the trace's counter recorded while the
  workload held the GPU, within what increase() can see of a series born mid-window;
- every query of every dashboard, with its variables set, parses and returns data;
- a tiny budget makes the page alert go pending or firing.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from clock_fakes import kept_clock_exporter
from conftest import require_tool
from pm_counters_fake import PmCountersNode
from prom_harness import ONLY_THE_TRACE, free_port, stop_process
from test_dashboards import DASHBOARDS, load, substitute, targets, variable_queries
from test_rules import REPO, RULE_FILES, gen, rules

pytestmark = pytest.mark.slow

TRACE = REPO / "tests" / "fixtures" / "h200" / "phased-load.jsonl"

SPEED = 4.0
# The node's input (pm_counters), above what the replayed GPU at SPEED and the CPU and
# memory models draw: the rest is the platform.
NODE_W = 6000.0
WORKLOAD = "phased-load"
ENERGY_RULE = "namespace_workload_component:wattprint_workload_energy_joules:increase1h"
NODE_ENERGY_RULE = "instance_component:wattprint_energy_joules:increase1h"
EMISSIONS_RULE = "namespace_workload_component:wattprint_workload_emissions_grams:increase1h"
GPU_SERIES = f'{{workload="{WORKLOAD}", component="gpu"}}'
# A 1 g budget per 30 days: anything the replay emits burns it thousands of times too fast.
BUDGETS = [{"workload": WORKLOAD, "grams": 1}, {"namespace": "e2e-team", "budget": "1kg"}]
# The replayed process has no namespace, so no namespace has both a budget and
# emissions: this panel can only show data for namespaced workloads.
# The SCI panel needs functional units declared as data: test_e2e_sci.py shows it.
EMPTY_BY_DESIGN = {
    # The workload runs outside Kubernetes (namespace ""): the namespace panels, which
    # follow $namespace, have no namespace to show.
    ("wattprint-carbon-budgets", "Namespace budgets used", "A"),
    ("wattprint-carbon-budgets", "Namespace burn rate (1h)", "A"),
    ("wattprint-workload", "Carbon per unit of work (SCI, last hour)", "A"),
} | {
    # The Inference dashboard needs serving engines' counters: test_e2e_inference.py.
    ("wattprint-inference", panel["title"], target["refId"])
    for panel, target in targets(load(DASHBOARDS[0].parent / "inference.json"))
}


def trace_gpu(trace: Path) -> list[dict[str, Any]]:
    """GPU 0 of every sample (line 1 is the header), with the sample's time."""
    lines = trace.read_text().splitlines()
    return [{"t": s["t"], **s["gpus"][0]} for s in map(json.loads, lines[1:])]


def held_energy(samples: list[dict[str, Any]], baseline: int) -> float:
    """Joules the GPU counter gained after sample `baseline` in the intervals the
    workload held the GPU (a sample's state applies to the interval ending at it)."""
    joules = 0.0
    for before, after in zip(samples[baseline:], samples[baseline + 1 :], strict=False):
        if any((p.get("identity") or {}).get("workload") == WORKLOAD for p in after["processes"]):
            joules += (after["energy_mj"] - before["energy_mj"]) / 1000
    return joules


def baseline_sample(samples: list[dict[str, Any]], device_joules: float) -> int:
    """The trace sample the exporter's counters start from. The exporter counts from
    its first sample; on a busy machine that can come a few seconds into the replay
    (the replay clock starts when the source is built). The GPU counter it serves is
    then the trace's delta from that sample to the end, to the millijoule."""
    end = samples[-1]["energy_mj"]
    for i, sample in enumerate(samples):
        if abs((end - sample["energy_mj"]) / 1000 - device_joules) < 0.0015:
            return i
    raise AssertionError(f"the exporter's GPU counter ({device_joules} J) is no delta of the trace")


@dataclass
class Stack:
    prometheus: str
    target: str
    exporter_log: Path

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        reply = requests.get(f"{self.prometheus}/api/v1/query", params=params, timeout=10)
        assert reply.status_code == 200, f"{expr}: {reply.text}"
        result: list[dict[str, Any]] = reply.json()["data"]["result"]
        return result

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "2"}
        reply = requests.get(f"{self.prometheus}/api/v1/query_range", params=params, timeout=10)
        assert reply.status_code == 200, f"{expr}: {reply.text}"
        result: list[dict[str, Any]] = reply.json()["data"]["result"]
        return result

    def value(self, expr: str, at: float | None = None) -> float:
        result = self.query(expr, at)
        assert len(result) == 1, f"{expr}: {result}"
        return float(result[0]["value"][1])


def wait_until(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = require_tool("prometheus")
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    tmp = tmp_path_factory.mktemp("e2e")
    budgets = tmp / "budgets.rules.yml"
    budgets.write_text(gen.render(BUDGETS))
    exporter_port, prometheus_port = free_port(), free_port()
    target = f"127.0.0.1:{exporter_port}"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [*map(str, RULE_FILES), str(budgets)],
        "scrape_configs": [{"job_name": "wattprint", "static_configs": [{"targets": [target]}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{prometheus_port}"
    procs: list[subprocess.Popen[bytes]] = []
    exporter_log = tmp / "exporter.log"
    node = PmCountersNode(tmp / "sys", NODE_W).start()
    try:
        with (tmp / "prometheus.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        prometheus,
                        f"--config.file={tmp / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prometheus_port}",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        s = Stack(url, target, exporter_log)

        def scraping() -> bool:
            try:
                # A Prometheus still opening its TSDB answers queries 503 (seen under load).
                if requests.get(f"{url}/-/ready", timeout=5).status_code != 200:
                    return False
                return bool(s.query(f'up{{instance="{target}"}}'))
            except requests.RequestException:
                return False

        # Let Prometheus try the target before the exporter exists: then its first
        # successful scrape comes before the workload appears (2.5 s into the replay),
        # and the workload's series starts near zero as it would in production.
        wait_until(scraping, 30, "Prometheus's first scrape")
        with exporter_log.open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        *kept_clock_exporter(tmp),
                        f"--web.listen-address={target}",
                        "--gpu.source=replay",
                        f"--gpu.replay-file={TRACE}",
                        f"--replay.speed={SPEED}",
                        "--cpu.source=model",
                        "--memory.source=model",
                        "--carbon.provider=static",
                        "--carbon.zone=DE",
                        "--sample.interval=250ms",
                        # The trace's H200 has no cited embodied figure: give one,
                        # so the Footprint panel's embodied query has data.
                        "--embodied.gpu-kgco2e=NVIDIA H200=164",
                        ONLY_THE_TRACE,
                        *node.flags(),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        wait_until(
            lambda: procs[1].poll() is not None or s.query(f'up{{instance="{target}"}} == 1'),
            30,
            "the exporter's first scrape",
        )
        assert procs[1].poll() is None, exporter_log.read_text()[-3000:]
        yield s
    finally:
        for proc in reversed(procs):
            stop_process(proc)
        node.stop()


@pytest.fixture(scope="module")
def replay_done(stack: Stack) -> float:
    """Wait for the replay to end; return the time of the first scrape after it."""
    samples = trace_gpu(TRACE)
    # The GPU's own counter: the job's stands still through the trace's last 6 s idle.
    counter = "wattprint_gpu_energy_joules_total"
    time.sleep((samples[-1]["t"] - samples[0]["t"]) / SPEED)
    last: list[float] = []

    def flat() -> bool:
        # Three stored samples, 1 s apart, with one value: the counters stopped. (One
        # scrape that found no new read stores nothing: that is not an end.)
        still = f"count_over_time({counter}[2500ms]) >= 3 and changes({counter}[2500ms]) == 0"
        if stack.query(still):
            last.append(stack.value(f"timestamp({counter})"))
            return True
        return False

    wait_until(flat, 20, "the end of the replay")
    return last[0]


def rule_expr(record: str) -> str:
    return next(r["expr"] for r in rules() if r.get("record") == record)


def pick(result: list[dict[str, Any]], **labels: str) -> float:
    values = [
        float(r["value"][1])
        for r in result
        if all(r["metric"].get(k) == v for k, v in labels.items())
    ]
    assert len(values) == 1, f"{labels}: {result}"
    return values[0]


def test_energy_from_the_rules_matches_the_trace(stack: Stack, replay_done: float) -> None:
    samples = trace_gpu(TRACE)
    at = replay_done  # the last scrape: see below
    device = stack.value("wattprint_gpu_energy_joules_total", at)
    baseline = baseline_sample(samples, device)
    expected = held_energy(samples, baseline)
    # The workload held the GPU from 10 s into the 70 s trace on; the exporter must
    # have started measuring well before most of that energy was drawn.
    assert expected > 0.9 * held_energy(samples, 0)

    # The rules' expressions evaluated at the last scrape, where increase() has no
    # window end to extrapolate to. The node's GPU energy: its series started with
    # the exporter, at idle, so increase() counts its first sample in full.
    trace_delta = (samples[-1]["energy_mj"] - samples[baseline]["energy_mj"]) / 1000
    node = stack.query(rule_expr(NODE_ENERGY_RULE), at)
    assert pick(node, instance=stack.target, component="gpu") == pytest.approx(
        trace_delta, rel=0.01
    )

    # The workload's series is born inside the window. PromQL's increase() ignores the
    # value a counter is born with, so the exporter serves each new series at 0 first
    # (collector.py): the rule then counts every joule the job drew.
    counter = f"wattprint_workload_energy_joules_total{GPU_SERIES}"
    assert stack.value(counter, at) == pytest.approx(expected, rel=1e-9)
    assert stack.value(f"min_over_time({counter}[1h])", at) == 0
    workload = pick(stack.query(rule_expr(ENERGY_RULE), at), workload=WORKLOAD, component="gpu")
    assert workload == pytest.approx(expected, rel=0.01)

    # Prometheus evaluates the rule: the stored series agrees, give or take the
    # extrapolation to the end of its window, at most one scrape interval (1 s) of the
    # workload's average power over its life.
    recorded = stack.value(f"{ENERGY_RULE}{GPU_SERIES}")
    first = stack.value(f"min_over_time(timestamp({counter})[1h:1s])")
    lifetime = stack.value(f"timestamp({ENERGY_RULE}{GPU_SERIES})") - first
    assert expected * 0.99 <= recorded <= expected * (1.01 + 1.1 / lifetime)


def test_emissions_are_energy_times_intensity(stack: Stack, replay_done: float) -> None:
    intensity = stack.value('wattprint_grid_carbon_intensity_grams_per_kwh{signal="average"}')
    pue = stack.value("wattprint_pue_ratio")
    ratio = stack.value(f"{EMISSIONS_RULE}{GPU_SERIES} / {ENERGY_RULE}{GPU_SERIES}")
    assert ratio * 3.6e6 == pytest.approx(intensity * pue, rel=1e-6)


def test_a_tiny_budget_trips_the_page_alert(stack: Stack) -> None:
    alert = f'ALERTS{{alertname="WattprintWorkloadEmissionBudgetBurnFast", workload="{WORKLOAD}"}}'
    wait_until(lambda: stack.query(alert), 30, "the burn-rate alert")
    (series,) = stack.query(alert)
    assert series["metric"]["alertstate"] in {"pending", "firing"}
    assert series["metric"]["severity"] == "warning"
    assert (
        stack.value(
            f'namespace_workload:wattprint_emissions_budget_burn:ratio_rate5m{{workload="{WORKLOAD}"}}'
        )
        > 14.4
    )


def test_every_dashboard_query_returns_data(stack: Stack, replay_done: float) -> None:
    # The page alert feeds a table of the Carbon & budgets dashboard.
    test_a_tiny_budget_trips_the_page_alert(stack)
    values = {
        "datasource": "",
        "namespace": "",
        "workload": WORKLOAD,
        "node": stack.target,
        "__rate_interval": "1m",
        "__range": "1h",
        "__range_s": "3600",
    }
    now = time.time()
    empty: set[tuple[str, str, str]] = set()
    for path in DASHBOARDS:
        board = load(path)
        for panel, target in targets(board):
            expr = substitute(target["expr"], values)
            if target.get("instant"):
                result = stack.query(expr, now)
            else:
                result = stack.query_range(expr, now - 120, now)
            if not result:
                empty.add((board["uid"], panel["title"], target["refId"]))
        # The variables list what the replay produced.
        found = {
            name: {
                r["metric"].get(label, "")
                for r in stack.query(f"count by ({label}) ({substitute(sel, values)})")
            }
            for name, label, sel in variable_queries(board)
        }
        assert found.get("node", {stack.target}) == {stack.target}
        assert found.get("workload", {WORKLOAD}) == {WORKLOAD}
    assert empty == EMPTY_BY_DESIGN


def test_exporter_serves_every_metric_the_rules_and_dashboards_use(stack: Stack) -> None:
    exposition = requests.get(f"http://{stack.target}/metrics", timeout=10).text
    served = set(re.findall(r"^# TYPE (\w+)", exposition, flags=re.MULTILINE))
    served |= set(re.findall(r"^(wattprint_\w+)", exposition, flags=re.MULTILINE))

    texts = [r.get("expr", "") for r in rules()]
    texts += [t["expr"] for p in DASHBOARDS for _, t in targets(load(p))]
    texts += [sel for p in DASHBOARDS for _, _, sel in variable_queries(load(p))]
    used: set[str] = set()
    for text in texts:
        # wattprint_(gpu|cpu)_energy_joules_total in a __name__ regex stands for two names.
        for head, alternatives, tail in re.findall(r"(wattprint_)\(([\w|]+)\)(\w*)", text):
            used.update(f"{head}{alt}{tail}" for alt in alternatives.split("|"))
        used.update(re.findall(r"(?<![:\w])wattprint_\w+(?![:\w(])", text))
    assert used, "no exporter metric found in rules and dashboards"
    assert used - served == set()


REFUSED = (
    "prometheus_target_scrapes_sample_out_of_order_total",
    "prometheus_target_scrapes_sample_out_of_bounds_total",
    "prometheus_target_scrapes_sample_duplicate_timestamp_total",
)


def test_prometheus_files_energy_under_the_read_time_and_refuses_none(
    stack: Stack, replay_done: float
) -> None:
    """The exporter stamps its energy samples with the sampler's read: Prometheus must
    keep those times (not the scrape's) and refuse no sample of it as out of order,
    out of bounds or a conflicting duplicate (each would also log a warning)."""
    metrics = requests.get(f"{stack.prometheus}/metrics", timeout=10).text
    for name in REFUSED:
        values = re.findall(rf"^{name} (\S+)$", metrics, re.M)
        assert values == ["0"], f"{name}: {values}"
    # A read is scraped after it happens (seconds after, on a loaded machine): the
    # reads' window reaches well past the counter's.
    reads = stack.query("wattprint_sampler_last_success_timestamp_seconds[60s]", replay_done + 30)
    counter = stack.query("wattprint_gpu_energy_joules_total[20s]", replay_done)
    read_times = [float(v) for _, v in reads[0]["values"]]
    scrape_times = [float(t) for t, _ in reads[0]["values"]]
    stored = [float(t) for t, _ in counter[0]["values"]]
    assert len(stored) >= 10
    # Prometheus keeps milliseconds: each stored time is a read the exporter reported.
    assert all(min(abs(t - r) for r in read_times) < 0.001 for t in stored)
    assert not set(stored) & set(scrape_times)
