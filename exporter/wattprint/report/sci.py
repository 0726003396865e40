"""Software Carbon Intensity per unit of work (ISO/IEC 21031:2024): SCI = (E x I + M) / R.

E x I is a workload's operational emissions (its energy x grid intensity x PUE), M its
embodied share, R the functional units it served: a counter the job itself exports
(`vllm:generation_tokens_total`, a training-steps counter). Units are data:

    units:
      - name: tokens                       # --per=tokens; part of the rule names
        metric: vllm:generation_tokens_total
        matchers: 'model_name!=""'         # optional, PromQL label matchers
        labels:                            # Wattprint label: the job metric's label
          namespace: namespace
          workload: app

`workload` (or `namespace` and `pod`, for a serving engine: sci_units.py) is how a
job's counter finds the energy it divides. Without `namespace`, the units join
workloads outside Kubernetes (empty namespace). rules() turns the units into recording
rules over the windows of the energy rules (5m rates, 1h increases); served() counts R
for a report from the raw samples, as the report counts energy.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from wattprint.report.promapi import PrometheusClient, format_ms
from wattprint.report.sci_units import Counter, Unit, UnitError, load_units, parse_units

GROUP_NAME = "wattprint-sci"
# (window, PromQL function, operation suffix): the windows of recording.rules.yml
WINDOWS = (("5m", "rate", "rate5m"), ("1h", "increase", "increase1h"))
ENERGY = "wattprint_workload_energy_joules_total"
EMISSIONS = "wattprint_workload_emissions_grams_total"
EMBODIED = "wattprint_workload_embodied_grams_total"
POD = ("namespace", "pod")
# Where each counter's samples go when a unit sums several names: a label only
# they carry, so that `or` keeps them all (rate() drops the name that told them apart).
COUNTER_LABEL = "wattprint_counter"

__all__ = ["Counter", "Unit", "UnitError", "load_units", "parse_units"]


def _counter_expr(counter: Counter, fn: str, window: str, tag: bool) -> list[str]:
    """One vector per metric of the counter, its labels renamed to Wattprint's."""
    out = []
    for metric, selector in zip(counter.metrics, counter.selectors(), strict=True):
        inner = f"{fn}({selector}[{window}])"
        for ours, theirs in counter.labels:
            if ours != theirs:
                inner = f'label_replace({inner}, "{ours}", "$1", "{theirs}", "(.*)")'
        if "namespace" not in dict(counter.labels):
            # Workloads outside Kubernetes have no namespace; a namespace the scrape
            # added (the exporting pod's) must not keep the units from joining them.
            inner = f'label_replace({inner}, "namespace", "", "", "")'
        if tag:
            inner = f'label_replace({inner}, "{COUNTER_LABEL}", "{metric}", "", "")'
        out.append(inner)
    return out


def _units_expr(unit: Unit, fn: str, window: str, by: str) -> str:
    tag = len(unit.counters) > 1 or len(unit.counters[0].metrics) > 1
    parts = [e for c in unit.counters for e in _counter_expr(c, fn, window, tag)]
    return f"sum by ({by}) (\n    " + "\n  or\n    ".join(parts) + "\n)\n"


def _sum(fn: str, metric: str, window: str, by: str = "namespace, workload") -> str:
    return f"sum by ({by}) ({fn}({metric}[{window}]))"


def _grams(fn: str, window: str, by: str) -> str:
    """Operational plus embodied grams; hardware without an embodied figure keeps its
    operational part (`or`), as in embodied.rules.yml."""
    emissions, embodied = _sum(fn, EMISSIONS, window, by), _sum(fn, EMBODIED, window, by)
    return f"(\n    {emissions}\n  + {embodied}\nor\n  {emissions}\n)"


