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
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from wattprint.report import serving
from wattprint.report.promapi import PrometheusClient
from wattprint.report.sci_units import Counter, Unit, UnitError, load_units, parse_units

GROUP_NAME = "wattprint-sci"
# (window, PromQL function, operation suffix): the windows of recording.rules.yml
WINDOWS = (("5m", "rate", "rate5m"), ("1h", "increase", "increase1h"))
ENERGY, EMISSIONS, EMBODIED = serving.ENERGY, serving.EMISSIONS, serving.EMBODIED
# Per unit of work counts the chips, as the budgets do: the platform (the rest of the
# server, where a node reads its input) is in no figure per unit.
CHIPS = '{component!="platform"}'
COUNTER_LABEL = serving.COUNTER_LABEL

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
    emissions = _sum(fn, EMISSIONS + CHIPS, window, by)
    embodied = _sum(fn, EMBODIED, window, by)
    return f"(\n    {emissions}\n  + {embodied}\nor\n  {emissions}\n)"


def _workload_rules(unit: Unit) -> list[dict[str, object]]:
    """Per workload: units served, and grams and joules per unit. The ratios divide
    increases over the window (see serving.WINDOWS for why not rates)."""
    out: list[dict[str, object]] = []
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
                "expr": f"{_sum('increase', ENERGY + CHIPS, window)}\n/ ({units} > 0)\n",
            }
        )
    return out


def rules(units: Sequence[Unit]) -> dict[str, Any]:
    """The recording rules: per unit and window, the units served and grams and joules
    per unit, joined per workload or per serving engine as the unit says."""
    out: list[dict[str, object]] = []
    for unit in units:
        out += serving.pod_rules(unit) if unit.per_pod else _workload_rules(unit)
    return {"groups": [{"name": GROUP_NAME, "rules": out}]}


def alerts(units: Sequence[Unit]) -> dict[str, Any]:
    """The alerts on those rules: a serving engine's join empty for an hour."""
    found = [serving.alert(unit) for unit in units if unit.per_pod]
    return {"groups": [{"name": f"{GROUP_NAME}-alerts", "rules": found}] if found else []}


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, so that the rules read as written."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(units: Sequence[Unit]) -> str:
    header = "# Generated by tools/gen_sci_rules.py from functional-unit data; do not edit.\n"
    groups = rules(units)["groups"] + alerts(units)["groups"]
    return header + yaml.dump({"groups": groups}, Dumper=_Dumper, sort_keys=False, width=200)


def functional_units(
    client: PrometheusClient, unit: Unit, since: float, until: float, lookback: float = 300.0
) -> dict[tuple[str, str], float]:
    """Units served in [since, until] from raw samples per (namespace, workload), of a
    workload-joined unit (serving.served counts those of a serving engine)."""
    out: dict[tuple[str, str], float] = {}
    for counter in unit.counters:
        for selector in counter.selectors():
            for labels, rise in serving.rises(client, selector, since, until, lookback):
                mapped = {"namespace": labels.get("namespace", "")} | counter.mapped(labels)
                key = (mapped["namespace"], mapped.get("workload", ""))
                out[key] = out.get(key, 0.0) + rise
    return out


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
    unjoined: str = ""  # why these units are in no figure (an engine's join is empty)


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
    """Per namespace and model over [since, until]: the energy and grams of each engine's
    pod, or of every pod or process of its workload (of the jobs the report found),
    shared among the models by the units each served, as the recording rules share it.
    An engine with neither pod nor workload, or whose key has no energy, is on no row,
    nor is a model that served no units in the window."""
    wanted = {(job.namespace, job.workload) for job in jobs}
    energy: dict[tuple[str, str, str], list[float]] = {}
    for i, metric in enumerate((ENERGY + CHIPS, EMISSIONS + CHIPS, EMBODIED)):
        for labels, rise in serving.rises(client, metric, since, until, 300.0):
            namespace, pod, workload = serving.wattprint_labels(labels)
            # The report's jobs are named as the series are; the join reads exported_*.
            if (labels.get("namespace", ""), workload) not in wanted:
                continue
            for joins in (("pod", namespace, pod), ("workload", namespace, workload)):
                if joins[2]:
                    energy.setdefault(joins, [0.0, 0.0, 0.0])[i] += rise
    units = serving.served(client, unit, since, until)
    totals: dict[tuple[str, str], list[float]] = {}
    missing: dict[tuple[str, str, str], float] = {}
    keyed = {key: joins for key, joins, _ in serving.shares(units)}
    for key, joins, share in serving.shares(units):
        if joins not in energy:
            continue
        row = totals.setdefault((key[0], key[3]), [0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate(energy[joins]):
            row[i] += value * share
        row[3] += units[key]
    # Units in no figure: an engine with no key, or one of the namespaces the report
    # covers (a --namespace filter leaves the others' energy out, not unjoined).
    covered = {job.namespace for job in jobs}
    for key, count in units.items():
        where = keyed.get(key)
        if count > 0 and (where is None or (key[0] in covered and where not in energy)):
            why = (
                "its series name no pod and no workload"
                if where is None
                else f"no Wattprint energy for {where[0]} {where[1] or '-'}/{where[2]}"
            )
            missing[(key[0], key[3], why)] = missing.get((key[0], key[3], why), 0.0) + count
    return [
        Row(namespace, model, e, g, m, r, sci(g, m, r))
        for (namespace, model), (e, g, m, r) in sorted(totals.items())
        if r > 0
    ] + [
        Row(namespace, model, 0.0, 0.0, 0.0, r, None, why)
        for (namespace, model, why), r in sorted(missing.items())
    ]


def render_rows(unit: Unit, listed: Sequence[Row], fmt: str) -> str:
    who = "model" if unit.per_pod else "workload"
    found = [r for r in listed if not r.unjoined]
    unjoined = [
        {"namespace": r.namespace, "model": r.workload, unit.name: r.units, "why": r.unjoined}
        for r in listed
        if r.unjoined
    ]
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
                }
                | ({"unjoined": unjoined} if unit.per_pod else {}),
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
    if unjoined:
        lines += ["", f"In no figure ({unit.name} whose engine joined no energy):"]
        lines += [
            f"  {r.namespace or '-'} {r.workload or '-'}: {r.units:.6g} {unit.name}, {r.unjoined}"
            for r in listed
            if r.unjoined
        ]
    return "\n".join(lines) + "\n"
