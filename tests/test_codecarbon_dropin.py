"""The codecarbon user's own script with one import changed, under a real
`accelerate launch --multi_gpu --num_processes 8` (torch's CPU build: gloo stands in for
NCCL, ACCELERATE_USE_CPU=1) on the live fake NVML with 8 GPUs (tests/livenvml.py), real
/proc and real processes. Each rank holds its own GPU while it "trains"."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import livenvml
from fake_nvml import TRACE
from wattprint.report.common import CODECARBON_COLUMNS

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
GPUS = 8
CHECKPOINT_S = 1.0

# The seed's script (codecarbon issue #544's pattern): only the import is Wattprint's.
# The lines marked "fake" stand in for the GPU work (there is no GPU here) and for the
# test's look at what flush() and stop() cost.
SCRIPT = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})  # fake
import livenvml  # fake
from accelerate import Accelerator
from wattprint import EmissionsTracker

accelerator = Accelerator()
tracker = EmissionsTracker(
    project_name="llm-finetune",
    output_dir=sys.argv[1],
    output_file=f"emissions_{{accelerator.process_index}}.csv",
    tracking_mode="machine",
)
tracker.start()
gpu = int(os.environ.get("GPU_OFFSET", "0")) + accelerator.process_index  # fake
held = livenvml.hold(Path(os.environ["WATTPRINT_TEST_NVML_DIR"]), gpu, 40 + 7 * gpu)  # fake
flushes = []  # fake
for checkpoint in range(3):
    end = time.time() + {checkpoint_s}
    while time.time() < end:  # fake: "training", a tenth of a core
        t = time.time()
        while time.time() - t < 0.01:
            pass
        time.sleep(0.09)
    accelerator.wait_for_everyone()
    t = time.perf_counter()  # fake
    tracker.flush()
    flushes.append(time.perf_counter() - t)  # fake
livenvml.release(held)  # fake
accelerator.wait_for_everyone()
t = time.perf_counter()  # fake
emissions = tracker.stop()
stop_s = time.perf_counter() - t  # fake
result = {{"flushes": flushes, "stop_s": stop_s, "emissions": emissions,  # fake
          "float": isinstance(emissions, float)}}  # fake
os.write(1, ("RESULT " + json.dumps(result) + "\\n").encode())  # fake: one write, one line
"""


