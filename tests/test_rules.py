"""Recording rules, alerts and budgets: promtool accepts them, their unit tests pass
and cover every rule, every alert is documented, and the budget generator's output
drives the burn-rate alerts."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from conftest import require_tool

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "rules"
RULE_FILES = sorted(RULES.glob("*.rules.yml"))
TEST_FILES = sorted((RULES / "tests").glob("*.test.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://github.com/wattprint/wattprint/blob/main/docs/runbooks.md#"


def _load_generator() -> ModuleType:
    # tools/ is not a package: the Helm chart's helper loads the file the same way.
    spec = importlib.util.spec_from_file_location(
        "gen_budget_rules", REPO / "tools" / "gen_budget_rules.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def rules() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            found.extend(group["rules"])
    return found


def unit_tests() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in TEST_FILES:
        found.extend(yaml.safe_load(path.read_text(encoding="utf-8"))["tests"])
    return found


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args], capture_output=True, text=True, check=False
    )


# ---- promtool ---------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_FILES)


@pytest.mark.parametrize("test_file", TEST_FILES, ids=[p.stem for p in TEST_FILES])
def test_promtool_unit_tests(test_file: Path) -> None:
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


# ---- coverage and conventions --------------------------------------------------------


def test_every_recording_rule_has_a_unit_test() -> None:
    tested = " ".join(t["expr"] for test in unit_tests() for t in test.get("promql_expr_test", []))
    untested = [r["record"] for r in rules() if "record" in r and r["record"] not in tested]
    assert not untested


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in unit_tests():
        for case in test.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert alerts - firing == set(), "never seen firing"
    assert alerts - quiet == set(), "never seen quiet"


def test_recorded_names_follow_level_metric_operations() -> None:
    pattern = re.compile(
        r"^(?P<level>[a-z]+(?:_[a-z]+)*):(?P<metric>wattprint_[a-z0-9_]+):[a-z0-9_]+$"
    )
    levels: dict[str, set[str]] = {}
    for rule in rules():
        if "record" in rule:
            match = pattern.match(rule["record"])
            assert match, rule["record"]
            assert not match["metric"].endswith("_total"), "drop _total after rate/increase"
            levels[rule["record"]] = set(match["level"].split("_"))
    # The level names exactly the labels the series keeps (the unit tests show
    # them); namespace is absent for workloads outside Kubernetes, and cluster, kept
    # wherever it is a label (tests/multicluster.test.yml), is never named.
    for test in unit_tests():
        for case in test.get("promql_expr_test", []):
            for sample in case["exp_samples"]:
                name = sample["labels"].split("{")[0]
                if name in levels:
                    labels = set(re.findall(r"(\w+)=", sample["labels"])) - {"cluster"}
                    assert labels <= levels[name] and levels[name] - labels <= {"namespace"}, (
                        name,
                        labels,
                    )


def test_every_aggregation_and_join_keeps_cluster() -> None:
    """Two clusters' nodes of one name never merge: every by() and on() of the
    recording rules names cluster (budgets, which have none, join group_left)."""
    for rule in rules():
        if "record" not in rule:
            continue
        for clause in re.findall(r"\b(by|on) \(([^)]*)\)", rule["expr"]):
            keeps = "cluster" in clause[1].split(", ")
            budget_join = clause[0] == "on" and "budget_grams" in rule["expr"]
            assert keeps or budget_join, (rule["record"], clause)


def github_anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_alerts_have_severity_annotations_and_a_runbook_section() -> None:
    anchors = {
        github_anchor(line[3:])
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        assert name.startswith("Wattprint"), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip(), name
        assert annotations["runbook_url"] == RUNBOOK_BASE + name.lower(), name
        assert name.lower() in anchors, f"docs/runbooks.md has no section {name}"


def test_every_recorded_series_is_documented() -> None:
    doc = (REPO / "docs" / "rules.md").read_text()
    missing = sorted({r["record"] for r in rules() if "record" in r and r["record"] not in doc})
    assert not missing


# ---- budget generator -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "grams"),
    [
        ("50kg", 50_000.0),
        ("1.5 t", 1_500_000.0),
        ("200g", 200.0),
        ("2000", 2000.0),
        (75, 75.0),
        (0.5, 0.5),
        ("2.5e3 KG", 2_500_000.0),
    ],
)
def test_budget_amounts(amount: object, grams: float) -> None:
    assert gen.parse_grams(amount, "x") == grams


@pytest.mark.parametrize("amount", ["5 lb", "kg", "", "-1kg", 0, -3, True, None, [50], "1e999"])
def test_bad_budget_amounts(amount: object) -> None:
    with pytest.raises(gen.BudgetError, match="x: "):
        gen.parse_grams(amount, "x")


def test_budget_rules_per_namespace_and_workload() -> None:
    rules_ = gen.budget_rules(
        [
            {"namespace": "team-a", "budget": "500kg"},
            {"namespace": "team-b", "workload": "train", "grams": 1234567.891, "period": "30d"},
            {"workload": "nightly", "budget": 2000},
        ]
    )
    assert rules_ == [
        {
            "record": "namespace:wattprint_emissions_budget_grams:30d",
            "expr": "vector(500000)",
            "labels": {"namespace": "team-a"},
        },
        {
            "record": "namespace_workload:wattprint_emissions_budget_grams:30d",
            "expr": "vector(1234567.891)",
            "labels": {"namespace": "team-b", "workload": "train"},
        },
        {
            "record": "namespace_workload:wattprint_emissions_budget_grams:30d",
            "expr": "vector(2000)",
            "labels": {"workload": "nightly"},
        },
    ]


@pytest.mark.parametrize(
    ("budgets", "message"),
    [
        (
            [{"namespace": "a", "budget": "1kg"}, {"namespace": "a", "grams": 5}],
            "has a budget already",
        ),
        ([{"workload": "w", "budget": "1kg"}, {"workload": "w", "budget": "2kg"}], "already"),
        ([{"namespace": "a", "budgt": "1kg"}], "unknown field 'budgt'"),
        ([{"namespace": "a", "budget": "1kg", "grams": 1000}], "exactly one of grams and budget"),
        ([{"namespace": "a"}], "exactly one of grams and budget"),
        ([{"budget": "1kg"}], "needs a namespace, a workload or both"),
        ([{"namespace": "a", "budget": "1kg", "period": "7d"}], "period '7d' is not supported"),
        ([{"namespace": 5, "budget": "1kg"}], "namespace must be a string"),
        (["team-a"], "must be a mapping"),
        ("team-a", "must be a list"),
    ],
)
def test_bad_budget_data(budgets: object, message: str) -> None:
    with pytest.raises(gen.BudgetError, match=re.escape(message)):
        gen.budget_rules(budgets)


def test_generator_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "budgets.rules.yml"
    assert gen.main([str(RULES / "budgets.example.yaml"), "-o", str(out)]) == 0
    document = yaml.safe_load(out.read_text())
    assert document["groups"][0]["name"] == "wattprint-budgets"
    assert len(document["groups"][0]["rules"]) == len(
        yaml.safe_load((RULES / "budgets.example.yaml").read_text())["budgets"]
    )

    bad = tmp_path / "bad.yaml"
    bad.write_text("budgets:\n  - namespace: a\n    budget: 5 lb\n")
    assert gen.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "gen_budget_rules: budgets[0]: '5 lb' is not an amount in g, kg or t (e.g. 50kg)"
    assert gen.main([str(tmp_path / "missing.yaml")]) == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # The last would win: a budget of 50 kg where 5 kg was meant first.
        (
            b"budgets:\n  - namespace: a\n    budget: 5kg\n    budget: 50kg\n",
            "is not valid YAML at line 4: key 'budget' is given twice",
        ),
        (b"budgets: &b []\nmore: *b\n", "is not valid YAML at line 2: aliases"),
        (b"budgets:\n  - namespace: \xff\n", "is not UTF-8 text (byte 24)"),
    ],
)
def test_budget_data_is_read_as_strictly_as_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, message: str
) -> None:
    bad = tmp_path / "budgets.yaml"
    bad.write_bytes(data)
    assert gen.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gen_budget_rules: ") and err.count("\n") == 1, err
    assert message in err


def test_generated_budgets_drive_the_burn_rate_alerts(tmp_path: Path) -> None:
    """The example budgets, through the generator, promtool and the rules of rules/:
    team-b/train-llm (50 kg) emitting 30 g/min burns 25.9x, team-a (500 kg) 2.6x."""
    budgets = tmp_path / "budgets.rules.yml"
    budgets.write_text(gen.render(gen.load((RULES / "budgets.example.yaml").read_text())))
    check = promtool("check", "rules", str(budgets))
    assert check.returncode == 0, check.stdout + check.stderr

    series = (
        'wattprint_workload_emissions_grams_total{{instance="n1:9950",job="wattprint",'
        'component="gpu",gpu="0",scheduler="kubernetes",namespace="{ns}",workload="{wl}",pod="p"}}'
    )
    test = {
        "rule_files": [*map(str, RULE_FILES), str(budgets)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series.format(ns="team-b", wl="train-llm"), "values": "0+30x90"},
                    {"series": series.format(ns="team-a", wl="etl"), "values": "0+30x90"},
                ],
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertstate="firing"}',
                        "eval_time": "60m",
                        "exp_samples": [
                            {
                                "labels": "ALERTS{"
                                'alertname="WattprintWorkloadEmissionBudgetBurnFast",'
                                'alertstate="firing",severity="warning",'
                                'namespace="team-b",workload="train-llm"}',
                                "value": 1,
                            }
                        ],
                    },
                    {
                        "expr": "namespace:wattprint_emissions_budget_burn:ratio_rate5m > bool 2.5",
                        "eval_time": "60m",
                        "exp_samples": [{"labels": '{namespace="team-a"}', "value": 1}],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "budgets.test.yml"
    path.write_text(yaml.safe_dump(test))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
