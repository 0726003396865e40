"""The Grafana dashboards (dashboards/*.json) have no mistake Grafana would reject or
show as an empty or mislabelled panel: structure, units, layout, datasource
variables, stable uids, and PromQL that parses and only names recorded series that
rules/ defines. Whether the queries return data is tested against a real Prometheus
in test_e2e_prometheus.py."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import require_tool
from wattprint.core.units import parse_duration
from wattprint.report import sci
from wattprint.sources.registry import is_estimated

REPO = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
RULE_FILES = sorted((REPO / "rules").glob("*.rules.yml"))

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "text", "piechart"}
# Grafana unit ids used here, plus Grafana's custom "suffix:" units.
UNITS = {"watt", "kwatth", "joule", "massg", "masskg", "percentunit", "s", "none", "short"}
VARIABLES = {"datasource", "cluster", "job", "node", "namespace", "workload", "model"}
# What a caller that does not set a variable gets: All.
DEFAULTS = {"model": ".*", "cluster": ".*", "job": ".*"}
# Ranges a panel may use: Grafana's, so that any scrape interval and zoom works.
RANGES = {"$__rate_interval", "$__range"}


def load(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return board


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows nest their panels


def targets(board: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield panel, target


def variable_queries(board: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(variable, label, series selector) of each label_values() variable."""
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
            assert match, f"{var['name']}: not a label_values() query: {query}"
            yield var["name"], match.group(2), match.group(1)


def substitute(expr: str, values: dict[str, str]) -> str:
    """The query Grafana would send, with the dashboard and global variables set."""
    rate = values.get("__rate_interval", "5m")
    rate_ms = values.get("__rate_interval_ms", f"{round(parse_duration(rate) * 1000)}")
    out = expr.replace("$__rate_interval_ms", rate_ms).replace("$__rate_interval", rate)
    out = out.replace("$__range_s", values.get("__range_s", "3600"))
    out = out.replace("$__range", values.get("__range", "1h"))
    values = {**DEFAULTS, **values}
    for name in sorted(VARIABLES, key=len, reverse=True):
        out = out.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return out


def recorded_names() -> set[str]:
    names: set[str] = set()
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            names.update(rule["record"] for rule in group["rules"] if "record" in rule)
    # Inference series come from unit data (tools/gen_sci_rules.py), not from rules/.
    names.update(
        rule["record"]
        for group in sci.rules(sci.load_units(REPO / "rules" / "inference-units.yaml"))["groups"]
        for rule in group["rules"]
    )
    # Budget series come from data (tools/gen_budget_rules.py), not from rules/.
    names.update(
        {
            "namespace:wattprint_emissions_budget_grams:30d",
            "namespace_workload:wattprint_emissions_budget_grams:30d",
        }
    )
    return names


