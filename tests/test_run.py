"""`wattprint run -- CMD` and `wattprint.track()` on a node with the live fake NVML
(tests/livenvml.py: the recorded H200 trace, 4 GPUs, shared by every process of the
test), real /proc and real processes: 4 ranks of one job with uneven load, and a
process of another job on the fourth GPU."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import livenvml
from fake_nvml import TRACE
from wattprint.config.options import build_config
from wattprint.jobs import meter as jobmeter
from wattprint.jobs import notes
from wattprint.report import jobdoc, render
from wattprint.report.common import CODECARBON_COLUMNS

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DURATION_S = 3.0
# The job's name, this session's own: a sampler counts every process on the node that
# carries a workload's name, and another session's tests (on a shared machine) run jobs
# of their own at the same time.
JOB = f"train-{uuid.uuid4().hex[:8]}"
# rank -> (gpu, SM utilization, share of a CPU it keeps busy): uneven on purpose
LAYOUT = {0: (0, 90, 1.0), 1: (0, 30, 0.25), 2: (1, 60, 0.5), 3: (2, 20, 0.1)}

RANK = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import livenvml
rank, track = int(sys.argv[1]), sys.argv[2] == "1"
gpu, sm, busy = {layout!r}[rank]
directory = Path(os.environ["WATTPRINT_TEST_NVML_DIR"])
tracker = None
if track:
    import wattprint
    tracker = wattprint.track(output_dir=sys.argv[3])
    tracker.start()
held = livenvml.hold(directory, gpu, sm)
end = time.time() + {duration}
while time.time() < end:
    t = time.time()
    while time.time() - t < 0.1 * busy:
        pass
    time.sleep(0.1 * (1 - busy))
livenvml.release(held)
if tracker is not None:
    # A barrier, as a distributed job has before it saves and stops: all ranks are done.
    while any(h.get("until") is None for h in livenvml.holds(directory)
              if h["gpu"] < 3):
        time.sleep(0.02)
    time.sleep(0.3)
    tracker.stop()
time.sleep(0.5)  # still listed on its GPU for a few samples after it stopped drawing
"""

LAUNCH = """
import subprocess, sys
ranks = [subprocess.Popen([sys.executable, {rank!r}, str(i), *sys.argv[2:]]) for i in range(4)]
for r in ranks:
    r.wait()
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Any]:
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    nvml_dir = tmp_path / "nvml"
    nvml_dir.mkdir()
    rank = tmp_path / "rank.py"
    rank.write_text(RANK.format(tests=str(TESTS), layout=LAYOUT, duration=DURATION_S))
    launch = tmp_path / "launch_4_ranks.py"
    launch.write_text(LAUNCH.format(rank=str(rank)))
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS / "livefake"), str(REPO / "exporter")]),
        WATTPRINT_TEST_NVML_DIR=str(nvml_dir),
        WATTPRINT_TEST_NVML_T0=str(time.time()),
        WATTPRINT_STATE_FILE=str(tmp_path / "state" / "state.json"),
        # The per-user fallback lock of this test alone: a sampler another session left
        # there would otherwise be found (and read) by every tracker of this user.
        XDG_RUNTIME_DIR=str(tmp_path),
        WATTPRINT_GPU_SOURCE="nvml",
        WATTPRINT_CPU_SOURCE="model",
        WATTPRINT_MEMORY_SOURCE="model",
        WATTPRINT_SAMPLE_INTERVAL="100ms",
        WATTPRINT_CARBON_ZONE="DE",
    )
    env.pop("WATTPRINT_WORKLOAD", None)
    return {"dir": nvml_dir, "launch": launch, "env": env, "tmp": tmp_path}


def outsider(node: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Another job's process holding GPU 3 for the whole test."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(TESTS)!r})
        import livenvml
        from pathlib import Path
        held = livenvml.hold(Path({str(node["dir"])!r}), 3, 100)
        time.sleep({DURATION_S + 6})
    """)
    env = dict(node["env"], WATTPRINT_WORKLOAD="someone-else")
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def wattprint_run(
    node: dict[str, Any],
    *args: str,
    status: int = 0,
    track: bool = False,
    env: dict[str, str] | None = None,
    workload: str = JOB,
    **kwargs: Any,
) -> subprocess.Popen[bytes]:
    out = node["tmp"] / "out"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wattprint",
            "run",
            f"--workload={workload}",
            f"--output.dir={out}",
            *args,
            "--",
            sys.executable,
            str(node["launch"]),
            str(status),
            "1" if track else "0",
            str(node["tmp"] / "ranks"),
        ],
        env=env or node["env"],
        stderr=subprocess.PIPE,
        **kwargs,
    )


