"""The chart's copies of rules/ and dashboards/ (helm/wattprint/files/) match the sources."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def _load_sync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sync_chart", REPO / "scripts" / "sync_chart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sync_chart = _load_sync()


def test_chart_copies_match_their_sources() -> None:
    problems = sync_chart.differences(REPO, REPO / sync_chart.CHART_FILES)
    assert problems == [], (
        "chart copies are stale; run: python scripts/sync_chart.py\n" + "\n".join(problems)
    )


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "rules").mkdir(parents=True)
    (repo / "dashboards").mkdir()
    (repo / "rules" / "energy.yml").write_text("groups: [{name: energy, rules: []}]\n")
    (repo / "rules" / "alerts.yaml").write_text("groups: [{name: alerts, rules: []}]\n")
    (repo / "rules" / "energy_test.yml").write_text("rule_files: [energy.yml]\ntests: []\n")
    (repo / "rules" / "budgets.example.yaml").write_text("budgets: [{namespace: a, grams: 1}]\n")
    (repo / "rules" / "README.md").write_text("not a rule file\n")
    (repo / "dashboards" / "overview.json").write_text('{"title": "Overview"}\n')
    return repo


def test_sync_copies_rule_files_and_dashboards_only(tmp_path: Path) -> None:
    repo, files = _repo(tmp_path), tmp_path / "files"

    sync_chart.sync(repo, files)

    copied = sorted(str(p.relative_to(files)) for p in files.rglob("*") if p.is_file())
    assert copied == ["dashboards/overview.json", "rules/alerts.yaml", "rules/energy.yml"]
    assert (files / "rules" / "energy.yml").read_bytes() == (
        repo / "rules" / "energy.yml"
    ).read_bytes()
    assert sync_chart.differences(repo, files) == []


def test_drift_is_reported_and_repaired(tmp_path: Path) -> None:
    repo, files = _repo(tmp_path), tmp_path / "files"
    sync_chart.sync(repo, files)
    (repo / "dashboards" / "overview.json").write_text('{"title": "Overview v2"}\n')
    (repo / "rules" / "alerts.yaml").unlink()
    (repo / "rules" / "cluster.yml").write_text("groups: [{name: cluster, rules: []}]\n")

    problems = sync_chart.differences(repo, files)
    assert len(problems) == 3
    assert any("overview.json" in p and p.startswith("differs") for p in problems)
    assert any("alerts.yaml" in p and p.startswith("no source") for p in problems)
    assert any("cluster.yml" in p and p.startswith("missing") for p in problems)

    sync_chart.sync(repo, files)
    assert sync_chart.differences(repo, files) == []
    assert not (files / "rules" / "alerts.yaml").exists()


def test_check_mode_exits_1_on_drift_and_0_after_a_sync(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    files = repo / sync_chart.CHART_FILES
    assert sync_chart.main(["--check"], repo=repo) == 1  # nothing copied yet
    assert sync_chart.main([], repo=repo) == 0
    assert sync_chart.main(["--check"], repo=repo) == 0
    (files / "rules" / "energy.yml").write_text("groups: []\n")
    assert sync_chart.main(["--check"], repo=repo) == 1
