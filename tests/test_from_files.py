"""`wattprint report --from-files` over what a user's directory really holds: two launches
under one name, files that disagree, ranks that never stopped, codecarbon's own CSVs
(tests/fixtures/h200/codecarbon-4-processes) and a checkpoint directory's other JSON."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from wattprint.jobs import meter as jobmeter
from wattprint.jobs.run import launch_id

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CODECARBON = TESTS / "fixtures" / "h200" / "codecarbon-4-processes"


def report(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wattprint", "report", f"--from-files={directory}", *args],
        env=dict(os.environ, PYTHONPATH=str(REPO / "exporter")),
        capture_output=True,
        text=True,
        timeout=60,
    )


def job_file(
    directory: Path,
    stem: str,
    span: tuple[float, float],
    joules: float,
    workload: str = "train",
    host: str = "vm",
    zone: str = "DE",
    pue: float = 1.0,
    **extra: Any,
) -> None:
    """A file as `wattprint run` (extra: launch, command) or a tracker (tracker, final) writes."""
    job = jobmeter.JobReport("env", "", workload, start=span[0], end=span[1])
    job.components["gpu"].energy_j = joules
    job.components["gpu"].pue_energy_j = joules * pue
    job.components["gpu"].emissions_g = joules / 3.6e6 * 344 * pue
    job.instances.add(("wattprint", host))
    job.zones = {zone}
    jobmeter.write_files(job, str(directory), stem, "test", {"host": host, **extra})


def gpu_kwh(result: subprocess.CompletedProcess[str]) -> dict[str, float]:
    assert result.returncode == 0, result.stderr
    return {j["workload"]: j["energy_kwh"]["gpu"] for j in json.loads(result.stdout)["jobs"]}


def test_two_launches_under_one_name_are_two_jobs_never_added(tmp_path: Path) -> None:
    # Two `wattprint run --workload=train` of their own, at the same time, one directory.
    job_file(tmp_path, "wattprint-train-vm", (100, 110), 3600.0, launch="a1", command=["x"])
    job_file(tmp_path / "b", "wattprint-train-vm", (102, 108), 7200.0, launch="b2", command=["x"])
    result = report(tmp_path, "--format=json")
    assert gpu_kwh(result) == {"train#a1": 0.001, "train#b2": 0.002}
    warning = "2 launches are named 'train': each is its own job"
    assert result.stderr.splitlines() == [
        f"wattprint: warning: {warning} (train#a1 is one)",
        f"wattprint: warning: {warning} (train#b2 is one)",
    ]
    assert [j["launch"] for j in json.loads(result.stdout)["jobs"]] == ["a1", "b2"]
    assert gpu_kwh(report(tmp_path, "--format=json", "--workload=train#b2")) == {"train#b2": 0.002}
    # Every format: one row per job.
    rows = list(csv.DictReader(report(tmp_path, "--format=codecarbon-csv").stdout.splitlines()))
    assert [(r["run_id"], float(r["gpu_energy"])) for r in rows] == [
        ("train#a1", 0.001),
        ("train#b2", 0.002),
    ]


def test_files_of_one_launch_that_disagree_are_added_with_a_warning(tmp_path: Path) -> None:
    job_file(tmp_path, "wattprint-train-a", (100, 110), 3600.0, host="a", launch="L", command=["x"])
    job_file(
        tmp_path, "wattprint-train-b", (100, 110), 3600.0, host="b", zone="FR", pue=1.5,
        launch="L", command=["y", "--fast"],
    )  # fmt: skip
    result = report(tmp_path, "--format=json")
    assert gpu_kwh(result) == {"train": 0.002}
    warnings = [
        "the files of 'train' disagree on the carbon zone "
        "(DE: wattprint-train-a.json; FR: wattprint-train-b.json): added up",
        "the files of 'train' disagree on the PUE "
        "(1: wattprint-train-a.json; 1.5: wattprint-train-b.json): added up",
        "the files of 'train' disagree on the command "
        "(x: wattprint-train-a.json; y --fast: wattprint-train-b.json): added up",
    ]
    assert result.stderr.splitlines() == [f"wattprint: warning: {w}" for w in warnings]
    assert json.loads(result.stdout)["jobs"][0]["notes"] == warnings
    table = report(tmp_path)
    assert f"  train: {warnings[0]}" in table.stdout


def test_files_without_a_launch_id_that_look_like_two_launches_are_flagged(tmp_path: Path) -> None:
    # Two unrelated 4-rank jobs, each named `none` by torchrun, one after the other.
    for first, pid in ((0.0, 1000), (100.0, 2000)):
        for rank in range(4):
            tracker = f"rank{rank}-{pid + rank}"
            job_file(
                tmp_path, f"wattprint-none-vm-{tracker}", (first + 10, first + 50), 360.0,
                workload="none", tracker=tracker, final=True,
            )  # fmt: skip
    result = report(tmp_path, "--format=json")
    assert gpu_kwh(result) == {"none": 0.0008}  # what the files say, added, and flagged
    hint = "two launches under one name? Added up as one job"
    assert result.stderr.splitlines() == [
        f"wattprint: warning: 2 files of 'none' are rank {rank} on vm "
        f"(wattprint-none-vm-rank{rank}-{1000 + rank}.json, "
        f"wattprint-none-vm-rank{rank}-{2000 + rank}.json): {hint}"
        for rank in range(4)
    ] + [f"wattprint: warning: the files of 'none' do not overlap in time: {hint}"]


def test_a_rank_that_never_stopped_says_how_much_of_the_job_it_covers(tmp_path: Path) -> None:
    job_file(tmp_path, "wattprint-t-r0", (100, 120), 10.0, workload="t", tracker="rank0-1")
    job_file(
        tmp_path, "wattprint-t-r1", (100, 115), 10.0, workload="t", tracker="rank1-2", final=False
    )
    [note] = json.loads(report(tmp_path, "--format=json").stdout)["jobs"][0]["notes"]
    assert note == (
        "wattprint-t-r1.json: its tracker never stopped (killed?): counted to its last flush, "
        "which covers 15.0 s of the job's 20.0 s (75%); its last 5.0 s are not counted"
    )
    # The only file, or the last one to end: nothing says when the job ended.
    (tmp_path / "wattprint-t-r0.json").unlink()
    [note] = json.loads(report(tmp_path, "--format=json").stdout)["jobs"][0]["notes"]
    assert note == (
        "wattprint-t-r1.json: its tracker never stopped (killed?): counted to its last flush, "
        "15.0 s into the job; no file says when the job ended"
    )


def test_codecarbon_files_are_named_and_never_added(tmp_path: Path) -> None:
    for path in sorted(CODECARBON.glob("cc_per_process_*.csv")):
        shutil.copy(path, tmp_path / path.name)
    result = report(tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"wattprint: no wattprint-job/v1 files under {tmp_path}, only codecarbon's: 4 "
        "codecarbon CSV file(s) not added (cc_per_process_0.csv, cc_per_process_1.csv, "
        "cc_per_process_2.csv and 1 more): each counts the whole node (every GPU it sees, "
        "all of its CPU and memory), so adding them would count the node once per file\n"
    )
    # Beside a Wattprint file: said on one line, and the total is the Wattprint file's.
    # Wattprint's own CSVs (beside each JSON, or the codecarbon file an EmissionsTracker
    # names) are not codecarbon's.
    job_file(tmp_path, "wattprint-train-vm", (100, 110), 3600.0, launch="L")
    job_file(
        tmp_path, "wattprint-train-vm-rank0-7", (120, 130), 3600.0, host="other",
        tracker="rank0-7", codecarbon_file="emissions_0.csv",
    )  # fmt: skip
    shutil.copy(tmp_path / "wattprint-train-vm.emissions.csv", tmp_path / "emissions_0.csv")
    result = report(tmp_path, "--format=json")
    assert gpu_kwh(result) == {"train": 0.002}
    assert result.stderr.splitlines() == [
        "wattprint: 4 codecarbon CSV file(s) not added (cc_per_process_0.csv, "
        "cc_per_process_1.csv, cc_per_process_2.csv and 1 more): each counts the whole "
        "node (every GPU it sees, all of its CPU and memory), so adding them would count "
        "the node once per file"
    ]


def test_a_checkpoint_directorys_other_json_files_are_one_line(tmp_path: Path) -> None:
    job_file(tmp_path, "wattprint-train-vm", (100, 110), 3600.0, launch="L")
    for step in range(1, 4):
        checkpoint = tmp_path / f"checkpoint-{step}"
        checkpoint.mkdir()
        for name in ("config.json", "trainer_state.json"):
            (checkpoint / name).write_text("{}")
    result = report(tmp_path, "--format=csv")
    assert result.returncode == 0
    assert result.stderr == (
        "wattprint: skipped 6 JSON file(s) that are not wattprint-job/v1: "
        "checkpoint-1/config.json, checkpoint-1/trainer_state.json, "
        "checkpoint-2/config.json and 3 more\n"
    )
    [row] = list(csv.DictReader(result.stdout.splitlines()))
    assert row["workload"] == "train"


def test_one_row_per_job_in_every_format_on_one_node(tmp_path: Path) -> None:
    job_file(tmp_path, "wattprint-train-vm", (100, 110), 3600.0, launch="L")
    for fmt in ("csv", "codecarbon-csv"):
        result = report(tmp_path, f"--format={fmt}")
        assert len(list(csv.DictReader(result.stdout.splitlines()))) == 1, result.stdout
    table = report(tmp_path).stdout.splitlines()
    # One row, in Wh (1 Wh), and no per-node part for a job of one node.
    assert table[2].split()[5:7] == ["ENERGY", "Wh"] and table[4] == ""
    assert table[3].split()[0] == "train" and "1.000" in table[3].split()
    assert "Energy per node" not in table
    for fmt in ("ghg-csv", "ghg-json"):  # a table in their place would be read as one
        result = report(tmp_path, f"--format={fmt}")
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == (
            f"wattprint: --format={fmt} needs a Prometheus; --from-files writes table, json, "
            "csv or codecarbon-csv\n"
        )


def test_the_launch_id_is_the_launchers_where_it_has_one() -> None:
    assert launch_id({"WATTPRINT_LAUNCH_ID": "mine", "SLURM_JOB_ID": "7"}) == "mine"
    assert launch_id({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2"}) == "slurm-7.2"
    assert launch_id({"SLURM_JOBID": "7"}) == "slurm-7"
    fresh = {launch_id({}) for _ in range(100)}
    assert len(fresh) == 100 and all(len(f) == 16 for f in fresh)