def expected_gpu_j(node: dict[str, Any], gpus: tuple[int, ...] = (0, 1, 2)) -> float:
    trace, t0 = livenvml.Trace(), float(node["env"]["WATTPRINT_TEST_NVML_T0"])
    return sum(livenvml.gpu_energy_j(trace, t0, node["dir"], g, time.time()) for g in gpus)


def load_job(path: Path) -> tuple[dict[str, Any], Any]:
    document = json.loads(path.read_text())
    return document, jobdoc.job_from_document(document)


def test_run_reports_the_jobs_share_exactly_and_passes_the_status(node: dict[str, Any]) -> None:
    other = outsider(node)
    try:
        proc = wattprint_run(node, status=3)
        _, err = proc.communicate(timeout=60)
    finally:
        other.kill()
    assert proc.returncode == 3, err.decode()  # the command failed: its status, and a report
    [path] = (node["tmp"] / "out").glob(f"wattprint-{JOB}-*.json")
    document, job = load_job(path)
    want = expected_gpu_j(node)
    got = job.components["gpu"].energy_j
    assert abs(got - want) / want < 0.005, (got, want)
    # GPU 3 belongs to the other job: not a joule of it here.
    assert sorted(g for _, g in job.gpus) == ["0", "1", "2"]
    # CPU and memory once: the job's share is at most the node's, not 4 ranks x the node.
    node_j = document["node_energy_j"]
    for part in ("cpu", "memory"):
        assert 0 < job.components[part].energy_j <= node_j[part]
    assert document["exit_status"] == 3
    assert "the command exited with status 3" in document["job"]["notes"]
    # The table went to stderr, in the unit its size reads best in.
    unit = render.Units.suited([job]).energy.name
    assert f"GPU {unit}" in err.decode() and unit in ("J", "Wh")
    # The JSON parses back to the same numbers.
    assert jobdoc.job_document(job, document["source"], {})["job"] == document["job"]
    assert jobdoc.job_document(job, "", {})["raw"] == document["raw"]
    # The CSV has codecarbon 3.3.2's columns, and its numbers are the JSON's.
    [csv_path] = (node["tmp"] / "out").glob(f"wattprint-{JOB}-*.emissions.csv")
    rows = list(csv.DictReader(csv_path.open()))
    assert tuple(rows[0].keys()) == CODECARBON_COLUMNS and len(rows) == 1
    assert float(rows[0]["gpu_energy"]) == document["job"]["energy_kwh"]["gpu"]
    assert float(rows[0]["energy_consumed"]) == document["job"]["energy_kwh"]["total"]
    inits = (node["dir"] / "inits").read_text().split()
    assert len(inits) == 1  # one sampler: the node's, which run started


def test_sigterm_reaches_the_command_and_a_report_is_written(node: dict[str, Any]) -> None:
    proc = wattprint_run(node)
    deadline = time.monotonic() + 30
    while len(livenvml.holds(node["dir"])) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    # The ranks died of SIGTERM; the launcher with them (128 + 15, as a shell says).
    assert proc.returncode in (128 + signal.SIGTERM, 1), err.decode()
    [path] = (node["tmp"] / "out").glob(f"wattprint-{JOB}-*.json")
    document, job = load_job(path)
    assert f"interrupted by signal {int(signal.SIGTERM)}" in document["job"]["notes"]
    assert job.components["gpu"].energy_j > 0
    assert not any(livenvml._alive(h["pid"]) for h in livenvml.holds(node["dir"]))


