"""End to end, energy per token of served models in the setups people run: the real
exporter replays the H200 trace with its one process split into nine (pods and, outside
Kubernetes, workloads) that share the GPU; fake engines serve the counters of vLLM,
Triton, SGLang and llama.cpp with their label sets over HTTP. A real Prometheus and
vmagent + VictoriaMetrics (rules by vmalert) scrape them through the relabelling of:

- the prometheus-community chart's annotation-based `kubernetes-pods` job, which
  scrapes Wattprint itself in Prometheus (its workload labels become exported_*) and a
  vLLM pod, which an operator's own ServiceMonitor (`production-stack`) scrapes too;
- docs/inference.md's own PodMonitor (as the Prometheus Operator renders it): vLLM
  prefill and decode pods (disaggregated), Triton on a Helm-deployed pod, and a
  two-pod LeaderWorkerSet engine whose pods the exporter names by one job label;
- docs/inference.md's bare-metal job: an SGLang engine tagged by workload, and a
  llama.cpp engine whose scrape names no workload (it must join nothing).

Joules and grams per token, per prompt and generated token and per request of each
model, every panel of the Inference dashboard, and `wattprint report --per=tokens` agree
within 1 % with energy x intensity / units computed from the trace and the counters the
fakes served, on both engines; the unjoined series show each broken case.

The replayed GPU has no embodied figure and CPU and memory are off, so each model's
SCI is exactly its pods' GPU energy x intensity x PUE / units.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
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
from wattprint.report import sci

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PRESETS = REPO / "rules" / "inference-units.yaml"
DOC = REPO / "docs" / "inference.md"
SPEED = 4.0
SCRAPE = "250ms"
TICK = 0.05  # the fakes' counters advance every 50 ms while they serve
LWS = "leaderworkerset.sigs.k8s.io/name"


@dataclass(frozen=True)
class Process:
    """A process holding the replayed GPU: a pod's or, outside Kubernetes, a workload's."""

    pid: int
    weight: int  # its SM utilization: the recorded process's x weight / 4
    workload: str
    namespace: str = ""
    pod: str = ""
    pod_labels: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return self.pod or self.workload

    def identity(self) -> dict[str, str]:
        if not self.pod:
            return {"scheduler": "env", "workload": self.workload}
        return {
            "scheduler": "kubernetes",
            "namespace": self.namespace,
            "pod": self.pod,
            "workload": self.workload,
        }


SERVING = (("app.kubernetes.io/component", "llm-serving"),)
LLAMA_0 = Process(426, 4, "vllm-llama", "chat", "vllm-llama-0")
GUARD_0 = Process(427, 1, "vllm-guard", "chat", "vllm-guard-0")  # up, serves nothing
PREFILL = Process(428, 2, "qwen", "search", "qwen-prefill-0", SERVING)
DECODE = Process(429, 2, "qwen", "search", "qwen-decode-0", SERVING)
TRITON = Process(
    430, 2, "trt", "rag", "trt-0", (*SERVING, ("app.kubernetes.io/instance", "trt-release"))
)
# A LeaderWorkerSet: the exporter names both pods by its label (--kubernetes.job-labels).
LEADER = Process(431, 3, "big", "lws", "big-0", (*SERVING, (LWS, "big")))
WORKER = Process(432, 3, "big", "lws", "big-0-1", (*SERVING, (LWS, "big")))
MISTRAL = Process(433, 1, "mistral-bm")
TINY = Process(434, 1, "tiny-bm")
PROCESSES = (LLAMA_0, GUARD_0, PREFILL, DECODE, TRITON, LEADER, WORKER, MISTRAL, TINY)


@dataclass(eq=False)
class Engine:
    """A fake engine: its kind's counter names, types and label sets over HTTP."""

    kind: str  # vllm, vllm-prefill, vllm-decode, triton, sglang, llamacpp
    model: str
    process: Process  # the pod (or the host's workload) it runs in
    prompt: int  # prompt tokens per tick
    generated: int  # generated tokens per tick
    every: int  # a request ends every this many ticks
    ticks: int = 0
    target: str = ""
    server: ThreadingHTTPServer | None = field(default=None, repr=False)

    def counts(self) -> dict[str, int]:
        """What its counters say. vLLM counts every step; SGLang, Triton and llama.cpp
        count a request's tokens when it ends."""
        ticks = self.ticks
        if not self.kind.startswith("vllm"):
            ticks = ticks // self.every * self.every
        prompt = ticks * self.prompt
        return {
            "prompt": prompt,
            # a decode pod receives the prompt's KV cache from the prefill pod
            "computed": 0 if self.kind == "vllm-decode" else prompt,
            "generated": ticks * self.generated,
            "requests": self.ticks // self.every,
        }

    def units(self) -> dict[str, int]:
        """What Wattprint should count: the prompt tokens the engine computed."""
        c = self.counts()
        return {
            "tokens": c["computed"] + c["generated"],
            "prompt_tokens": c["computed"],
            "generated_tokens": c["generated"],
            "requests": c["requests"],
        }

    def exposition(self) -> str:
        c = self.counts()
        if self.kind.startswith("vllm"):
            # vllm/v1/metrics/loggers.py (0.34): prometheus_client counters
            labels = f'engine="0",model_name="{self.model}"'
            sources = {
                "local_compute": c["computed"],
                "local_cache_hit": 0,
                "external_kv_transfer": c["prompt"] - c["computed"],
            }
            return "".join(
                [
                    "# TYPE vllm:prompt_tokens_total counter\n",
                    f"vllm:prompt_tokens_total{{{labels}}} {c['prompt']}.0\n",
                    "# TYPE vllm:prompt_tokens_by_source_total counter\n",
                    *(
                        f'vllm:prompt_tokens_by_source_total{{{labels},source="{s}"}} {n}.0\n'
                        for s, n in sources.items()
                    ),
                    "# TYPE vllm:generation_tokens_total counter\n",
                    f"vllm:generation_tokens_total{{{labels}}} {c['generated']}.0\n",
                    "# TYPE vllm:request_success_total counter\n",
                    f'vllm:request_success_total{{{labels},finished_reason="stop"}} '
                    f"{c['requests']}.0\n",
                ]
            )
        if self.kind == "triton":
            # custom_metrics_reporter.cc (tensorrtllm_backend v0.19.0), Triton's own counter
            out = []
            for name, kind, n in (
                ("input", "input", c["prompt"]),
                ("output", "output", c["generated"]),
            ):
                labels = (
                    f'model="{self.model}",response_metric_type="total_{kind}_tokens",version="1"'
                )
                out += [
                    f"# TYPE nv_llm_{name}_token_len histogram\n",
                    f'nv_llm_{name}_token_len_bucket{{{labels},le="+Inf"}} {c["requests"]}\n',
                    f"nv_llm_{name}_token_len_sum{{{labels}}} {n}\n",
                    f"nv_llm_{name}_token_len_count{{{labels}}} {c['requests']}\n",
                ]
            out.append("# TYPE nv_inference_request_success counter\n")
            for model in (self.model, "ensemble"):
                out.append(
                    f'nv_inference_request_success{{model="{model}",version="1"}} {c["requests"]}\n'
                )
            return "".join(out)
        if self.kind == "sglang":
            # srt/observability/metrics_collector.py (0.5.23)
            labels = f'engine_type="unified",is_streaming="false",model_name="{self.model}"'
            return "".join(
                f"# TYPE sglang:{name} counter\nsglang:{name}{{{labels}}} {n}.0\n"
                for name, n in (
                    ("prompt_tokens_total", c["prompt"]),
                    ("generation_tokens_total", c["generated"]),
                    ("num_requests_total", c["requests"]),
                )
            )
        # llama.cpp server, started with --metrics: no labels
        return (
            "# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {c['prompt']}\n"
            "# TYPE llamacpp:tokens_predicted_total counter\n"
            f"llamacpp:tokens_predicted_total {c['generated']}\n"
        )

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = fake.exposition().encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a scraper that gave up (its timeout): the next scrape is fresh

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