def accelerate() -> str:
    found = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    if found is None:
        pytest.fail("accelerate is not installed: pip install -e '.[test]' (scripts/test)")
    return found


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Any]:
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    nvml_dir = tmp_path / "nvml"
    nvml_dir.mkdir()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(tests=str(TESTS), checkpoint_s=CHECKPOINT_S))
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS / "livefake"), str(REPO / "exporter")]),
        WATTPRINT_TEST_NVML_DIR=str(nvml_dir),
        WATTPRINT_TEST_NVML_T0=str(time.time()),
        WATTPRINT_TEST_NVML_GPUS=str(GPUS),
        WATTPRINT_STATE_FILE=str(tmp_path / "state" / "state.json"),
        WATTPRINT_GPU_SOURCE="nvml",
        WATTPRINT_CPU_SOURCE="model",
        WATTPRINT_MEMORY_SOURCE="model",
        WATTPRINT_SAMPLE_INTERVAL="200ms",
        WATTPRINT_CARBON_ZONE="DE",
        ACCELERATE_USE_CPU="1",  # no CUDA here: gloo, and process_index as on GPUs
        OMP_NUM_THREADS="1",
    )
    for name in ("WATTPRINT_WORKLOAD", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK"):
        env.pop(name, None)
    return {"dir": nvml_dir, "script": script, "env": env, "tmp": tmp_path}


class SamplerWatch:
    """Every tracker sampler process of this test seen in /proc, and any seen a zombie."""

    def __init__(self, state_file: str) -> None:
        self.marker = f"WATTPRINT_STATE_FILE={state_file}".encode()
        self.pids: set[int] = set()
        self.zombies: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> SamplerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    cmdline = Path(entry.path, "cmdline").read_bytes()
                    if b"wattprint.jobs.nodesampler" not in cmdline:
                        continue
                    state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state == "Z":
                        self.zombies.add(int(entry.name))
                    elif self.marker in Path(entry.path, "environ").read_bytes():
                        self.pids.add(int(entry.name))
                except (OSError, IndexError):
                    continue


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(node: dict[str, Any], out: Path, offset: int = 0, n: int = GPUS) -> Any:
    env = dict(node["env"], GPU_OFFSET=str(offset))
    port = free_port()  # the rendezvous's
    return subprocess.Popen(
        [
            accelerate(),
            "launch",
            "--multi_gpu",
            f"--num_processes={n}",
            "--num_machines=1",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            f"--main_process_port={port}",
            str(node["script"]),
            str(out),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def results(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("RESULT ")]


def last_rows(out: Path, pattern: str = "emissions_*.csv") -> dict[str, dict[str, Any]]:
    import pandas

    return {p.name: pandas.read_csv(p).iloc[-1].to_dict() for p in sorted(out.glob(pattern))}


def expected_gpu_j(node: dict[str, Any], gpus: range) -> float:
    trace, t0 = livenvml.Trace(), float(node["env"]["WATTPRINT_TEST_NVML_T0"])
    return sum(livenvml.gpu_energy_j(trace, t0, node["dir"], g, time.time()) for g in gpus)


def test_the_seeds_script_with_one_import_changed_adds_up(node: dict[str, Any]) -> None:
    from codecarbon.output_methods.emissions_data import EmissionsData
    from codecarbon.output_methods.file import FileOutput

    out = node["tmp"] / "runs"
    with SamplerWatch(node["env"]["WATTPRINT_STATE_FILE"]) as watch:
        proc = launch(node, out)
        stdout, stderr = proc.communicate(timeout=240)
        time.sleep(0.3)
    assert proc.returncode == 0, stderr[-3000:]
    ranks = results(stdout)
    assert len(ranks) == GPUS, stdout + stderr[-3000:]
    # stop() gives its row's kg CO2e as a float (how long it takes: benchmarks/bench_flush.py).
    assert all(r["float"] and r["emissions"] > 0 for r in ranks), ranks

    import pandas

    rows = last_rows(out)
    assert sorted(rows) == [f"emissions_{i}.csv" for i in range(GPUS)]
    # The columns known here are filled, utilization as numbers (codecarbon's own
    # comparisons on them work).
    for row in rows.values():
        for column in ("os", "python_version", "codecarbon_version", "cpu_model", "gpu_model"):
            assert isinstance(row[column], str) and row[column], (column, row)
        for column in ("cpu_count", "gpu_count", "ram_total_size", "cpu_utilization_percent"):
            assert row[column] > 0, (column, row)
        assert 0 <= row["ram_utilization_percent"] <= 100 and row["gpu_count"] == 1
        # The node's sampler exports no GPU utilization: empty, not an idle GPU's 0.
        assert pandas.isna(row["gpu_utilization_percent"]), row
    # Each file: a row per flush and the stop's, codecarbon's columns in its order.
    for name in rows:
        frame = pandas.read_csv(out / name)
        assert len(frame) == 4 and tuple(frame.columns) == CODECARBON_COLUMNS
        assert list(frame["gpu_energy"]) == sorted(frame["gpu_energy"])
    # The 8 files' last rows add up to the GPUs' energy (kWh), each GPU once.
    got = sum(r["gpu_energy"] for r in rows.values()) * 3.6e6
    want = expected_gpu_j(node, range(GPUS))
    assert abs(got - want) / want < 0.005, (got, want)
    # CPU and memory once: the ranks' shares add up to at most what the node drew.
    documents = [json.loads(p.read_text()) for p in out.glob("wattprint-*.json")]
    assert len(documents) == GPUS and all(d["final"] for d in documents)
    for part, column in (("cpu", "cpu_energy"), ("memory", "ram_energy")):
        node_j = max(d["node_energy_j"][part] for d in documents)
        ranks_j = sum(r[column] for r in rows.values()) * 3.6e6
        assert 0 < ranks_j <= node_j * 1.02, (part, ranks_j, node_j)
    # Each rank its own run (codecarbon's UUID); one job, named after the project, in
    # the JSON files that report --from-files adds up.
    assert len({r["run_id"] for r in rows.values()}) == GPUS
    [launch_id] = {d["launch"] for d in documents}
    assert {d["job"]["workload"] for d in documents} == {f"llm-finetune-{launch_id}"}
    # stop() returned its row's emissions: the file's last row, written before it returned.
    assert sorted(r["emissions"] for r in ranks) == sorted(r["emissions"] for r in rows.values())
    assert {r["project_name"] for r in rows.values()} == {"llm-finetune"}
    assert {r["tracking_mode"] for r in rows.values()} == {"process"}
    # One sampler ran, elected; none stayed a zombie; it read NVML (one init).
    assert len(watch.pids) == 1 and not watch.zombies, (watch.pids, watch.zombies)
    assert set((node["dir"] / "inits").read_text().split()) == {str(p) for p in watch.pids}

    # codecarbon's own code reads a file and appends to it (no backup, no new header).
    frame = pandas.read_csv(out / "emissions_0.csv")
    assert list(frame.columns) == [f.name for f in dataclasses.fields(EmissionsData)]
    data = EmissionsData(**frame.iloc[-1].to_dict())
    FileOutput("emissions_0.csv", str(out)).out(data, None)
    assert not list(out.glob("*.bak*")) and len(pandas.read_csv(out / "emissions_0.csv")) == 5

    # The messages: tracking_mode said once (by the node's first rank), where each rank
    # writes, and each rank's stop line.
    assert (
        stderr.count(
            "wattprint: tracking_mode='machine': each tracker reports its own process tree's "
            "share of every GPU, CPU and memory (tracking_mode column: process), so the ranks' "
            "files add up to the job instead of counting the machine once per rank"
        )
        == 1
    )
    assert stderr.count(f"writing to {out} at each flush() and stop()") == GPUS
    stops = [line for line in stderr.splitlines() if " stopped: " in line]
    assert len(stops) == GPUS, stderr[-3000:]
    assert all(
        "(this process tree); wall: not measured " in s
        and "; the job on " in s
        and "emissions_" in s
        for s in stops
    )


def test_two_launches_at_once_are_two_jobs(node: dict[str, Any]) -> None:
    out = node["tmp"] / "runs"
    a = launch(node, out, offset=0, n=4)
    b = launch(node, out, offset=4, n=4)
    for proc in (a, b):
        _, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr[-3000:]
    documents = [json.loads(p.read_text()) for p in out.glob("wattprint-*.json")]
    jobs = {d["job"]["workload"] for d in documents}
    assert len(documents) == 8 and len(jobs) == 2, jobs
    assert len({d["launch"] for d in documents}) == 2
    report = subprocess.run(
        [sys.executable, "-m", "wattprint", "report", f"--from-files={out}", "--format=json"],
        env=dict(os.environ, PYTHONPATH=str(REPO / "exporter")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    merged = {j["workload"]: j for j in json.loads(report.stdout)["jobs"]}
    assert set(merged) == jobs
    # Each launch's GPUs are its own: 0-3 and 4-7, each job exactly its four.
    for job in merged.values():
        gpus = sorted(int(g["gpu"]) for g in job["gpus"])
        assert gpus in ([0, 1, 2, 3], [4, 5, 6, 7]), gpus
        want = expected_gpu_j(node, range(gpus[0], gpus[0] + 4))
        got = job["energy_kwh"]["gpu"] * 3.6e6
        assert abs(got - want) / want < 0.005, (got, want)