# A name with a space: the trackers' job is run's, as given (their files spell it my_...).
@pytest.mark.parametrize("workload", [JOB, f"my {JOB}"])
def test_rank_trackers_add_up_to_the_job_with_one_sampler(
    node: dict[str, Any], workload: str
) -> None:
    proc = wattprint_run(node, track=True, workload=workload)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err.decode()
    [path] = (node["tmp"] / "out").glob(f"wattprint-{workload.replace(' ', '_')}-*.json")
    _, job = load_job(path)
    ranks = [load_job(p)[1] for p in sorted((node["tmp"] / "ranks").glob("*.json"))]
    assert len(ranks) == 4
    total = jobdoc.merge(ranks)
    for part in ("gpu",):
        got, want = total.components[part].energy_j, job.components[part].energy_j
        assert abs(got - want) / want < 0.005, (part, got, want)
    # CPU and memory once: the ranks' shares add up to at most the job's (the job also
    # holds the launcher and the ranks' start-up before their trackers started).
    for part in ("cpu", "memory"):
        assert 0 < total.components[part].energy_j <= job.components[part].energy_j
    # GPU 0's two ranks each have their share of it, and the shares make GPU 0 once.
    assert all(r.workload == workload for r in ranks)
    gpu0 = [g.energy_j for r in ranks for (_, index), g in r.gpus.items() if index == "0"]
    whole = job.gpus[next(k for k in job.gpus if k[1] == "0")].energy_j
    assert len(gpu0) == 2 and min(gpu0) > 0
    assert abs(sum(gpu0) - whole) / whole < 0.005
    # At most one sampler: run's; the trackers read from it.
    assert len((node["dir"] / "inits").read_text().split()) == 1


def test_trackers_without_run_start_one_sampler(node: dict[str, Any]) -> None:
    env = dict(node["env"], WATTPRINT_WORKLOAD="solo")
    proc = subprocess.run(
        [sys.executable, str(node["launch"]), "0", "1", str(node["tmp"] / "ranks")],
        env=env,
        capture_output=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    ranks = [load_job(p)[1] for p in (node["tmp"] / "ranks").glob("*.json")]
    assert len(ranks) == 4
    got = jobdoc.merge(ranks).components["gpu"].energy_j
    want = expected_gpu_j(node)
    assert abs(got - want) / want < 0.005, (got, want)
    assert len(set((node["dir"] / "inits").read_text().split())) == 1


def test_with_an_exporter_run_reads_it_and_agrees_exactly(node: dict[str, Any]) -> None:
    import socket as sock

    with sock.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exporter = subprocess.Popen(
        [sys.executable, "-m", "wattprint", f"--web.listen-address=127.0.0.1:{port}"],
        env=node["env"],
        stderr=subprocess.DEVNULL,
    )
    try:
        lock = Path(node["env"]["WATTPRINT_STATE_FILE"] + ".lock")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (lock.exists() and lock.read_text()):
            time.sleep(0.05)
        proc = wattprint_run(node)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        reading = jobmeter.ExporterReader(f"http://127.0.0.1:{port}").read()
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)
    document, job = load_job(next((node["tmp"] / "out").glob(f"wattprint-{JOB}-*.json")))
    assert document["source"].startswith("exporter http://127.0.0.1:")
    # run took no NVML reading of its own: the exporter is the only one that did.
    assert (node["dir"] / "inits").read_text().split() == [str(exporter.pid)]
    # Its numbers are the exporter's counters for the job (born during it), exactly.
    for part in ("gpu", "cpu", "memory"):
        counted = sum(v[0] for k, v in reading.series.items() if k[0] == part and k[4] == JOB)
        assert job.components[part].energy_j == pytest.approx(counted, rel=1e-12, abs=1e-9)
    want = expected_gpu_j(node)
    assert abs(job.components["gpu"].energy_j - want) / want < 0.005


