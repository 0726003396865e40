"""End to end, energy per token of served models: the real exporter replays the H200
trace with its one process split into two serving pods (two models, two namespaces)
that share the GPU, two fake vLLM engines serve vLLM's token and request counters with
vLLM's label sets over HTTP. A real Prometheus scrapes all three and evaluates rules/
and the rules tools/gen_sci_rules.py makes of the shipped presets
(rules/inference-units.yaml); vmagent scrapes the same into a VictoriaMetrics, where
vmalert evaluates the same rules.

- The two pods' energies add up to what the GPU drew while they held it, and each is
  within 1 % of the policy's split (by SM utilization) computed from the trace.
- The recorded joules and grams per token, per generated token and per request of each
  model, every panel of the Inference dashboard, and `wattprint report --per=tokens`
  agree within 1 % with energy x intensity / tokens computed from the trace and the
  counters the fakes served, on both engines.

The replayed GPU has no embodied figure and CPU and memory are off, so each model's
SCI is exactly its pod's GPU energy x intensity x PUE / tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from clock_fakes import kept_clock_exporter
from conftest import require_tool
from prom_harness import (
    ONLY_THE_TRACE,
    free_port,
    relay,
    require_vm_tool,
    run_prometheus,
    run_victoriametrics,
    run_vmagent,
    run_vmalert,
    stop_process,
)
from test_dashboards import load, substitute, targets
from test_e2e_prometheus import TRACE, baseline_sample
from test_rules import RULE_FILES

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PRESETS = REPO / "rules" / "inference-units.yaml"
SPEED = 4.0
SCRAPE = "250ms"
TICK = 0.05  # the fakes' counters advance every 50 ms while they serve


@dataclass(frozen=True)
class Model:
    """One serving pod: its identity in the trace and what its engine serves per tick."""

    namespace: str
    pod: str
    model: str
    pid: int
    prompt: int  # prompt tokens per tick
    generated: int  # generated tokens per tick
    every: int  # one request finishes every this many ticks

    def sm_util(self, util: int | None) -> int | None:
        """Its SM utilization when the recorded process had `util`: the second pod
        runs a third of the first's load."""
        if util is None or self.pid == LLAMA.pid:
            return util
        return util // 3


LLAMA = Model("chat", "vllm-llama-0", "meta-llama/Llama-3.1-8B-Instruct", 426, 48, 16, 4)
QWEN = Model("search", "vllm-qwen-0", "Qwen/Qwen2.5-7B-Instruct", 427, 20, 7, 10)
MODELS = (LLAMA, QWEN)


def two_pod_trace(path: Path) -> list[dict[str, Any]]:
    """The recorded trace with each sample's process as the two pods' processes;
    returns the samples (header dropped)."""
    lines = TRACE.read_text().splitlines()
    samples = [json.loads(line) for line in lines[1:]]
    for sample in samples:
        for gpu in sample["gpus"]:
            gpu["processes"] = [
                {
                    "pid": m.pid,
                    "used_memory_bytes": p["used_memory_bytes"],
                    "sm_util": m.sm_util(p["sm_util"]),
                    "identity": {
                        "scheduler": "kubernetes",
                        "namespace": m.namespace,
                        "pod": m.pod,
                        "workload": m.pod.rsplit("-", 1)[0],
                    },
                }
                for p in gpu["processes"]
                for m in MODELS
            ]
    path.write_text("\n".join([lines[0], *map(json.dumps, samples)]) + "\n")
    return samples


def policy_split(samples: list[dict[str, Any]], baseline: int) -> dict[str, float]:
    """Joules per pod after sample `baseline`, split as the README's default policy says:
    by SM utilization among the processes holding the GPU, equally when none has a
    sample above zero. The state of a sample applies to the interval ending at it."""
    out = {m.pod: 0.0 for m in MODELS}
    for before, after in zip(samples[baseline:], samples[baseline + 1 :], strict=False):
        gpu, prev = after["gpus"][0], before["gpus"][0]
        joules = (gpu["energy_mj"] - prev["energy_mj"]) / 1000
        holders = {p["identity"]["pod"]: p["sm_util"] for p in gpu["processes"]}
        if not holders:
            continue
        weights = {pod: float(u) for pod, u in holders.items() if u}
        weights = weights or {pod: 1.0 for pod in holders}
        for pod, weight in weights.items():
            out[pod] += joules * weight / sum(weights.values())
    return out


