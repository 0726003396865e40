"""`wattprint report` shows each job's chips and its figure at the wall, and says which:
a Prometheus over promtool blocks of two nodes, p1 with a platform source (it reads the
node's input: the exporter serves measurement_info for components node and platform)
and c2 without one. infer runs on p1 alone, train on both."""

from __future__ import annotations

import csv
import io
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require_tool
from prom_harness import run_prometheus
from test_report import parse_table, report, report_json
from wattprint.report.render import WALL_SECTION

pytestmark = pytest.mark.slow  # starts Prometheus
SCRAPE, END = 15, 3600
KWH = 3.6e6
G_PER_J = 1 / 6000  # 600 g/kWh, PUE 1
# (instance, workload, component, gpu) -> W, constant over the hour: on p1 the chips draw
# 620 W and the node 930 W, so the platform's 310 W goes 225 W to infer (450 / 620 of the
# chips), 50 W to train and 35 W unattributed.
USES = {
    ("p1", "infer", "gpu", "0"): 400.0,
    ("p1", "infer", "cpu", ""): 50.0,
    ("p1", "infer", "platform", ""): 225.0,
    ("p1", "train", "gpu", "1"): 100.0,
    ("p1", "train", "platform", ""): 50.0,
    ("c2", "train", "gpu", "0"): 200.0,
}
METHODS = {
    ("p1", "gpu", "0"): "nvml_energy_counter",
    ("p1", "gpu", "1"): "nvml_energy_counter",
    ("p1", "cpu", "0"): "rapl",
    ("p1", "node", "node"): "pm_counters",
    ("p1", "platform", "node"): "pm_counters",
    ("c2", "gpu", "0"): "nvml_energy_counter",
}


