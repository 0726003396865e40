"""codecarbon 3.3.2's own tracker tests judge the drop-in: fetched from its sdist at test
time (`pip download --no-binary`; none of codecarbon's code is in this repository), their
public imports (EmissionsTracker, OfflineEmissionsTracker, track_emissions,
track_task_emissions) switched to wattprint's and nothing else, run with pytest in a
subprocess beside a node sampler of their own (state, trackers, HOME and TMPDIR in
tmp). Every test that checks public behaviour must pass; the exceptions are named below
with their reason, and in docs/codecarbon.md."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VERSION = "3.3.2"
PUBLIC_NAMES = ("EmissionsTracker", "OfflineEmissionsTracker", "track_emissions")
PUBLIC_NAMES += ("track_task_emissions",)

# Every test of these files that checks codecarbon's public behaviour (its arguments,
# return values, files, handlers, logs), by file, class and name.
PUBLIC = {
    "test_emissions_tracker.py::TestCarbonTracker": (
        "test_graceful_start_failure",
        "test_graceful_stop_failure",
        "test_decorator_ONLINE_NO_ARGS",
        "test_decorator_ONLINE_WITH_ARGS",
        "test_decorator_OFFLINE_NO_COUNTRY",
        "test_decorator_OFFLINE_WITH_LOC_ARGS",
        "test_decorator_OFFLINE_WITH_CLOUD_ARGS",
        "test_track_task_emissions_decorator",
        "test_offline_tracker_country_name",
        "test_offline_tracker_invalid_headers",
        "test_offline_tracker_valid_headers",
        "test_carbon_tracker_offline_context_manager",
        "test_get_detected_hardware",
    ),
    "test_emissions_tracker_constant.py::TestCarbonTrackerConstant": (
        "test_carbon_tracker_online_constant",
        "test_carbon_tracker_offline_constant",
        "test_decorator_constant",
    ),
    "test_emissions_tracker_flush.py::TestCarbonTrackerFlush": (
        "test_carbon_tracker_online_flush",
        "test_carbon_tracker_offline_flush",
        "test_decorator_flush",
        "test_flush_with_active_task",
    ),
    "test_offline_emissions_tracker.py::TestOfflineEmissionsTracker": (
        "test_offline_tracker",
        "test_offline_tracker_task",
    ),
    "test_tracking_inference.py::TestCarbonInferenceTracker": (
        "test_tracker_measures_model_loading_task",
        "test_tracker_measures_correctly_each_inference_from_task",
        "test_tracker_outputs_data_point_for_each_task_logged",
    ),
    "test_custom_handler.py::TestCarbonCustomHandler": (
        "test_carbon_tracker_custom_handler",
        "test_decorator_flush",
    ),
    "test_logging_output.py::TestCarbonTrackerFlush": (
        "test_carbon_tracker_online_logging_output",
        "test_carbon_tracker_offline_logging_output",
        "test_decorator_flush",
    ),
    "test_utilization_tracking.py::TestUtilizationTracking": (
        "test_utilization_fields_in_emissions_data",
        "test_utilization_fields_in_csv_output",
        "test_utilization_history_cleared_on_start",
        "test_utilization_averaging_over_time",
        "test_task_utilization_tracking",
        "test_utilization_with_empty_history",
    ),
}
# Public, but asserting a whole-machine figure of codecarbon's own CPU model, which a
# tracker of one process tree's share does not report (docs/codecarbon.md).
WHOLE_MACHINE = {
    "test_emissions_tracker_constant.py::TestCarbonTrackerConstant": {
        "test_carbon_tracker_offline_constant_force_cpu_power": "cpu_power == half the "
        "forced TDP: codecarbon's constant model of the whole CPU",
        "test_carbon_tracker_offline_constant_pue": "cpu_power == half the forced TDP x PUE",
        "test_carbon_tracker_offline_load_force_cpu_power": "cpu_power from the machine's "
        "CPU load and the forced TDP",
    },
}
# The rest patch or read codecarbon's internals (its schedulers, hardware objects,
# private methods, mock call counts of its geolocation and GPU probes, BoAmps): they
# test codecarbon's implementation, not its contract.
INTERNALS = 28

SUPPORT = {
    "tests/__init__.py": "",
    "tests/fake_modules/__init__.py": "",
    # What the tests set on codecarbon's pynvml stand-in; codecarbon's own GPU code,
    # which reads it, is not what runs here.
    "tests/fake_modules/pynvml.py": "from unittest import mock\n\nDETAILS = {}\n"
    "INIT_MOCK = mock.MagicMock()\n",
    "pytest.ini": "[pytest]\n",
}
COLUMNS_V1 = (
    "timestamp,project_name,run_id,duration,emissions,emissions_rate,cpu_power,gpu_power,"
    "ram_power,cpu_energy,gpu_energy,ram_energy,energy_consumed,country_name,"
    "country_iso_code,region,cloud_provider,cloud_region,os,python_version,cpu_count,"
    "cpu_model,gpu_count,gpu_model,longitude,latitude,ram_total_size,tracking_mode,on_cloud"
)
# `responses` (an HTTP mock the online tests decorate with) where it is not installed:
# nothing here makes an HTTP request.
RESPONSES_STUB = (
    "GET = 'GET'\ncalls = []\n\n\ndef activate(function):\n    return function\n\n\n"
    "def add(*args, **kwargs):\n    pass\n"
)


def _sdist(directory: Path) -> Path:
    """codecarbon's sdist, downloaded now; a failure fails the test under CI=true."""
    try:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", f"codecarbon=={VERSION}"),
                *("--no-binary", ":all:", "--no-deps", "--no-build-isolation"),
                *("-d", str(directory)),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        found = sorted(directory.glob(f"codecarbon-{VERSION}.tar.gz"))
    except (OSError, subprocess.TimeoutExpired) as err:
        done, found = None, []
        why = str(err)
    if not found:
        why = done.stderr.strip().splitlines()[-1] if done and done.stderr.strip() else why
        message = f"cannot download codecarbon {VERSION}'s sdist: {why}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found[0]


