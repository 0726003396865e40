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
            {"units": [{"name": "t", "metric": "x", "labels": {"workload": "a", "pod": "p"}}]},
            "'pod' is not namespace or workload",
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
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert f"{bad}: unit tokens: labels must map at least workload" in result.stderr


def test_sci_is_none_without_units() -> None:
    assert sci.sci(10.0, 2.0, 0.0) is None
    assert sci.sci(10.0, 2.0, 4.0) == 3.0
