"""The shipped engine presets joined to Wattprint's energy in the setups people run,
checked with promtool on the generated rules: each case joins right or is recorded as
what did not join, never a wrong figure.

- Wattprint scraped by a job that adds namespace/pod target labels (exported_*);
- Triton's own `model` label moved to exported_model by a scrape's `model` label;
- an engine scraped by two jobs (counted once);
- a two-pod engine (LeaderWorkerSet) joined by the workload both pods share;
- vLLM prefill/decode disaggregation (computed prompt tokens only) and an older vLLM
  without the by-source counter;
- an engine outside Kubernetes joined by workload, and one with no key (no figure);
- an engine that counts at request end: its energy in a window without tokens;
- two clusters with one pod name (never merged).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import require_tool
from wattprint.report import sci

REPO = Path(__file__).resolve().parent.parent
PRESETS = REPO / "rules" / "inference-units.yaml"
ENERGY = "wattprint_workload_energy_joules_total"
EMISSIONS = "wattprint_workload_emissions_grams_total"


def series(metric: str, per_minute: float | str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    values = per_minute if isinstance(per_minute, str) else f"0+{per_minute}x60"
    return {"series": f"{metric}{{{inner}}}", "values": values}


def wattprint(joules: float, **labels: str) -> list[dict[str, str]]:
    """A workload's energy and grams (1 g per 1000 J) as the exporter serves them."""
    scheduler = "kubernetes" if "pod" in labels else "env"
    who = {"instance": "node-1", "job": "wattprint", "component": "gpu", "gpu": "0"}
    who |= {"scheduler": scheduler} | labels
    return [series(ENERGY, joules, **who), series(EMISSIONS, joules / 1000, **who)]


def engine(metric: str, per_minute: float | str, **labels: str) -> dict[str, str]:
    return series(metric, per_minute, **({"job": "engines", "instance": "e:8000"} | labels))


VLLM_PROMPT = "vllm:prompt_tokens_by_source_total"
VLLM_GEN = "vllm:generation_tokens_total"


