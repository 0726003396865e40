"""A GHG-Protocol-style export of `wattprint report`: per workload and per namespace,
location-based Scope 2 (the electricity the workload drew x the grid's average
intensity x PUE) and Scope 3 (category 2, capital goods: the embodied emissions of the
hardware it held, amortized over its service life), with every factor used and its
source in the same file, so that an auditor needs nothing else to check a number.

One row schema for CSV and JSON: `record` says what a row is (emissions of a
workload, of a namespace, the total, or a factor).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from wattprint.carbon import registry as carbon_registry
from wattprint.report.promapi import PrometheusClient, format_ms

JOULES_PER_KWH = 3.6e6
COLUMNS = (
    "record",
    "namespace",
    "workload",
    "scope",
    "category",
    "method",
    "kgco2e",
    "activity",
    "activity_unit",
    "factor",
    "factor_unit",
    "source",
    "period_start",
    "period_end",
)
SCOPE2 = ("2", "purchased electricity", "location-based")
SCOPE3 = ("3", "2: capital goods (embodied, cradle to gate)", "amortized over service life")
OWID = "Our World in Data / Ember yearly average, CC BY 4.0"
GCP = "Google Cloud region-carbon-info yearly average, Apache-2.0"


@dataclass(frozen=True)
class Row:
    """One row of the GHG export: emissions of a workload, a namespace or the total, or a factor."""

    record: str  # workload | namespace | total | factor
    namespace: str = ""
    workload: str = ""
    scope: str = ""
    category: str = ""
    method: str = ""
    kgco2e: float | None = None
    activity: float | None = None
    activity_unit: str = ""
    factor: float | None = None
    factor_unit: str = ""
    source: str = ""
    period_start: str = ""
    period_end: str = ""


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _intensity_source(zone: str, provider: str, years: dict[tuple[str, str], str]) -> str:
    # Where a live provider's numbers come from is its registration's citation; the
    # static provider's dataset is named by its zone: gcp:<region> or a country.
    citation = carbon_registry.citation(provider)
    if citation:
        return citation
    year = years.get((zone, provider))
    dataset = GCP if zone.startswith("gcp:") else OWID
    return f"{dataset}{f', {year}' if year else ''} (wattprint embedded default)"


def _factor(period: tuple[str, str], scope: str, category: str, **fields: Any) -> Row:
    """A row of one factor in force over the period."""
    return Row(
        "factor",
        scope=scope,
        category=category,
        period_start=period[0],
        period_end=period[1],
        **fields,
    )


def _embodied_figure(labels: dict[str, str]) -> str:
    return f"embodied figure {labels.get('model') or labels.get('component', '')}"


def read_factors(client: PrometheusClient, since: float, until: float) -> list[Row]:
    """The factors in force over [since, until], from the exporters' own series."""
    span = format_ms(max(until - since, 1.0))
    period = (_iso(since), _iso(until))
    rows: list[Row] = []
    years = {
        (s.labels.get("zone", ""), s.labels.get("provider", "")): s.labels.get("year", "")
        for s in client.instant(
            f"max by (zone, provider, year) (max_over_time("
            f"wattprint_grid_carbon_intensity_dataset_info[{span}]))",
            until,
        )
    }
    for s in client.instant(
        f"avg by (zone, provider, signal) (avg_over_time("
        f"wattprint_grid_carbon_intensity_grams_per_kwh[{span}]))",
        until,
    ):
        zone, provider = s.labels.get("zone", ""), s.labels.get("provider", "")
        rows.append(
            _factor(
                period,
                "2",
                f"grid intensity {zone} ({s.labels.get('signal', '')}, {provider})",
                method="time average over the period; emissions use the value in force "
                "at each sample",
                factor=s.samples[-1][1],
                factor_unit="gCO2e/kWh",
                source=_intensity_source(zone, provider, years),
            )
        )
    for s in client.instant(f"avg(avg_over_time(wattprint_pue_ratio[{span}]))", until):
        rows.append(
            _factor(
                period,
                "2",
                "PUE",
                method="time average over the period",
                factor=s.samples[-1][1],
                factor_unit="ratio",
                source="--pue (operator's figure)",
            )
        )
    for s in client.instant(
        f"max by (component, model, source) (max_over_time("
        f"wattprint_embodied_figure_kgco2e[{span}]))",
        until,
    ):
        rows.append(
            _factor(
                period,
                "3",
                _embodied_figure(s.labels),
                method="per device, cradle to gate; amortized linearly over --embodied.lifetime",
                factor=s.samples[-1][1],
                factor_unit="kgCO2e per device",
                source=s.labels.get("source", ""),
            )
        )
    for s in client.instant(
        f"max by (component, model) (max_over_time(wattprint_embodied_unknown[{span}]))", until
    ):
        rows.append(
            _factor(
                period,
                "3",
                _embodied_figure(s.labels),
                method="no figure known: counted as 0, not estimated",
                source="none",
            )
        )
    return rows


def emission_rows(jobs: Sequence[Any], since: float, until: float) -> list[Row]:
    """Scope 2 and Scope 3 rows per workload, per namespace and in total."""
    period = (_iso(since), _iso(until))
    rows: list[Row] = []
    totals: dict[str, list[float]] = {}

    def add(
        record: str, namespace: str, workload: str, kwh: float, op_g: float, emb_g: float
    ) -> None:
        intensity = op_g / kwh if kwh > 0 else None
        rows.append(
            Row(
                record,
                namespace,
                workload,
                *SCOPE2,
                kgco2e=op_g / 1000,
                activity=kwh,
                activity_unit="kWh (devices, before PUE)",
                factor=intensity,
                factor_unit="gCO2e/kWh (effective: intensity x PUE)",
                source="see factor rows",
                period_start=period[0],
                period_end=period[1],
            )
        )
        rows.append(
            Row(
                record,
                namespace,
                workload,
                *SCOPE3,
                kgco2e=emb_g / 1000,
                source="see factor rows",
                period_start=period[0],
                period_end=period[1],
            )
        )

    for job in sorted(jobs, key=lambda j: (j.namespace, j.workload)):
        kwh = job.energy_j / JOULES_PER_KWH
        add("workload", job.namespace, job.workload, kwh, job.emissions_g, job.embodied_g)
        for key in (job.namespace, "\0total"):
            t = totals.setdefault(key, [0.0, 0.0, 0.0])
            t[0] += kwh
            t[1] += job.emissions_g
            t[2] += job.embodied_g
    for namespace, (kwh, op_g, emb_g) in sorted(totals.items()):
        if namespace == "\0total":
            continue
        add("namespace", namespace, "", kwh, op_g, emb_g)
    kwh, op_g, emb_g = totals.get("\0total", [0.0, 0.0, 0.0])
    add("total", "", "", kwh, op_g, emb_g)
    return rows


def render(rows: Sequence[Row], fmt: str, url: str) -> str:
    if fmt == "ghg-json":
        document = {
            "standard": "GHG Protocol Scope 2 (location-based) and Scope 3 category 2",
            "generator": "wattprint report",
            "prometheus": url,
            "rows": [asdict(r) for r in rows],
        }
        return json.dumps(document, indent=2) + "\n"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow(["" if v is None else v for v in asdict(r).values()])
    return buf.getvalue()
