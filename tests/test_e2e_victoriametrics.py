"""The same rules, dashboards and report on VictoriaMetrics (Debian's victoria-metrics
1.79: the single-node server, vmagent and vmalert, with their defaults) as on
Prometheus 2.42, side by side.

- Identical data: one synthetic two-node history (a job older than every window, one in
  its first minute, one that ended, an exporter restart, an idle device) is written into
  a Prometheus (promtool blocks) and a VictoriaMetrics (import API). Every recording
  rule, alert and dashboard query, evaluated on both at the instants of the samples,
  gives the same series and values within 1 %.
- Live, the scenarios of test_e2e_prometheus.py: the real exporter replays the H200
  trace; vmagent scrapes it into VictoriaMetrics and vmalert evaluates rules/ (and a
  generated tiny budget) against it; a Prometheus scrapes the same exporter (as a second
  host) and evaluates the same files. The job's energy and emissions from the rules
  match the trace on both; a rate is the counters' rise over its window on both, also in
  a job's first seconds; every dashboard query returns data; `wattprint report` gives
  the exporter's counter in every format; the page alert fires on both and the residual
  alert on neither.

test_report.py runs its synthetic-fleet report cases against both engines too.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from clock_fakes import kept_clock_exporter
from conftest import TRACE, require_tool
from pm_counters_fake import PmCountersNode
from prom_harness import (
    ONLY_THE_TRACE,
    free_port,
    import_openmetrics,
    relay,
    require_vm_tool,
    run_prometheus,
    run_victoriametrics,
    run_vmagent,
    run_vmalert,
    stop_process,
)
from test_dashboards import DASHBOARDS, load, substitute, targets, variable_queries
from test_rules import RULE_FILES, gen, rules
from wattprint.sources.registry import is_estimated

pytestmark = pytest.mark.slow

VM_TOOLS = ("victoria-metrics", "vmagent", "vmalert")
JOULES_PER_KWH = 3.6e6


@dataclass
class Engine:
    name: str
    url: str

    def query(self, expr: str, at: float | None = None, nocache: bool = True) -> list[Any]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        if nocache:
            # VictoriaMetrics would move a query within 30 s of now back by 30 s.
            params["nocache"] = "1"
        reply = requests.get(f"{self.url}/api/v1/query", params=params, timeout=30)
        assert reply.status_code == 200, f"{self.name}: {expr}: {reply.text}"
        result: list[Any] = reply.json()["data"]["result"]
        return result

    def query_range(
        self, expr: str, start: float, end: float, step: float, nocache: bool = True
    ) -> list[Any]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"}
        if nocache:
            params["nocache"] = "1"
        reply = requests.get(f"{self.url}/api/v1/query_range", params=params, timeout=30)
        assert reply.status_code == 200, f"{self.name}: {expr}: {reply.text}"
        result: list[Any] = reply.json()["data"]["result"]
        return result

    def value(self, expr: str, at: float | None = None) -> float:
        result = self.query(expr, at)
        assert len(result) == 1, f"{self.name}: {expr}: {result}"
        return float(result[0]["value"][1])

    def samples(self, selector: str, at: float, span: str = "1h") -> list[tuple[float, float]]:
        """The raw samples of one series in (at - span, at]."""
        result = self.query(f"{selector}[{span}]", at)
        assert len(result) == 1, f"{self.name}: {selector}: {result}"
        return [(float(t), float(v)) for t, v in result[0]["values"]]


def wait_until(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def close(a: float, b: float, rel: float = 0.01) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-9


# -- recorded series as the expressions that define them --------------------------------

RECORDED = {r["record"]: r["expr"] for r in rules() if "record" in r}
# Labels that the exporter's series carry themselves, so that a matcher on them can be
# moved from a recorded series to the selectors its rule reads.
PUSHABLE = {"instance", "namespace", "workload"}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
_KEYWORDS |= {"and", "or", "unless", "inf", "nan"}


def _selectors(expr: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of each metric name in a PromQL expression; `end` is past
    its {...} matchers if it has them."""
    masked = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: '"' + "_" * (len(m.group()) - 2) + '"', expr)
    masked = re.sub(r"\[[^\]]*\]", lambda m: "[" + "_" * (len(m.group()) - 2) + "]", masked)
    masked = re.sub(r"\{[^}]*\}", lambda m: "{" + "_" * (len(m.group()) - 2) + "}", masked)
    # Label lists of by/on/group_left(...): names, not series.
    masked = re.sub(
        r"\b((?:by|without|on|ignoring|group_left|group_right)\s*)\(([^)]*)\)",
        lambda m: m.group(1) + "(" + "_" * len(m.group(2)) + ")",
        masked,
    )
    found = []
    for m in re.finditer(r"(?<![\w:.\"$])[a-zA-Z_:][\w:]*", masked):
        name, end = m.group(), m.end()
        after = masked[end:]
        if name in _KEYWORDS or re.match(r"\s*(\(|(by|without)\b)", after) or set(name) == {"_"}:
            continue
        brace = re.match(r"\s*\{[^}]*\}", masked[end:])
        found.append((m.start(), end + (brace.end() if brace else 0), name))
    return found


def _matchers(text: str) -> list[tuple[str, str, str]]:
    return re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")', text)


def _with_matchers(selector: str, text: str) -> str:
    if not selector.endswith("}"):
        return f"{selector}{{{text}}}"
    inside = selector[selector.index("{") + 1 : -1].strip()
    return selector[: selector.index("{")] + "{" + (f"{inside}, " if inside else "") + text + "}"