def _workload_rules(unit: Unit) -> list[dict[str, str]]:
    """Per workload: units served, and grams and joules per unit. The ratios divide
    increases over the window (see POD_WINDOWS for why not rates)."""
    out: list[dict[str, str]] = []
    by = "namespace, workload"
    for window, fn, op in WINDOWS:
        served = f"namespace_workload:wattprint_functional_units_{unit.name}:{op}"
        out.append({"record": served, "expr": _units_expr(unit, fn, window, by)})
        units = served if fn == "increase" else f"(\n{_units_expr(unit, 'increase', window, by)})"
        out.append(
            {
                "record": f"namespace_workload:wattprint_sci_grams_per_{unit.name}:ratio_{op}",
                "expr": f"{_grams('increase', window, by)}\n/ ({units} > 0)\n",
            }
        )
        out.append(
            {
                "record": f"namespace_workload:wattprint_joules_per_{unit.name}:ratio_{op}",
                "expr": f"{_sum('increase', ENERGY, window)}\n/ ({units} > 0)\n",
            }
        )
    return out


# (window, seconds, ratio suffix) of the per-pod rules. They record increases only:
# a ratio of two increases is the same on every engine, while VictoriaMetrics divides a
# rate() by the age of a series younger than its window, so that a ratio of two rates
# of series born at different times would be off for their first minutes.
POD_WINDOWS = (("5m", 300, "rate5m"), ("1h", 3600, "increase1h"))


def _pod_rules(unit: Unit) -> list[dict[str, str]]:
    """Per pod and model: the units served, the pod's energy and grams shared among
    its models by their units (a pod that serves one model gives it all), and per
    namespace and model the joules and grams per unit. A pod that served no units in
    the window has no share: its energy stays on the pod's own series."""
    out: list[dict[str, str]] = []
    pod, by = ", ".join(POD), "namespace, pod, model"
    for window, seconds, ratio in POD_WINDOWS:
        op = f"increase{window}"
        served = f"namespace_pod_model:wattprint_functional_units_{unit.name}:{op}"
        share = f"{served}\n  / on ({pod}) group_left ()\n  (sum by ({pod}) ({served}) > 0)"
        out.append({"record": served, "expr": _units_expr(unit, "increase", window, by)})
        if op != ratio:
            # Units per second, as the 5-minute rise over the window on every engine.
            per_second = f"namespace_pod_model:wattprint_functional_units_{unit.name}:{ratio}"
            out.append({"record": per_second, "expr": f"{served} / {seconds}"})
        shared = {
            "workload_energy_joules": _sum("increase", ENERGY, window, pod),
            "sci_grams": _grams("increase", window, pod),
        }
        for what, per_pod in shared.items():
            out.append(
                {
                    "record": f"namespace_pod_model:wattprint_{what}_by_{unit.name}:{op}",
                    "expr": f"{per_pod}\n* on ({pod}) group_right ()\n(\n  {share}\n)\n",
                }
            )
        for what, name in (("workload_energy_joules", "joules"), ("sci_grams", "sci_grams")):
            part = f"namespace_pod_model:wattprint_{what}_by_{unit.name}:{op}"
            out.append(
                {
                    "record": f"namespace_model:wattprint_{name}_per_{unit.name}:ratio_{ratio}",
                    "expr": f"sum by (namespace, model) ({part})\n"
                    f"/ (sum by (namespace, model) ({served}) > 0)\n",
                }
            )
    return out


def rules(units: Sequence[Unit]) -> dict[str, Any]:
    """One rule group: per unit and window, the units served and grams and joules per
    unit, joined per workload or per pod (and model) as the unit says."""
    out: list[dict[str, str]] = []
    for unit in units:
        out += _pod_rules(unit) if unit.per_pod else _workload_rules(unit)
    return {"groups": [{"name": GROUP_NAME, "rules": out}]}


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, so that the rules read as written."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(units: Sequence[Unit]) -> str:
    header = "# Generated by tools/gen_sci_rules.py from functional-unit data; do not edit.\n"
    return header + yaml.dump(rules(units), Dumper=_Dumper, sort_keys=False, width=200)