LLAMA = Engine("vllm", "meta-llama/Llama-3.1-8B-Instruct", LLAMA_0, 48, 16, 4)
GUARD = Engine("vllm", "meta-llama/Llama-Guard-3-8B", GUARD_0, 0, 0, 10**9)
QWEN_P = Engine("vllm-prefill", "Qwen/Qwen2.5-7B-Instruct", PREFILL, 20, 0, 10)
QWEN_D = Engine("vllm-decode", "Qwen/Qwen2.5-7B-Instruct", DECODE, 20, 7, 10)
TRT = Engine("triton", "tensorrt_llm", TRITON, 30, 10, 5)
BIG = Engine("vllm", "big-405b", LEADER, 12, 4, 8)
MIS = Engine("sglang", "mistral-7b", MISTRAL, 25, 9, 6)
TINY_E = Engine("llamacpp", "tiny", TINY, 8, 8, 1)
ENGINES = (LLAMA, GUARD, QWEN_P, QWEN_D, TRT, BIG, MIS, TINY_E)


@dataclass(frozen=True)
class Model:
    """A served model: its engines and the processes whose energy its units cost."""

    namespace: str
    name: str
    engines: tuple[Engine, ...]
    processes: tuple[Process, ...]
    # In prefill/decode disaggregation both pods count a request.
    counts_requests_once: bool = True

    def units(self, unit: str) -> int:
        return sum(e.units()[unit] for e in self.engines)

    def where(self) -> str:
        return f'{{namespace="{self.namespace}", model="{self.name}"}}'