def openmetrics(t0: int) -> str:
    times = range(0, END + 1, SCRAPE)
    out: list[str] = []
    for family, per_j in (
        ("wattprint_workload_energy_joules", 1.0),
        ("wattprint_workload_emissions_grams", G_PER_J),
    ):
        out.append(f"# TYPE {family} counter")
        for (instance, workload, component, gpu), watts in USES.items():
            labels = (
                f'component="{component}",{f"gpu={gpu!r}," if gpu else ""}instance="{instance}",'
                f'job="wattprint",scheduler="slurm",workload="{workload}"'
            ).replace("'", '"')
            out += [f"{family}_total{{{labels}}} {watts * t * per_j!r} {t0 + t}" for t in times]
    out.append("# TYPE wattprint_measurement_info gauge")
    for (instance, component, device), method in METHODS.items():
        labels = (
            f'component="{component}",device="{device}",estimated="false",instance="{instance}",'
            f'job="wattprint",method="{method}"'
        )
        out += [f"wattprint_measurement_info{{{labels}}} 1.0 {t0 + t}" for t in times]
    out.append("# EOF")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    tmp = tmp_path_factory.mktemp("wall")
    t0 = (int(time.time()) // 60) * 60 - 3 * 3600  # inside the retention, clear of the head
    (tmp / "fleet.om").write_text(openmetrics(t0))
    subprocess.run(
        [require_tool("promtool"), "tsdb", "create-blocks-from", "openmetrics",
         str(tmp / "fleet.om"), str(tmp / "tsdb")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    with run_prometheus(require_tool("prometheus"), tmp, tsdb=tmp / "tsdb") as url:
        yield url, t0


def test_each_job_has_its_chips_and_its_wall_figure_only_where_every_node_read_its_input(
    fleet: tuple[str, int],
) -> None:
    url, t0 = fleet
    span = [f"--since={t0}", f"--until={t0 + END}"]
    jobs = {j["workload"]: j for j in report_json(url, *span)["jobs"]}
    infer, train = jobs["infer"], jobs["train"]
    # The chips, as before: the platform is not in energy_kwh nor in emissions_kg.
    assert infer["figures"] == "chips"
    assert infer["energy_kwh"]["total"] == pytest.approx(450 * END / KWH)
    assert "platform" not in infer["energy_kwh"]
    assert infer["emissions_kg"]["total"] == pytest.approx(450 * END * G_PER_J / 1000)
    assert infer["wall"] == {
        "energy_kwh": pytest.approx(675 * END / KWH),
        "emissions_kg": pytest.approx(675 * END * G_PER_J / 1000),
        "platform_energy_kwh": pytest.approx(225 * END / KWH),
        "platform_emissions_kg": pytest.approx(225 * END * G_PER_J / 1000),
        "unavailable": None,
    }
    # train ran on c2 too, which reads no input: no wall figure, and why, never its
    # chips (300 W) nor p1's part (350 W) in its place.
    assert train["energy_kwh"]["total"] == pytest.approx(300 * END / KWH)
    assert train["wall"]["energy_kwh"] is None and train["wall"]["emissions_kg"] is None
    assert train["wall"]["platform_energy_kwh"] is None
    assert "no platform reading" in train["wall"]["unavailable"]
    assert "c2" in train["wall"]["unavailable"] and "p1" not in train["wall"]["unavailable"]

    result = report(url, *span, "--format=csv")
    assert result.returncode == 0, result.stderr
    rows = {r["workload"]: r for r in csv.DictReader(io.StringIO(result.stdout))}
    assert float(rows["infer"]["energy_kwh"]) == pytest.approx(450 * END / KWH)
    assert float(rows["infer"]["wall_energy_kwh"]) == pytest.approx(675 * END / KWH)
    assert float(rows["infer"]["platform_energy_kwh"]) == pytest.approx(225 * END / KWH)
    assert float(rows["infer"]["wall_emissions_kg"]) == pytest.approx(675 * END * G_PER_J / 1000)
    assert rows["infer"]["wall_unavailable"] == ""
    assert rows["train"]["wall_energy_kwh"] == rows["train"]["wall_emissions_kg"] == ""
    assert "c2" in rows["train"]["wall_unavailable"]

    result = report(url, *span)
    assert result.returncode == 0, result.stderr
    sections = parse_table(result.stdout)
    wall = {r["WORKLOAD"]: r for r in sections[WALL_SECTION]}
    assert float(wall["infer"]["CHIPS kWh"]) == pytest.approx(450 * END / KWH, rel=1e-3)
    assert float(wall["infer"]["PLATFORM kWh"]) == pytest.approx(225 * END / KWH, rel=1e-3)
    assert float(wall["infer"]["WALL kWh"]) == pytest.approx(675 * END / KWH, rel=1e-3)
    assert wall["train"]["WALL kWh"] == wall["train"]["WALL CO2e kg"] == "n/a"
    assert "train: no figure at the wall: no platform reading" in result.stdout
    (main_row,) = [r for r in sections[""] if r["WORKLOAD"] == "infer"]
    assert float(main_row["ENERGY kWh"]) == pytest.approx(450 * END / KWH, rel=1e-3)


def test_the_job_files_keep_the_wall_and_a_merge_has_one_only_if_every_part_does(
    tmp_path: Path,
) -> None:
    """Read back from its file, a job keeps its platform; merged with a part from a node
    without a platform reading (a tracker's file), the total has no wall figure."""
    from wattprint.report.jobdoc import job_document, job_from_document, merge
    from wattprint.report.jobreport import JobReport

    job = JobReport("slurm", "", "infer", start=0.0, end=10.0)
    job.components["gpu"].energy_j = 400.0
    job.platform.energy_j = 200.0
    job.instances = job.platform_nodes = {("wattprint", "p1")}
    back = job_from_document(job_document(job, "test"))
    assert back.wall_energy_j == 600.0 and back.energy_j == 400.0
    other = JobReport("slurm", "", "infer", start=0.0, end=10.0)
    other.components["gpu"].energy_j = 100.0
    other.instances = {("wattprint", "c2")}
    assert merge([back, back]).wall_energy_j == 1200.0
    total = merge([back, other])
    assert total.energy_j == 500.0 and total.wall_energy_j is None
    assert "c2" in total.wall_unavailable