def _rise(samples: Sequence[tuple[float, float]], since: float, until: float) -> float:
    """A counter's rise in [since, until] from its raw samples: from the last sample at
    or before `since` (the first one, for a counter born later) to the last at or
    before `until`, counter resets counted as restarts."""
    before = [v for t, v in samples if t <= since]
    inside = [v for t, v in samples if since < t <= until]
    values = ([before[-1]] if before else []) + inside
    rise = 0.0
    for a, b in itertools.pairwise(values):
        rise += b - a if b >= a else b
    return rise


def _rises(
    client: PrometheusClient, selector: str, since: float, until: float, lookback: float
) -> list[tuple[dict[str, str], float]]:
    span = format_ms(until - since + lookback)
    return [
        (s.labels, _rise(s.samples, since, until))
        for s in client.instant(f"{selector}[{span}]", until)
    ]


def served(
    client: PrometheusClient, unit: Unit, since: float, until: float, lookback: float = 300.0
) -> dict[tuple[str, ...], float]:
    """Units served in [since, until] from raw samples, per (namespace, workload), or
    per (namespace, pod, model) for a unit joined per pod."""
    keys = ("namespace", "pod", "model") if unit.per_pod else ("namespace", "workload")
    out: dict[tuple[str, ...], float] = {}
    for counter in unit.counters:
        for selector in counter.selectors():
            for labels, rise in _rises(client, selector, since, until, lookback):
                mapped = {**{k: labels.get(k, "") for k in keys}, **counter.mapped(labels)}
                key = tuple(mapped[k] for k in keys)
                out[key] = out.get(key, 0.0) + rise
    return out


def functional_units(
    client: PrometheusClient, unit: Unit, since: float, until: float, lookback: float = 300.0
) -> dict[tuple[str, str], float]:
    """Units served per (namespace, workload) of a workload-joined unit."""
    return {(k[0], k[1]): v for k, v in served(client, unit, since, until, lookback).items()}


def sci(operational_g: float, embodied_g: float, units: float) -> float | None:
    """(E x I + M) / R; None without units (no division by zero passed off as a score)."""
    if units <= 0 or not math.isfinite(units):
        return None
    return (operational_g + embodied_g) / units


# ---- wattprint report --per=UNIT ---------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("carbon per unit of work (SCI)")
    group.add_argument(
        "--per",
        metavar="UNIT",
        help="print each job's SCI, (operational + embodied) / units, per this unit",
    )
    group.add_argument(
        "--units",
        dest="units_file",
        metavar="FILE",
        default=os.environ.get("WATTPRINT_UNITS_FILE"),
        help="functional units (YAML, as for tools/gen_sci_rules.py; env WATTPRINT_UNITS_FILE)",
    )


def pick_unit(args: argparse.Namespace) -> Unit | None:
    """The unit --per names, or None without --per; UnitError for a bad file or name."""
    if args.per is None:
        return None
    if not args.units_file:
        raise UnitError("--per needs --units FILE (the functional units declared as data)")
    units = {u.name: u for u in load_units(args.units_file)}
    if args.per not in units:
        known = ", ".join(sorted(units)) or "none"
        raise UnitError(f"unit {args.per!r} is not in {args.units_file} (it has: {known})")
    return units[args.per]


@dataclass(frozen=True)
class Row:
    """One job's SCI: its energy, operational and embodied grams, units served, SCI per unit."""

    namespace: str
    workload: str
    energy_j: float
    operational_g: float
    embodied_g: float
    units: float
    sci_g: float | None


def rows(
    client: PrometheusClient, unit: Unit, jobs: Sequence[Any], since: float, until: float
) -> list[Row]:
    """One row per job; R over the part of [since, until] the job lived in. A unit
    joined per pod gives one row per namespace and model instead (model_rows)."""
    if unit.per_pod:
        return model_rows(client, unit, jobs, since, until)
    out = []
    for job in jobs:
        start = max(since, job.start) if job.end > job.start else since
        end = min(until, job.end) if job.end > job.start else until
        served = functional_units(client, unit, start, end).get((job.namespace, job.workload), 0.0)
        out.append(
            Row(
                job.namespace,
                job.workload,
                job.energy_j,
                job.emissions_g,
                job.embodied_g,
                served,
                sci(job.emissions_g, job.embodied_g, served),
            )
        )
    return out