MODELS = (
    Model("chat", LLAMA.model, (LLAMA,), (LLAMA_0,)),
    Model("search", QWEN_P.model, (QWEN_P, QWEN_D), (PREFILL, DECODE), False),
    Model("rag", TRT.model, (TRT,), (TRITON,)),
    Model("lws", BIG.model, (BIG,), (LEADER, WORKER)),
    Model("", MIS.model, (MIS,), (MISTRAL,)),
)


def split_trace(path: Path) -> list[dict[str, Any]]:
    """The recorded trace with each sample's process as the nine processes; returns the
    samples (header dropped)."""
    lines = TRACE.read_text().splitlines()
    samples = [json.loads(line) for line in lines[1:]]
    for sample in samples:
        for gpu in sample["gpus"]:
            gpu["processes"] = [
                {
                    "pid": q.pid,
                    "used_memory_bytes": p["used_memory_bytes"],
                    "sm_util": None if p["sm_util"] is None else p["sm_util"] * q.weight // 4,
                    "identity": q.identity(),
                }
                for p in gpu["processes"]
                for q in PROCESSES
            ]
    path.write_text("\n".join([lines[0], *map(json.dumps, samples)]) + "\n")
    return samples


def policy_split(samples: list[dict[str, Any]], baseline: int) -> dict[int, float]:
    """Joules per pid after sample `baseline`, split as the README's default policy says:
    by SM utilization among the processes holding the GPU, equally when none has a
    sample above zero. The state of a sample applies to the interval ending at it."""
    out = {q.pid: 0.0 for q in PROCESSES}
    for before, after in zip(samples[baseline:], samples[baseline + 1 :], strict=False):
        gpu, prev = after["gpus"][0], before["gpus"][0]
        joules = (gpu["energy_mj"] - prev["energy_mj"]) / 1000
        holders = {p["pid"]: p["sm_util"] for p in gpu["processes"]}
        if not holders:
            continue
        weights = {pid: float(u) for pid, u in holders.items() if u}
        weights = weights or {pid: 1.0 for pid in holders}
        for pid, weight in weights.items():
            out[pid] += joules * weight / sum(weights.values())
    return out


# ---- the scrape configurations ------------------------------------------------------


def discovered(
    address: str, namespace: str, pod: str, labels: Any, port_name: str
) -> dict[str, Any]:
    """A static target with the meta labels Kubernetes pod discovery gives it."""
    host, _, port = address.rpartition(":")
    meta = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_ip": host,
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_node_name": "node-1",
        "__meta_kubernetes_pod_container_name": "main",
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
        "__meta_kubernetes_pod_annotation_prometheus_io_port": port,
    }
    for key, value in labels:
        meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    return {"targets": [address], "labels": meta}


# The prometheus-community chart's annotation-based job (charts/prometheus values.yaml).
KUBERNETES_PODS = [
    {
        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
        "action": "keep",
        "regex": "true",
    },
    {
        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
        "action": "replace",
        "target_label": "__metrics_path__",
        "regex": "(.+)",
    },
    {
        "source_labels": [
            "__meta_kubernetes_pod_annotation_prometheus_io_port",
            "__meta_kubernetes_pod_ip",
        ],
        "action": "replace",
        "regex": r"(\d+);((([0-9]+?)(\.|$)){4})",
        "replacement": "$2:$1",
        "target_label": "__address__",
    },
    {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
    {
        "source_labels": ["__meta_kubernetes_namespace"],
        "action": "replace",
        "target_label": "namespace",
    },
    {"source_labels": ["__meta_kubernetes_pod_name"], "action": "replace", "target_label": "pod"},
    {
        "source_labels": ["__meta_kubernetes_pod_phase"],
        "regex": "Pending|Succeeded|Failed|Completed",
        "action": "drop",
    },
    {
        "source_labels": ["__meta_kubernetes_pod_node_name"],
        "action": "replace",
        "target_label": "node",
    },
]


def doc_blocks() -> list[Any]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)]


