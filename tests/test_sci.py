"""Carbon per unit of work: functional units as data, the rules the generator makes
from them (checked and evaluated by promtool), and their one-line errors."""

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
EXAMPLE = REPO / "rules" / "sci-units.example.yaml"
GEN = REPO / "tools" / "gen_sci_rules.py"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args], capture_output=True, text=True, check=False
    )


def generate(tmp_path: Path, units: Path = EXAMPLE) -> Path:
    out = tmp_path / "sci.rules.yml"
    result = subprocess.run(
        [sys.executable, str(GEN), str(units), "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return out


def test_example_units_generate_rules_promtool_accepts(tmp_path: Path) -> None:
    rules = generate(tmp_path)
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    records = [r["record"] for r in yaml.safe_load(rules.read_text())["groups"][0]["rules"]]
    assert "namespace_workload:wattprint_sci_grams_per_tokens:ratio_increase1h" in records
    assert "namespace_workload:wattprint_joules_per_steps:ratio_rate5m" in records
    assert len(records) == 2 * 2 * 3  # units x windows x (units, grams, joules)


WATTPRINT = 'component="{c}",gpu="0",scheduler="{s}",namespace="{ns}",workload="{w}",pod="p"'


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    inner = (
        WATTPRINT.format(**labels)
        if "c" in labels
        else ",".join(f'{k}="{v}"' for k, v in labels.items())
    )
    return {"series": f"{metric}{{{inner}}}", "values": values}


def case(record: str, namespace: str, workload: str, value: float) -> dict[str, Any]:
    """The workload's series of the rule at 60m has this value (to 1e-6)."""
    labels = (
        f'namespace="{namespace}",workload="{workload}"' if namespace else f'workload="{workload}"'
    )
    return {
        "expr": f'round(namespace_workload:wattprint_{record}{{workload="{workload}"}} * 1e6)',
        "eval_time": "60m",
        "exp_samples": [{"labels": f"{{{labels}}}", "value": round(value * 1e6)}],
    }


def test_generated_rules_compute_sci_per_unit(tmp_path: Path) -> None:
    rules = generate(tmp_path)
    k8s = {"s": "kubernetes", "ns": "llm", "w": "chat"}
    slurm = {"s": "slurm", "ns": "", "w": "train"}
    tests: list[dict[str, Any]] = [
        {
            "interval": "1m",
            "input_series": [
                # chat: 6000 tokens an hour, 180 + 60 g operational, 36 g embodied, 60 kJ
                series(
                    "vllm:generation_tokens_total",
                    "0+100x60",
                    app="chat",
                    namespace="llm",
                    instance="a",
                ),
                series("wattprint_workload_emissions_grams_total", "0+3x60", c="gpu", **k8s),
                series("wattprint_workload_emissions_grams_total", "0+1x60", c="cpu", **k8s),
                series("wattprint_workload_embodied_grams_total", "0+0.6x60", c="gpu", **k8s),
                series("wattprint_workload_energy_joules_total", "0+1000x60", c="gpu", **k8s),
                # train: a Slurm job on hardware without an embodied figure; its step
                # counter's scrape added a namespace it must not keep
                series("train_steps_total", "0+10x60", slurm_job_name="train", namespace="ops"),
                series("wattprint_workload_emissions_grams_total", "0+2x60", c="gpu", **slurm),
                series("wattprint_workload_energy_joules_total", "0+50x60", c="gpu", **slurm),
                # a workload that served no units gets no SCI rather than +Inf
                series("vllm:generation_tokens_total", "0x60", app="idle", namespace="llm"),
                series(
                    "wattprint_workload_emissions_grams_total",
                    "0+5x60",
                    c="gpu",
                    s="kubernetes",
                    ns="llm",
                    w="idle",
                ),
            ],
            "promql_expr_test": [
                # micro-units, rounded: the same sums in another order differ in the
                # last bit of a float
                case(
                    "sci_grams_per_tokens:ratio_increase1h", "llm", "chat", (180 + 60 + 36) / 6000
                ),
                case("sci_grams_per_tokens:ratio_rate5m", "llm", "chat", (3 + 1 + 0.6) / 100),
                case("joules_per_tokens:ratio_increase1h", "llm", "chat", 10),
                case("joules_per_tokens:ratio_rate5m", "llm", "chat", 10),
                case("functional_units_tokens:increase1h", "llm", "chat", 6000),
                case("sci_grams_per_steps:ratio_increase1h", "", "train", 0.2),
                case("functional_units_steps:increase1h", "", "train", 600),
                {
                    "expr": "namespace_workload:wattprint_sci_grams_per_tokens:ratio_increase1h"
                    '{workload="idle"}',
                    "eval_time": "60m",
                    "exp_samples": [],
                },
            ],
        }
    ]
    path = tmp_path / "sci.test.yml"
    path.write_text(
        yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests})
    )
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "list under 'units'"),
        ({"units": [{"name": "Tokens", "metric": "x", "labels": {"workload": "a"}}]}, "lower case"),
        (
            {"units": [{"name": "t", "metric": "x y", "labels": {"workload": "a"}}]},
            "not a Prometheus metric",
        ),
        (
            {"units": [{"name": "t", "metric": "x", "labels": {"namespace": "ns"}}]},
            "at least workload",
        ),
        (
            {"units": [{"name": "t", "metric": "x", "labels": {"workload": "a", "node": "n"}}]},
            "'node' is not namespace, workload, pod or model",
        ),
        (
            {"units": [{"name": "t", "metric": "x", "labels": {"workload": "a", "pod": "p"}}]},
            "a pod join maps namespace and pod",
        ),
        (
            {"units": [{"name": "t", "metric": "x", "labels": {"pod": "p"}}]},
            "a pod join maps namespace and pod",
        ),
        (
            {"units": [{"name": "t", "metric": "x", "labels": {"workload": "a", "model": "m"}}]},
            "model is kept on per-pod units only",
        ),
        (
            {"units": [{"name": "t", "metric": ["x", "y z"], "labels": {"workload": "a"}}]},
            "'y z' is not a Prometheus metric",
        ),
        (
            {"units": [{"name": "t", "metric": "x", "counters": [], "labels": {"workload": "a"}}]},
            "either counters or",
        ),
        (
            {
                "units": [
                    {
                        "name": "t",
                        "counters": [
                            {"metric": "x", "labels": {"workload": "a"}},
                            {"metric": "y", "labels": {"namespace": "n", "pod": "p"}},
                        ],
                    }
                ]
            },
            "all join per pod or all per workload",
        ),
        (
            {"units": [{"name": "t", "metric": "x", "labels": {"workload": "a-b"}}]},
            "not a label name",
        ),
        (
            {
                "units": [
                    {"name": "t", "metric": "x", "labels": {"workload": "a"}, "matchers": '{a="b"}'}
                ]
            },
            "without braces",
        ),
        (
            {"units": [{"name": "t", "metric": "x", "labels": {"workload": "a"}, "per": 1}]},
            "unknown field",
        ),
        (
            {"units": [{"name": "t", "metric": "x", "labels": {"workload": "a"}}] * 2},
            "declared twice",
        ),
    ],
)
def test_bad_unit_data_is_one_clear_line(data: object, message: str) -> None:
    with pytest.raises(sci.UnitError, match=message):
        sci.parse_units(data)