@pytest.fixture(params=DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def board(request: pytest.FixtureRequest) -> dict[str, Any]:
    path: Path = request.param
    data = load(path)
    data["__file"] = path.stem
    return data


def test_the_five_dashboards_exist() -> None:
    assert {p.stem for p in DASHBOARDS} == {
        "fleet",
        "workload",
        "node-gpu",
        "carbon-budgets",
        "inference",
    }


def test_uids_and_titles_are_stable_and_unique() -> None:
    boards = [load(p) for p in DASHBOARDS]
    for path, board in zip(DASHBOARDS, boards, strict=True):
        # The uid is what links and provisioning refer to: fixed, never generated.
        assert board["uid"] == f"wattprint-{path.stem}"
        assert len(board["uid"]) <= 40
        assert board.get("id") is None, "an exported numeric id breaks import elsewhere"
    assert len({b["title"] for b in boards}) == len(boards)


def test_metadata(board: dict[str, Any]) -> None:
    assert "wattprint" in board["tags"]
    assert isinstance(board["schemaVersion"], int)
    assert board["title"].startswith("Wattprint / ")
    assert "__inputs" not in board, "import must not ask for a datasource"


def test_variables(board: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in board["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for name, var in variables.items():
        assert name in VARIABLES, f"unexpected variable {name}"
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE
            # "All" must match series without the label too (workloads outside
            # Kubernetes have no namespace), so it is .* rather than a value list.
            if var.get("includeAll"):
                assert var.get("allValue") == ".*", name
    # Grafana resolves a variable's query after the variables it names: define those first.
    defined: set[str] = set()
    for var in board["templating"]["list"]:
        query = var.get("query") if var["type"] == "query" else ""
        refs = set(re.findall(r"\$\{?(\w+)", str(query)))
        assert refs <= defined, f"{var['name']} uses {refs - defined} before it is defined"
        defined.add(var["name"])
    used = set()
    for _, target in targets(board):
        used.update(re.findall(r"\$\{?(\w+)", target["expr"]))
    for _, _, selector in variable_queries(board):
        used.update(re.findall(r"\$\{?(\w+)", selector))
    used = {u for u in used if not u.startswith("__")}
    assert used <= set(variables), f"undefined variables {used - set(variables)}"
    assert "node" in used


def test_no_hard_coded_datasource(board: dict[str, Any]) -> None:
    def walk(node: object, where: str) -> Iterator[tuple[str, object]]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "datasource":
                    yield where, value
                yield from walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from walk(value, f"{where}[{i}]")

    found = list(walk(board, "dashboard"))
    assert found
    for where, value in found:
        assert value == DATASOURCE, f"{where}: {value}"
    assert "${DS_" not in json.dumps(board)


def test_panels_types_units_and_layout(board: dict[str, Any]) -> None:
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells: set[tuple[int, int]] = set()
    for panel in panels(board):
        title = panel.get("title", "")
        assert panel["type"] in PANEL_TYPES, title
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("h", "w", "x", "y")), title
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] >= 0 and pos["y"] >= 0, title
        assert pos["x"] + pos["w"] <= 24, f"{title} is wider than the grid"
        area = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not area & cells, f"{title} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            assert pos["w"] == 24 and pos["h"] == 1
            continue
        assert title and panel.get("description"), "every panel says what it shows"
        assert panel["targets"], title
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert unit in UNITS or (unit or "").startswith("suffix:"), f"{title}: unit {unit!r}"


def test_targets(board: dict[str, Any]) -> None:
    for panel, target in targets(board):
        where = f"{panel['title']} {target['refId']}"
        assert target["datasource"] == DATASOURCE, where
        assert target["expr"].strip(), where
        for window in re.findall(r"\[([^\]]+)\]", target["expr"]):
            assert window in RANGES, f"{where}: fixed range [{window}]"
        if "$__range" in target["expr"].replace("$__rate_interval", ""):
            # increase(x[$__range]) over every step of a range query is slow and wrong
            assert target.get("instant") is True, f"{where}: $__range needs an instant query"
        if panel["type"] == "timeseries":
            assert target.get("range") is True and not target.get("instant"), where
        # A legend label the query does not keep shows as an empty string.
        for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
            assert label in target["expr"], f"{where}: legend uses {label}, the query drops it"
    for panel in panels(board):
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_recorded_series_exist(board: dict[str, Any]) -> None:
    known = recorded_names()
    for panel, target in targets(board):
        for name in re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", target["expr"]):
            assert name in known, f"{panel['title']}: {name} is not recorded by rules/"


def test_every_query_parses(board: dict[str, Any], tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    values = {"datasource": "", "node": ".*", "namespace": ".*", "workload": "x"}
    rules: list[dict[str, str]] = []
    for panel, target in targets(board):
        record = f"dashboard:panel{panel['id']}_{target['refId']}:query"
        rules.append({"record": record, "expr": substitute(target["expr"], values)})
    for name, label, selector in variable_queries(board):
        expr = f"count by ({label}) ({substitute(selector, values)})"
        rules.append({"record": f"dashboard:variable_{name}:query", "expr": expr})
    for rule in rules:
        assert "$" not in rule["expr"], f"unsubstituted variable in {rule}"
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def panel_expr(board: dict[str, Any], title: str, values: dict[str, str]) -> list[str]:
    found = [substitute(t["expr"], values) for p, t in targets(board) if p["title"] == title]
    assert found, f"no panel {title!r}"
    return found


def test_fleet_sums_every_device_of_a_rapl_dram_node(tmp_path: Path) -> None:
    """A node with two GPUs and RAPL package and dram zones (package="0", "1" on both
    CPU and memory) and a platform source: the Fleet stats and the energy per component
    count every device once, the chips' stats leave the platform out and the wall's
    show the node's input, through the repository's recording rules (promtool)."""
    board = load(REPO / "dashboards" / "fleet.json")
    values = {"datasource": "", "node": ".*", "namespace": ".*", "workload": ".*"}
    node = 'instance="n1:9950",job="wattprint"'
    watts = {  # device -> (counter selector labels, watts, method)
        ("gpu", "0"): ("wattprint_gpu_energy_joules_total", 'gpu="0",uuid="GPU-0"', 400),
        ("gpu", "1"): ("wattprint_gpu_energy_joules_total", 'gpu="1",uuid="GPU-1"', 200),
        ("cpu", "0"): ("wattprint_cpu_energy_joules_total", 'package="0"', 50),
        ("cpu", "1"): ("wattprint_cpu_energy_joules_total", 'package="1"', 50),
        ("memory", "0"): ("wattprint_memory_energy_joules_total", 'package="0"', 25),
        ("memory", "1"): ("wattprint_memory_energy_joules_total", 'package="1"', 25),
    }
    series = [
        {"series": f"{name}{{{node},{labels}}}", "values": f"0+{w * 60}x60"}
        for name, labels, w in watts.values()
    ]
    # The node draws 1000 W at the wall: 250 W are the rest of the server, measured.
    series += [
        {"series": f"wattprint_node_energy_joules_total{{{node}}}", "values": "0+60000x60"},
        {"series": f"wattprint_platform_energy_joules_total{{{node}}}", "values": "0+15000x60"},
        {
            "series": f'wattprint_measurement_info{{{node},component="platform",device="node",'
            'method="pm_counters",estimated="false"}',
            "values": "1x60",
        },
    ]
    # Memory is modelled: the exporter marks it estimated, and the share follows the label.
    methods = {"gpu": "nvml_energy_counter", "cpu": "rapl", "memory": "model"}
    for component, device in watts:
        method = methods[component]
        estimated = str(is_estimated(method)).lower()
        labels = (
            f'component="{component}",device="{device}",method="{method}",estimated="{estimated}"'
        )
        series.append(
            {"series": f"wattprint_measurement_info{{{node},{labels}}}", "values": "1x60"}
        )
    [energy] = panel_expr(board, "Energy (chips)", values)
    [power] = panel_expr(board, "Power now (chips)", values)
    [estimated] = panel_expr(board, "Estimated share", values)
    gpu_kwh, cpu_kwh, memory_kwh, platform_kwh = panel_expr(board, "Energy by component", values)
    gpu_w, cpu_w, memory_w, platform_w = panel_expr(board, "Power by component", values)
    [by_method] = panel_expr(board, "Measured vs estimated power", values)
    [wall] = panel_expr(board, "Power now at the wall", values)
    [share] = panel_expr(board, "Platform share of the wall", values)
    wall_w, chips_w = panel_expr(board, "Power: chips and at the wall", values)
    # 750 W of chips for the hour before 60m: 0.75 kWh, of which GPUs 0.6, CPUs 0.1,
    # memory 0.05; the platform 0.25 kWh beside them.
    checks = [
        (energy, "{}", 0.75),
        (power, "{}", 750),
        (estimated, "{}", 50 / 750),
        (gpu_kwh, "{}", 0.6),
        (cpu_kwh, "{}", 0.1),
        (memory_kwh, "{}", 0.05),
        (platform_kwh, "{}", 0.25),
        (gpu_w, "{}", 600),
        (cpu_w, "{}", 100),
        (memory_w, "{}", 50),
        (platform_w, "{}", 250),
        (wall, "{}", 1000),
        (share, "{}", 0.25),
        (wall_w, "{}", 1000),
        (chips_w, "{}", 750),
    ]
    tests = [
        {"expr": expr, "eval_time": "60m", "exp_samples": [{"labels": labels, "value": value}]}
        for expr, labels, value in checks
    ]
    tests.append(
        {
            "expr": by_method,
            "eval_time": "60m",
            "exp_samples": [
                {"labels": '{method="nvml_energy_counter"}', "value": 600},
                {"labels": '{method="rapl"}', "value": 100},
                {"labels": '{method="model"}', "value": 50},
                {"labels": '{method="pm_counters"}', "value": 250},
            ],
        }
    )
    spec = {
        "rule_files": [str(p) for p in RULE_FILES if p.name == "recording.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    path = tmp_path / "fleet.test.yml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def promtool_test(path: Path, series: list[dict[str, str]], tests: list[dict[str, Any]]) -> None:
    """Run promql_expr_test cases at 60m over the input series with the repository's rules."""
    spec = {
        "rule_files": [str(p) for p in RULE_FILES],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_chips_and_the_wall_panels_say_which_and_never_pass_one_off_as_the_other(
    tmp_path: Path,
) -> None:
    """The nodes of rules/tests/wall.test.yml: team-b/infer runs on p1, which reads its
    input (the platform 225 W of infer's), team-a/train also on c2, which does not. The
    chips' panels leave the platform out; the wall's show infer's chips + platform and
    nothing at all for train (never its chips as its wall figure)."""
    spec = yaml.safe_load((REPO / "rules" / "tests" / "wall.test.yml").read_text())
    series = spec["tests"][0]["input_series"]
    workload, budgets, node = (
        load(REPO / "dashboards" / f"{name}.json")
        for name in ("workload", "carbon-budgets", "node-gpu")
    )
    tests: list[dict[str, Any]] = []

    def check(board: dict[str, Any], title: str, values: dict[str, str], *samples: Any) -> None:
        values = {"datasource": "", "node": ".*", "namespace": ".*", "workload": ".*", **values}
        exprs = panel_expr(board, title, values)
        for expr, expected in zip(exprs, samples, strict=True):
            found = [{"labels": labels, "value": v} for labels, v in expected]
            tests.append({"expr": expr, "eval_time": "60m", "exp_samples": found})

    infer, train, every = {"workload": "infer"}, {"workload": "train"}, {}
    # infer: 450 W of chips, 225 W of platform, 1 g per 6000 J.
    check(workload, "Energy (chips)", infer, [("{}", 0.45)])
    check(workload, "Emissions (chips)", infer, [("{}", 270)])
    check(workload, "Average power (chips)", infer, [("{}", 450)])
    check(workload, "Energy at the wall", infer, [("{}", 0.675)])
    check(workload, "Emissions at the wall", infer, [("{}", 405)])
    check(workload, "Average power at the wall", infer, [("{}", 675)])
    check(workload, "Platform share of its energy", infer, [("{}", 225 / 675)])
    # train: 100 W on p1 and 200 W on c2; no wall figure.
    check(workload, "Energy (chips)", train, [("{}", 0.3)])
    for title in ("Energy at the wall", "Emissions at the wall", "Average power at the wall"):
        check(workload, title, train, [])
    check(workload, "Platform share of its energy", train, [])
    check(
        budgets,
        "Emissions by workload (chips)",
        every,
        [
            ('{namespace="team-b",workload="infer"}', 270),
            ('{namespace="team-a",workload="train"}', 180),
        ],
    )
    # p1: 930 W in, 620 W of chips, 310 W of platform; c2: 200 W of chips, nothing else.
    check(
        node,
        "Node power: at the wall, chips and platform",
        every,
        [('{instance="p1:9950"}', 930)],
        [('{instance="p1:9950"}', 620), ('{instance="c2:9950"}', 200)],
        [('{instance="p1:9950"}', 310)],
    )
    residual = '{__name__="instance:wattprint_node_residual:ratio_increase1h",instance="p1:9950"}'
    check(node, "Node energy residual (1h)", {}, [(residual, 0)])
    promtool_test(tmp_path / "wall.test.yml", series, tests)


SELECTOR = re.compile(r"(?<![\w:$])([a-zA-Z_][\w:]*)?\{([^{}]*)\}")


@pytest.mark.parametrize("path", [p for p in DASHBOARDS if p.stem != "inference"], ids=str)
def test_every_selector_follows_the_cluster_and_job_variables(path: Path) -> None:
    """Under a Thanos or Mimir querier over several clusters, picking a cluster (and a
    scrape job) narrows every panel; budgets, which have no cluster, are left whole."""
    board = load(path)
    names = [v["name"] for v in board["templating"]["list"]]
    assert names[1:3] == ["cluster", "job"], names
    for panel, target in targets(board):
        for name, body in SELECTOR.findall(target["expr"]):
            if "budget_grams" in name:
                continue
            assert 'cluster=~"$cluster"' in body, (panel["title"], target["expr"])
            raw = ":" not in name and name != "ALERTS"
            assert raw == ('job=~"$job"' in body), (panel["title"], target["expr"])
        for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", target["expr"]):
            assert clause.startswith("cluster"), (panel["title"], target["expr"])


def data_links(board: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in panels(board):
        for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
            yield panel, link


def kept_labels(expr: str) -> set[str]:
    """Labels a panel's query result keeps: its by() lists, or a recorded series' level."""
    kept = {
        label for clause in re.findall(r"\bby \(([^)]*)\)", expr) for label in clause.split(", ")
    }
    if not kept and (match := re.match(r"\s*([a-z_]+):wattprint_", expr)):
        kept = {"cluster", *match.group(1).split("_")}
    return kept


def test_drill_down_from_fleet_to_workload_to_node() -> None:
    """Fleet's and Carbon & budgets' top workloads open the Workload dashboard on that
    workload, and the Workload dashboard's GPUs open Node & GPU on that node; each link
    sets only variables its target has, from labels its panel's query keeps."""
    boards = {load(p)["uid"]: load(p) for p in DASHBOARDS}
    targets_of: dict[str, set[str]] = {}
    for uid, board in boards.items():
        own = {v["name"] for v in board["templating"]["list"]}
        for panel, link in data_links(board):
            match = re.fullmatch(r"/d/([\w-]+)/[\w-]+\?(.*)", link["url"])
            assert match, link["url"]
            target = boards[match.group(1)]
            targets_of.setdefault(uid, set()).add(target["uid"])
            wanted = {v["name"] for v in target["templating"]["list"]}
            for param in match.group(2).split("&"):
                if param == "${__url_time_range}":
                    continue
                if param.startswith("${"):  # ${cluster:queryparam}: this board's selection
                    name = re.fullmatch(r"\$\{(\w+):queryparam\}", param)
                    assert name and name.group(1) in own & wanted, param
                    continue
                var, _, value = param.partition("=")
                assert var.removeprefix("var-") in wanted, (uid, panel["title"], var)
                source = re.fullmatch(
                    r"\$\{(?:__field\.labels|__data\.fields)\.(\w+)\}|\$\{(\w+)\}", value
                )
                assert source, (uid, panel["title"], value)
                if source.group(2):
                    assert source.group(2) in own, value
                elif panel["type"] != "table":
                    exprs = [t["expr"] for t in panel["targets"]]
                    assert all(source.group(1) in kept_labels(e) for e in exprs), (
                        uid,
                        panel["title"],
                        source.group(1),
                    )
    assert "wattprint-workload" in targets_of["wattprint-fleet"]
    assert "wattprint-workload" in targets_of["wattprint-carbon-budgets"]
    assert "wattprint-node-gpu" in targets_of["wattprint-workload"]


def test_fleet_keeps_two_clusters_with_one_node_name_apart(tmp_path: Path) -> None:
    """gpu-1 of cluster a (300 W, measured) and gpu-1 of cluster b (100 W, estimated):
    all clusters sum both, cluster a shows its own, and the estimated share's join
    never pairs one cluster's node with the other's."""
    board = load(REPO / "dashboards" / "fleet.json")
    series = []
    for cluster, watts, method in (("a", 300, "nvml_energy_counter"), ("b", 100, "model")):
        node = f'cluster="{cluster}",instance="gpu-1",job="wattprint"'
        estimated = str(is_estimated(method)).lower()
        series += [
            {
                "series": f'wattprint_gpu_energy_joules_total{{{node},gpu="0"}}',
                "values": f"0+{watts * 60}x60",
            },
            {
                "series": f'wattprint_measurement_info{{{node},component="gpu",device="0",'
                f'method="{method}",estimated="{estimated}"}}',
                "values": "1x60",
            },
        ]
    tests = []
    for cluster, power, share in ((".*", 400, 0.25), ("a", 300, 0), ("b", 100, 1)):
        values = {"datasource": "", "cluster": cluster, "job": ".*", "node": ".*"}
        values |= {"namespace": ".*", "workload": ".*"}
        for title, value in (("Power now (chips)", power), ("Estimated share", share)):
            [expr] = panel_expr(board, title, values)
            tests.append(
                {
                    "expr": expr,
                    "eval_time": "60m",
                    "exp_samples": [{"labels": "{}", "value": value}],
                }
            )
    spec = {
        "rule_files": [str(p) for p in RULE_FILES if p.name == "recording.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    path = tmp_path / "clusters.test.yml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_inference_panels_per_model_with_embodied_and_a_pod_of_two_models(
    tmp_path: Path,
) -> None:
    """The Inference dashboard's panels over the rules the shipped presets make, on a
    synthetic hour (promtool evaluates both): a vLLM pod with an embodied figure, a
    Triton pod serving two models, and a pod that served nothing (not on the panels)."""
    rules = tmp_path / "inference.rules.yml"
    rules.write_text(sci.render(sci.load_units(REPO / "rules" / "inference-units.yaml")))
    board = load(REPO / "dashboards" / "inference.json")
    values = {"datasource": "", "node": ".*", "namespace": ".*", "workload": "", "model": ".*"}
    values |= {"__rate_interval": "5m", "__range": "1h", "__range_s": "3600"}
    node = 'instance="n1:9950",job="wattprint",component="gpu",gpu="0",scheduler="kubernetes"'

    def pod(metric: str, ns: str, name: str, per_minute: float) -> dict[str, str]:
        labels = f'{node},namespace="{ns}",pod="{name}",workload="{name}"'
        return {"series": f"{metric}{{{labels}}}", "values": f"0+{per_minute}x60"}

    def engine(metric: str, ns: str, name: str, per_minute: float, **extra: str) -> dict[str, str]:
        labels = ",".join(f'{k}="{v}"' for k, v in {**extra, "namespace": ns, "pod": name}.items())
        return {"series": f"{metric}{{{labels}}}", "values": f"0+{per_minute}x60"}

    energy, grams = (
        "wattprint_workload_energy_joules_total",
        "wattprint_workload_emissions_grams_total",
    )
    embodied = "wattprint_workload_embodied_grams_total"
    series = [
        # chat-0: 24 kJ a minute (400 W), 8 g + 2 g embodied, 400 + 200 tokens, 3 requests
        pod(energy, "llm", "chat-0", 24000),
        pod(grams, "llm", "chat-0", 8),
        pod(embodied, "llm", "chat-0", 2),
        engine("vllm:prompt_tokens_total", "llm", "chat-0", 400, model_name="llama", engine="0"),
        engine(
            "vllm:generation_tokens_total", "llm", "chat-0", 200, model_name="llama", engine="0"
        ),
        engine(
            "vllm:request_success_total",
            "llm",
            "chat-0",
            3,
            model_name="llama",
            engine="0",
            finished_reason="stop",
        ),
        # trt-0: 12 kJ and 6 g a minute, no embodied figure; models a (100) and b (300)
        pod(energy, "rag", "trt-0", 12000),
        pod(grams, "rag", "trt-0", 6),
        engine("nv_llm_input_token_len_sum", "rag", "trt-0", 100, model="a", version="1"),
        engine("nv_llm_output_token_len_sum", "rag", "trt-0", 300, model="b", version="1"),
        # idle-0: energy, no tokens
        pod(energy, "llm", "idle-0", 6000),
        pod(grams, "llm", "idle-0", 2),
        engine("vllm:generation_tokens_total", "llm", "idle-0", 0, model_name="x", engine="0"),
    ]
    llama, a, b = (
        '{model="llama", namespace="llm"}',
        '{model="a", namespace="rag"}',
        '{model="b", namespace="rag"}',
    )
    expected = {
        ("Energy per token by model", "A"): [(llama, 24000 / 600), (a, 30), (b, 30)],
        ("Energy per token by model", "B"): [(llama, 24000 / 200), (b, 12000 / 300)],
        ("gCO2e per 1,000 tokens by model", "A"): [
            (llama, 1000 * 10 / 600),
            (a, 1000 * 6 / 400),
            (b, 1000 * 6 / 400),
        ],
        # An engine up but idle shows: 0 tokens/s beside the power it still draws.
        ("Tokens per second by model", "A"): [
            (llama, 10),
            (a, 100 / 60),
            (b, 5),
            ('{model="x", namespace="llm"}', 0),
        ],
        ("Power of the serving pods", "A"): [
            ('{namespace="llm", pod="chat-0"}', 400),
            ('{namespace="llm", pod="idle-0"}', 100),
            ('{namespace="rag", pod="trt-0"}', 200),
        ],
        ("Energy per request by model", "A"): [(llama, 8000)],
        ("Embodied share (last hour)", "A"): [
            ('{namespace="llm"}', 2 / (8 + 2 + 2)),  # the idle pod's grams count too
            ('{namespace="rag"}', 0),
        ],
        ("Energy with no tokens (last hour)", "A"): [
            ('{namespace="llm", pod="idle-0"}', 6000 * 60)
        ],
        ("Tokens that joined no energy (last hour)", "A"): [],
        ("Engines scraped by several jobs", "A"): [],
        ("SCI, gCO2e per 1,000 tokens (last hour)", "A"): [
            (llama, 1000 * 10 / 600),
            (a, 1000 * 6 / 400),
            (b, 1000 * 6 / 400),
        ],
        ("SCI, gCO2e per request (last hour)", "A"): [(llama, 10 / 3)],
    }
    found = {(p["title"], t["refId"]): substitute(t["expr"], values) for p, t in targets(board)}
    assert set(found) == set(expected)
    tests = [
        {
            # micro-units, rounded: the same sums in another order differ in the last bit
            "expr": f"round(({found[key]}) * 1e6)",
            "eval_time": "60m",
            "exp_samples": [{"labels": labels, "value": round(v * 1e6)} for labels, v in samples],
        }
        for key, samples in expected.items()
    ]
    spec = {
        "rule_files": [str(p) for p in RULE_FILES] + [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    path = tmp_path / "inference.test.yml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