class FakeVllm:
    """A vLLM engine's /metrics: its counters' names, types and label sets, advancing
    by the model's rates while `serving` is set."""

    def __init__(self, model: Model, serving: threading.Event) -> None:
        self.model, self.serving = model, serving
        self.ticks = 0
        self.done = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = fake.exposition().encode()
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

    @property
    def counts(self) -> dict[str, int]:
        ticks = self.ticks
        return {
            "prompt_tokens": ticks * self.model.prompt,
            "generated_tokens": ticks * self.model.generated,
            "tokens": ticks * (self.model.prompt + self.model.generated),
            "requests": ticks // self.model.every,
        }

    def exposition(self) -> str:
        # As vLLM's PrometheusStatLogger writes them (vllm/v1/metrics/loggers.py):
        # prometheus_client counters, labels model_name and engine.
        labels = f'engine="0",model_name="{self.model.model}"'
        counts = self.counts
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {float(self.serving.is_set())}\n"
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f"vllm:prompt_tokens_total{{{labels}}} {float(counts['prompt_tokens'])}\n"
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            f"vllm:generation_tokens_total{{{labels}}} {float(counts['generated_tokens'])}\n"
            "# HELP vllm:request_success_total Count of successfully processed requests.\n"
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{{labels},finished_reason="length"}} 0.0\n'
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} '
            f"{float(counts['requests'])}\n"
        )

    def _count(self) -> None:
        while not self.done.is_set():
            if self.serving.is_set():
                self.ticks += 1
            time.sleep(TICK)

    def close(self) -> None:
        self.done.set()
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Store:
    """One time-series engine the stack writes into, queried as Grafana would."""

    name: str
    url: str

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        # VictoriaMetrics would move a query within 30 s of now back by 30 s.
        params |= {"nocache": "1"} if self.name == "victoriametrics" else {}
        reply = requests.get(f"{self.url}/api/v1/query", params=params, timeout=10)
        assert reply.status_code == 200, f"{self.name}: {expr}: {reply.text}"
        result: list[dict[str, Any]] = reply.json()["data"]["result"]
        return result

    def last_points(self, expr: str, end: float) -> list[dict[str, Any]]:
        """A range query's last point of each series."""
        params = {"query": expr, "start": f"{end - 60:.3f}", "end": f"{end:.3f}", "step": "5"}
        params |= {"nocache": "1"} if self.name == "victoriametrics" else {}
        reply = requests.get(f"{self.url}/api/v1/query_range", params=params, timeout=10)
        assert reply.status_code == 200, f"{self.name}: {expr}: {reply.text}"
        return [
            {"metric": r["metric"], "value": r["values"][-1]}
            for r in reply.json()["data"]["result"]
        ]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        assert len(result) == 1, f"{self.name}: {expr}: {result}"
        return float(result[0]["value"][1])


