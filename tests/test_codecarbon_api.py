"""wattprint.EmissionsTracker's codecarbon API in-process: every codecarbon argument taken
or warned about once, what each maps onto, the CSV shared by ranks, codecarbon's own
messages, and `wattprint.track` staying the function."""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def said() -> Iterator[list[str]]:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("wattprint.tracker")
    keep = Keep()
    logger.addHandler(keep)
    from wattprint.jobs import codecarbon_api

    codecarbon_api._warned.clear()
    yield lines
    logger.removeHandler(keep)


def test_every_codecarbon_argument_is_taken_or_warned_about_once(
    said: list[str], tmp_path: Path
) -> None:
    import inspect

    import codecarbon
    from codecarbon.emissions_tracker import BaseEmissionsTracker, OfflineEmissionsTracker

    import wattprint

    names = [p for p in inspect.signature(BaseEmissionsTracker.__init__).parameters if p != "self"]
    offline = [
        p
        for p in inspect.signature(OfflineEmissionsTracker.__init__).parameters
        if p not in ("self", "args", "kwargs")
    ]
    decorator = [
        p for p in inspect.signature(codecarbon.track_emissions).parameters if p not in ("fn",)
    ]
    from wattprint.jobs.codecarbon_api import LOCATION, POSITIONAL

    # codecarbon's own signature, in its order: none is a TypeError here.
    assert list(POSITIONAL) == names
    assert set(offline) == set(LOCATION)
    assert set(decorator) <= {*POSITIONAL, *LOCATION, "offline"}
    values: dict[str, object] = {
        name: "x" for name in (*POSITIONAL, *LOCATION) if name not in ("log_level",)
    }
    values.update(output_dir=str(tmp_path), gpu_ids=[0, 1], pue=1.2, measure_power_secs=2)
    values.update(force_cpu_power=150, allow_multiple_runs=False, tracking_mode="machine")
    values.update(on_csv_write="update", save_to_file=True, force_ram_power=10)
    wattprint.OfflineEmissionsTracker(**values)
    wattprint.EmissionsTracker(**values)  # the same warnings are not given twice
    ignored = [line.split(" ignored: ", 1)[0] for line in said if " ignored: " in line]
    assert len(ignored) == len(set(ignored)), said
    assert sorted(ignored) == sorted(
        [
            *(f"{n}" for n in ("api_endpoint", "api_key", "save_to_api", "emissions_endpoint")),
            *("save_to_prometheus", "save_to_logfire", "prometheus_url"),
            "electricitymaps_api_token",
            "co2_signal_api_token",
            *("force_ram_power", "force_mode_cpu_load", "rapl_include_dram", "rapl_prefer_psys"),
            "wue",
            "metadata",
            "logger_preamble",
            "allow_multiple_runs=False",
            "on_csv_write='update'",
            "output method 'x'",
        ]
    )
    assert (
        "api_key ignored: Wattprint sends nothing to an API: rows go to output_dir/output_file"
    ) in said
    # What has a meaning here is not said to be ignored: output handlers, the logger,
    # the intensity, the experiment's name, the measurement interval.
    for name in ("output_handlers", "logging_logger", "save_to_logger", "experiment_name"):
        assert not any(line.startswith(name) for line in said), name
    assert "api_call_interval='x' is no whole number: 8" in said
    assert (
        "Invalid value for force_carbon_intensity_g_co2e_kwh: 'x'. It must be a numeric "
        "value: the intensity is the zone's"
    ) in said
    # What is not codecarbon's is Python's usual error.
    with pytest.raises(TypeError, match="unexpected keyword argument 'carbon_zone'"):
        wattprint.EmissionsTracker(carbon_zone="DE")
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        wattprint.track_emissions(nope=1)