def inline(expr: str) -> str | None:
    """`expr` with every recorded series replaced by its rule's expression, so that it
    reads only the exporter's series and the budgets; None if a matcher on a recorded
    series cannot be moved to the series its rule reads (e.g. method, which a join adds)."""
    for _ in range(10):
        out, last, changed = [], 0, False
        for start, end, name in _selectors(expr):
            if name not in RECORDED:
                continue
            matchers = [m for m in _matchers(expr[start:end]) if m[1:] != ("=~", '".*"')]
            if any(label not in PUSHABLE for label, _, _ in matchers):
                return None
            body = RECORDED[name]
            if matchers:
                text = ", ".join(f"{k}{op}{v}" for k, op, v in matchers)
                pieces, cut = [], 0
                for s, e, _ in _selectors(body):
                    pieces += [body[cut:s], _with_matchers(body[s:e], text)]
                    cut = e
                body = "".join(pieces) + body[cut:]
            out += [expr[last:start], f"({body.strip()})"]
            last, changed = end, True
        expr = "".join(out) + expr[last:]
        if not changed:
            return expr
    raise AssertionError(f"recorded series nested too deep: {expr}")


# -- identical data in both engines ------------------------------------------------------

SCRAPE = 15
HISTORY = 6 * 3600 + 1800  # longer than every raw window (6h)
RESTART = HISTORY - 2400  # n2's exporter restarts just after this sample
BATCH = (3 * 3600, 5 * 3600)  # a job that ended; its series stay 10 minutes
INFER = HISTORY - 45  # a job born 45 s before the end
NODES = ("n1:9950", "n2:9950")
DEVICE_COMPONENTS = ("gpu", "cpu", "memory", "platform")  # the node's input is their sum
ZONES = {"n1:9950": "DE", "n2:9950": "FR"}
PUE = {"n1:9950": 1.2, "n2:9950": 1.5}
METHODS = {  # (instance, component, device) -> method
    ("n1:9950", "gpu", "0"): "nvml_energy_counter",
    ("n1:9950", "gpu", "1"): "nvml_energy_counter",
    ("n1:9950", "cpu", "0"): "rapl",
    ("n1:9950", "memory", "0"): "model",
    ("n2:9950", "gpu", "0"): "nvml_power_integrated",
    ("n2:9950", "gpu", "1"): "nvml_energy_counter",
    ("n2:9950", "cpu", "0"): "model",
    ("n2:9950", "memory", "0"): "model",  # idle: 0 W, so no ratio of its power
    # n1 reads its input (pm_counters): the rest of the server is a component of its
    # own there, and the wall rules have n1's workloads; n2 reads none.
    ("n1:9950", "platform", "node"): "pm_counters",
}
BUDGETS = {  # (namespace, workload) -> grams per 30 days; "" workload: the namespace's
    ("ml", "train"): 500.0,
    ("serving", "infer"): 1.0,
    ("", "batch"): 200.0,
    ("ml", ""): 1000.0,
    ("serving", ""): 5.0,
}


@dataclass(frozen=True)
class Job:
    scheduler: str
    namespace: str
    workload: str
    pod: str
    instance: str
    component: str
    device: str
    share: float  # of the device's power
    start: int
    end: int


JOBS = (
    Job("kubernetes", "ml", "train", "train-0", "n1:9950", "gpu", "0", 0.7, 0, HISTORY + 1),
    Job("kubernetes", "ml", "train", "train-0", "n1:9950", "cpu", "0", 0.4, 0, HISTORY + 1),
    Job("slurm", "", "batch", "", "n1:9950", "gpu", "1", 0.9, *BATCH),
    Job("kubernetes", "ml", "train", "train-0", "n1:9950", "platform", "node", 0.5, 0, HISTORY + 1),
    Job("slurm", "", "batch", "", "n1:9950", "platform", "node", 0.3, *BATCH),
    Job(
        "kubernetes", "serving", "infer", "infer-0", "n2:9950", "gpu", "1", 0.8, INFER, HISTORY + 1
    ),
)


def watts(instance: str, component: str, device: str, t: float) -> float:
    """Each device's power over the interval that ends at t: varied, never steady."""
    if component == "platform":
        return 300 + 80 * math.sin(2 * math.pi * t / 1200)
    phase = NODES.index(instance) + int(device or 0)
    if component == "gpu":
        return 80 + 50 * int(device) + 250 * (1 + math.sin(2 * math.pi * t / 1800 + phase))
    if component == "cpu":
        return 50 + 20 * math.sin(2 * math.pi * t / 900 + phase)
    return 10.0 if instance == "n1:9950" else 0.0


def intensity(instance: str, t: float) -> float:
    return 300 + 100 * math.sin(2 * math.pi * t / 7200) + (50 if instance == "n2:9950" else 0)


Points = list[tuple[int, float]]