def start_exporter(
    node: dict[str, Any], env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int]:
    """The node's exporter, once it holds the node lock."""
    import socket as sock

    with sock.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exporter = subprocess.Popen(
        [sys.executable, "-m", "wattprint", f"--web.listen-address=127.0.0.1:{port}"],
        env=env,
        stderr=subprocess.PIPE,
    )
    lock = Path(node["env"]["WATTPRINT_STATE_FILE"] + ".lock")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (lock.exists() and lock.read_text()):
        time.sleep(0.05)
    return exporter, port


def run_plain(
    node: dict[str, Any], *argv: str, env: dict[str, str] | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    out = node["tmp"] / "out"
    return subprocess.run(
        [sys.executable, "-m", "wattprint", "run", f"--output.dir={out}", *argv],
        env=dict(env or node["env"], **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_command_that_cannot_start_gets_its_error_and_no_report(node: dict[str, Any]) -> None:
    script = node["tmp"] / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hello\n")
    cases = {
        "/nonexistent": (127, "wattprint run: cannot run /nonexistent: No such file or directory"),
        "no-such-command-7f3a": (127, "wattprint run: no-such-command-7f3a: command not found"),
        str(script): (126, f"wattprint run: cannot run {script}: Permission denied"),
        str(node["tmp"]): (126, f"wattprint run: cannot run {node['tmp']}: Is a directory"),
    }
    for command, (status, line) in cases.items():
        result = run_plain(node, "--", command)
        assert (result.returncode, result.stderr) == (status, line + "\n"), command
        assert result.stdout == ""
    # No report, no files, and no sampler was even started (it would have opened NVML).
    assert not (node["tmp"] / "out").exists()
    assert not (node["dir"] / "inits").exists()
    # One that only exec() can refuse: the sampler had started, but still no report.
    garbage = node["tmp"] / "not-a-program"
    garbage.write_bytes(b"\x7fELF\x00garbage")
    garbage.chmod(0o755)
    result = run_plain(node, "--", str(garbage))
    assert result.returncode == 126
    assert (
        result.stderr.splitlines()[-1] == f"wattprint run: cannot run {garbage}: Exec format error"
    )
    assert not (node["tmp"] / "out").exists()


def test_a_job_shorter_than_one_sample_says_so_in_joules(node: dict[str, Any]) -> None:
    result = run_plain(node, "--workload=blink", "--", "true", WATTPRINT_SAMPLE_INTERVAL="2s")
    assert result.returncode == 0, result.stderr
    notes = load_job(next((node["tmp"] / "out").glob("wattprint-blink-*.json")))[0]["job"]["notes"]
    [note] = [n for n in notes if "shorter than one sample" in n]
    assert note.startswith("the command ran 0.")
    assert note.endswith(
        " s, shorter than one sample (2 s): "
        "the sampler never saw its processes, so nothing is counted"
    )
    assert f"  blink: {note}" in result.stderr
    assert "ENERGY J  GPU J  CPU J  MEMORY J  CO2e g" in result.stderr
    assert "ENERGY kWh" not in result.stderr
    assert "Measured and estimated" not in result.stderr  # no empty table of it


def test_the_notes_on_what_the_samples_saw() -> None:
    assert notes.unseen(True, 0.05, 0.1) == (
        "the command ran 0.05 s, shorter than one sample (0.1 s): "
        "only the samples that saw it count what it used"
    )
    assert notes.unseen(False, 3.0, 1.0) == (
        "the sampler saw no process of the command in 3.00 s: nothing is counted"
    )
    assert notes.unseen(True, 3.0, 1.0) is None
    # The interval, as the node's sampler says it in /metrics.
    config = build_config({"sample.interval": "100ms"}, {})
    given = {"sample.interval": "--sample.interval=100ms"}
    theirs = jobmeter.Reading(time=0.0, interval=1.0, zones={"DE"})
    assert notes.overridden(config, given, theirs, "URL") == [
        "--sample.interval=100ms not applied: the node's sampler (URL) uses 1s"
    ]
    assert notes.overridden(config, given, dataclasses.replace(theirs, interval=0.1), "U") == []
    # A zone spelled another way is the same zone.
    for spelled in ("DEU", "de"):
        config = build_config({"carbon.zone": spelled}, {})
        assert (
            notes.overridden(config, {"carbon.zone": f"--carbon.zone={spelled}"}, theirs, "U") == []
        )
    config = build_config({"carbon.zone": "FRA"}, {})
    assert notes.overridden(config, {"carbon.zone": "--carbon.zone=FRA"}, theirs, "U") == [
        "--carbon.zone=FRA not applied: the node's sampler (U) uses DE"
    ]


def test_units_suit_the_size() -> None:
    def table(joules: float, grams: float) -> list[str]:
        job = jobmeter.JobReport("env", "", "j", start=0.0, end=10.0)
        job.components["gpu"].energy_j = job.components["gpu"].pue_energy_j = joules
        job.components["gpu"].emissions_g = grams
        window = jobmeter.make_window(0.0, 10.0, whole_life=False)
        text = render.render_table([job], window, "", render.Units.suited([job]))
        header, row = text.splitlines()[2:4]
        return [f"{h}={v}" for h, v in zip(re.split(r"\s{2,}", header), row.split())]

    assert table(0.0486, 0.0000046)[5:7] == ["ENERGY J=0.04860", "GPU J=0.04860"]
    assert table(7200.0, 0.9)[5:7] == ["ENERGY Wh=2.000", "GPU Wh=2.000"]
    assert table(5.4e6, 2500.0)[5:7] == ["ENERGY kWh=1.500", "GPU kWh=1.500"]
    assert "CO2e g=0.9000" in table(7200.0, 0.9) and "CO2e kg=2.500" in table(5.4e6, 2500.0)
    # The Prometheus report keeps kWh and kg whatever the size.
    job = jobmeter.JobReport("env", "", "j", start=0.0, end=10.0)
    window = jobmeter.make_window(0.0, 10.0, whole_life=False)
    assert "ENERGY kWh" in render.render_table([job], window, "")


def test_run_names_the_settings_the_nodes_sampler_overrides(node: dict[str, Any]) -> None:
    # The node's exporter, started without a zone; run asked for FR and a PUE of 1.5.
    env = {k: v for k, v in node["env"].items() if k != "WATTPRINT_CARBON_ZONE"}
    exporter, port = start_exporter(node, env)
    try:
        given = ("--carbon.zone=FR", "--pue=1.5", "--cpu.source=rapl")
        overridden = run_plain(node, "--workload=over", *given, "--", "sleep", "0.3", env=env)
        run_plain(node, "--workload=envzone", "--", "true")  # DE in its environment
        agreeing = run_plain(node, "--workload=agree", "--", "true", env=env)
    finally:
        exporter.terminate()
        _, exporter_log = exporter.communicate(timeout=10)
    assert overridden.returncode == 0, overridden.stderr
    url = f"http://127.0.0.1:{port}/metrics"
    world = (
        f"the node's sampler ({url}) accounts with the world average (zone WORLD): "
        "it was started without --carbon.zone"
    )
    assert notes_of(node, "over") == [  # in --help's order
        f"--cpu.source=rapl not applied: the node's sampler ({url}) keeps its own settings",
        f"--carbon.zone=FR not applied: the node's sampler ({url}) uses WORLD",
        f"--pue=1.5 not applied: the node's sampler ({url}) uses 1",
        world,
    ]
    assert "  over: --pue=1.5 not applied" in overridden.stderr  # the table's notes
    assert notes_of(node, "envzone") == [
        f"WATTPRINT_CARBON_ZONE=DE not applied: the node's sampler ({url}) uses WORLD",
        world,
    ]
    assert notes_of(node, "agree") == [world], agreeing.stderr
    # The same words as the exporter's own warning, which it logged when it started.
    warning = (
        "no --carbon.zone: accounting with the world average (zone WORLD); "
        "set your grid zone, e.g. --carbon.zone=DE"
    )
    assert f'level=warn source=wattprint msg="{warning}"' in exporter_log.decode()

    # The node's sampler started by run without a zone: the exporter's warning, word for
    # word, and a note.
    result = run_plain(node, "--workload=world", "--", "true", env=env)
    assert f'level=warn source=wattprint msg="{warning}"' in result.stderr
    [note] = notes_of(node, "world")
    assert note.endswith(
        "accounts with the world average (zone WORLD): it was started without --carbon.zone"
    )
    assert "warn" not in run_plain(node, "--workload=de", "--", "true").stderr.replace(
        "level=warn source=wattprint.sampler.clock", ""
    )


def test_another_job_of_the_same_name_on_the_node_is_named_in_the_notes(
    node: dict[str, Any],
) -> None:
    # A process of another job that carries the name this run is given.
    busy = "import time\nwhile True:\n    sum(range(10000)); time.sleep(0.01)\n"
    other = subprocess.Popen(
        [sys.executable, "-c", busy], env=dict(node["env"], WATTPRINT_WORKLOAD="twin")
    )
    try:
        time.sleep(0.5)
        result = run_plain(node, "--workload=twin", "--", "sleep", "0.5")
    finally:
        other.kill()
        other.wait()
    assert result.returncode == 0, result.stderr
    [path] = (node["tmp"] / "out").glob("wattprint-twin-*.json")
    assert (
        "the node's sampler counted energy for workload 'twin' before the command started: "
        "another job of that name ran or runs on this node, and what it used meanwhile is "
        "counted here too (give this run its own --workload)"
    ) in json.loads(path.read_text())["job"]["notes"]
    alone = run_plain(node, "--workload=single", "--", "sleep", "0.5")
    assert "another job of that name" not in alone.stderr


def notes_of(node: dict[str, Any], workload: str) -> list[str]:
    """The job's notes on what ran it (not on the command's own length or status)."""
    [path] = (node["tmp"] / "out").glob(f"wattprint-{workload}-*.json")
    notes: list[str] = json.loads(path.read_text())["job"]["notes"]
    return [n for n in notes if "not applied" in n or "world average" in n]


def report_from_files(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wattprint", "report", f"--from-files={directory}", *args],
        env=dict(os.environ, PYTHONPATH=str(REPO / "exporter")),
        capture_output=True,
        text=True,
        timeout=60,
    )


def kwh(joules: float) -> float:
    return joules / 3.6e6


def test_report_from_files_adds_up_the_nodes(node: dict[str, Any]) -> None:
    # Two nodes of one job: `wattprint run -- ...` on each, named as Slurm names them,
    # given one launch id as a launcher would (srun's is its job and step).
    launch = dict(node["env"], WATTPRINT_LAUNCH_ID="job-4242")
    for name in ("node-a", "node-b"):
        proc = wattprint_run(node, env=dict(launch, SLURMD_NODENAME=name))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
    out = node["tmp"] / "out"
    parts = {p.name: load_job(p)[1] for p in sorted(out.glob(f"wattprint-{JOB}-*.json"))}
    assert sorted(parts) == [f"wattprint-{JOB}-node-a.json", f"wattprint-{JOB}-node-b.json"]
    a, b = parts[f"wattprint-{JOB}-node-a.json"], parts[f"wattprint-{JOB}-node-b.json"]

    result = report_from_files(out, "--format=json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    [job] = document["jobs"]
    assert job["workload"] == JOB and job["launch"] == "job-4242"
    for part in ("gpu", "cpu", "memory"):
        joules = a.components[part].energy_j + b.components[part].energy_j
        assert joules > 0
        assert job["energy_kwh"][part] == kwh(joules)  # exactly the sum
        grams = a.components[part].emissions_g + b.components[part].emissions_g
        assert job["emissions_kg"][part] == grams / 1000
    # The total is the components' sums, added up (exactly), and the nodes' totals.
    parts_j = [a.components[p].energy_j + b.components[p].energy_j for p in a.components]
    parts_g = [a.components[p].emissions_g + b.components[p].emissions_g for p in a.components]
    assert job["energy_kwh"]["total"] == kwh(sum(parts_j))
    assert job["emissions_kg"]["total"] == sum(parts_g) / 1000
    assert job["energy_kwh"]["total"] == pytest.approx(kwh(a.energy_j + b.energy_j), rel=1e-12)
    # Each node's GPUs are its own rows: 3 GPUs of node-a, 3 of node-b.
    assert sorted((g["instance"], g["gpu"]) for g in job["gpus"]) == [
        (n, g) for n in ("node-a", "node-b") for g in "012"
    ]
    assert job["duration_seconds"] == round(b.end - a.start, 3)
    nodes = {n["node"]: n for n in document["nodes"]}
    assert sorted(nodes) == ["node-a", "node-b"]
    for name, part_job in (("node-a", a), ("node-b", b)):
        assert nodes[name]["energy_kwh"]["total"] == kwh(part_job.energy_j)
        assert nodes[name]["energy_kwh"]["gpu"] == kwh(part_job.components["gpu"].energy_j)

    # One row per job in every format; the table and the JSON give each node's part.
    table = report_from_files(out)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"files under {out}: 2 files from 2 node(s)"
    assert lines[3].split()[0] == JOB and lines[4] == "", table.stdout
    at = lines.index("Energy per node")
    assert lines[at + 1].split()[:4] == ["WORKLOAD", "NODE", "FILES", "ENERGY"]
    assert [line.split()[:3] for line in lines[at + 2 : at + 4]] == [
        [JOB, "node-a", "1"],
        [JOB, "node-b", "1"],
    ]

    codecarbon = report_from_files(out, "--format=codecarbon-csv")
    [row] = list(csv.DictReader(codecarbon.stdout.splitlines()))
    assert row["run_id"] == JOB
    assert float(row["energy_consumed"]) == kwh(sum(parts_j))
    assert float(row["gpu_energy"]) == kwh(
        a.components["gpu"].energy_j + b.components["gpu"].energy_j
    )
    [row] = list(csv.DictReader(report_from_files(out, "--format=csv").stdout.splitlines()))
    assert row["workload"] == JOB and float(row["energy_kwh"]) == kwh(sum(parts_j))


def synthetic(
    tmp: Path, name: str, host: str, span: tuple[float, float], joules: float, **extra: Any
) -> list[str]:
    job = jobmeter.JobReport("env", "", "train", start=span[0], end=span[1])
    job.components["gpu"].energy_j = joules
    job.components["gpu"].pue_energy_j = joules
    job.instances.add(("wattprint", host))
    return jobmeter.write_files(job, str(tmp), name, "test", {"host": host, **extra})


def test_report_from_files_counts_nothing_twice_and_says_what_is_wrong(tmp_path: Path) -> None:
    # A node's `wattprint run` file holds its ranks' trackers: their files are left out.
    synthetic(tmp_path, "wattprint-train-a", "a", (100, 110), 1000.0, command=["x"])
    synthetic(tmp_path, "wattprint-train-a-r0", "a", (101, 109), 5.0, tracker="r0-1", final=True)
    synthetic(tmp_path, "wattprint-train-b-r0", "b", (101, 109), 7.0, tracker="r0-2", final=False)
    (tmp_path / "config.json").write_text("{}")
    result = report_from_files(tmp_path, "--format=json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["jobs"][0]["energy_kwh"]["gpu"] == kwh(1007.0)
    assert document["skipped"] == [
        "wattprint-train-a-r0.json: left out, a's `wattprint run` file holds it"
    ]
    assert document["jobs"][0]["notes"] == [
        "wattprint-train-b-r0.json: its tracker never stopped (killed?): counted to its last "
        "flush, which covers 9.0 s of the job's 10.0 s (90%); its last 1.0 s are not counted"
    ]
    assert result.stderr == (
        "wattprint: skipped 1 JSON file(s) that are not wattprint-job/v1: config.json\n"
    )

    # The same measurement twice (a copy) would double the job: refused, one line.
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "wattprint-train-a.json").write_text((tmp_path / "wattprint-train-a.json").read_text())
    result = report_from_files(tmp_path)
    assert result.returncode == 1
    assert "at the same time: adding them would count it twice" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "wattprint-train-c.json").write_text('{"format": "wattprint-job/v1", "job": {}}')
    result = report_from_files(broken)
    assert result.returncode == 1 and "malformed wattprint-job/v1 document" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = report_from_files(tmp_path / "nowhere")
    assert result.returncode == 1 and "not a directory" in result.stderr
    result = report_from_files(tmp_path / "copy", "--workload=other")
    assert result.returncode == 1 and "no file of workload 'other'" in result.stderr


FLUSHING = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import livenvml
import wattprint
directory = Path(os.environ["WATTPRINT_TEST_NVML_DIR"])
tracker = wattprint.track(output_dir=sys.argv[1])
tracker.start()
held = livenvml.hold(directory, 0, 80)
for _ in range(2):  # checkpoints
    time.sleep(1.0)
    tracker.flush()
time.sleep(1.0)
tracker.stop()
livenvml.release(held)
"""


def test_flush_appends_a_row_and_codecarbon_reads_and_appends_to_the_file(
    node: dict[str, Any],
) -> None:
    import pandas
    from codecarbon.output_methods.emissions_data import EmissionsData
    from codecarbon.output_methods.file import FileOutput

    script = node["tmp"] / "flushing.py"
    script.write_text(FLUSHING.format(tests=str(TESTS)))
    out = node["tmp"] / "ranks"
    env = dict(node["env"], WATTPRINT_WORKLOAD="solo")
    proc = subprocess.run(
        [sys.executable, str(script), str(out)], env=env, capture_output=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr.decode()
    [csv_path] = out.glob("wattprint-solo-*.emissions.csv")
    [json_path] = out.glob("wattprint-solo-*.json")
    document, _ = load_job(json_path)

    # One row per flush() and one for stop(), as codecarbon's default "append": each the
    # total since start(), so the last row is the run's and equals the JSON.
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 3
    assert {r["run_id"] for r in rows} == {"solo"}
    gpu = [float(r["gpu_energy"]) for r in rows]
    duration = [float(r["duration"]) for r in rows]
    assert 0 < gpu[0] < gpu[1] < gpu[2] and duration[0] < duration[1] < duration[2]
    assert document["final"] is True
    assert gpu[2] == document["job"]["energy_kwh"]["gpu"]
    assert float(rows[2]["energy_consumed"]) == document["job"]["energy_kwh"]["total"]
    assert float(rows[2]["emissions"]) == document["job"]["emissions_kg"]["total"]

    # codecarbon's own code: its EmissionsData has our columns in our order, it takes
    # our row, and its FileOutput appends it to our file (no backup, no new header).
    fields = [f.name for f in dataclasses.fields(EmissionsData)]
    assert list(rows[0]) == fields
    frame = pandas.read_csv(csv_path)
    data = EmissionsData(**frame.iloc[-1].to_dict())
    assert data.gpu_energy == gpu[2] and data.run_id == "solo"
    FileOutput(csv_path.name, str(out)).out(data, None)
    assert not list(out.glob("*.bak*"))
    back = pandas.read_csv(csv_path)
    assert len(back) == 4 and list(back.columns) == fields
    assert back.iloc[3].to_dict() == pytest.approx(frame.iloc[2].to_dict(), nan_ok=True)


def test_two_runs_sharing_a_sampler_both_get_their_report_whichever_ends_first(
    node: dict[str, Any],
) -> None:
    out = node["tmp"] / "out"
    busy = "import time\nend = time.time() + float(__import__('sys').argv[1])\n"
    busy += "while time.time() < end: pass\n"

    def run(name: str, seconds: float) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "wattprint", "run", f"--workload={name}",
             f"--output.dir={out}", "--", sys.executable, "-c", busy, str(seconds)],
            env=node["env"], stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    first = run(f"{JOB}-first", 1.0)  # starts the node's sampler, and ends first
    time.sleep(0.5)
    second = run(f"{JOB}-second", 3.0)
    for proc in (first, second):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "no report" not in err and "Traceback" not in err, err
    for name in (f"{JOB}-first", f"{JOB}-second"):
        [path] = out.glob(f"wattprint-{name}-*.json")
        _, job = load_job(path)
        assert job.components["cpu"].energy_j > 0, name