def model_rows(
    client: PrometheusClient, unit: Unit, jobs: Sequence[Any], since: float, until: float
) -> list[Row]:
    """Per namespace and model over [since, until]: each serving pod's energy and grams
    (of the jobs the report found), shared among the pod's models by the units each
    served, the same split the recording rules make. A pod that served no units in the
    window keeps its energy off every model."""
    wanted = {(job.namespace, job.workload) for job in jobs}
    pods: dict[tuple[str, str], list[float]] = {}
    for i, metric in enumerate((ENERGY, EMISSIONS, EMBODIED)):
        for labels, rise in _rises(client, metric, since, until, 300.0):
            if (labels.get("namespace", ""), labels.get("workload", "")) not in wanted:
                continue
            key = (labels.get("namespace", ""), labels.get("pod", ""))
            pods.setdefault(key, [0.0, 0.0, 0.0])[i] += rise
    units = served(client, unit, since, until)
    per_pod: dict[tuple[str, str], float] = {}
    for (namespace, pod, _), count in units.items():
        per_pod[(namespace, pod)] = per_pod.get((namespace, pod), 0.0) + count
    totals: dict[tuple[str, str], list[float]] = {}
    for (namespace, pod, model), count in units.items():
        whole = per_pod[(namespace, pod)]
        if (namespace, pod) not in pods or whole <= 0:
            continue
        row = totals.setdefault((namespace, model), [0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate(pods[(namespace, pod)]):
            row[i] += value * count / whole
        row[3] += count
    return [
        Row(namespace, model, e, g, m, r, sci(g, m, r))
        for (namespace, model), (e, g, m, r) in sorted(totals.items())
    ]


def render_rows(unit: Unit, found: Sequence[Row], fmt: str) -> str:
    who = "model" if unit.per_pod else "workload"
    fields = ("namespace", who, "energy_j", "operational_g", "embodied_g", unit.name)
    per = f"sci_g_per_{unit.name}"
    if fmt == "json":
        items = [
            dict(
                zip(
                    fields,
                    (r.namespace, r.workload, r.energy_j, r.operational_g, r.embodied_g, r.units),
                    strict=True,
                )
            )
            | {per: r.sci_g}
            for r in found
        ]
        return (
            json.dumps(
                {
                    "unit": unit.name,
                    "metric": unit.metric,
                    "models" if unit.per_pod else "jobs": items,
                },
                indent=2,
            )
            + "\n"
        )
    if fmt in ("csv",):
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow([*fields, per])
        for r in found:
            writer.writerow(
                [
                    r.namespace,
                    r.workload,
                    r.energy_j,
                    r.operational_g,
                    r.embodied_g,
                    r.units,
                    "" if r.sci_g is None else r.sci_g,
                ]
            )
        return buf.getvalue()
    lines = [f"SCI per {unit.name} ({unit.metric}): (operational + embodied) / {unit.name}", ""]
    if unit.per_pod:
        lines[1:1] = [
            f"Each serving pod's energy over the window, idle time included, shared among its "
            f"models by the {unit.name} each served."
        ]
    header = [
        "namespace",
        who,
        "energy kWh",
        "operational g",
        "embodied g",
        unit.name,
        f"gCO2e per {unit.name}",
    ]
    table = [header] + [
        [
            r.namespace or "-",
            r.workload,
            f"{r.energy_j / 3.6e6:.4g}",
            f"{r.operational_g:.4g}",
            f"{r.embodied_g:.4g}",
            f"{r.units:.6g}",
            "no units served" if r.sci_g is None else f"{r.sci_g:.4g}",
        ]
        for r in found
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += [
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    ]
    return "\n".join(lines) + "\n"