def test_codecarbon_arguments_map_onto_the_sampler_and_the_tracker(tmp_path: Path) -> None:
    from wattprint.jobs.codecarbon_api import EmissionsTracker

    tracker = EmissionsTracker(
        "proj",  # project_name, positional as in codecarbon
        5,  # measure_power_secs
        country_iso_code="DEU",
        pue=1.25,
        force_cpu_power=140,
        gpu_ids="0, 2",
        experiment_id="exp-1",
        output_dir=str(tmp_path),
    )
    inner = tracker._tracker
    # The sampler measures; the zone and PUE are the tracker's own.
    assert inner.flags == {"sample.interval": "5000ms", "cpu.tdp-watts": "140.0"}
    assert tracker._carbon.zone == "DEU" and tracker._carbon.pue == 1.25
    assert tracker._carbon.grams_per_kwh is not None and tracker._carbon.grams_per_kwh > 0
    assert inner.gpu_ids == {"0", "2"} and inner.identity.name == "proj"
    assert tracker.job_id.startswith("proj-")
    forced = EmissionsTracker(country_iso_code="DEU", force_carbon_intensity_g_co2e_kwh=100)
    assert forced._carbon.grams_per_kwh == 100.0
    gcp = EmissionsTracker(cloud_provider="gcp", cloud_region="europe-west3")
    assert gcp._carbon.zone == "gcp:europe-west3"
    # Each tracker its own run.
    assert tracker.run_id != forced.run_id != gcp.run_id
    # Any positive interval: the sampler's range holds it, said once.
    assert EmissionsTracker(measure_power_secs=999)._tracker.flags["sample.interval"] == ("60000ms")
    # Without start(), as codecarbon: flush() says so and gives None.
    assert tracker.flush() is None and tracker.stop() is None


def test_codecarbons_configuration_files_and_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wattprint.jobs.codecarbon_api import EmissionsTracker

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.delenv("WATTPRINT_SAMPLE_INTERVAL", raising=False)
    (home / ".codecarbon.config").write_text(
        "[codecarbon]\nproject_name=global\nmeasure_power_secs=10\npue=1.5\n"
    )
    (work / ".codecarbon.config").write_text("[codecarbon]\nproject_name=local\n")
    monkeypatch.setenv("CODECARBON_EXPERIMENT_ID", "from-env")
    tracker = EmissionsTracker()
    assert (tracker._project, tracker._experiment) == ("local", "from-env")
    assert tracker._carbon.pue == 1.5 and tracker._tracker.flags["sample.interval"] == "10000ms"
    # The argument wins over all; Wattprint's own variable wins over codecarbon's config.
    assert EmissionsTracker(project_name="arg")._project == "arg"
    monkeypatch.setenv("WATTPRINT_SAMPLE_INTERVAL", "2s")
    assert "sample.interval" not in EmissionsTracker()._tracker.flags
    # A FIFO where the file would be is not waited on.
    (work / ".codecarbon.config").unlink()
    os.mkfifo(work / ".codecarbon.config")
    assert EmissionsTracker()._project == "global"


def test_track_is_the_function_whatever_was_imported() -> None:
    import wattprint
    import wattprint.jobs.codecarbon_api
    import wattprint.jobs.tracker

    assert callable(wattprint.track) and wattprint.track.__module__ == "wattprint"
    assert wattprint.EmissionsTracker is wattprint.jobs.codecarbon_api.EmissionsTracker
    assert wattprint.track_emissions is wattprint.jobs.codecarbon_api.track_emissions
    # codecarbon's other public names, equal to codecarbon's own.
    import dataclasses

    from codecarbon.output import OutputMethod, TaskEmissionsData

    assert [m.value for m in wattprint.OutputMethod] == [m.value for m in OutputMethod]
    assert OutputMethod.CSV == wattprint.OutputMethod.CSV
    assert callable(wattprint.track_task_emissions)
    from wattprint.jobs.ccdata import TASK_COLUMNS

    assert list(TASK_COLUMNS) == [f.name for f in dataclasses.fields(TaskEmissionsData)]
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        wattprint.Nope  # noqa: B018


def test_the_codecarbon_file_is_appended_to_by_many_and_kept_aside_if_foreign(
    tmp_path: Path, said: list[str]
) -> None:
    from wattprint.jobs.trackfiles import append_row
    from wattprint.report.common import CODECARBON_COLUMNS

    path = tmp_path / "emissions.csv"
    for rank in range(3):
        append_row(path, {"run_id": "job", "project_name": f"r{rank}", "emissions": "0.5"})
    rows = list(csv.DictReader(path.open()))
    assert [r["project_name"] for r in rows] == ["r0", "r1", "r2"]
    assert tuple(rows[0]) == CODECARBON_COLUMNS
    # A file of other columns (codecarbon 2's, a user's): moved aside, as codecarbon does.
    other = tmp_path / "old.csv"
    other.write_text("timestamp,emissions\n2026-01-01,1\n")
    append_row(other, {"run_id": "job"})
    assert (tmp_path / "old.csv.bak").read_text().startswith("timestamp,emissions\n")
    [row] = list(csv.DictReader(other.open()))
    assert row["run_id"] == "job"
    assert f"{other} has other columns than codecarbon's: moved to {other}.bak" in said