def podmonitor_jobs(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """docs/inference.md's PodMonitor as the Prometheus Operator renders it: a job per
    endpoint, its pods kept by the selector and the port's name, namespace, pod and
    container and job labels set, then the endpoint's own relabelings."""
    (monitor,) = [b for b in doc_blocks() if isinstance(b, dict) and b.get("kind") == "PodMonitor"]
    meta, spec = monitor["metadata"], monitor["spec"]
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    jobs = []
    for i, endpoint in enumerate(spec["podMetricsEndpoints"]):
        relabel: list[dict[str, Any]] = [
            {
                "source_labels": [
                    "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)
                ],
                "regex": v,
                "action": "keep",
            }
            for k, v in spec["selector"]["matchLabels"].items()
        ]
        relabel += [
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": endpoint["port"],
                "action": "keep",
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container",
            },
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ]
        relabel += [
            {keys.get(k, k): v for k, v in r.items()} for r in endpoint.get("relabelings", [])
        ]
        jobs.append(
            {
                "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{i}",
                "metrics_path": endpoint.get("path", "/metrics"),
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "static_configs": targets,
                "relabel_configs": relabel,
            }
        )
    return jobs


def bare_metal_job() -> dict[str, Any]:
    """docs/inference.md's job for engines outside Kubernetes, its targets the fakes':
    mistral tagged by its workload, tiny (llama.cpp) forgotten (its model only)."""
    (config,) = [
        b
        for b in doc_blocks()
        if isinstance(b, dict)
        and "scrape_configs" in b
        and any(j["job_name"] == "llm-bare-metal" for j in b["scrape_configs"])
    ]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "llm-bare-metal"]
    job = dict(job)
    job["static_configs"] = [
        {"targets": [MIS.target], "labels": {"workload": MISTRAL.workload}},
        {"targets": [TINY_E.target], "labels": {"model": TINY_E.model}},
    ]
    return job


def engine_jobs() -> list[dict[str, Any]]:
    served = [
        discovered(e.target, e.process.namespace, e.process.pod, e.process.pod_labels, "http")
        for e in (LLAMA, GUARD)
    ]
    monitored = [
        discovered(
            e.target,
            e.process.namespace,
            e.process.pod,
            e.process.pod_labels,
            "metrics" if e is TRT else "http",
        )
        for e in (QWEN_P, QWEN_D, TRT, BIG)
    ]
    return [
        {
            "job_name": "kubernetes-pods",
            "static_configs": served,
            "relabel_configs": KUBERNETES_PODS,
        },
        # the vLLM production-stack's own ServiceMonitor scrapes the same pod
        {
            "job_name": "production-stack",
            "static_configs": [
                {
                    "targets": [LLAMA.target],
                    "labels": {
                        "namespace": LLAMA_0.namespace,
                        "pod": LLAMA_0.pod,
                        "service": "vllm-router",
                    },
                }
            ],
        },
        *podmonitor_jobs(monitored),
        bare_metal_job(),
    ]


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


def wait_until(
    check: Callable[[], Any], timeout: float, what: str, seen: Callable[[], Any] = lambda: ""
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what} {seen()}"
        time.sleep(0.1)