def test_generator_names_the_file_and_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "units.yaml"
    bad.write_text("units:\n  - name: tokens\n    metric: vllm:generation_tokens_total\n")
    result = subprocess.run(
        [sys.executable, str(GEN), str(bad)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert f"{bad}: unit tokens: labels must map at least workload" in result.stderr


DUPLICATE = """units:
  - name: tokens
    metric: vllm:generation_tokens_total
    labels: {namespace: namespace, workload: app}
    metric: vllm:prompt_tokens_total
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (DUPLICATE, "is not valid YAML at line 5: key 'metric' is given twice"),
        ("units: &u [1]\nmore: *u\n", "is not valid YAML at line 2: aliases"),
        ("units: [\n", "is not valid YAML"),
    ],
)
def test_units_file_is_read_as_strictly_as_the_config(
    tmp_path: Path, text: str, message: str
) -> None:
    """A key given twice would silently count the last counter only: refused, one line,
    status 2, from the report and from the generator alike."""
    bad = tmp_path / "units.yaml"
    bad.write_text(text)
    with pytest.raises(sci.UnitError, match=f"^{bad} {message}"):
        sci.load_units(bad)
    for command in (
        [str(GEN), str(bad)],
        # (nothing listens on port 9: the file is refused before any query)
        [
            "-m",
            "wattprint",
            "report",
            "--prometheus.url=http://127.0.0.1:9",
            "--per=tokens",
            f"--units={bad}",
        ],
    ):
        result = subprocess.run(
            [sys.executable, *command], capture_output=True, text=True, check=False, timeout=60
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert f"{bad} {message}" in result.stderr


def test_sci_is_none_without_units() -> None:
    assert sci.sci(10.0, 2.0, 0.0) is None
    assert sci.sci(10.0, 2.0, 4.0) == 3.0


INFERENCE = REPO / "rules" / "inference-units.yaml"


def pod_series(metric: str, values: str, namespace: str, pod: str, **labels: str) -> dict[str, str]:
    """An engine's series as a scrape of its pod labels it, or a Wattprint pod series."""
    if metric.startswith("wattprint_"):
        labels = {"component": "gpu", "gpu": "0", "scheduler": "kubernetes", "workload": pod}
    inner = ",".join(
        f'{k}="{v}"' for k, v in {**labels, "namespace": namespace, "pod": pod}.items()
    )
    return {"series": f"{metric}{{{inner}}}", "values": values}


def model_case(record: str, labels: str, value: float) -> dict[str, Any]:
    return {
        "expr": f"round({record}{{{labels}}} * 1e6)",
        "eval_time": "60m",
        "exp_samples": [{"labels": f"{{{labels}}}", "value": round(value * 1e6)}],
    }


def test_inference_presets_give_energy_per_token_per_model(tmp_path: Path) -> None:
    """The shipped engine presets, per pod and model: a vLLM pod serving one model, a
    Triton pod serving two (its energy shared by their tokens), a TGI pod without a
    model label, and a pod that served nothing (no figure rather than +Inf)."""
    rules = generate(tmp_path, INFERENCE)
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    energy, emissions = (
        "wattprint_workload_energy_joules_total",
        "wattprint_workload_emissions_grams_total",
    )
    embodied = "wattprint_workload_embodied_grams_total"
    vllm = {"model_name": "llama", "engine": "0", "instance": "10.0.0.1:8000"}
    triton = {"version": "1", "instance": "10.0.0.2:8002"}
    inputs = [
        # chat-0 (vLLM, llama): 1200 J, 6 g + 1.2 g embodied, 300 prompt + 100 generated
        # tokens and 2 requests a minute
        pod_series(energy, "0+1200x60", "llm", "chat-0"),
        pod_series(emissions, "0+6x60", "llm", "chat-0"),
        pod_series(embodied, "0+1.2x60", "llm", "chat-0"),
        pod_series("vllm:prompt_tokens_total", "0+300x60", "llm", "chat-0", **vllm),
        pod_series("vllm:generation_tokens_total", "0+100x60", "llm", "chat-0", **vllm),
        pod_series(
            "vllm:request_success_total", "0+2x60", "llm", "chat-0", finished_reason="stop", **vllm
        ),
        # trt-0 (Triton): 800 J a minute for 100 + 300 tokens of models a and b
        pod_series(energy, "0+800x60", "llm", "trt-0"),
        pod_series(emissions, "0+4x60", "llm", "trt-0"),
        pod_series(
            "nv_llm_input_token_len_sum",
            "0+100x60",
            "llm",
            "trt-0",
            model="a",
            response_metric_type="total_input_tokens",
            **triton,
        ),
        pod_series(
            "nv_llm_input_token_len_sum",
            "0+300x60",
            "llm",
            "trt-0",
            model="b",
            response_metric_type="total_input_tokens",
            **triton,
        ),
        # tgi-0 in another namespace: 500 J a minute for 50 + 50 tokens, no model label
        pod_series(energy, "0+500x60", "search", "tgi-0"),
        pod_series(emissions, "0+2x60", "search", "tgi-0"),
        pod_series("tgi_request_input_length_sum", "0+50x60", "search", "tgi-0"),
        pod_series("tgi_request_generated_tokens_sum", "0+50x60", "search", "tgi-0"),
        # idle-0 served nothing
        pod_series(energy, "0+300x60", "llm", "idle-0"),
        pod_series("vllm:generation_tokens_total", "0x60", "llm", "idle-0", model_name="x"),
    ]
    ratio = "namespace_model:wattprint_{}_per_{}:ratio_increase1h"
    llama, chat = 'model="llama",namespace="llm"', 'model="llama",namespace="llm",pod="chat-0"'
    checks = [
        model_case(ratio.format("joules", "tokens"), llama, 1200 / 400),
        model_case(ratio.format("joules", "prompt_tokens"), llama, 1200 / 300),
        model_case(ratio.format("joules", "generated_tokens"), llama, 1200 / 100),
        model_case(ratio.format("joules", "requests"), llama, 1200 / 2),
        model_case(ratio.format("sci_grams", "tokens"), llama, (6 + 1.2) / 400),
        model_case(ratio.format("joules", "tokens"), 'model="a",namespace="llm"', 2),
        model_case(ratio.format("joules", "tokens"), 'model="b",namespace="llm"', 2),
        model_case(ratio.format("sci_grams", "tokens"), 'model="b",namespace="llm"', 4 / 400),
        # no model label: the series has none (an empty label is no label)
        model_case(ratio.format("joules", "tokens"), 'namespace="search"', 5),
        model_case("namespace_pod_model:wattprint_functional_units_tokens:increase1h", chat, 24000),
        model_case(
            "namespace_pod_model:wattprint_workload_energy_joules_by_tokens:increase1h",
            'model="a",namespace="llm",pod="trt-0"',
            200 * 60,
        ),
        model_case("namespace_pod_model:wattprint_sci_grams_by_tokens:increase5m", chat, 7.2 * 5),
        model_case("namespace_pod_model:wattprint_functional_units_tokens:rate5m", chat, 400 / 60),
        model_case("namespace_model:wattprint_joules_per_tokens:ratio_rate5m", llama, 3),
        {
            "expr": 'namespace_model:wattprint_joules_per_tokens:ratio_increase1h{model="x"}',
            "eval_time": "60m",
            "exp_samples": [],
        },
    ]
    path = tmp_path / "inference.test.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(rules)],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": checks}],
            }
        )
    )
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_inference_preset_names_its_engine_version_and_source() -> None:
    units = {u.name: u for u in sci.load_units(INFERENCE)}
    assert set(units) == {"tokens", "prompt_tokens", "generated_tokens", "requests"}
    for unit in units.values():
        assert unit.per_pod
        for counter in unit.counters:
            assert counter.engine and counter.source, (unit.name, counter.metrics)
    metrics = {m for c in units["tokens"].counters for m in (*c.metrics, c.fallback) if m}
    assert {"vllm:prompt_tokens_total", "vllm:generation_tokens_total"} <= metrics
    (vllm,) = [c for c in units["requests"].counters if "vllm:request_success_total" in c.metrics]
    assert dict(vllm.labels) == {
        "namespace": "namespace",
        "pod": "pod",
        "workload": "workload",
        "model": "model_name",
    }