def test_codecarbons_own_messages_without_start(said: list[str]) -> None:
    from wattprint.jobs.codecarbon_api import EmissionsTracker

    theirs: list[str] = []

    class Theirs(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            theirs.append(record.getMessage())

    # Logging set up for codecarbon's logger still applies.
    codecarbon_logger = logging.getLogger("codecarbon")
    handler = Theirs(level=logging.ERROR)
    codecarbon_logger.addHandler(handler)
    try:
        tracker = EmissionsTracker()
        assert tracker.flush() is None and tracker.stop() is None
    finally:
        codecarbon_logger.removeHandler(handler)
    assert said[-2:] == [
        "You first need to start the tracker.",
        "Tracker already stopped or never started.",
    ]
    assert theirs == ["You first need to start the tracker."]  # its level: ERROR


@pytest.mark.parametrize(
    ("argument", "value", "line"),
    [
        ("pue", "abc", "EmissionsTracker(pue='abc'): 'abc' is not a number"),
        ("pue", 0.5, "EmissionsTracker(pue=0.5): '0.5' is not a plausible PUE (1.0 to 5.0)"),
        (
            "measure_power_secs",
            "x",
            "EmissionsTracker(measure_power_secs='x'): 'x' is not a number",
        ),
        (
            "measure_power_secs",
            0,
            "EmissionsTracker(measure_power_secs=0): '0' must be a positive number of seconds",
        ),
        (
            "force_cpu_power",
            "-1",
            "EmissionsTracker(force_cpu_power='-1'): '-1' must be zero or a positive number",
        ),
        (
            "log_level",
            "verbose",
            "EmissionsTracker(log_level='verbose'): not a log level "
            "(debug, info, warning, error, critical)",
        ),
        ("gpu_ids", 3, "EmissionsTracker(gpu_ids=3): not a list of GPU indices"),
    ],
)
def test_a_bad_codecarbon_argument_is_one_line_from_the_constructor(
    argument: str, value: object, line: str
) -> None:
    from wattprint.config.options import ConfigError
    from wattprint.jobs.codecarbon_api import EmissionsTracker, OfflineEmissionsTracker

    with pytest.raises(ConfigError) as raised:
        EmissionsTracker(**{argument: value})
    assert str(raised.value) == line and isinstance(raised.value, ValueError)
    with pytest.raises(ConfigError, match=r"^OfflineEmissionsTracker\("):
        OfflineEmissionsTracker(**{argument: value})
    # The decorator says it when it decorates, not at the first call.
    import wattprint

    with pytest.raises(ConfigError) as raised:
        wattprint.track_emissions(**{argument: value})
    assert str(raised.value) == line.replace("EmissionsTracker(", "track_emissions(", 1)


def test_a_writer_waiting_on_a_file_set_aside_appends_to_the_new_one(tmp_path: Path) -> None:
    import fcntl
    import threading
    import time

    from wattprint.jobs.trackfiles import append_row

    path = tmp_path / "emissions.csv"
    path.write_text("timestamp,emissions\n2026-01-01,1\n")  # another format
    with open(path, "a+") as first:  # a rank that is setting it aside
        fcntl.flock(first.fileno(), fcntl.LOCK_EX)
        waiting = threading.Thread(target=append_row, args=(path, {"run_id": "b"}))
        waiting.start()  # opened the old file, waits for its lock
        time.sleep(0.3)
        path.rename(tmp_path / "emissions.csv.bak")
        append_row(path, {"run_id": "a"})
    waiting.join(10)
    assert [r["run_id"] for r in csv.DictReader(path.open())] == ["a", "b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emissions.csv", "emissions.csv.bak"]
