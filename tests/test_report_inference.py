"""`wattprint report --per=tokens` with the shipped engine presets, on a backfilled
two-hour history in a Prometheus (promtool blocks) and a VictoriaMetrics (import API):
one row per namespace and model; a pod serving two models shares its energy by their
tokens, so the models add up to the pod; an engine restart (its counters back to 0)
loses no token; a pod whose engine served nothing is on no row; an explicit range
counts only what was drawn and served inside it. Engines joined by workload: one
outside Kubernetes (its workload's energy, not the training job's beside it) and a
two-pod engine (both pods' energy); an engine whose series name no pod and no workload
is in no figure and listed as unjoined."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import require_tool
from prom_harness import import_openmetrics, require_vm_tool, run_prometheus, run_victoriametrics

REPO = Path(__file__).resolve().parent.parent
PRESETS = REPO / "rules" / "inference-units.yaml"
SCRAPE = 15
END = 2 * 3600
RESTART = 3600  # the vLLM engine restarts after this scrape: its counters start over
INTENSITY, PUE = 400.0, 1.25
GRAMS_PER_JOULE = INTENSITY / 3.6e6 * PUE
# pod -> (namespace, watts, embodied g/s)
PODS = {
    "chat-0": ("llm", 300.0, 0.002),
    "trt-0": ("rag", 200.0, 0.0),
    "idle-0": ("llm", 100.0, 0.0),
}
# (pod, metric, labels, tokens per scrape)
ENGINE = [
    ("chat-0", "vllm:prompt_tokens_total", 'model_name="llama",engine="0"', 30),
    ("chat-0", "vllm:generation_tokens_total", 'model_name="llama",engine="0"', 10),
    ("trt-0", "nv_llm_input_token_len_sum", 'model="a",version="1"', 5),
    ("trt-0", "nv_llm_output_token_len_sum", 'model="b",version="1"', 15),
    ("idle-0", "vllm:generation_tokens_total", 'model_name="x",engine="0"', 0),
]

HOSTS = {"mistral-bm": 250.0, "train": 1000.0}  # workload -> watts, outside Kubernetes
# (metric, labels, tokens per scrape) of engines joined by workload, or by nothing
AWAY = [
    (
        "sglang:generation_tokens_total",
        'model_name="mistral",workload="mistral-bm",instance="h:1"',
        6,
    ),
    (
        "vllm:generation_tokens_total",
        'model_name="big",namespace="lws",pod="big-0",workload="big",instance="l:1"',
        8,
    ),
    ("llamacpp:tokens_predicted_total", 'model="tiny",instance="h:2"', 3),
]


def history(t0: int) -> str:
    times = range(0, END + 1, SCRAPE)
    node = 'instance="n1:9950",job="wattprint"'
    families: dict[str, tuple[str, list[str]]] = {}

    def add(name: str, labels: str, value: float, t: int) -> None:
        family = name.removesuffix("_total")
        # A histogram's _sum alone: OpenMetrics calls a family it cannot type unknown.
        kind = "counter" if name.endswith("_total") else "unknown" if "_sum" in name else "gauge"
        families.setdefault(family, (kind, []))[1].append(f"{name}{{{labels}}} {value!r} {t0 + t}")

    for pod, (namespace, watts, embodied) in PODS.items():
        who = f'{node},component="gpu",gpu="0",scheduler="kubernetes",namespace="{namespace}"'
        who += f',workload="{pod.split("-")[0]}",pod="{pod}"'
        # Its share of the rest of the server (the node reads its input): at the wall,
        # never in a figure per unit, which counts the chips as the budgets do.
        platform = who.replace('component="gpu",gpu="0"', 'component="platform"')
        for t in times:
            add("wattprint_workload_energy_joules_total", who, watts * t, t)
            add("wattprint_workload_emissions_grams_total", who, watts * t * GRAMS_PER_JOULE, t)
            add("wattprint_workload_energy_joules_total", platform, watts / 2 * t, t)
            add(
                "wattprint_workload_emissions_grams_total",
                platform,
                watts / 2 * t * GRAMS_PER_JOULE,
                t,
            )
            if embodied:
                add("wattprint_workload_embodied_grams_total", who, embodied * t, t)
    zone = f'{node},zone="DE",provider="static",signal="average"'
    method = f'{node},component="gpu",device="0",method="nvml_energy_counter"'
    for t in times:
        add("wattprint_gpu_energy_joules_total", f'{node},gpu="0",uuid="GPU-0"', 700.0 * t, t)
        add("wattprint_pue_ratio", node, PUE, t)
        add("wattprint_grid_carbon_intensity_grams_per_kwh", zone, INTENSITY, t)
        add("wattprint_measurement_info", method, 1.0, t)
    # Outside Kubernetes: an engine's workload and a training job beside it; and a
    # two-pod engine (LeaderWorkerSet) whose pods the exporter names by one workload.
    for workload, watts in HOSTS.items():
        who = f'{node},component="gpu",gpu="0",scheduler="env",workload="{workload}"'
        for t in times:
            add("wattprint_workload_energy_joules_total", who, watts * t, t)
            add("wattprint_workload_emissions_grams_total", who, watts * t * GRAMS_PER_JOULE, t)
    for pod in ("big-0", "big-0-1"):
        who = f'{node},component="gpu",gpu="1",scheduler="kubernetes",namespace="lws"'
        who += f',workload="big",pod="{pod}"'
        for t in times:
            add("wattprint_workload_energy_joules_total", who, 150.0 * t, t)
            add("wattprint_workload_emissions_grams_total", who, 150.0 * t * GRAMS_PER_JOULE, t)
    for metric, labels, per_scrape in AWAY:
        for t in times:
            add(metric, f'{labels},job="engines"', float(t // SCRAPE * per_scrape), t)
    for pod, metric, labels, per_scrape in ENGINE:
        where = f'{labels},job="engines",instance="{pod}:8000",namespace="{PODS[pod][0]}"'
        for t in times:
            # The vLLM engine restarts: its counters start over from 0.
            n = t // SCRAPE if pod != "chat-0" or t <= RESTART else (t - RESTART) // SCRAPE - 1
            add(metric, f'{where},pod="{pod}"', float(n * per_scrape), t)
    out: list[str] = []
    for family, (kind, lines) in sorted(families.items()):
        out += [f"# TYPE {family} {kind}", *lines]
    return "\n".join([*out, "# EOF"]) + "\n"


@pytest.fixture(scope="module", params=["prometheus", "victoriametrics"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    tmp = tmp_path_factory.mktemp("inference-report")
    t0 = (int(time.time()) // 60) * 60 - 3 * 3600
    source = tmp / "history.om"
    source.write_text(history(t0))
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


def report(url: str, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattprint",
            "report",
            f"--prometheus.url={url}",
            f"--units={PRESETS}",
            "--format=json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def rows(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["namespace"], r["model"]): r for r in doc["models"]}


def test_whole_life_per_model(store: tuple[str, int]) -> None:
    url, _ = store
    doc = report(url, "--per=tokens")
    found = rows(doc)
    assert set(found) == {
        ("llm", "llama"),
        ("rag", "a"),
        ("rag", "b"),
        ("", "mistral"),
        ("lws", "big"),
    }
    scrapes = END // SCRAPE
    # llama: every token, the restart's included (the first scrape after it reads 0)
    llama = found[("llm", "llama")]
    assert llama["tokens"] == (scrapes - 1) * 40
    assert llama["energy_j"] == pytest.approx(300.0 * END, rel=1e-6)
    assert llama["operational_g"] == pytest.approx(300.0 * END * GRAMS_PER_JOULE, rel=1e-6)
    assert llama["embodied_g"] == pytest.approx(0.002 * END, rel=1e-6)
    want = (300.0 * END * GRAMS_PER_JOULE + 0.002 * END) / llama["tokens"]
    assert llama["sci_g_per_tokens"] == pytest.approx(want, rel=1e-6)
    # trt-0's energy, shared 1:3 by tokens between its two models: they add up to it
    a, b = found[("rag", "a")], found[("rag", "b")]
    assert (a["tokens"], b["tokens"]) == (scrapes * 5, scrapes * 15)
    assert a["energy_j"] == pytest.approx(200.0 * END / 4, rel=1e-6)
    assert a["energy_j"] + b["energy_j"] == pytest.approx(200.0 * END, rel=1e-6)
    assert a["sci_g_per_tokens"] == pytest.approx(b["sci_g_per_tokens"], rel=1e-9)
    # by workload: the engine's own workload outside Kubernetes (not the training job
    # beside it), both pods of the two-pod engine
    assert found[("", "mistral")]["energy_j"] == pytest.approx(250.0 * END, rel=1e-6)
    assert found[("", "mistral")]["tokens"] == scrapes * 6
    assert found[("lws", "big")]["energy_j"] == pytest.approx(2 * 150.0 * END, rel=1e-6)
    # an engine whose series name no pod and no workload: in no figure, and said so
    assert doc["unjoined"] == [
        {
            "namespace": "",
            "model": "tiny",
            "tokens": scrapes * 3,
            "why": "its series name no pod and no workload",
        }
    ]


def test_an_explicit_range_per_generated_token(store: tuple[str, int]) -> None:
    url, t0 = store
    since, until = t0 + 1800, t0 + 5400  # the restart is inside
    found = rows(report(url, "--per=generated_tokens", f"--since={since}", f"--until={until}"))
    llama = found[("llm", "llama")]
    assert llama["generated_tokens"] == (3600 // SCRAPE - 1) * 10
    assert llama["energy_j"] == pytest.approx(300.0 * 3600, rel=1e-6)
    assert ("rag", "a") not in found  # a's counter is prompt tokens only
    assert found[("rag", "b")]["energy_j"] == pytest.approx(200.0 * 3600, rel=1e-6)
    only = report(url, "--per=generated_tokens", "--namespace=rag")
    assert set(rows(only)) == {("rag", "b")}
    # the other namespaces' tokens are left out, not called unjoined
    assert [u["model"] for u in only["unjoined"]] == ["tiny"]