def fleet() -> list[tuple[str, dict[str, str], Points]]:
    """(name, labels, samples) of the exporter series two nodes serve, scraped every 15 s,
    and the budgets. Counters as the exporter serves them: a new workload or unattributed
    series starts at 0; after n2's restart every counter of n2 starts over."""
    out: list[tuple[str, dict[str, str], Points]] = []
    times = range(0, HISTORY + 1, SCRAPE)
    devices = sorted({(i, c, d) for i, c, d in METHODS})
    for instance in NODES:
        node = {"instance": instance, "job": "wattprint"}
        for inst, component, device in devices:
            if inst != instance:
                continue
            jobs = [
                j for j in JOBS if (j.instance, j.component, j.device) == (inst, component, device)
            ]
            dev_e = dev_g = 0.0
            idle_e = idle_g = 0.0
            job_e = {j: 0.0 for j in jobs}
            job_g = {j: 0.0 for j in jobs}
            series: dict[Any, Points] = {"device": [], "idle_e": [], "idle_g": []}
            for j in jobs:
                series[(j, "e")], series[(j, "g")] = [], []
            born_idle = 0
            for t in times:
                restarted = instance == "n2:9950" and t > RESTART
                if instance == "n2:9950" and t == RESTART + SCRAPE:
                    dev_e = dev_g = idle_e = idle_g = 0.0
                    born_idle = t
                if t > 0:
                    joules = watts(instance, component, device, t) * SCRAPE
                    grams = joules * intensity(instance, t) / JOULES_PER_KWH * PUE[instance]
                    dev_e += joules
                    dev_g += grams
                    left = 1.0
                    for j in jobs:
                        if j.start < t <= j.end:
                            job_e[j] += joules * j.share
                            job_g[j] += grams * j.share
                            left -= j.share
                    idle_e += joules * left
                    idle_g += grams * left
                series["device"].append((t, dev_e))
                # A new series is served at 0 first (collector.py).
                first = t == born_idle
                series["idle_e"].append((t, 0.0 if first else idle_e))
                series["idle_g"].append((t, 0.0 if first else idle_g))
                for j in jobs:
                    if j.start <= t <= j.end + 600 and not (restarted and j.start <= RESTART):
                        series[(j, "e")].append((t, 0.0 if t == j.start else job_e[j]))
                        series[(j, "g")].append((t, 0.0 if t == j.start else job_g[j]))
            gpu = {"gpu": device} if component == "gpu" else {}
            if component == "gpu":
                meta = {"uuid": f"GPU-{instance[:2]}-{device}", "model": "NVIDIA H100 80GB HBM3"}
                out.append(
                    ("wattprint_gpu_energy_joules_total", {**node, **gpu, **meta}, series["device"])
                )
            elif component == "platform":
                out.append(("wattprint_platform_energy_joules_total", node, series["device"]))
                # The node's input: its devices' energy and the platform's, as the
                # exporter keeps it.
                inputs = [
                    points
                    for name, labels, points in out
                    if labels.get("instance") == instance
                    and name in {f"wattprint_{c}_energy_joules_total" for c in DEVICE_COMPONENTS}
                ]
                total = [(t, sum(p[k][1] for p in inputs)) for k, t in enumerate(times)]
                out.append(("wattprint_node_energy_joules_total", node, total))
                info = {"component": "node", "device": "node", "method": "pm_counters"}
                out.append(
                    (
                        "wattprint_measurement_info",
                        {**node, **info, "estimated": "false"},
                        [(t, 1.0) for t in times],
                    )
                )
            else:
                name = f"wattprint_{component}_energy_joules_total"
                out.append((name, {**node, "package": device}, series["device"]))
            part = {**node, "component": component, **gpu}
            out.append(("wattprint_unattributed_energy_joules_total", part, series["idle_e"]))
            out.append(("wattprint_unattributed_emissions_grams_total", part, series["idle_g"]))
            for j in jobs:
                who = {"scheduler": j.scheduler, "namespace": j.namespace, "workload": j.workload}
                who = {k: v for k, v in {**who, "pod": j.pod}.items() if v}
                out.append(
                    ("wattprint_workload_energy_joules_total", {**part, **who}, series[(j, "e")])
                )
                out.append(
                    ("wattprint_workload_emissions_grams_total", {**part, **who}, series[(j, "g")])
                )
                if component == "gpu":
                    held = [(t, 1.0) for t, _ in series[(j, "e")] if t <= j.end]
                    info = {**node, **who, "gpu": device, "uuid": f"GPU-{instance[:2]}-{device}"}
                    out.append(("wattprint_workload_gpu_info", info, held))
            method = {
                "component": component,
                "device": device,
                "method": METHODS[(inst, component, device)],
                "estimated": str(is_estimated(METHODS[(inst, component, device)])).lower(),
            }
            out.append(
                ("wattprint_measurement_info", {**node, **method}, [(t, 1.0) for t in times])
            )
        zone = {"zone": ZONES[instance], "provider": "static", "signal": "average"}
        gauges: list[tuple[str, dict[str, str], Callable[[int], float]]] = [
            (
                "wattprint_grid_carbon_intensity_grams_per_kwh",
                zone,
                lambda t, i=instance: intensity(i, t),
            ),
            ("wattprint_grid_carbon_intensity_timestamp_seconds", zone, lambda t: float(t)),
            ("wattprint_pue_ratio", {}, lambda t, i=instance: PUE[i]),
            ("wattprint_build_info", {"version": "0.1.0"}, lambda t: 1.0),
            ("wattprint_sampler_last_success_timestamp_seconds", {}, lambda t: float(t)),
            ("wattprint_sampler_interval_seconds", {}, lambda t: 1.0),
            ("wattprint_collector_success", {"collector": "nvml"}, lambda t: 1.0),
            ("wattprint_collector_duration_seconds", {"collector": "nvml"}, lambda t: 0.01),
            ("wattprint_collector_errors_total", {"collector": "nvml"}, lambda t: 0.0),
            ("wattprint_carbon_errors_total", {"provider": "static"}, lambda t: 0.0),
            ("wattprint_carbon_fallback_active", {"zone": ZONES[instance]}, lambda t: 0.0),
        ]
        for name, extra, value in gauges:
            out.append((name, {**node, **extra}, [(t, value(t)) for t in times]))
    for (namespace, workload), grams in BUDGETS.items():
        level = "namespace_workload" if workload else "namespace"
        labels = {k: v for k, v in {"namespace": namespace, "workload": workload}.items() if v}
        name = f"{level}:wattprint_emissions_budget_grams:30d"
        out.append((name, labels, [(t, grams) for t in times]))
    return out


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))


def openmetrics(series: list[tuple[str, dict[str, str], Points]], t0: int) -> str:
    """For promtool tsdb create-blocks-from openmetrics (seconds)."""
    out: list[str] = []
    for name in sorted({n for n, _, _ in series}):
        counter = name.endswith("_total")
        family = name.removesuffix("_total") if counter else name
        out.append(f"# TYPE {family} {'counter' if counter else 'gauge'}")
        for n, labels, points in series:
            if n == name:
                text = _label_text(labels)
                out.extend(f"{name}{{{text}}} {v!r} {t0 + t}" for t, v in points)
    return "\n".join([*out, "# EOF"]) + "\n"


@dataclass
class Twins:
    prom: Engine
    vm: Engine
    t0: int

    def engines(self) -> tuple[Engine, Engine]:
        return self.prom, self.vm


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Twins]:
    with twins_stack(tmp_path_factory.mktemp("twins")) as stack:
        yield stack