def inputs() -> list[dict[str, str]]:
    chat = {"namespace": "llm", "pod": "chat-0", "model_name": "llama", "engine": "0"}
    lws = {"namespace": "lws", "pod": "big-0", "workload": "big", "model_name": "big"}
    return [
        # 1, 3: Wattprint scraped by a kubernetes-pods job, the engine by two jobs
        *wattprint(
            1200,
            namespace="monitoring",
            pod="wattprint-x",
            exported_namespace="llm",
            exported_pod="chat-0",
            workload="chat",
        ),
        *[
            engine(VLLM_PROMPT, 300, source="local_compute", job=job, **chat)
            for job in ("llm/podmonitor", "production-stack")
        ],
        *[engine(VLLM_GEN, 100, job=job, **chat) for job in ("llm/podmonitor", "production-stack")],
        # 2: Triton, its model label moved aside by the scrape's
        *wattprint(800, namespace="rag", pod="trt-0", workload="trt"),
        *[
            engine(metric, n, namespace="rag", pod="trt-0", model="rel", exported_model=m)
            for metric, n, m in (
                ("nv_llm_output_token_len_sum", 200, "tensorrt_llm"),
                ("nv_inference_request_success", 4, "tensorrt_llm"),
                ("nv_inference_request_success", 4, "ensemble"),
            )
        ],
        # 4: a LeaderWorkerSet: two pods of workload big, the leader counts
        *wattprint(600, namespace="lws", pod="big-0", workload="big"),
        *wattprint(600, namespace="lws", pod="big-0-1", workload="big"),
        engine(VLLM_PROMPT, 200, source="local_compute", **lws),
        engine(VLLM_GEN, 100, **lws),
        # 5: prefill/decode: the decode pod received the prompt, computed none of it
        *wattprint(500, namespace="pd", pod="prefill-0", workload="pd"),
        *wattprint(500, namespace="pd", pod="decode-0", workload="pd"),
        engine(
            VLLM_PROMPT,
            400,
            source="local_compute",
            namespace="pd",
            pod="prefill-0",
            model_name="qwen",
            instance="p:8000",
        ),
        engine(
            "vllm:prompt_tokens_total",
            400,
            namespace="pd",
            pod="prefill-0",
            model_name="qwen",
            instance="p:8000",
        ),
        engine(
            VLLM_PROMPT,
            0,
            source="local_compute",
            namespace="pd",
            pod="decode-0",
            model_name="qwen",
            instance="d:8000",
        ),
        engine(
            VLLM_PROMPT,
            400,
            source="external_kv_transfer",
            namespace="pd",
            pod="decode-0",
            model_name="qwen",
            instance="d:8000",
        ),
        engine(
            "vllm:prompt_tokens_total",
            400,
            namespace="pd",
            pod="decode-0",
            model_name="qwen",
            instance="d:8000",
        ),
        engine(VLLM_GEN, 100, namespace="pd", pod="decode-0", model_name="qwen", instance="d:8000"),
        # an older vLLM: no by-source counter, its prompt_tokens counts
        *wattprint(300, namespace="old", pod="old-0", workload="old"),
        engine(
            "vllm:prompt_tokens_total",
            200,
            namespace="old",
            pod="old-0",
            model_name="o",
            instance="o:8000",
        ),
        engine(VLLM_GEN, 100, namespace="old", pod="old-0", model_name="o", instance="o:8000"),
        # 7: bare metal: an engine tagged by workload, a training job, an untagged engine
        *wattprint(900, workload="mistral-bm"),
        *wattprint(5000, workload="train"),
        engine(
            "sglang:prompt_tokens_total",
            150,
            workload="mistral-bm",
            model_name="mistral",
            instance="h:30000",
        ),
        engine(
            "sglang:generation_tokens_total",
            150,
            workload="mistral-bm",
            model_name="mistral",
            instance="h:30000",
        ),
        engine("llamacpp:tokens_predicted_total", 100, model="tiny", instance="h:8080"),
        # outside Kubernetes on a node whose exporter a kubernetes-pods job scrapes: the
        # exporter pod's target labels are not the workload's
        *wattprint(700, workload="bm2", scheduler="env", namespace="monitoring", pod="wp-x"),
        engine(VLLM_GEN, 70, workload="bm2", model_name="bm2", instance="h:8001"),
        # two clusters, one pod name: never merged
        *wattprint(1200, namespace="mc", pod="p-0", workload="p", cluster="a"),
        *wattprint(600, namespace="mc", pod="p-0", workload="p", cluster="b"),
        *[
            engine(VLLM_GEN, 400, namespace="mc", pod="p-0", model_name="m", cluster=c)
            for c in ("a", "b")
        ],
        # an engine whose pod Wattprint never saw
        engine(VLLM_GEN, 50, namespace="llm", pod="ghost-0", model_name="ghost", instance="g:8000"),
        # 6: counts at request end: nothing in the last 10 minutes, energy all along
        *wattprint(400, namespace="tgi", pod="tgi-0", workload="tgi"),
        engine(
            "tgi_request_generated_tokens_sum",
            "0+100x50 5000x10",
            namespace="tgi",
            pod="tgi-0",
            model="t5",
        ),
    ]


def case(expr: str, want: dict[str, float]) -> dict[str, Any]:
    """The series of `expr` at 60m, each as {labels: value} (rounded to 1e-6)."""
    return {
        "expr": f"round(({expr}) * 1e6)",
        "eval_time": "60m",
        "exp_samples": [{"labels": k, "value": round(v * 1e6)} for k, v in want.items()],
    }


