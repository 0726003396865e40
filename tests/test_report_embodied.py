"""Embodied emissions end to end: the replayed exporter with a figure for its GPU model,
a real Prometheus with the embodied rules, and `wattprint report` showing operational,
embodied and their sum."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import TRACE, require_tool
from prom_harness import Stack, replay_stack
from test_report import parse_table, report, report_json

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = "--workload=phased-load"  # the trace's job (the host's own processes may add others)
GRAMS_PER_GPU_S = 164_000 / (4 * 8766 * 3600)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = require_tool("prometheus")
    with replay_stack(
        prometheus,
        TRACE,
        tmp_path_factory.mktemp("embodied"),
        speed=4.0,
        rule_files=[REPO / "rules" / "embodied.rules.yml"],
        exporter_args=["--embodied.gpu-kgco2e=NVIDIA H200=164"],
    ) as stack:
        header = json.loads(TRACE.read_text().split("\n", 1)[0])
        span = max(p["end"] for p in header["phases"]) - min(p["start"] for p in header["phases"])
        stack.wait_until(lambda: time.time() > stack.started + span / stack.speed + 1, 90)
        stack.wait_for_scrapes(2)
        yield stack


def settled_until(stack: Stack) -> str:
    """One end for every report of a test, once Prometheus holds the job's samples on
    both sides of it: the replayed process still holds the GPU after the trace ends, so
    its embodied grams go on accruing, and the report cuts that rise at `until` between
    the samples around it. Before the one after it is scraped (a second or more under
    load), a report counts only up to the one before, and a later one of the same range
    more (by up to 2 % here)."""
    until = time.time() - 1
    job = WORKLOAD.removeprefix("--workload=")
    newest = [
        f'min(timestamp(wattprint_workload_{family}_total{{workload="{job}"}}))'
        for family in ("energy_joules", "emissions_grams", "embodied_grams")
    ]
    stack.wait_until(lambda: all(float(stack.query(q)[0]["value"][1]) > until for q in newest), 30)
    return f"--until={until:.3f}"


@pytest.mark.slow
def test_report_shows_operational_embodied_and_their_sum(stack: Stack) -> None:
    until = settled_until(stack)
    (job,) = report_json(stack.prometheus_url, until, WORKLOAD)["jobs"]
    # Embodied accrues by wall-clock time held: at least while the job drew energy,
    # at most since the exporter started.
    held_s = job["embodied_kg"] * 1000 / GRAMS_PER_GPU_S
    assert 0.85 * job["duration_seconds"] <= held_s <= float(until[8:]) - stack.started
    exported = sum(
        float(s["value"][1])
        for s in stack.query(
            f'wattprint_workload_embodied_grams_total{{workload="{job["workload"]}"}}',
            at=float(until[8:]),
        )
    )
    # The report interpolates the counter to `until` between the scrapes around it.
    assert job["embodied_kg"] * 1000 == pytest.approx(exported, abs=2 * GRAMS_PER_GPU_S)
    assert job["footprint_kg"] == pytest.approx(
        job["emissions_kg"]["total"] + job["embodied_kg"], rel=1e-12
    )
    table = report(stack.prometheus_url, until, WORKLOAD)
    assert table.returncode == 0, table.stderr
    (row,) = parse_table(table.stdout)["Operational and embodied"]
    assert float(row["EMBODIED CO2e kg"]) == pytest.approx(job["embodied_kg"], rel=1e-3)
    assert float(row["TOTAL CO2e kg"]) == pytest.approx(job["footprint_kg"], rel=1e-3)
    csv_row = report(stack.prometheus_url, "--format=csv", until, WORKLOAD).stdout.splitlines()
    header, values = csv_row[0].split(","), csv_row[1].split(",")
    assert float(values[header.index("embodied_kg")]) == pytest.approx(job["embodied_kg"])
    # The recording rule agrees with the report on what the workload accrued.
    recorded = stack.query(
        f'namespace_workload:wattprint_workload_embodied_grams:increase1h{{workload="{job["workload"]}"}}'
    )
    assert recorded and float(recorded[0]["value"][1]) > 0


@pytest.mark.slow
def test_ghg_export_has_both_scopes_per_workload_and_namespace_with_factors(
    stack: Stack,
) -> None:
    import csv
    import io

    until = settled_until(stack)
    (job,) = report_json(stack.prometheus_url, until, WORKLOAD)["jobs"]
    result = report(stack.prometheus_url, "--format=ghg-csv", until, WORKLOAD)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    by = {(r["record"], r["workload"], r["scope"]): r for r in rows if r["record"] != "factor"}
    scope2 = by[("workload", job["workload"], "2")]
    scope3 = by[("workload", job["workload"], "3")]
    assert float(scope2["kgco2e"]) == pytest.approx(job["emissions_kg"]["total"], rel=1e-9)
    assert float(scope2["activity"]) == pytest.approx(job["energy_kwh"]["total"], rel=1e-9)
    assert scope2["method"] == "location-based"
    assert float(scope3["kgco2e"]) == pytest.approx(job["embodied_kg"], rel=1e-9)
    assert scope3["category"].startswith("2: capital goods")
    # The job has no namespace; its namespace row and the total carry the same sums.
    for record in ("namespace", "total"):
        assert float(by[(record, "", "2")]["kgco2e"]) == pytest.approx(float(scope2["kgco2e"]))
        assert float(by[(record, "", "3")]["kgco2e"]) == pytest.approx(float(scope3["kgco2e"]))
    factors = {r["category"]: r for r in rows if r["record"] == "factor"}
    grid = factors["grid intensity DE (average, static)"]
    intensity = float(
        stack.query('wattprint_grid_carbon_intensity_grams_per_kwh{signal="average"}')[0]["value"][
            1
        ]
    )
    assert float(grid["factor"]) == pytest.approx(intensity)
    assert "Our World in Data" in grid["source"] and "20" in grid["source"]  # the year
    figure = factors["embodied figure NVIDIA H200"]
    assert float(figure["factor"]) == 164 and figure["source"] == "--embodied.gpu-kgco2e"
    assert float(factors["PUE"]["factor"]) == 1.0
    # The same rows as JSON.
    doc = json.loads(report(stack.prometheus_url, "--format=ghg-json", until, WORKLOAD).stdout)
    assert len(doc["rows"]) == len(rows)
    assert {r["category"] for r in doc["rows"]} == {r["category"] for r in rows}
