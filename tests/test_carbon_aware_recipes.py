"""The KEDA and Slurm recipes of docs/carbon-beyond-the-meter.md: their PromQL, taken
from the page itself, evaluated by promtool on forecast series as the exporter names
them, so that the documented query and the exported metrics cannot drift apart."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from conftest import require_tool

DOC = Path(__file__).resolve().parent.parent / "docs" / "carbon-beyond-the-meter.md"
OFFSET = "wattprint_grid_carbon_greenest_start_offset_seconds"


def recipe(marker: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:.*?-->\n```\w+\n(.*?)```", text, re.S)
    assert match, f"no {marker} block in {DOC.name}"
    return match.group(1)


def keda_query() -> str:
    scaled = yaml.safe_load(recipe("keda-recipe"))
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    return str(trigger["metadata"]["query"])


def slurm_query() -> str:
    match = re.search(r"^QUERY='(.*)'$", recipe("slurm-recipe"), re.M)
    assert match
    return match.group(1)


def series(within: str, duration: str, zone: str = "GB") -> str:
    return (
        f'{OFFSET}{{zone="{zone}",provider="uk-grid",within="{within}",duration="{duration}",'
        'instance="node-a:9105"}'
    )


def run_promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    path = tmp_path / "recipes.test.yml"
    path.write_text(yaml.safe_dump({"tests": tests}, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_keda_query_scales_to_eight_only_near_the_greenest_window(tmp_path: Path) -> None:
    query = keda_query()
    run_promtool(
        tmp_path,
        [
            {
                "interval": "1m",
                # greenest 4 h run of the next 12 h: 2 h away, counting down to 0, then
                # the forecast stops (provider gone).
                "input_series": [
                    {"series": series("12h", "4h"), "values": "7200-60x120 _x10"},
                    # other windows, zones and nodes must not change the answer
                    {"series": series("24h", "4h"), "values": "0x130"},
                    {"series": series("12h", "4h", zone="DE"), "values": "0x130"},
                ],
                "promql_expr_test": [
                    {
                        "expr": query,
                        "eval_time": "0m",
                        "exp_samples": [{"labels": "{}", "value": 0}],
                    },
                    {
                        "expr": query,
                        "eval_time": "89m",
                        "exp_samples": [{"labels": "{}", "value": 0}],
                    },
                    {
                        "expr": query,
                        "eval_time": "91m",
                        "exp_samples": [{"labels": "{}", "value": 8}],
                    },
                    {
                        "expr": query,
                        "eval_time": "120m",
                        "exp_samples": [{"labels": "{}", "value": 8}],
                    },
                    # no forecast for GB: fail open
                    {
                        "expr": query,
                        "eval_time": "128m",
                        "exp_samples": [{"labels": "{}", "value": 8}],
                    },
                ],
            }
        ],
    )


def test_slurm_query_gives_the_begin_offset(tmp_path: Path) -> None:
    query = slurm_query()
    assert 'within="24h"' in query and 'duration="4h"' in query
    run_promtool(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series("24h", "4h"), "values": "5400 5340"},
                    {"series": series("12h", "4h"), "values": "60 0"},
                ],
                "promql_expr_test": [
                    {
                        "expr": query,
                        "eval_time": "0m",
                        "exp_samples": [{"labels": "{}", "value": 5400}],
                    },
                    {
                        "expr": query,
                        "eval_time": "1m",
                        "exp_samples": [{"labels": "{}", "value": 5340}],
                    },
                ],
            }
        ],
    )


def test_recipes_name_only_exported_label_values() -> None:
    from wattprint.carbon import forecast

    for query in (keda_query(), slurm_query()):
        within = re.search(r'within="(\d+)h"', query)
        duration = re.search(r'duration="(\d+)h"', query)
        assert within and int(within.group(1)) in forecast.WITHIN_H
        assert duration and int(duration.group(1)) in forecast.DURATIONS_H
