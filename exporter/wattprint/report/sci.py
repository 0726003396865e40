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

`workload` is required: it is how a job's counter finds the workload whose energy it
divides. Without `namespace`, the units join workloads outside Kubernetes (empty
namespace). rules() turns the units into recording rules over the windows of the
energy rules (5m rates, 1h increases); functional_units() counts R for a report from
the raw samples, as the report counts energy.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from wattprint.report.promapi import PrometheusClient, format_ms

GROUP_NAME = "wattprint-sci"
WORKLOAD_LABELS = ("namespace", "workload")
# (window, PromQL function, operation suffix): the windows of recording.rules.yml
WINDOWS = (("5m", "rate", "rate5m"), ("1h", "increase", "increase1h"))
ENERGY = "wattprint_workload_energy_joules_total"
EMISSIONS = "wattprint_workload_emissions_grams_total"
EMBODIED = "wattprint_workload_embodied_grams_total"

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_FIELDS = {"name", "metric", "matchers", "labels", "description"}


class UnitError(ValueError):
    """The unit data is invalid; the message names the entry and the bad value."""


@dataclass(frozen=True)
class Unit:
    """A functional unit from the units file: the job's counter and how its labels map."""

    name: str
    metric: str
    labels: tuple[tuple[str, str], ...]  # (Wattprint label, the job metric's label)
    matchers: str = ""
    description: str = ""

    def selector(self) -> str:
        return f"{self.metric}{{{self.matchers}}}" if self.matchers else self.metric

    def mapped(self, labels: Mapping[str, str]) -> tuple[str, str]:
        """(namespace, workload) of a series of the job's metric."""
        where = dict(self.labels)
        namespace = labels.get(where["namespace"], "") if "namespace" in where else ""
        return namespace, labels.get(where["workload"], "")


def parse_units(data: object) -> list[Unit]:
    if not isinstance(data, dict) or not isinstance(data.get("units"), list):
        raise UnitError("expected a mapping with a list under 'units'")
    units: list[Unit] = []
    for i, entry in enumerate(data["units"]):
        where = f"units[{i}]"
        if not isinstance(entry, dict):
            raise UnitError(f"{where}: expected a mapping")
        unknown = set(entry) - _FIELDS
        if unknown:
            raise UnitError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise UnitError(f"{where}: name {name!r} must be lower case, digits, _ (e.g. tokens)")
        where = f"unit {name}"
        metric = entry.get("metric")
        if not isinstance(metric, str) or not _METRIC.match(metric):
            raise UnitError(f"{where}: metric {metric!r} is not a Prometheus metric name")
        matchers = entry.get("matchers", "")
        if not isinstance(matchers, str) or any(c in matchers for c in "{}"):
            raise UnitError(f"{where}: matchers must be label matchers without braces")
        labels = entry.get("labels")
        if not isinstance(labels, dict) or "workload" not in labels:
            raise UnitError(f"{where}: labels must map at least workload to a label of {metric}")
        for ours, theirs in labels.items():
            if ours not in WORKLOAD_LABELS:
                raise UnitError(f"{where}: labels: {ours!r} is not namespace or workload")
            if not isinstance(theirs, str) or not _LABEL.match(theirs):
                raise UnitError(f"{where}: labels.{ours}: {theirs!r} is not a label name")
        if name in {u.name for u in units}:
            raise UnitError(f"{where}: declared twice")
        pairs = tuple((k, labels[k]) for k in WORKLOAD_LABELS if k in labels)
        units.append(Unit(name, metric, pairs, matchers, str(entry.get("description", ""))))
    return units


def load_units(path: str | Path) -> list[Unit]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UnitError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UnitError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    try:
        return parse_units(data)
    except UnitError as exc:
        raise UnitError(f"{path}: {exc}") from None


def _units_expr(unit: Unit, fn: str, window: str) -> str:
    inner = f"{fn}({unit.selector()}[{window}])"
    for ours, theirs in unit.labels:
        if ours != theirs:
            inner = f'label_replace({inner}, "{ours}", "$1", "{theirs}", "(.*)")'
    if "namespace" not in dict(unit.labels):
        # Workloads outside Kubernetes have no namespace; a namespace the scrape added
        # (the exporting pod's) must not keep the units from joining them.
        inner = f'label_replace({inner}, "namespace", "", "", "")'
    return f"sum by (namespace, workload) ({inner})"


def _sum(fn: str, metric: str, window: str) -> str:
    return f"sum by (namespace, workload) ({fn}({metric}[{window}]))"


def rules(units: Sequence[Unit]) -> dict[str, Any]:
    """One rule group: per unit and window, the units served and grams and joules per
    unit. Grams are operational plus embodied; a workload on hardware without an
    embodied figure keeps its operational part (`or`), as in embodied.rules.yml."""
    out: list[dict[str, str]] = []
    for unit in units:
        for window, fn, op in WINDOWS:
            served = f"namespace_workload:wattprint_functional_units_{unit.name}:{op}"
            emissions, embodied = _sum(fn, EMISSIONS, window), _sum(fn, EMBODIED, window)
            out.append({"record": served, "expr": _units_expr(unit, fn, window)})
            out.append(
                {
                    "record": f"namespace_workload:wattprint_sci_grams_per_{unit.name}:ratio_{op}",
                    "expr": f"(\n    {emissions}\n  + {embodied}\nor\n  {emissions}\n)\n"
                    f"/ ({served} > 0)\n",
                }
            )
            out.append(
                {
                    "record": f"namespace_workload:wattprint_joules_per_{unit.name}:ratio_{op}",
                    "expr": f"{_sum(fn, ENERGY, window)}\n/ ({served} > 0)\n",
                }
            )
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


def functional_units(
    client: PrometheusClient, unit: Unit, since: float, until: float, lookback: float = 300.0
) -> dict[tuple[str, str], float]:
    """Units served per (namespace, workload) in [since, until], from raw samples: the
    rise from the last sample at or before `since` (the first one, for a counter born
    later) to the last at or before `until`, counter resets counted as restarts."""
    span = format_ms(until - since + lookback)
    out: dict[tuple[str, str], float] = {}
    for series in client.instant(f"{unit.selector()}[{span}]", until):
        before = [v for t, v in series.samples if t <= since]
        inside = [v for t, v in series.samples if since < t <= until]
        values = ([before[-1]] if before else []) + inside
        rise = 0.0
        for a, b in itertools.pairwise(values):
            rise += b - a if b >= a else b
        key = unit.mapped(series.labels)
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


def rows(
    client: PrometheusClient, unit: Unit, jobs: Sequence[Any], since: float, until: float
) -> list[Row]:
    """One row per job; R over the part of [since, until] the job lived in."""
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


def render_rows(unit: Unit, found: Sequence[Row], fmt: str) -> str:
    fields = ("namespace", "workload", "energy_j", "operational_g", "embodied_g", unit.name)
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
            json.dumps({"unit": unit.name, "metric": unit.metric, "jobs": items}, indent=2) + "\n"
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
    header = [
        "namespace",
        "workload",
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