@dataclass
class Run:
    stores: dict[str, Store]
    samples: list[dict[str, Any]]
    serving: tuple[float, float]  # when the engines served (wall time)

    @property
    def prom(self) -> Store:
        return self.stores["prometheus"]

    def energy(self) -> dict[int, float]:
        """Each process's joules as the policy splits the trace, from the sample the
        exporter started at."""
        device = self.prom.value("wattprint_gpu_energy_joules_total")
        gpu = [sample["gpus"][0] for sample in self.samples]
        return policy_split(self.samples, baseline_sample(gpu, device))

    def model_energy(self, model: Model) -> float:
        energy = self.energy()
        return sum(energy[q.pid] for q in model.processes)

    def grams_per_joule(self) -> float:
        signal = 'wattprint_grid_carbon_intensity_grams_per_kwh{signal="average"}'
        return self.prom.value(signal) * self.prom.value("wattprint_pue_ratio") / 3.6e6


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The exporter and the engines, scraped by a Prometheus (rules by itself) and by
    vmagent into a VictoriaMetrics (rules by vmalert), from the exporter's start on."""
    prometheus = require_tool("prometheus")
    vm_tools = {name: require_vm_tool(name) for name in ("victoria-metrics", "vmagent", "vmalert")}
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    tmp = tmp_path_factory.mktemp("e2e-inference")
    trace = tmp / "processes.jsonl"
    samples = split_trace(trace)
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
    done = threading.Event()
    for engine in ENGINES:
        engine.start()

    def tick() -> None:
        while not done.is_set():
            if serving.is_set():
                for engine in ENGINES:
                    engine.ticks += 1
            time.sleep(TICK)

    threading.Thread(target=tick, daemon=True).start()
    target = f"127.0.0.1:{free_port()}"
    exporter: subprocess.Popen[bytes] | None = None
    try:
        with ExitStack() as stack:
            # Prometheus reaches the exporter from 127.0.0.2, as a second host would: the
            # exporter gives each scraper its own first 0 of a new series (collector.py).
            relayed = stack.enter_context(relay(target))
            # Prometheus scrapes Wattprint through the kubernetes-pods job: the exporter
            # pod's namespace and pod push the workloads' aside (exported_*).
            wattprint_pod = discovered(
                relayed,
                "monitoring",
                "wattprint-x7k2p",
                (("app.kubernetes.io/name", "wattprint"),),
                "metrics",
            )
            jobs = engine_jobs()
            jobs[0] = jobs[0] | {"static_configs": [*jobs[0]["static_configs"], wattprint_pod]}
            config = {
                "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
                "rule_files": [str(p) for p in rule_files],
                "scrape_configs": jobs,
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
                    *engine_jobs(),
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
            # every engine target (2 + 1 + 4 + 2) up, and Wattprint's (not started yet)
            for store in stores.values():
                wait_until(
                    lambda s=store: len(s.query("up")) == 10 and len(s.query("up == 1")) == 9,
                    30,
                    f"{store.name}'s scrape of the exporter and the engines",
                    lambda s=store: [(r["metric"], r["value"][1]) for r in s.query("up")],
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

            def processes_running() -> bool:
                assert exporter is not None and exporter.poll() is None, "exporter died"
                return len(stores["prometheus"].query(f"{counter} > 0")) == len(PROCESSES)

            wait_until(processes_running, 30, "the replayed processes")
            # Serve while the processes hold the GPU, with idle time on both sides: it
            # is part of what a token costs.
            time.sleep(0.5)
            serving.set()
            began = time.time()
            left = length - (time.monotonic() - started) - 2.0
            assert left > 5, f"the replay ({length:.0f} s) is almost over: {left:.1f} s left"
            time.sleep(left)
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
            yield Run(stores, samples, (began, ended))
    finally:
        done.set()
        if exporter is not None:
            stop_process(exporter)
        for engine in ENGINES:
            engine.close()


STORES = ["prometheus", "victoriametrics"]
UNITS = ("tokens", "prompt_tokens", "generated_tokens", "requests")


def pick(result: list[dict[str, Any]], **labels: str) -> float:
    values = [
        float(r["value"][1])
        for r in result
        if all(r["metric"].get(k, "") == v for k, v in labels.items())
    ]
    assert len(values) == 1, f"{labels}: {result}"
    return values[0]


def test_the_processes_add_up_and_follow_the_policy(run: Run) -> None:
    want = run.energy()
    vm = run.stores["victoriametrics"]  # scraped without target labels: the workloads' own
    found = vm.query("sum by (pod, workload) (wattprint_workload_energy_joules_total)")
    got = {q.pid: pick(found, pod=q.pod, workload=q.workload) for q in PROCESSES}
    device = vm.value("wattprint_gpu_energy_joules_total")
    unattributed = vm.value('sum(wattprint_unattributed_energy_joules_total{component="gpu"})')
    assert sum(got.values()) + unattributed == pytest.approx(device, rel=1e-6)
    for pid, joules in got.items():
        assert joules == pytest.approx(want[pid], rel=0.01), pid
    # Prometheus scraped the exporter through the kubernetes-pods job: the workload's
    # labels were pushed aside, as in the setup the join must survive.
    moved = run.prom.query('wattprint_workload_energy_joules_total{exported_pod="vllm-llama-0"}')
    assert moved and {r["metric"]["pod"] for r in moved} == {"wattprint-x7k2p"}


@pytest.mark.parametrize("store", STORES)
def test_energy_and_carbon_per_unit_of_every_model(run: Run, store: str) -> None:
    db, per_joule = run.stores[store], run.grams_per_joule()
    ratio = "namespace_model:wattprint_{}_per_{}:ratio_increase1h"
    for model in MODELS:
        energy = run.model_energy(model)
        assert model.units("tokens") > 1000 and model.units("requests") > 10, model.name
        for unit in UNITS:
            if unit == "requests" and not model.counts_requests_once:
                continue
            got = db.value(ratio.format("joules", unit) + model.where())
            want = energy / model.units(unit)
            assert got == pytest.approx(want, rel=0.01), (model.name, unit)
        grams = db.value(ratio.format("sci_grams", "tokens") + model.where())
        assert grams == pytest.approx(energy * per_joule / model.units("tokens"), rel=0.01)
    # An engine whose scrape names neither pod nor workload joins nothing: no figure,
    # rather than every unlabelled workload's energy over its tokens.
    for unit in UNITS:
        assert db.query(ratio.format("joules", unit) + '{model="tiny"}') == []
    found = db.query("namespace_model:wattprint_joules_per_tokens:ratio_increase1h")
    assert {(r["metric"].get("namespace", ""), r["metric"]["model"]) for r in found} == {
        (m.namespace, m.name) for m in MODELS
    }


@pytest.mark.parametrize("store", STORES)
def test_what_did_not_join_is_recorded(run: Run, store: str) -> None:
    db, energy = run.stores[store], run.energy()
    units = "namespace_pod_model:wattprint_functional_units_tokens"
    orphans = db.query(f"{units}_without_energy:increase1h > 0")
    assert [r["metric"].get("model") for r in orphans] == ["tiny"]
    assert float(orphans[0]["value"][1]) == pytest.approx(TINY_E.units()["tokens"], rel=0.01)
    idle = db.query("namespace_pod:wattprint_workload_energy_joules_without_tokens:increase1h")
    assert pick(idle, namespace="chat", pod=GUARD_0.pod) == pytest.approx(
        energy[GUARD_0.pid], rel=0.01
    )
    twice = db.query(f"{units}_scrape_jobs:count5m")
    assert [(r["metric"]["pod"], float(r["value"][1])) for r in twice] == [(LLAMA_0.pod, 2.0)]
    # The alert's expression names the model whose join is empty (it fires after 15m).
    (alert,) = [
        a
        for g in sci.alerts(sci.load_units(PRESETS))["groups"]
        for a in g["rules"]
        if a["labels"]["unit"] == "tokens"
    ]
    firing = db.query(alert["expr"])
    assert [r["metric"].get("model") for r in firing] == ["tiny"]


def test_idle_time_between_requests_is_part_of_the_cost(run: Run) -> None:
    """The pod held the GPU before and after its engine served: that energy is in its
    model's joules per token, as the SCI asks, not left out."""
    vm, energy = run.stores["victoriametrics"], run.energy()
    counter = f'sum(wattprint_workload_energy_joules_total{{pod="{LLAMA_0.pod}"}})'
    began, ended = (float(vm.query(counter, at)[0]["value"][1]) for at in run.serving)
    busy = ended - began
    idle = energy[LLAMA_0.pid] - busy
    assert idle > 0.1 * energy[LLAMA_0.pid]
    tokens = LLAMA.units()["tokens"]
    per_token = run.prom.value(
        "namespace_model:wattprint_joules_per_tokens:ratio_increase1h" + MODELS[0].where()
    )
    assert per_token == pytest.approx((busy + idle) / tokens, rel=0.01)
    assert per_token > 1.05 * busy / tokens


@pytest.mark.parametrize("store", STORES)
def test_every_inference_panel_agrees_with_the_trace(run: Run, store: str) -> None:
    db = run.stores[store]
    board = load(REPO / "dashboards" / "inference.json")
    values = {"datasource": "", "node": ".*", "namespace": ".*", "workload": "", "model": ".*"}
    values |= {"__rate_interval": "1s", "__range": "1h", "__range_s": "3600"}
    energy, per_joule = run.energy(), run.grams_per_joule()
    now = time.time()
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for panel, target in targets(board):
        expr = substitute(target["expr"], values)
        if target.get("instant"):
            seen[(panel["title"], target["refId"])] = db.query(expr, now)
            continue
        # The last point of each series: the rate5m rules' window then spans the run.
        seen[(panel["title"], target["refId"])] = db.last_points(expr, now)
    checks: dict[tuple[str, str], Callable[[Model, float], float]] = {
        ("Energy per token by model", "A"): lambda m, e: e / m.units("tokens"),
        ("Energy per token by model", "B"): lambda m, e: e / m.units("generated_tokens"),
        ("gCO2e per 1,000 tokens by model", "A"): lambda m, e: (
            1000 * e * per_joule / m.units("tokens")
        ),
        ("Tokens per second by model", "A"): lambda m, e: m.units("tokens") / 300,  # a 5 m rate
        ("Energy per request by model", "A"): lambda m, e: e / m.units("requests"),
        ("SCI, gCO2e per 1,000 tokens (last hour)", "A"): lambda m, e: (
            1000 * e * per_joule / m.units("tokens")
        ),
        ("SCI, gCO2e per request (last hour)", "A"): lambda m, e: (
            e * per_joule / m.units("requests")
        ),
    }
    for m in MODELS:
        labels = {"namespace": m.namespace, "model": m.name}
        for key, want in checks.items():
            if "request" in key[0] and not m.counts_requests_once:
                continue
            got = pick(seen[key], **labels)
            assert got == pytest.approx(want(m, run.model_energy(m)), rel=0.01), (key, m.name)
    # No embodied figure for the replayed H200: the embodied share is 0, per namespace.
    share = seen[("Embodied share (last hour)", "A")]
    assert {r["metric"].get("namespace", ""): float(r["value"][1]) for r in share} == {
        m.namespace: 0 for m in MODELS
    }
    # The power panel shows exactly the serving pods and workloads, tiny's host not.
    power = seen[("Power of the serving pods", "A")]
    shown = sorted(r["metric"].get("pod") or r["metric"]["workload"] for r in power)
    assert shown == sorted(
        [
            "vllm-llama-0",
            "vllm-guard-0",
            "qwen-prefill-0",
            "qwen-decode-0",
            "trt-0",
            "big",
            "mistral-bm",
        ]
    )
    orphans = seen[("Tokens that joined no energy (last hour)", "A")]
    assert pick(orphans, model="tiny") == pytest.approx(TINY_E.units()["tokens"], rel=0.01)
    idle = seen[("Energy with no tokens (last hour)", "A")]
    assert pick(idle, pod=GUARD_0.pod) == pytest.approx(energy[GUARD_0.pid], rel=0.01)
    assert pick(seen[("Engines scraped by several jobs", "A")], pod=LLAMA_0.pod) == 2
    covered = {
        "Embodied share (last hour)",
        "Power of the serving pods",
        "Tokens that joined no energy (last hour)",
        "Energy with no tokens (last hour)",
        "Engines scraped by several jobs",
    }
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


@pytest.mark.parametrize("store", STORES)
def test_report_per_unit_per_model(run: Run, store: str) -> None:
    db, per_joule = run.stores[store], run.grams_per_joule()
    result = report(db, "--per=tokens", "--format=json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = {(r["namespace"], r["model"]): r for r in doc["models"]}
    assert set(rows) == {(m.namespace, m.name) for m in MODELS}  # tiny joins nothing
    (tiny,) = doc["unjoined"]  # and the report says so
    assert (tiny["model"], tiny["tokens"]) == ("tiny", TINY_E.units()["tokens"])
    for m in MODELS:
        row, energy = rows[(m.namespace, m.name)], run.model_energy(m)
        assert row["tokens"] == m.units("tokens")  # every token, from the raw samples
        assert row["energy_j"] == pytest.approx(energy, rel=0.01), m.name
        assert row["embodied_g"] == 0
        want = energy * per_joule / m.units("tokens")
        assert row["sci_g_per_tokens"] == pytest.approx(want, rel=0.01)
    per_request = json.loads(report(db, "--per=requests", "--format=json").stdout)["models"]
    for r in per_request:
        (m,) = [m for m in MODELS if (m.namespace, m.name) == (r["namespace"], r["model"])]
        if m.counts_requests_once:
            assert r["requests"] == m.units("requests")
