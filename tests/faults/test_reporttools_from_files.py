"""`wattprint report --from-files` over a directory that others can write to (a shared
output directory, a checkpoint tree): every file it cannot trust is one line naming it,
left out of the totals; never a traceback, a hang, a negative or infinite total, or an
escape code printed to the user's terminal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from test_from_files import job_file, report

GOOD_J = 3600.0  # the one good file's: 0.001 kWh


def good(directory: Path) -> None:
    job_file(directory, "wattprint-train-vm", (100, 110), GOOD_J, launch="L")


def tampered(directory: Path, name: str, change: str, by: str) -> None:
    """A copy of the good file (another node's) with one figure replaced, as text."""
    text = (directory / "wattprint-train-vm.json").read_text()
    text = text.replace('"host": "vm"', '"host": "other"').replace('"vm"', '"other"')
    assert change in text
    (directory / name).write_text(text.replace(change, by, 1))


def gpu_kwh(directory: Path) -> tuple[float, list[str]]:
    """The job's GPU energy and the lines said on stderr; status 0, no traceback."""
    result = report(directory, "--format=json")
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stderr
    [job] = json.loads(result.stdout)["jobs"]
    return job["energy_kwh"]["gpu"], result.stderr.splitlines()


def test_a_json_file_nested_100k_deep_is_one_line(tmp_path: Path) -> None:
    good(tmp_path)
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "other.json").write_text(deep)
    (tmp_path / "wattprint-deep.json").write_text(deep)
    kwh, said = gpu_kwh(tmp_path)
    assert kwh == 0.001
    assert said == [
        "wattprint: left out 1 file(s) that cannot be read: wattprint-deep.json is nested too deep",
        "wattprint: skipped 1 JSON file(s) that are not wattprint-job/v1: other.json",
    ]


@pytest.mark.parametrize(
    ("by", "why"),
    [
        ("NaN", "NaN is not a number"),
        ("-3000000.0", "raw.components.gpu.energy_j is -3e+06, below 0"),
        ("1e308", "raw.components.gpu.energy_j is 1e+308, over 1e+18"),
        ("1" * 400, "a number of 400 digits"),
    ],
)
def test_a_figure_that_is_not_a_measurement_leaves_its_file_out(
    tmp_path: Path, by: str, why: str
) -> None:
    good(tmp_path)
    for n in (1, 2):  # two of 1e308 would add up to inf
        tampered(
            tmp_path, f"wattprint-train-bad{n}.json", '"energy_j": 3600.0', f'"energy_j": {by}'
        )
    kwh, said = gpu_kwh(tmp_path)
    assert kwh == 0.001  # the good file's alone: never negative, never inf
    assert said == [
        "wattprint: left out 2 file(s) that cannot be read: "
        f"wattprint-train-bad1.json: {why}; wattprint-train-bad2.json: {why}"
    ]


def test_a_400_digit_start_is_one_line(tmp_path: Path) -> None:
    good(tmp_path)
    tampered(tmp_path, "wattprint-train-b.json", '"start": 100', '"start": 1' + "0" * 400)
    tampered(tmp_path, "wattprint-train-c.json", '"start": 100', '"start": 1e300')
    kwh, said = gpu_kwh(tmp_path)
    assert kwh == 0.001
    assert said == [
        "wattprint: left out 2 file(s) that cannot be read: wattprint-train-b.json: a number "
        "of 401 digits; wattprint-train-c.json: raw.start is 1e+300, over 1e+10"
    ]


def test_a_link_to_dev_zero_and_a_fifo_are_never_read(tmp_path: Path) -> None:
    good(tmp_path)
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "wattprint-zero.json").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "wattprint-fifo.json")
    os.mkfifo(tmp_path / "fifo.json")
    os.mkfifo(tmp_path / "fifo.csv")
    kwh, said = gpu_kwh(tmp_path)  # within the helper's 60 s: no hang, no MemoryError
    assert kwh == 0.001
    assert said == [
        "wattprint: left out 2 file(s) that cannot be read: "
        "wattprint-fifo.json is a FIFO, not a regular file; "
        "wattprint-zero.json is a symbolic link: not followed",
        "wattprint: skipped 2 JSON file(s) that are not wattprint-job/v1: fifo.json, zero.json",
    ]


def test_escape_codes_in_names_are_never_printed(tmp_path: Path) -> None:
    evil = "\x1b]0;owned\x07\x1b[2J"
    job_file(tmp_path, f"wattprint-{evil}", (100, 110), GOOD_J, workload=f"t{evil}", host=evil)
    job_file(
        tmp_path, f"wattprint-{evil}-r1", (101, 109), 10.0, workload=f"t{evil}", host=evil,
        tracker=f"r{evil}", final=False,
    )  # fmt: skip
    (tmp_path / f"{evil}.json").write_text("[1]")
    (tmp_path / f"wattprint-bad{evil}.json").write_text("{")
    for fmt in ("table", "json", "csv", "codecarbon-csv"):
        result = report(tmp_path, f"--format={fmt}")
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout + result.stderr and "\x07" not in result.stderr
    assert "t\\x1b]0;owned\\x07\\x1b[2J" in result.stdout
    assert "wattprint-bad\\x1b]0;owned\\x07\\x1b[2J.json is not valid JSON" in result.stderr