@contextmanager
def twins_stack(tmp: Path) -> Iterator[Twins]:
    """A Prometheus and a VictoriaMetrics holding the same synthetic history."""
    prometheus, promtool = require_tool("prometheus"), require_tool("promtool")
    victoria = require_vm_tool("victoria-metrics")
    tmp.mkdir(parents=True, exist_ok=True)
    # Ending two hours ago on the quarter hour: in the past for both, clear of the head.
    t0 = (int(time.time()) // 900) * 900 - 2 * 3600 - HISTORY
    series = fleet()
    (tmp / "fleet.om").write_text(openmetrics(series, t0))
    subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(tmp / "fleet.om"),
            str(tmp / "tsdb"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with ExitStack() as stack:
        prom = stack.enter_context(run_prometheus(prometheus, tmp / "prom", tsdb=tmp / "tsdb"))
        vm = stack.enter_context(run_victoriametrics(victoria, tmp / "vm"))
        import_openmetrics(vm, (tmp / "fleet.om").read_text())
        twins = Twins(Engine("Prometheus", prom), Engine("VictoriaMetrics", vm), t0)
        count = f"count_over_time(wattprint_gpu_energy_joules_total[{HISTORY + 60}s])"
        expected = len(range(0, HISTORY + 1, SCRAPE))
        for engine in twins.engines():
            wait_until(
                lambda e=engine: (
                    [float(r["value"][1]) for r in e.query(count, t0 + HISTORY)] == [expected] * 4
                ),
                30,
                f"{engine.name} to hold the history",
            )
        yield twins


def as_map(result: list[Any]) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(
            r["value"][1]
        )
        for r in result
    }


# The instants compared (seconds after t0): samples, where Prometheus has nothing to
# extrapolate at the end of a window. infer is 0, 15, 30 and 45 s old at the last four.
INSTANTS = {
    "train older than every window, infer 45 s old": HISTORY,
    "infer 30 s old": HISTORY - 15,
    "infer 15 s old": HISTORY - 30,
    "infer born": HISTORY - 45,
    "30 s after n2's restart": RESTART + 30,
    "batch running for 1 h": BATCH[0] + 3600,
    "batch ended 20 minutes ago": BATCH[1] + 1200,
}


# Near 0 by design: compared in absolute terms, against the alert's 1 % threshold.
ABSOLUTE = {"instance_component:wattprint_attribution_residual:ratio_increase1h": 0.001}


def differences(twins: Twins, expr: str, at: float, absolute: float = 0.0) -> list[str]:
    """What differs between the engines' answers to `expr` at `at`, beyond 1 % (or
    `absolute`). A series born at this very sample has one sample: VictoriaMetrics
    computes 0 from it, Prometheus nothing, and that alone is no difference."""
    prom, vm = (as_map(e.query(expr, at)) for e in twins.engines())
    only = {k: v for k, v in vm.items() if k not in prom}
    if prom.keys() - vm.keys() or any(v != 0 for v in only.values()):
        return [f"series differ: Prometheus {sorted(prom)} VictoriaMetrics {sorted(vm)}"]
    return [
        f"{dict(key)}: Prometheus {prom[key]!r} VictoriaMetrics {vm[key]!r}"
        for key in prom
        if not (close(prom[key], vm[key]) or abs(prom[key] - vm[key]) <= absolute)
    ]


def rule_cases() -> list[tuple[str, str]]:
    cases = []
    for rule in rules():
        name = rule.get("record") or rule["alert"]
        expr = inline(rule["expr"])
        if expr is not None:
            cases.append((name, expr))
    return cases


# Rules that cannot be inlined into one query: none since the estimated ratios select
# on the exporter's own `estimated` label instead of a label a join adds.
NOT_INLINED: set[str] = set()


def test_every_rule_and_alert_means_the_same_on_both_engines(twins: Twins) -> None:
    cases = rule_cases()
    names = {name for name, _ in cases}
    every = {r.get("record") or r["alert"] for r in rules()}
    assert every - names == NOT_INLINED
    failures, seen = [], 0
    for what, offset in INSTANTS.items():
        at = twins.t0 + offset
        for name, expr in cases:
            seen += bool(twins.prom.query(expr, at))
            found = differences(twins, expr, at, ABSOLUTE.get(name, 0.0))
            failures += [f"{name} ({what}): {d}" for d in found]
    assert not failures, "\n".join(failures)
    assert seen > len(cases) * 3  # most rules have series to compare, not just none


def dashboard_cases(workload: str) -> list[tuple[str, dict[str, Any], str]]:
    values = {
        "datasource": "",
        "node": ".*",
        "namespace": ".*",
        "workload": workload,
        "__rate_interval": "1m",
        "__range": "1h",
        "__range_s": "3600",
    }
    cases = []
    for path in DASHBOARDS:
        for panel, target in targets(load(path)):
            expr = inline(substitute(target["expr"], values))
            where = f"{path.stem} / {panel['title']} {target['refId']}"
            if expr is not None:
                cases.append((where, target, expr))
    return cases


@pytest.mark.parametrize("workload", ["train", "infer"])
def test_every_dashboard_query_means_the_same_on_both_engines(twins: Twins, workload: str) -> None:
    end = twins.t0 + HISTORY
    failures, compared = [], 0
    for where, target, expr in dashboard_cases(workload):
        if target.get("instant"):
            for what, offset in INSTANTS.items():
                failures += [
                    f"{where} ({what}): {d}" for d in differences(twins, expr, twins.t0 + offset)
                ]
            compared += 1
            continue
        # As Grafana asks: the range on multiples of the step (here 1m, 30 minutes).
        prom, vm = (e.query_range(expr, end - 1800, end, 60) for e in twins.engines())
        as_points = lambda result: {  # noqa: E731
            (tuple(sorted(r["metric"].items())), float(t)): float(v)
            for r in result
            for t, v in r["values"]
        }
        p, v = as_points(prom), as_points(vm)
        if p.keys() != v.keys():
            failures.append(f"{where}: points differ: {sorted(set(p) ^ set(v))[:3]}")
        failures += [
            f"{where} at {k[1]}: {p[k]!r} vs {v[k]!r}"
            for k in p.keys() & v.keys()
            if not close(p[k], v[k])
        ]
        compared += bool(p)
    assert not failures, "\n".join(failures)
    assert compared > 40


# -- live: vmagent and vmalert beside Prometheus, on one exporter ---------------------------

SPEED = 4.0
NODE_W = 6000.0  # the node's input (pm_counters): the rest is the platform
WORKLOAD = "phased-load"
ENERGY_RULE = "namespace_workload_component:wattprint_workload_energy_joules:increase1h"
NODE_ENERGY_RULE = "instance_component:wattprint_energy_joules:increase1h"
EMISSIONS_RULE = "namespace_workload_component:wattprint_workload_emissions_grams:increase1h"
POWER_RULE = "instance_component:wattprint_energy_joules:rate5m"
JOB_POWER_RULE = "namespace_workload_component:wattprint_workload_energy_joules:rate5m"
GPU_SERIES = f'{{workload="{WORKLOAD}", component="gpu"}}'
COUNTER = f"wattprint_workload_energy_joules_total{GPU_SERIES}"
GRAMS = f"wattprint_workload_emissions_grams_total{GPU_SERIES}"
BURN = "namespace_workload:wattprint_emissions_budget_burn:ratio_rate{}"
LIVE_BUDGETS = [{"workload": WORKLOAD, "grams": 1}, {"namespace": "e2e-team", "budget": "1kg"}]
# The replayed process has no namespace, so no namespace has both a budget and emissions.
# The same panels as with Prometheus (test_e2e_prometheus.py): no namespaced budget,
# and no job that exports units of work.
EMPTY_BY_DESIGN = {
    # The workload runs outside Kubernetes (namespace ""): the namespace panels, which
    # follow $namespace, have no namespace to show.
    ("wattprint-carbon-budgets", "Namespace budgets used", "A"),
    ("wattprint-carbon-budgets", "Namespace burn rate (1h)", "A"),
    ("wattprint-workload", "Carbon per unit of work (SCI, last hour)", "A"),
} | {
    # The Inference dashboard needs serving engines' counters: test_e2e_inference.py.
    ("wattprint-inference", panel["title"], target["refId"])
    for panel, target in targets(load(DASHBOARDS[0].parent / "inference.json"))
}
PAGE = f'ALERTS{{alertname="WattprintWorkloadEmissionBudgetBurnFast", workload="{WORKLOAD}"}}'
RESIDUAL = 'ALERTS{alertname="WattprintAttributionResidualHigh"}'


@dataclass
class Live:
    prom: Engine
    vm: Engine
    target: str
    started: float
    logs: Path

    def engines(self) -> tuple[Engine, Engine]:
        return self.prom, self.vm


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    with live_stack(tmp_path_factory.mktemp("live")) as stack:
        yield stack


@contextmanager
def live_stack(tmp: Path) -> Iterator[Live]:
    """The exporter replaying the trace, scraped by vmagent into VictoriaMetrics (rules
    by vmalert) and by a Prometheus (rules by itself), from the exporter's start on."""
    tools = {name: require_vm_tool(name) for name in VM_TOOLS}
    prometheus = require_tool("prometheus")
    tmp.mkdir(parents=True, exist_ok=True)
    budgets = tmp / "budgets.rules.yml"
    budgets.write_text(gen.render(LIVE_BUDGETS))
    rule_files = [*RULE_FILES, budgets]
    target = f"127.0.0.1:{free_port()}"
    with ExitStack() as stack:
        # Prometheus reaches the exporter from 127.0.0.2, as a second host would: the
        # exporter gives each scraper its own first 0 of a new series (collector.py).
        relayed = stack.enter_context(relay(target))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {
                    "job_name": "wattprint",
                    "static_configs": [{"targets": [relayed]}],
                    "relabel_configs": [{"target_label": "instance", "replacement": target}],
                }
            ],
        }
        prom = stack.enter_context(run_prometheus(prometheus, tmp / "prom", yaml.safe_dump(config)))
        vm = stack.enter_context(run_victoriametrics(tools["victoria-metrics"], tmp / "vm"))
        scrape = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "wattprint",
                    # vmagent's default, spelled out as docs/scale.md advises.
                    "honor_timestamps": True,
                    "static_configs": [{"targets": [target]}],
                }
            ],
        }
        stack.enter_context(
            run_vmagent(tools["vmagent"], tmp / "vmagent", vm, yaml.safe_dump(scrape))
        )
        stack.enter_context(run_vmalert(tools["vmalert"], tmp / "vmalert", vm, rule_files, "1s"))
        s = Live(Engine("Prometheus", prom), Engine("VictoriaMetrics", vm), target, 0.0, tmp)
        # Both try the target before the exporter exists, so that their first successful
        # scrapes come before the workload appears (2.5 s into the replay).
        up = f'up{{instance="{target}"}}'
        for engine in s.engines():
            wait_until(lambda e=engine: e.query(up), 30, f"{engine.name}'s first scrape")
        log = tmp / "exporter.log"
        node = PmCountersNode(tmp / "sys", NODE_W).start()
        stack.callback(node.stop)
        s.started = time.time()
        exporter = subprocess.Popen(
            [
                # On a node whose clock a time daemon keeps, as in production: only then
                # does the exporter stamp its samples (clock.py).
                *kept_clock_exporter(tmp),
                f"--web.listen-address={target}",
                "--gpu.source=replay",
                f"--gpu.replay-file={TRACE}",
                f"--replay.speed={SPEED}",
                "--cpu.source=model",
                "--memory.source=model",
                "--carbon.provider=static",
                "--carbon.zone=DE",
                "--sample.interval=250ms",
                # The trace's H200 has no cited embodied figure: give one, so the
                # Footprint panel's embodied query has data.
                "--embodied.gpu-kgco2e=NVIDIA H200=164",
                ONLY_THE_TRACE,
                *node.flags(),
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        stack.callback(stop_process, exporter)
        for engine in s.engines():
            wait_until(
                lambda e=engine: exporter.poll() is not None or e.query(f"{up} == 1"),
                30,
                f"{engine.name}'s first scrape of the exporter",
            )
        assert exporter.poll() is None, log.read_text()[-3000:]
        yield s


@pytest.fixture(scope="module")
def replay_done(live: Live) -> dict[str, float]:
    return wait_for_the_end(live)


def wait_for_the_end(live: Live) -> dict[str, float]:
    """Wait for the replay to end; per engine, the time of its first sample after it."""
    samples = trace_gpu()
    time.sleep(max(0.0, live.started + (samples[-1]["t"] - samples[0]["t"]) / SPEED - time.time()))
    last: dict[str, float] = {}
    for engine in live.engines():

        def flat(e: Engine = engine) -> bool:
            points = e.samples(COUNTER, time.time(), "10s") if e.query(COUNTER) else []
            if len(points) >= 2 and points[-1][1] == points[-2][1]:
                last[e.name] = points[-1][0]
                return True
            return False

        wait_until(flat, 30, f"the end of the replay on {engine.name}")
    return last


def trace_gpu() -> list[dict[str, Any]]:
    """GPU 0 of every sample of the trace (line 1 is the header), with its time."""
    lines = TRACE.read_text().splitlines()
    return [{"t": s["t"], **s["gpus"][0]} for s in map(json.loads, lines[1:])]


def held_energy(samples: list[dict[str, Any]], baseline: int) -> float:
    """Joules the GPU counter gained after sample `baseline` in the intervals the
    workload held the GPU (a sample's state applies to the interval ending at it)."""
    joules = 0.0
    for before, after in zip(samples[baseline:], samples[baseline + 1 :], strict=False):
        if any((p.get("identity") or {}).get("workload") == WORKLOAD for p in after["processes"]):
            joules += (after["energy_mj"] - before["energy_mj"]) / 1000
    return joules


def baseline_sample(samples: list[dict[str, Any]], device_joules: float) -> int:
    """The trace sample the exporter's counters start from (its first read)."""
    end = samples[-1]["energy_mj"]
    for i, sample in enumerate(samples):
        if abs((end - sample["energy_mj"]) / 1000 - device_joules) < 0.0015:
            return i
    raise AssertionError(f"the exporter's GPU counter ({device_joules} J) is no delta of the trace")


def pick(result: list[Any], **labels: str) -> float:
    values = [
        float(r["value"][1])
        for r in result
        if all(r["metric"].get(k) == v for k, v in labels.items())
    ]
    assert len(values) == 1, f"{labels}: {result}"
    return values[0]


def rule_expr(record: str) -> str:
    return str(RECORDED[record])


def test_energy_from_the_rules_matches_the_trace(live: Live, replay_done: dict[str, float]) -> None:
    samples = trace_gpu()
    device = live.vm.value("wattprint_gpu_energy_joules_total", replay_done[live.vm.name])
    baseline = baseline_sample(samples, device)
    expected = held_energy(samples, baseline)
    assert expected > 0.9 * held_energy(samples, 0)
    trace_delta = (samples[-1]["energy_mj"] - samples[baseline]["energy_mj"]) / 1000
    found = {}
    for engine in live.engines():
        # At each engine's own last sample: Prometheus has no window end to extrapolate to.
        at = replay_done[engine.name]
        node = pick(engine.query(rule_expr(NODE_ENERGY_RULE), at), component="gpu")
        assert node == pytest.approx(trace_delta, rel=0.01), engine.name
        # Each scraper got the job's series at 0 first, so the rules count every joule.
        assert engine.value(COUNTER, at) == pytest.approx(expected, rel=1e-9)
        assert engine.value(f"min_over_time({COUNTER}[1h])", at) == 0, engine.name
        workload = pick(
            engine.query(rule_expr(ENERGY_RULE), at), workload=WORKLOAD, component="gpu"
        )
        assert workload == pytest.approx(expected, rel=0.01), engine.name
        found[engine.name] = workload
    assert found["VictoriaMetrics"] == pytest.approx(found["Prometheus"], rel=0.01)
    # vmalert's own evaluation, written back: VictoriaMetrics does not extrapolate, so
    # once the job is in the past it is the job's energy.
    recorded = f"{ENERGY_RULE}{GPU_SERIES}"
    wait_until(
        lambda: (r := live.vm.query(recorded)) and float(r[0]["value"][1]) >= expected * 0.999,
        90,
        "vmalert's record of the job's energy",
    )
    assert live.vm.value(recorded) == pytest.approx(expected, rel=1e-6)


def test_emissions_are_energy_times_intensity(live: Live, replay_done: dict[str, float]) -> None:
    vm = live.vm
    intensity = vm.value('wattprint_grid_carbon_intensity_grams_per_kwh{signal="average"}')
    pue = vm.value("wattprint_pue_ratio")
    ratio = f"{EMISSIONS_RULE}{GPU_SERIES} / {ENERGY_RULE}{GPU_SERIES}"
    wait_until(lambda: vm.query(ratio), 90, "vmalert's records of energy and emissions")
    assert vm.value(ratio) * JOULES_PER_KWH == pytest.approx(intensity * pue, rel=1e-6)
    grams = {
        e.name: pick(e.query(rule_expr(EMISSIONS_RULE), replay_done[e.name]), component="gpu")
        for e in live.engines()
    }
    assert grams["VictoriaMetrics"] == pytest.approx(grams["Prometheus"], rel=0.01)
    assert grams["VictoriaMetrics"] == pytest.approx(vm.value(GRAMS), rel=1e-6)


def test_a_rate_is_the_rise_over_its_window_from_the_first_seconds(
    live: Live, replay_done: dict[str, float]
) -> None:
    """The job's power, burn rate and the Fleet's power, evaluated by each engine at
    its own samples: the counter's rise over the window divided by the window, both in
    the job's first seconds and after it. (MetricsQL's rate() would divide by the span
    of the samples: the job's power since it started, not over the window.)"""
    budget = f'namespace_workload:wattprint_emissions_budget_grams:30d{{workload="{WORKLOAD}"}}'
    fleet = board_expr("fleet", "Power now (chips)")
    for engine in live.engines():
        end = replay_done[engine.name]
        job = engine.samples(COUNTER, end, "1h")
        grams = dict(engine.samples(GRAMS, end, "1h"))
        device = {
            r["metric"]["__name__"]: [(float(t), float(v)) for t, v in r["values"]]
            for r in engine.query(f"{DEVICES}[1h]", end)
        }
        assert len(device) == 3
        assert job[0][1] == 0 and len(job) > 10
        # A few seconds into the job, half way, and at its end.
        for t, joules in (job[3], job[len(job) // 2], job[-1]):
            power = pick(
                engine.query(rule_expr(JOB_POWER_RULE), t), workload=WORKLOAD, component="gpu"
            )
            assert power == pytest.approx(joules / 300, rel=1e-9), (engine.name, t)
            burn = inline(BURN.format("5m"))
            assert burn is not None
            ratio = grams[t] / 300 / (engine.value(budget, t) / 2592000)
            assert pick(engine.query(burn, t), workload=WORKLOAD) == pytest.approx(ratio, rel=1e-9)
        # The devices' series started with the exporter, less than the window ago.
        # VictoriaMetrics counts their first values in full (close to 0); Prometheus at
        # least the rise after them and at most all of it.
        first = sum(points[0][1] for points in device.values())
        for t, _ in device[DEVICE][3::5]:
            power = engine.value(fleet, t)
            joules = sum(dict(points)[t] for points in device.values())
            if engine is live.vm:
                assert power == pytest.approx(joules / 300, rel=1e-9), t
            else:
                assert (joules - first) / 300 * 0.999999 <= power <= joules / 300 * 1.000001, t


def test_vmalerts_records_agree_with_prometheus_20_s_after_the_job(
    live: Live, replay_done: dict[str, float]
) -> None:
    """The job's power and burn rates as vmalert recorded them in VictoriaMetrics, 20 s
    after the replayed job ended while they still fall, against Prometheus' rules at its
    last sample before that instant. Without -datasource.lookback each record was ~30 s
    late and each burn rate (a ratio of two records) ~60 s: half of Prometheus'.

    Prometheus at its own sample instant, not its record at any instant: between samples
    it extrapolates the last rise by up to a scrape interval, which for a job 36 s old
    is up to 3 % of a 5-minute rate (docs/scale.md)."""
    samples = trace_gpu()
    at = live.started + (samples[-1]["t"] - samples[0]["t"]) / SPEED + 20
    # Both have written their records for `at` (VictoriaMetrics answers as of 30 s ago,
    # and vmalert evaluates that far back), with a few seconds to spare.
    time.sleep(max(0.0, at + 35 - time.time()))
    sampled = live.prom.samples(COUNTER, at, "10s")[-1][0]
    power = f"{JOB_POWER_RULE}{GPU_SERIES}"
    records = {power: rule_expr(JOB_POWER_RULE)}
    for window in ("5m", "30m", "1h", "6h"):
        burn = BURN.format(window)
        records[f'{burn}{{workload="{WORKLOAD}"}}'] = str(inline(burn))
    found = {}
    for record, expr in records.items():
        labels = {"workload": WORKLOAD} | ({"component": "gpu"} if record == power else {})
        exact = pick(live.prom.query(expr, sampled), **labels)
        vm, prom = live.vm.value(record, at), live.prom.value(record, at)
        found[record.split("{")[0].rsplit(":", 1)[-1]] = (round(exact, 4), vm, prom)
        assert exact > 0, record
        assert vm == pytest.approx(exact, rel=0.02), (record, exact, vm)
        # Prometheus' own record, extrapolated to its evaluation instant, is above that.
        assert exact * 0.999 <= prom <= exact * 1.04, (record, exact, prom)
    print(f"20 s after the job (Prometheus at its sample, vmalert, Prometheus' record): {found}")


def board_expr(board: str, title: str, workload: str = WORKLOAD) -> str:
    """A dashboard query as Grafana sends it, recorded series written out."""
    values = {"datasource": "", "node": ".*", "namespace": ".*", "workload": workload}
    found = [
        substitute(t["expr"], {**values, "__rate_interval": "1m"})
        for p, t in targets(load(REPO_DASHBOARDS / f"{board}.json"))
        if p["title"] == title
    ]
    assert len(found) == 1, (board, title)
    expr = inline(found[0])
    assert expr is not None
    return expr


REPO_DASHBOARDS = DASHBOARDS[0].parent
DEVICES = '{__name__=~"wattprint_(gpu|cpu|memory)_energy_joules_total"}'
DEVICE = "wattprint_gpu_energy_joules_total"


def test_every_dashboard_query_returns_data(live: Live, replay_done: dict[str, float]) -> None:
    vm = live.vm
    # The page alert feeds a table of the Carbon & budgets dashboard. Grafana's queries
    # see VictoriaMetrics 30 s late (-search.latencyOffset): wait until they show it.
    wait_until(lambda: vm.query(PAGE, nocache=False), 150, "the page alert, as Grafana sees it")
    values = {
        "datasource": "",
        "namespace": "",
        "workload": WORKLOAD,
        "node": live.target,
        "__rate_interval": "1m",
        "__range": "1h",
        "__range_s": "3600",
    }
    now = time.time()
    empty: set[tuple[str, str, str]] = set()
    for path in DASHBOARDS:
        board = load(path)
        for panel, target in targets(board):
            expr = substitute(target["expr"], values)
            # As Grafana asks: no nocache, so VictoriaMetrics' own caching and offsets.
            if target.get("instant"):
                result = vm.query(expr, now, nocache=False)
            else:
                result = vm.query_range(expr, now - 120, now, 2, nocache=False)
            if not result:
                empty.add((board["uid"], panel["title"], target["refId"]))
        found = {
            name: {
                r["metric"].get(label, "")
                for r in vm.query(f"count by ({label}) ({substitute(sel, values)})")
            }
            for name, label, sel in variable_queries(board)
        }
        assert found.get("node", {live.target}) == {live.target}
        # Processes of other tests on this machine may show up as workloads too.
        assert WORKLOAD in found.get("workload", {WORKLOAD})
    assert empty == EMPTY_BY_DESIGN


def report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wattprint", "report", f"--prometheus.url={url}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def report_json(url: str, *args: str) -> dict[str, Any]:
    result = report(url, "--format=json", *args)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_report_gives_the_exporters_counter_in_every_format(
    live: Live, replay_done: dict[str, float]
) -> None:
    samples = trace_gpu()
    for engine in live.engines():
        counter = engine.samples(COUNTER, replay_done[engine.name], "1h")
        final = counter[-1][1]
        document = report_json(engine.url, f"--workload={WORKLOAD}")
        assert document["engine"].startswith(engine.name)
        (job,) = document["jobs"]
        gpu_j = job["energy_kwh"]["gpu"] * JOULES_PER_KWH
        assert gpu_j == pytest.approx(final, rel=1e-12), engine.name
        baseline = baseline_sample(samples, engine.value("wattprint_gpu_energy_joules_total"))
        assert gpu_j == pytest.approx(held_energy(samples, baseline), rel=1e-6)
        grams = engine.samples(GRAMS, replay_done[engine.name], "1h")[-1][1]
        assert job["emissions_kg"]["total"] * 1000 == pytest.approx(grams, rel=1e-12)
        assert job["gpus"][0]["model"] == "NVIDIA H200" and job["zones"] == ["DE"]

        energy, emissions = job["energy_kwh"]["total"], job["emissions_kg"]["total"]
        table = report(engine.url, f"--workload={WORKLOAD}")
        assert table.returncode == 0, table.stderr
        head, _, rest = table.stdout.partition("\n\n")
        assert head.startswith(f"{engine.name} ") and "whole life" in head
        row = dict(
            zip(
                re.split(r"\s{2,}", rest.splitlines()[0]), re.split(r"\s{2,}", rest.splitlines()[1])
            )
        )
        assert float(row["ENERGY kWh"]) == pytest.approx(energy, rel=1e-3)
        assert float(row["CO2e kg"]) == pytest.approx(emissions, rel=1e-3)
        result = report(engine.url, f"--workload={WORKLOAD}", "--format=csv")
        (line,) = csv.DictReader(io.StringIO(result.stdout))
        assert float(line["energy_kwh"]) == energy and float(line["emissions_kg"]) == emissions
        result = report(engine.url, f"--workload={WORKLOAD}", "--format=codecarbon-csv")
        (line,) = csv.DictReader(io.StringIO(result.stdout))
        assert float(line["energy_consumed"]) == energy and float(line["emissions"]) == emissions

        # --since/--until on two of the engine's samples inside the job: exactly the
        # counter's rise between them, nothing to cut between samples.
        (t1, v1), (t2, v2) = counter[2], counter[-4]
        (job,) = report_json(
            engine.url, f"--workload={WORKLOAD}", f"--since={t1}", f"--until={t2}"
        )["jobs"]
        assert job["energy_kwh"]["gpu"] * JOULES_PER_KWH == pytest.approx(v2 - v1, rel=1e-9)
    # Without runtimeinfo, the whole life starts where the oldest data was found.
    assert "does not report its retention" in report(live.vm.url).stdout.splitlines()[0]


def test_vmagent_keeps_the_exporters_sample_times(
    live: Live, replay_done: dict[str, float]
) -> None:
    """The exporter stamps its energy samples with the sampler's read: vmagent must
    keep those times (honor_timestamps), not put its scrape's."""
    at = replay_done[live.vm.name]
    # A read is scraped after it happens (seconds after, on a loaded machine): the
    # reads' window reaches well past the stored samples'.
    reads = live.vm.query("wattprint_sampler_last_success_timestamp_seconds[60s]", at + 30)
    read_times = [float(v) for _, v in reads[0]["values"]]
    scrape_times = [float(t) for t, _ in reads[0]["values"]]
    stored = [t for t, _ in live.vm.samples("wattprint_gpu_energy_joules_total", at, "20s")]
    assert len(stored) >= 10
    assert all(min(abs(t - r) for r in read_times) < 0.001 for t in stored)
    assert not set(stored) & set(scrape_times)


def test_the_page_alert_fires_on_both_and_the_residual_alert_on_neither(
    live: Live, replay_done: dict[str, float]
) -> None:
    firing = f'{PAGE[:-1]}, alertstate="firing"}}'
    since: dict[str, float] = {}
    for engine in live.engines():
        # for: 2m after pending; VictoriaMetrics reads each step about 30 s late.
        wait_until(lambda e=engine: e.query(firing), 300, f"the page alert firing on {engine.name}")
        since[engine.name] = time.time() - live.started
        (series,) = engine.query(firing)
        assert series["metric"]["severity"] == "warning"
        assert not engine.query(RESIDUAL), engine.name
        residual = "instance_component:wattprint_attribution_residual:ratio_increase1h"
        values = [float(r["value"][1]) for r in engine.query(residual)]
        # gpu, cpu, memory and the platform (the node's input is read: NODE_W).
        assert len(values) == 4 and all(abs(v) < 0.01 for v in values), (engine.name, values)
    # The job is inside every window now: the recorded burn rates agree.
    for window in ("5m", "1h", "6h"):
        prom, vm = (
            e.value(f'{BURN.format(window)}{{workload="{WORKLOAD}"}}') for e in live.engines()
        )
        assert vm == pytest.approx(prom, rel=0.01), window
    print(f"page alert firing after {since}")


@pytest.mark.parametrize("values", ["kube-prometheus-stack", "budgets"])
def test_the_charts_rule_groups_load_in_vmalert(values: str, tmp_path: Path) -> None:
    """What the chart's PrometheusRule carries (budgets included) is what the
    VictoriaMetrics operator turns into a VMRule: vmalert parses every expression as
    MetricsQL and every template."""
    from test_helm import _rule_groups, objects

    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups(objects(values))}))
    result = subprocess.run(
        [require_vm_tool("vmalert"), "-dryRun", f"-rule={rules}", "-loggerLevel=ERROR"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # And a broken expression would not pass: the check is real.
    rules.write_text(rules.read_text().replace("increase(", "increase((", 1))
    result = subprocess.run(
        [require_vm_tool("vmalert"), "-dryRun", f"-rule={rules}", "-loggerLevel=ERROR"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
