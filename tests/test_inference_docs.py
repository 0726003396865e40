"""docs/inference.md says what the presets and the scrape configs do: its scrape job is
one promtool accepts, its PodMonitor is well-formed, and its table of engine metrics
names exactly the counters rules/inference-units.yaml sums."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from conftest import require_tool
from wattprint.report import sci

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "inference.md"
PRESETS = REPO / "rules" / "inference-units.yaml"


def yaml_blocks() -> list[Any]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)]


def promtool_knows_kubernetes_sd(tool: str, tmp_path: Path) -> bool:
    probe = tmp_path / "probe.yml"
    probe.write_text("scrape_configs: [{job_name: p, kubernetes_sd_configs: [{role: pod}]}]\n")
    result = subprocess.run([tool, "check", "config", str(probe)], capture_output=True, timeout=60)
    return result.returncode == 0


def scrape_configs() -> list[dict[str, Any]]:
    return [b for b in yaml_blocks() if isinstance(b, dict) and "scrape_configs" in b]


def test_scrape_configs_are_valid_and_label_namespace_and_pod(tmp_path: Path) -> None:
    tool = require_tool("promtool")
    (config,) = [c for c in scrape_configs() if "kubernetes_sd_configs" in c["scrape_configs"][0]]
    (job,) = config["scrape_configs"]
    targets = {
        r["target_label"]: r["source_labels"] for r in job["relabel_configs"] if "target_label" in r
    }
    assert targets["namespace"] == ["__meta_kubernetes_namespace"]
    assert targets["pod"] == ["__meta_kubernetes_pod_name"]
    assert not job.get("honor_labels")
    if not promtool_knows_kubernetes_sd(tool, tmp_path):
        # Debian builds Prometheus without Kubernetes discovery: check the rest.
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["static_configs"] = []
    # and the bare-metal jobs: every target names its workload
    (bare,) = [c for c in scrape_configs() if "kubernetes_sd_configs" not in c["scrape_configs"][0]]
    for each in bare["scrape_configs"]:
        for static in each["static_configs"]:
            assert static["labels"]["workload"], each["job_name"]
    for i, checked in enumerate((config, bare)):
        path = tmp_path / f"prometheus-{i}.yml"
        path.write_text(yaml.safe_dump(checked))
        result = subprocess.run(
            [tool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_no_scrape_sets_a_label_an_engine_exports_on_every_pod() -> None:
    """The PodMonitor and the plain job set `model` and `workload` only from a pod label
    that opts in (absent: no label), never from one every Helm release has: a `model`
    target label on a Triton pod would rename Triton's own to exported_model."""
    (monitor,) = [b for b in yaml_blocks() if isinstance(b, dict) and b.get("kind") == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert {e["port"] for e in endpoints} == {"http", "metrics"}  # Triton serves on 8002
    rules = [
        (r["sourceLabels"], r.get("regex"), r["targetLabel"])
        for e in endpoints
        for r in e["relabelings"]
    ]
    (plain,) = [c for c in scrape_configs() if "kubernetes_sd_configs" in c["scrape_configs"][0]]
    rules += [
        (r["source_labels"], r.get("regex"), r["target_label"])
        for r in plain["scrape_configs"][0]["relabel_configs"]
        if r.get("target_label") in ("model", "workload")
    ]
    opt_in = {
        "model": ["__meta_kubernetes_pod_label_wattprint_io_model"],
        "workload": ["__meta_kubernetes_pod_label_leaderworkerset_sigs_k8s_io_name"],
    }
    assert {target for _, _, target in rules} == {"model", "workload"}
    for sources, regex, target in rules:
        assert sources == opt_in[target] and regex == "(.+)", (sources, target)


def test_each_engine_says_how_its_metrics_are_turned_on_and_where() -> None:
    text = DOC.read_text()
    table = text[text.index("| engine | metrics | served on |") :].split("\n\n")[0]
    rows = {row.split("|")[1].strip(): row for row in table.splitlines()[2:]}
    assert "--enable-metrics" in rows["SGLang"]
    assert "--metrics" in rows["llama.cpp server"] and "?model=" in rows["llama.cpp server"]
    assert "8002" in rows["Triton (TensorRT-LLM backend)"]
    assert set(rows) == {
        "vLLM",
        "SGLang",
        "TGI",
        "Triton (TensorRT-LLM backend)",
        "llama.cpp server",
    }


def test_the_table_of_engines_names_the_presets_counters() -> None:
    text = DOC.read_text()
    table = text[text.index("| engine | prompt tokens |") :].split("\n\n")[0]
    named = set(re.findall(r"`([a-z_:]+(?:_total|_sum|_success))(?:\{[^`]*\})?`", table))
    units = sci.load_units(PRESETS)

    def names(unit: sci.Unit) -> set[str]:
        return {m for c in unit.counters for m in (*c.metrics, c.fallback) if m}

    assert named == {m for u in units if u.name != "tokens" for m in names(u)}
    # tokens is prompt plus generated, for every engine
    by_name = {u.name: names(u) for u in units}
    tokens = by_name["tokens"]
    assert tokens == by_name["prompt_tokens"] | by_name["generated_tokens"]


def test_the_new_engine_example_is_a_counter_the_generator_takes() -> None:
    (counters,) = [b for b in yaml_blocks() if isinstance(b, list)]
    (unit,) = sci.parse_units({"units": [{"name": "tokens", "counters": counters}]})
    assert unit.per_pod and dict(unit.counters[0].labels)["model"] == "served_model"