def test_every_setup_joins_right_or_is_recorded_as_unjoined(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    rules = tmp_path / "inference.rules.yml"
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_sci_rules.py"), str(PRESETS), "-o", str(rules)],
        check=True,
    )
    ratio = "namespace_model:wattprint_joules_per_tokens:ratio_increase1h"
    units = "namespace_pod_model:wattprint_functional_units_tokens"
    checks = [
        case(
            ratio,
            {
                '{namespace="llm", model="llama"}': 1200 / 400,  # counted once, exported_*
                '{namespace="rag", model="tensorrt_llm"}': 800 / 200,  # Triton's own name
                '{namespace="lws", model="big"}': 1200 / 300,  # both pods' energy
                '{namespace="pd", model="qwen"}': 1000 / 500,  # the prompt counted once
                '{namespace="old", model="o"}': 300 / 300,
                '{model="mistral"}': 900 / 300,  # its workload's energy only
                '{model="bm2"}': 700 / 70,
                '{cluster="a", namespace="mc", model="m"}': 1200 / 400,
                '{cluster="b", namespace="mc", model="m"}': 600 / 400,
                '{namespace="tgi", model="t5"}': 400 * 60 / 5000,
                # no series for tiny (no key) nor ghost (no energy)
            },
        ),
        # the decode pod computed no prompt token: its energy still costs the model's
        case(
            'namespace_model:wattprint_joules_per_prompt_tokens:ratio_increase1h{namespace="pd"}',
            {'{namespace="pd", model="qwen"}': 1000 / 400},
        ),
        case(
            "namespace_model:wattprint_joules_per_requests:ratio_increase1h",
            {'{namespace="rag", model="tensorrt_llm"}': 800 / 4},  # not the ensemble
        ),
        case(
            'namespace_model:wattprint_sci_grams_per_tokens:ratio_increase1h{namespace="lws"}',
            {'{namespace="lws", model="big"}': 1.2 / 300},
        ),
        case(
            f"{units}_without_energy:increase1h",
            {
                '{model="tiny"}': 6000,
                '{namespace="llm", pod="ghost-0", model="ghost"}': 3000,
            },
        ),
        case(
            f"{units}_scrape_jobs:count5m",
            {'{namespace="llm", pod="chat-0", model="llama"}': 2},
        ),
        # the request-end engine counted nothing in the last 5 minutes: its pod's energy
        # then is recorded, not dropped silently
        case(
            "namespace_pod:wattprint_workload_energy_joules_without_tokens:increase5m",
            {'{namespace="tgi", pod="tgi-0"}': 2000},
        ),
        case(
            'ALERTS{alertname="WattprintServingJoinEmpty", unit="tokens", alertstate="firing"}',
            {
                '{alertname="WattprintServingJoinEmpty", alertstate="firing", '
                'severity="warning", unit="tokens", model="tiny"}': 1,
                '{alertname="WattprintServingJoinEmpty", alertstate="firing", '
                'severity="warning", unit="tokens", namespace="llm", model="ghost"}': 1,
            },
        ),
    ]
    path = tmp_path / "join.test.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(rules)],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": inputs(), "promql_expr_test": checks}],
            }
        )
    )
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("counter", "message"),
    [
        ({"metric": "a", "fallback": "b c"}, "fallback 'b c' is not a Prometheus metric name"),
        ({"metric": ["a", "b"], "fallback": "c"}, "a fallback stands in for one metric"),
        ({"metric": "a", "labels": {"pod": "pod", "workload": "w"}}, "maps namespace and pod"),
    ],
)
def test_bad_serving_counters_are_one_clear_line(counter: dict[str, Any], message: str) -> None:
    entry = {"labels": {"namespace": "namespace", "pod": "pod"}} | counter
    with pytest.raises(sci.UnitError, match=message):
        sci.parse_units({"units": [{"name": "tokens", "counters": [entry]}]})


def test_a_serving_counter_may_join_by_workload_and_fall_back() -> None:
    labels = {"namespace": "namespace", "pod": "pod", "workload": "workload"}
    entry = {"metric": "a_total", "fallback": "b_total", "labels": labels}
    (unit,) = sci.parse_units({"units": [{"name": "tokens", "counters": [entry]}]})
    assert unit.per_pod and unit.counters[0].fallback == "b_total"
    assert dict(unit.counters[0].labels)["workload"] == "workload"