def switch_imports(source: str) -> str:
    """The public names from wattprint; every other import as it was."""

    def replace(match: re.Match[str]) -> str:
        module, body = match.group(1), match.group(2)
        names = [n.strip() for n in body.strip("()").replace("\n", " ").split(",") if n.strip()]
        ours = [n for n in names if n in PUBLIC_NAMES]
        theirs = [n for n in names if n not in PUBLIC_NAMES]
        lines = [f"from wattprint import {', '.join(ours)}"] if ours else []
        if theirs:
            lines.append(f"from {module} import {', '.join(theirs)}")
        return "\n".join(lines)

    pattern = r"^from (codecarbon(?:\.emissions_tracker)?) import (\([^)]*\)|[^\n]+)"
    return re.sub(pattern, replace, source, flags=re.MULTILINE)


def _extract(sdist: Path, root: Path) -> None:
    files = {name.split("::")[0] for name in (*PUBLIC, *WHOLE_MACHINE)}
    files |= {"testdata.py", "testutils.py"}
    prefix = f"codecarbon-{VERSION}/tests/"
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            name = member.name.removeprefix(prefix)
            if member.name.startswith(prefix) and name in files and member.isfile():
                handle = archive.extractfile(member)
                assert handle is not None
                path = root / "tests" / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(switch_imports(handle.read().decode("utf-8")))
    missing = sorted(f for f in files if not (root / "tests" / f).exists())
    assert not missing, f"not in codecarbon's sdist: {missing}"
    for name, text in SUPPORT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    from wattprint.report.common import CODECARBON_COLUMNS

    data = root / "tests" / "test_data"
    data.mkdir()
    morocco = "Morocco,MAR,,,,Linux,3.12,8,cpu,0,,,,16,machine"
    (data / "emissions_valid_headers.csv").write_text(
        ",".join(CODECARBON_COLUMNS)
        + "\n2026-01-01T00:00:00,p,r,e,10,1e-05,1e-06,0.269999999999999,0,0.1,1e-06,0,1e-06,"
        + "2e-06,0,Morocco,MAR,,,,Linux,3.12,3.3.2,8,cpu,0,,,,16,machine,0,0,0,0,N,1,0\n"
    )
    (data / "emissions_invalid_headers.csv").write_text(
        COLUMNS_V1 + "\n2020-01-01T00:00:00,p,r,10,1e-05,1e-06,0.27,0,0.1,1e-06,0,1e-06,"
        f"2e-06,{morocco},N\n"
    )
    try:
        import responses  # noqa: F401
    except ImportError:
        (root / "responses.py").write_text(RESPONSES_STUB)


def test_codecarbons_own_tracker_tests_pass_with_the_import_switched(tmp_path: Path) -> None:
    root = tmp_path / "suite"
    root.mkdir()
    _extract(_sdist(tmp_path / "sdist"), root)
    for name in ("home", "tmp", "run"):
        (tmp_path / name).mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CODECARBON_")}
    env = {k: v for k, v in env.items() if not k.startswith("WATTPRINT_")}
    for name in ("RANK", "LOCAL_RANK", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    state = tmp_path / "state" / "state.json"
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO / "exporter"), str(root)]),
        HOME=str(tmp_path / "home"),
        TMPDIR=str(tmp_path / "tmp"),
        XDG_RUNTIME_DIR=str(tmp_path / "run"),
        WATTPRINT_STATE_FILE=str(state),
        WATTPRINT_CPU_SOURCE="model",
        WATTPRINT_MEMORY_SOURCE="model",
        WATTPRINT_SAMPLE_INTERVAL="200ms",
    )
    ids = [f"tests/{group}::{name}" for group, names in PUBLIC.items() for name in names]
    report = tmp_path / "junit.xml"
    try:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
                *("-o", "addopts=", f"--junitxml={report}", *ids),
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        _end_sampler(state)
    outcomes = _outcomes(report)
    wanted = {f"{g.split('::')[0]}::{name}" for g, names in PUBLIC.items() for name in names}
    failed = {test: outcomes.get(test, "not run") for test in sorted(wanted)}
    failed = {test: outcome for test, outcome in failed.items() if outcome != "passed"}
    assert not failed, f"{json.dumps(failed, indent=1)}\n{done.stdout[-6000:]}"
    assert len(wanted) == 36 and INTERNALS == 67 - 36 - 3


def _outcomes(report: Path) -> dict[str, str]:
    """file::test -> passed, failed, error or skipped, from pytest's JUnit XML."""
    if not report.exists():
        return {}
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[1]
        outcome = "passed"
        for kind in ("failure", "error", "skipped"):
            if case.find(kind) is not None:
                outcome = kind
        found[f"{module}.py::{case.get('name')}"] = outcome
    return found


def _end_sampler(state: Path) -> None:
    """The node sampler the trackers started exits once idle; a test leaves none."""
    lock = Path(f"{state}.lock")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            pid = int(json.loads(lock.read_text())["pid"])
            os.kill(pid, 0)
        except (OSError, ValueError, KeyError):
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGTERM)
