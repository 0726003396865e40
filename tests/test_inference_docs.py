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


def test_plain_prometheus_scrape_job_is_valid_and_labels_namespace_and_pod(
    tmp_path: Path,
) -> None:
    tool = require_tool("promtool")
    (config,) = [b for b in yaml_blocks() if isinstance(b, dict) and "scrape_configs" in b]
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
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [tool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_pod_monitor_is_well_formed() -> None:
    (monitor,) = [b for b in yaml_blocks() if isinstance(b, dict) and b.get("kind") == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (relabel,) = endpoint["relabelings"]
    assert set(relabel) == {"sourceLabels", "targetLabel"} and relabel["targetLabel"] == "model"


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