@dataclass
class Run:
    stores: dict[str, Store]
    target: str
    samples: list[dict[str, Any]]
    served: dict[str, dict[str, int]]  # pod -> unit -> count
    serving: tuple[float, float]  # when the engines served (wall time)

    @property
    def prom(self) -> Store:
        return self.stores["prometheus"]

    def energy(self) -> dict[str, float]:
        """Each pod's joules as the policy splits the trace, from the sample the
        exporter started at."""
        device = self.prom.value("wattprint_gpu_energy_joules_total")
        gpu = [sample["gpus"][0] for sample in self.samples]
        return policy_split(self.samples, baseline_sample(gpu, device))

    def grams_per_joule(self) -> float:
        signal = 'wattprint_grid_carbon_intensity_grams_per_kwh{signal="average"}'
        return self.prom.value(signal) * self.prom.value("wattprint_pue_ratio") / 3.6e6


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The exporter and the two engines, scraped by a Prometheus (rules by itself) and
    by vmagent into a VictoriaMetrics (rules by vmalert), from the exporter's start on."""
    prometheus = require_tool("prometheus")
    vm_tools = {name: require_vm_tool(name) for name in ("victoria-metrics", "vmagent", "vmalert")}
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    tmp = tmp_path_factory.mktemp("e2e-inference")
    trace = tmp / "two-pods.jsonl"
    samples = two_pod_trace(trace)
    inference_rules = tmp / "inference.rules.yml"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "gen_sci_rules.py"),
            str(PRESETS),
            "-o",
            str(inference_rules),
        ],
        check=True,
    )
    rule_files = [*RULE_FILES, inference_rules]
    serving = threading.Event()
    fakes = [FakeVllm(m, serving) for m in MODELS]
    target = f"127.0.0.1:{free_port()}"
    # The labels the Kubernetes discovery's relabelling gives each serving pod
    # (docs/inference.md, "Scraping the serving pods").
    engines = {
        "job_name": "vllm",
        "static_configs": [
            {"targets": [f.target], "labels": {"namespace": f.model.namespace, "pod": f.model.pod}}
            for f in fakes
        ],
    }
    exporter: subprocess.Popen[bytes] | None = None
    try:
        with ExitStack() as stack:
            # Prometheus reaches the exporter from 127.0.0.2, as a second host would: the
            # exporter gives each scraper its own first 0 of a new series (collector.py).
            relayed = stack.enter_context(relay(target))
            config = {
                "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
                "rule_files": [str(p) for p in rule_files],
                "scrape_configs": [
                    {
                        "job_name": "wattprint",
                        "static_configs": [{"targets": [relayed]}],
                        "relabel_configs": [{"target_label": "instance", "replacement": target}],
                    },
                    engines,
                ],
            }
            prom = stack.enter_context(
                run_prometheus(prometheus, tmp / "prom", yaml.safe_dump(config))
            )
            # Queries within 1 s of now see the newest samples (its default, 30 s, would
            # have vmalert record each rule 30 s late, and the run wait that long).
            vm = stack.enter_context(
                run_victoriametrics(
                    vm_tools["victoria-metrics"], tmp / "vm", "-search.latencyOffset=1s"
                )
            )
            scrape = {
                "global": {"scrape_interval": SCRAPE},
                "scrape_configs": [
                    {"job_name": "wattprint", "static_configs": [{"targets": [target]}]},
                    engines,
                ],
            }
            stack.enter_context(
                run_vmagent(vm_tools["vmagent"], tmp / "vmagent", vm, yaml.safe_dump(scrape))
            )
            stack.enter_context(
                run_vmalert(
                    vm_tools["vmalert"], tmp / "vmalert", vm, rule_files, "1s", lookback="1s"
                )
            )
            stores = {
                "prometheus": Store("prometheus", prom),
                "victoriametrics": Store("victoriametrics", vm),
            }
            up = f'up{{instance="{target}"}}'
            for store in stores.values():
                wait_until(lambda s=store: s.query(up), 30, f"{store.name}'s first scrape")
                wait_until(
                    lambda s=store: len(s.query('up{job="vllm"} == 1')) == 2,
                    30,
                    f"{store.name}'s scrape of the engines",
                )
            with (tmp / "exporter.log").open("wb") as log:
                exporter = subprocess.Popen(
                    [
                        # On a node whose clock a time daemon keeps, as in production:
                        # then it stamps its samples and each scraper gets its own
                        # first 0 of a new series (clock.py, collector.py).
                        *kept_clock_exporter(tmp),
                        f"--web.listen-address={target}",
                        "--gpu.source=replay",
                        f"--gpu.replay-file={trace}",
                        f"--replay.speed={SPEED}",
                        "--cpu.source=none",
                        "--memory.source=none",
                        "--carbon.provider=static",
                        "--carbon.zone=DE",
                        "--sample.interval=250ms",
                        ONLY_THE_TRACE,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            started = time.monotonic()
            length = (samples[-1]["t"] - samples[0]["t"]) / SPEED
            counter = "wattprint_workload_energy_joules_total"

            def pods_running() -> bool:
                assert exporter is not None and exporter.poll() is None, "exporter died"
                return len(stores["prometheus"].query(f"{counter} > 0")) == 2

            wait_until(pods_running, 30, "the replayed pods")
            # Serve while the pods hold the GPU, with idle time on both sides: it is
            # part of what a token costs.
            time.sleep(0.5)
            serving.set()
            began = time.time()
            time.sleep(max(0.0, length - (time.monotonic() - started) - 2.0))
            serving.clear()
            ended = time.time()
            time.sleep(2.5)  # the replay ends
            for store in stores.values():
                wait_until(
                    lambda s=store: s.query(f"sum({counter}) - sum({counter} offset 1s) == 0"),
                    20,
                    f"the replay's end on {store.name}",
                )
            # Flat counters for a while: increase() then sees long series, and its
            # extrapolation to the window's end (under one scrape) stays far below 1 %.
            time.sleep(15)
            counts = {f.model.pod: f.counts for f in fakes}
            yield Run(stores, target, samples, counts, (began, ended))
    finally:
        if exporter is not None:
            stop_process(exporter)
        for fake in fakes:
            fake.close()


ENGINES = ["prometheus", "victoriametrics"]


def pick(result: list[dict[str, Any]], **labels: str) -> float:
    values = [
        float(r["value"][1])
        for r in result
        if all(r["metric"].get(k, "") == v for k, v in labels.items())
    ]
    assert len(values) == 1, f"{labels}: {result}"
    return values[0]


def test_two_pods_on_one_gpu_add_up_and_follow_the_policy(run: Run) -> None:
    want = run.energy()
    pods = run.prom.query("sum by (pod) (wattprint_workload_energy_joules_total)")
    got = {m.pod: pick(pods, pod=m.pod) for m in MODELS}
    device = run.prom.value("wattprint_gpu_energy_joules_total")
    unattributed = run.prom.value(
        'sum(wattprint_unattributed_energy_joules_total{component="gpu"})'
    )
    # Exact, in integer micro-joules: the parts add up to the GPU.
    assert sum(got.values()) + unattributed == pytest.approx(device, abs=1e-5)
    assert sum(got.values()) == pytest.approx(sum(want.values()), rel=1e-6)
    for pod, joules in got.items():
        assert joules == pytest.approx(want[pod], rel=0.01), pod
    # A third of the load: the second pod's share is well below the first's.
    assert 0.2 < got[QWEN.pod] / got[LLAMA.pod] < 0.6


@pytest.mark.parametrize("engine", ENGINES)
def test_recorded_energy_and_carbon_per_token_per_model(run: Run, engine: str) -> None:
    store, (energy, per_joule) = run.stores[engine], (run.energy(), run.grams_per_joule())
    for m in MODELS:
        served = run.served[m.pod]
        assert served["tokens"] > 2000 and served["requests"] > 10
        where = f'{{namespace="{m.namespace}", model="{m.model}"}}'
        tokens = store.value(
            f"namespace_pod_model:wattprint_functional_units_tokens:increase1h{where}"
        )
        assert tokens == pytest.approx(served["tokens"], rel=0.01)
        for unit in ("tokens", "prompt_tokens", "generated_tokens", "requests"):
            joules = store.value(
                f"namespace_model:wattprint_joules_per_{unit}:ratio_increase1h{where}"
            )
            assert joules == pytest.approx(energy[m.pod] / served[unit], rel=0.01), (m.model, unit)
        grams = store.value(
            f"namespace_model:wattprint_sci_grams_per_tokens:ratio_increase1h{where}"
        )
        assert grams == pytest.approx(energy[m.pod] * per_joule / served["tokens"], rel=0.01)


def test_idle_time_between_requests_is_part_of_the_cost(run: Run) -> None:
    """The pods held the GPU before and after their engines served: that energy is in
    each model's joules per token, as the SCI asks, not left out."""
    energy = run.energy()
    counter = "sum by (pod) (wattprint_workload_energy_joules_total)"
    began, ended = (run.prom.query(counter, at) for at in run.serving)
    for m in MODELS:
        busy = pick(ended, pod=m.pod) - pick(began, pod=m.pod)
        idle = energy[m.pod] - busy
        assert idle > 0.1 * energy[m.pod], m.pod  # a real part of the pod's energy
        where = f'{{namespace="{m.namespace}", model="{m.model}"}}'
        per_token = run.prom.value(
            f"namespace_model:wattprint_joules_per_tokens:ratio_increase1h{where}"
        )
        assert per_token == pytest.approx((busy + idle) / run.served[m.pod]["tokens"], rel=0.01)
        assert per_token > 1.05 * busy / run.served[m.pod]["tokens"]


@pytest.mark.parametrize("engine", ENGINES)
def test_every_inference_panel_agrees_with_the_trace(run: Run, engine: str) -> None:
    store = run.stores[engine]
    board = load(REPO / "dashboards" / "inference.json")
    values = {"datasource": "", "node": ".*", "namespace": ".*", "workload": "", "model": ".*"}
    values |= {"__rate_interval": "1s", "__range": "1h", "__range_s": "3600"}
    energy, per_joule = run.energy(), run.grams_per_joule()
    now = time.time()
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for panel, target in targets(board):
        expr = substitute(target["expr"], values)
        if target.get("instant"):
            seen[(panel["title"], target["refId"])] = store.query(expr, now)
            continue
        # The last point of each series: the rate5m rules' window then spans the run.
        seen[(panel["title"], target["refId"])] = store.last_points(expr, now)
    for m in MODELS:
        served, labels = run.served[m.pod], {"namespace": m.namespace, "model": m.model}
        per_token = energy[m.pod] / served["tokens"]
        checks = {
            ("Energy per token by model", "A"): per_token,
            ("Energy per token by model", "B"): energy[m.pod] / served["generated_tokens"],
            ("gCO2e per 1,000 tokens by model", "A"): 1000 * per_token * per_joule,
            ("Tokens per second by model", "A"): served["tokens"] / 300,  # a 5 m rate
            ("Energy per request by model", "A"): energy[m.pod] / served["requests"],
            ("SCI, gCO2e per 1,000 tokens (last hour)", "A"): 1000 * per_token * per_joule,
            ("SCI, gCO2e per request (last hour)", "A"): energy[m.pod]
            * per_joule
            / served["requests"],
        }
        for key, want in checks.items():
            assert pick(seen[key], **labels) == pytest.approx(want, rel=0.01), (key, m.model)
    # No embodied figure for the replayed H200: the embodied share is 0, per namespace.
    share = seen[("Embodied share (time range)", "A")]
    assert {r["metric"]["namespace"]: float(r["value"][1]) for r in share} == {
        "chat": 0,
        "search": 0,
    }
    # The power panel shows exactly the serving pods.
    power = seen[("Power of the serving pods", "A")]
    assert sorted(r["metric"]["pod"] for r in power) == sorted(m.pod for m in MODELS)
    covered = {"Embodied share (time range)", "Power of the serving pods"}
    covered |= {title for title, _ in checks}
    assert {p["title"] for p, _ in targets(board)} == covered


def report(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "wattprint",
            "report",
            f"--prometheus.url={store.url}",
            f"--units={PRESETS}",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_report_per_tokens_per_model(run: Run, engine: str) -> None:
    store = run.stores[engine]
    result = report(store, "--per=tokens", "--format=json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = {(r["namespace"], r["model"]): r for r in doc["models"]}
    assert set(rows) == {(m.namespace, m.model) for m in MODELS}
    energy, per_joule = run.energy(), run.grams_per_joule()
    for m in MODELS:
        row, served = rows[(m.namespace, m.model)], run.served[m.pod]
        assert row["tokens"] == served["tokens"]  # every token, from the raw samples
        assert row["energy_j"] == pytest.approx(energy[m.pod], rel=0.01)
        assert row["embodied_g"] == 0
        want = energy[m.pod] * per_joule / served["tokens"]
        assert row["sci_g_per_tokens"] == pytest.approx(want, rel=0.01)
    requests_row = json.loads(report(store, "--per=requests", "--format=json").stdout)["models"]
    for r in requests_row:
        (m,) = [m for m in MODELS if m.model == r["model"]]
        assert r["requests"] == run.served[m.pod]["requests"]
    table = report(store, "--per=tokens", f"--namespace={LLAMA.namespace}")
    assert table.returncode == 0, table.stderr
    assert "model" in table.stdout.splitlines()[3] and LLAMA.model in table.stdout
    assert QWEN.model not in table.stdout
