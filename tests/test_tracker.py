"""Trackers on the live fake NVML (tests/livenvml.py), in real processes: the node's
sampler's errors reach every waiting tracker at once, a rank that dies still writes its
final row, and every message a tracker gives, by its text."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from fake_nvml import TRACE

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

PRELUDE = f"""
import os, sys, time
from pathlib import Path
sys.path.insert(0, {str(TESTS)!r})
import livenvml
import wattprint
from wattprint import EmissionsTracker
nvml = Path(os.environ["WATTPRINT_TEST_NVML_DIR"])
out = sys.argv[1]
"""


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Any]:
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    nvml_dir = tmp_path / "nvml"
    nvml_dir.mkdir()
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
    for name in ("WATTPRINT_WORKLOAD", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    return {"dir": nvml_dir, "env": env, "tmp": tmp_path, "out": tmp_path / "out"}


def python(
    node: dict[str, Any], code: str, env: dict[str, str] | None = None, name: str = ""
) -> Any:
    script = node["tmp"] / (name or f"script-{time.monotonic_ns()}.py")
    script.write_text(PRELUDE + textwrap.dedent(code))
    return subprocess.Popen(
        [sys.executable, str(script), str(node["out"])],
        env=env or node["env"],
        cwd=node["tmp"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: Any, timeout: float = 60) -> tuple[int, str, str]:
    stdout, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stdout, stderr


def documents(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(node["out"].glob("wattprint-*.json"))]


def test_a_sampler_that_cannot_start_tells_every_waiting_tracker_at_once(
    node: dict[str, Any],
) -> None:
    code = """
        t = time.monotonic()
        tracker = wattprint.track(output_dir=out, carbon_zone="XX")
        print(tracker.start(), round(time.monotonic() - t, 2), tracker.flush(), tracker.stop())
    """
    procs = [python(node, code) for _ in range(4)]
    for proc in procs:
        status, stdout, stderr = finish(proc)
        # Never raised into the script: one line, and it runs on.
        assert status == 0, stderr
        started, seconds, flushed, stopped = stdout.split()
        assert (started, flushed, stopped) == ("False", "None", "None") and float(seconds) < 10
        [line] = [s for s in stderr.splitlines() if "not tracking" in s]
        assert line.startswith(
            "wattprint: not tracking: the node's sampler did not start: unknown carbon zone "
            "'XX' (not a known zone)"
        ), line
    # One of them started it; the others read its error instead of starting their own.
    assert (node["dir"] / "inits").exists() is False  # it failed before opening NVML
    # A codecarbon tracker's zone is its own: an unknown one is said (as codecarbon
    # says it) and its energy is counted at the sampler's intensity.
    status, stdout, stderr = finish(
        python(node, "t = EmissionsTracker(country_iso_code='XX'); t.start(); print(t.stop())")
    )
    assert status == 0, stderr
    assert "wattprint: unknown carbon zone 'XX' (not a known zone)." in stderr
    assert stderr.count("unknown carbon zone") == 1
    assert float(stdout) >= 0


def test_track_twice_in_one_process_and_its_messages(node: dict[str, Any]) -> None:
    code = """
        held = livenvml.hold(nvml, 0, 80)
        for round in range(2):
            tracker = wattprint.track(output_dir=out)
            tracker.start()
            time.sleep(0.5)
            t = time.perf_counter()
            job = tracker.stop()
            print("stop_s", time.perf_counter() - t, type(job).__name__)
            final = tracker.wait(10)
            print("final", final is not None and final.energy_j > 0)
        outer = wattprint.track(output_dir=out + "/nested")
        outer.start()
        inner = wattprint.track(output_dir=out + "/nested")
        inner.start()
        inner.stop(), outer.stop()
        livenvml.release(held)
    """
    status, stdout, stderr = finish(python(node, code))
    assert status == 0, stderr
    assert (
        f"another tracker of this process runs (pid{status_pid(stderr)}-3): from now on the "
        f"process's energy is booked to pid{status_pid(stderr)}-4 alone, until it stops; "
        "stop one tracker before starting the next"
    ) in stderr
    assert stdout.count("final True") == 2, stdout
    starts = [line for line in stderr.splitlines() if " at each flush() and stop()" in line]
    assert len(starts) == 4, stderr
    assert starts[0].startswith("wattprint: tracking script-") and "(process) as pid" in starts[0]
    assert "with the node's sampler http://127.0.0.1:" in starts[0]
    assert starts[0].endswith(f"writing to {node['out']} at each flush() and stop()")
    stops = [line for line in stderr.splitlines() if " stopped: " in line]
    assert len(stops) == 4
    assert " J, " in stops[0] or " Wh, " in stops[0]
    assert "(this process tree); wall: not measured " in stops[0]
    assert "; the job on " in stops[0] and " meanwhile: " in stops[0]
    assert ".emissions.csv" in stops[0] and ".json" in stops[0]
    # Two trackers of one process, one after the other: two files, neither replaced.
    written = documents(node)
    assert len(written) == 2 and all(d["final"] for d in written)
    assert len({d["tracker"] for d in written}) == 2


def status_pid(stderr: str) -> str:
    """The pid a plain process's tracker names itself by (`as pid<PID>`)."""
    return stderr.split(" as pid", 1)[1].split()[0].split("-")[0]


def test_a_rank_that_dies_still_writes_its_final_row(node: dict[str, Any]) -> None:
    by_exception = """
        tracker = EmissionsTracker(project_name="crash", output_dir=out, output_file="e.csv")
        tracker.start()
        held = livenvml.hold(nvml, 1, 80)
        time.sleep(0.5)
        raise RuntimeError("the training loop fell over")
    """
    by_sigterm = """
        tracker = EmissionsTracker(project_name="term", output_dir=out, output_file="t.csv")
        tracker.start()
        held = livenvml.hold(nvml, 2, 80)
        print("ready", flush=True)
        time.sleep(60)
    """
    by_sigkill = """
        tracker = EmissionsTracker(project_name="kill", output_dir=out, output_file="k.csv")
        tracker.start()
        held = livenvml.hold(nvml, 3, 80)
        time.sleep(0.5)
        tracker.flush()
        print("flushed", flush=True)
        time.sleep(60)
    """
    chained = """
        import signal
        def theirs(signum, frame):
            print("their handler ran", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, theirs)  # the framework's, installed before
        tracker = EmissionsTracker(project_name="chain", output_dir=out, output_file="c.csv")
        tracker.start()
        held = livenvml.hold(nvml, 0, 80)
        print("ready", flush=True)
        time.sleep(60)
    """
    crash = python(node, by_exception)
    term, kill, chain = python(node, by_sigterm), python(node, by_sigkill), python(node, chained)
    for proc, word in ((term, "ready"), (kill, "flushed"), (chain, "ready")):
        assert proc.stdout.readline().strip() == word
    time.sleep(0.5)
    term.send_signal(signal.SIGTERM)
    chain.send_signal(signal.SIGTERM)
    kill.send_signal(signal.SIGKILL)
    status, _, stderr = finish(crash)
    assert status == 1 and "RuntimeError: the training loop fell over" in stderr
    assert " stopped: " in stderr
    status, _, stderr = finish(term)
    assert status == -signal.SIGTERM, stderr  # it still dies of SIGTERM
    assert " stopped: " in stderr
    status, stdout, _ = finish(chain)
    assert status == 3 and "their handler ran" in stdout  # called after the final row
    finish(kill)
    by_project = {d["project_name"]: d for d in documents(node)}
    assert all(by_project[name]["final"] is True for name in ("crash", "term", "chain"))
    assert by_project["kill"]["final"] is False  # its last flush, said so
    for name in ("e.csv", "t.csv", "c.csv"):
        [row] = list(csv.DictReader((node["out"] / name).open()))
        assert float(row["gpu_energy"]) > 0
    assert len(list(csv.DictReader((node["out"] / "k.csv").open()))) == 1


def test_no_zone_is_the_world_average_said_as_the_exporter_says(node: dict[str, Any]) -> None:
    env = dict(node["env"])
    env.pop("WATTPRINT_CARBON_ZONE")
    status, _, stderr = finish(
        python(node, "t = EmissionsTracker(output_dir=out); t.start(); t.stop()", env=env)
    )
    assert status == 0, stderr
    assert (
        "wattprint: no carbon zone: accounting with the world average (zone WORLD); set your "
        "grid zone, e.g. country_iso_code='DEU' or WATTPRINT_CARBON_ZONE=DE"
    ) in stderr


def test_flags_the_running_sampler_does_not_take_are_said(node: dict[str, Any]) -> None:
    first = python(
        node,
        """
        t = EmissionsTracker(output_dir=out, output_file="first.csv")
        t.start()
        print("up", flush=True)
        time.sleep(30)
        """,
    )
    assert first.stdout.readline().strip() == "up"
    status, _, stderr = finish(
        python(
            node,
            """
            t = EmissionsTracker(output_dir=out, output_file="second.csv",
                                 country_iso_code="FRA", pue=1.5, measure_power_secs=5)
            t.start()
            begun = time.monotonic()
            while time.monotonic() - begun < 0.5:  # some CPU time to count
                pass
            t.stop()
            """,
        )
    )
    first.kill()
    assert status == 0, stderr
    # The interval is the running sampler's: said. The zone and PUE are the tracker's own.
    line = next(s for s in stderr.splitlines() if "was already running" in s)
    assert (
        "it accounts with a sample every 0.1 s, not 5 s; measure_power_secs=5 cannot change it"
    ) in line
    second = next(d for d in documents(node) if d.get("codecarbon_file") == "second.csv")
    assert any("was already running" in n for n in second["job"]["notes"])
    [row] = list(csv.DictReader((node["out"] / "second.csv").open()))
    assert (row["country_iso_code"], row["country_name"], row["pue"]) == ("FRA", "France", "1.5")
    from wattprint.carbon.embedded import lookup

    # France's intensity, on the energy with the tracker's PUE (codecarbon's columns).
    kwh = float(row["energy_consumed"])
    assert kwh > 0 and float(row["emissions"]) == pytest.approx(
        kwh * lookup("FRA").grams_per_kwh / 1000
    )


def test_track_emissions_decorates_a_function(
    node: dict[str, Any],
) -> None:
    code = """
        from wattprint import track_emissions

        @track_emissions(project_name="deco", output_dir=out, offline=True, country_iso_code="DEU")
        def train(n):
            held = livenvml.hold(nvml, 0, 50)
            time.sleep(0.5)
            livenvml.release(held)
            return n * 2

        @track_emissions
        def bare():
            return "ok"

        print(train(21), bare())
    """
    env = dict(node["env"])
    status, stdout, stderr = finish(python(node, code, env=env))
    assert status == 0, stderr
    assert stdout.split() == ["42", "ok"]
    [row] = list(csv.DictReader((node["out"] / "emissions.csv").open()))
    assert row["project_name"] == "deco" and float(row["gpu_energy"]) > 0
    # bare(): codecarbon's defaults, emissions.csv in the current directory.
    [row] = list(csv.DictReader((node["tmp"] / "emissions.csv").open()))
    # Its job is named by its script, the project column is codecarbon's default.
    assert row["project_name"] == "codecarbon" and len(row["run_id"]) == 36  # a UUID
    [path] = node["tmp"].glob("wattprint-*.json")
    document = json.loads(path.read_text())
    assert document["job"]["workload"].startswith("script-")
    assert document["run_id"] == row["run_id"]


def test_gpu_ids_keep_only_those_gpus(node: dict[str, Any]) -> None:
    code = """
        tracker = EmissionsTracker(project_name="two", output_dir=out, gpu_ids=[1])
        tracker.start()
        held = [livenvml.hold(nvml, 0, 60), livenvml.hold(nvml, 1, 60)]
        time.sleep(0.8)
        for h in held:
            livenvml.release(h)
        time.sleep(0.3)
        returned = tracker.stop()
        data = tracker.final_emissions_data  # waits for the final row
        print(returned, data.emissions, data.gpu_energy, data.run_id, tracker.final_emissions)
        with EmissionsTracker(project_name="ctx", output_dir=out, output_file="ctx.csv") as t:
            time.sleep(0.3)
    """
    status, stdout, stderr = finish(python(node, code))
    assert status == 0, stderr
    [document] = [d for d in documents(node) if d["project_name"] == "two"]
    assert [g["gpu"] for g in document["job"]["gpus"]] == ["1"]
    [row] = list(csv.DictReader((node["out"] / "emissions.csv").open()))
    assert row["gpu_count"] == "1" and float(row["gpu_energy"]) > 0
    # final_emissions_data: codecarbon's fields, the final row's values.
    returned, emissions, gpu_energy, run_id, final = stdout.split()
    assert float(emissions) == float(row["emissions"]) == float(final)
    assert float(gpu_energy) == float(row["gpu_energy"]) and run_id == row["run_id"]
    # stop() returned at once what the latest sample said: at most the final row.
    assert 0 < float(returned) <= float(emissions)
    assert len(list(csv.DictReader((node["out"] / "ctx.csv").open()))) == 1


def test_a_sampler_that_dies_mid_job_is_said_and_the_row_kept(node: dict[str, Any]) -> None:
    code = """
        import json, signal
        tracker = EmissionsTracker(project_name="orphan", output_dir=out)
        tracker.start()
        held = livenvml.hold(nvml, 0, 80)
        time.sleep(1.5)  # the tracker's thread read a sample with energy meanwhile
        lock = os.environ["WATTPRINT_STATE_FILE"] + ".lock"
        os.kill(json.loads(Path(lock).read_text())["pid"], signal.SIGKILL)  # the sampler
        time.sleep(1.5)
        t = time.perf_counter()
        print("stop", tracker.stop() > 0, time.perf_counter() - t < 2, flush=True)
    """
    status, stdout, stderr = finish(python(node, code), timeout=90)
    assert status == 0, stderr
    assert stdout.split() == ["stop", "True", "True"]
    [lost] = [line for line in stderr.splitlines() if "cannot read the exporter" in line]
    assert lost.startswith("wattprint: cannot read the exporter at http://127.0.0.1:")
    assert lost.endswith("; rows stay at its last sample until it answers")
    # The row counts to the last sample the tracker's thread saw; the energy after it is
    # missing: not final, and said in its notes.
    [document] = documents(node)
    assert document["final"] is False and document["job"]["energy_kwh"]["gpu"] > 0
    assert lost.removeprefix("wattprint: ") in document["job"]["notes"]


def test_multiprocessing_spawned_ranks_are_one_job(node: dict[str, Any]) -> None:
    # As torch.multiprocessing.spawn starts ranks: no RANK variable, one parent.
    code = """
        import multiprocessing

        def rank(i):
            tracker = EmissionsTracker(output_dir=out, output_file=f"spawned_{i}.csv")
            tracker.start()
            tracker.stop()

        if __name__ == "__main__":
            ranks = [multiprocessing.get_context("spawn").Process(target=rank, args=(i,))
                     for i in range(2)]
            for r in ranks:
                r.start()
            for r in ranks:
                r.join()
                assert r.exitcode == 0
    """
    for _ in range(2):
        status, _, stderr = finish(python(node, code, name="spawner.py"))  # twice the same
        assert status == 0, stderr
    runs = [
        [r["run_id"] for r in csv.DictReader((node["out"] / f"spawned_{i}.csv").open())]
        for i in range(2)
    ]
    # Each tracker its own run (codecarbon's UUID)...
    assert len({run for rank in runs for run in rank}) == 4
    # ... and each launch one job (the JSON's, for report --from-files): both ranks the
    # same, the second launch another one.
    jobs: dict[str, set[str]] = {}
    for document in documents(node):
        jobs.setdefault(document["launch"], set()).add(document["job"]["workload"])
    assert len(jobs) == 2 and all(len(names) == 1 for names in jobs.values()), jobs
    names = [next(iter(n)) for n in jobs.values()]
    assert names[0] != names[1] and all(n.startswith("spawner-") for n in names)
    assert "(launching process)" in stderr


def _gpu_job(node: dict[str, Any], env: dict[str, str], extra: str = "") -> tuple[str, Any]:
    """A tracker over 1.5 s of GPU load; its stderr and its JSON."""
    code = f"""
        {extra}
        tracker = wattprint.track(output_dir=out)
        tracker.start()
        held = livenvml.hold(nvml, 0, 80)
        time.sleep(1.5)
        livenvml.release(held)
        tracker.stop()
        tracker.wait(10)
    """
    status, _, stderr = finish(python(node, code, env=env, name="t.py"))
    assert status == 0, stderr
    [document] = documents(node)
    return stderr, document


def test_a_tracker_counts_its_process_whatever_the_sampler_names_it(
    node: dict[str, Any],
) -> None:
    # Under srun the sampler names the process by the Slurm job (from its environment;
    # no Slurm needed): the tracker's job id is another name; its series are its own.
    stderr, document = _gpu_job(node, dict(node["env"], SLURM_JOB_ID="4242"))
    assert document["job"]["workload"].startswith("t-") and document["job"]["energy_kwh"]["gpu"] > 0
    assert "stopped: 0 J" not in stderr and "counted 0 J" not in stderr


def test_a_workload_name_is_kept_as_given(node: dict[str, Any]) -> None:
    # As `wattprint run --workload "a b"` exports it to its command.
    stderr, document = _gpu_job(node, dict(node["env"], WATTPRINT_WORKLOAD="a b"))
    assert document["job"]["workload"] == "a b" and document["job"]["energy_kwh"]["gpu"] > 0
    assert "wattprint: tracking a b (named) as pid" in stderr
    assert next(p.name for p in node["out"].glob("*.json")).startswith("wattprint-a_b-")


def test_a_tracker_given_the_nodes_exporter_url_registers_with_it(node: dict[str, Any]) -> None:
    first = python(
        node,
        """
        t = wattprint.track(output_dir=out + "/first")
        t.start()
        print(t._reader.url, flush=True)
        time.sleep(60)
        """,
    )
    url = first.stdout.readline().strip()
    try:
        env = dict(node["env"], WATTPRINT_EXPORTER_URL=url, SLURM_JOB_ID="4242")
        stderr, document = _gpu_job(node, env)
        assert document["job"]["energy_kwh"]["gpu"] > 0, stderr
        assert "not this node's sampler" not in stderr
        # An exporter no node lock names: nothing to register with, said, and counted
        # by the workload's name (here another name than the sampler's: 0 J, said).
        for path in node["out"].glob("wattprint-*"):
            path.unlink()
        env["WATTPRINT_STATE_FILE"] = str(node["tmp"] / "elsewhere" / "state.json")
        stderr, document = _gpu_job(node, env)
    finally:
        first.kill()
        first.wait()
    workload = document["job"]["workload"]
    said = (
        f"wattprint: {url} is not this node's sampler (no node lock names it): the tracker "
        f"cannot register its process there and counts the series of workload {workload!r} "
        "by that name"
    )
    assert said in stderr.splitlines()
    zero = next(line for line in stderr.splitlines() if "counted 0 J" in line)
    assert zero.startswith(f"wattprint: {workload} pid")
    assert zero.endswith(f"sample(s) of {url}: it booked no energy to this process tree")
    assert document["job"]["energy_kwh"]["gpu"] == 0
    notes = document["job"]["notes"]
    assert said.removeprefix("wattprint: ") in notes and zero.removeprefix("wattprint: ") in notes


def test_a_nested_tracker_hands_the_process_back_when_it_stops(node: dict[str, Any]) -> None:
    code = """
        import json
        outer = wattprint.track(output_dir=out + "/outer")
        outer.start()
        held = livenvml.hold(nvml, 0, 80)
        time.sleep(0.5)
        inner = wattprint.track(output_dir=out + "/inner")
        inner.start()
        time.sleep(0.5)
        inner.stop()
        inner.wait(10)
        [registration] = Path(os.environ["WATTPRINT_STATE_FILE"] + ".lock.trackers").glob("*.json")
        print("registered", json.loads(registration.read_text())["tracker"], outer.id)
        time.sleep(0.6)  # the outer tracker's thread reads a sample after it
        before = outer.flush().energy_j
        time.sleep(1.5)
        after = outer.flush().energy_j
        print("rises", after > before > 0)
        livenvml.release(held)
        outer.stop()
    """
    status, stdout, stderr = finish(python(node, code))
    assert status == 0, stderr
    registered, rises = stdout.splitlines()
    _, now, outer = registered.split()
    assert now == outer and rises == "rises True", stdout
    assert (
        f"from now on the process's energy is booked to {outer}-2 alone, until it stops"
    ) in stderr


def test_the_private_meeting_directory_must_be_this_users_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wattprint.jobs.discovery import lock_candidates
    from wattprint.jobs.meter import MeterError
    from wattprint.jobs.nodesampler import find_or_start

    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("WATTPRINT_STATE_FILE", "")
    planted = tmp_path / "someone-elses"
    planted.mkdir()
    (runtime / "wattprint").symlink_to(planted)
    not_a_dir = tmp_path / "file"  # the node lock's directory cannot be made
    not_a_dir.write_text("")
    with pytest.raises(MeterError) as raised:
        lock_candidates(str(not_a_dir / "state.json"))
    assert str(raised.value) == (
        f"{runtime}/wattprint is not a directory of this user's alone (a symlink): another "
        "user could plant files in it; remove it, or set XDG_RUNTIME_DIR or --state.file"
    )
    (runtime / "wattprint").unlink()
    (runtime / "wattprint").mkdir(mode=0o777)
    os.chmod(runtime / "wattprint", 0o777)
    with pytest.raises(MeterError, match=r"wattprint is not a directory of this user's alone \("):
        lock_candidates(str(not_a_dir / "state.json"))
    # Where the node lock's directory can be written, the fallback is not needed: left out.
    writable = tmp_path / "state" / "state.json"
    assert lock_candidates(str(writable)) == [f"{writable}.lock"]
    (runtime / "wattprint").rmdir()
    # Made where missing: this user's alone; the election's files in it too.
    with pytest.raises(MeterError, match="unknown carbon zone 'XX'"):
        find_or_start(str(not_a_dir / "state.json"), {"carbon.zone": "XX"})
    assert (runtime / "wattprint").stat().st_mode & 0o777 == 0o700
    for name in ("state.json.lock.start", "state.json.lock.start.log"):
        assert (runtime / "wattprint" / name).stat().st_mode & 0o777 == 0o600, name


def test_planted_symlinks_beside_the_lock_are_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wattprint.host.identity.tracked import Registration, register
    from wattprint.jobs.meter import MeterError
    from wattprint.jobs.nodesampler import find_or_start

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run-user"))
    monkeypatch.setenv("WATTPRINT_STATE_FILE", "")
    state = tmp_path / "shared" / "state.json"
    state.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    election = Path(f"{state}.lock.start")
    election.symlink_to(victim)
    with pytest.raises(MeterError) as raised:
        find_or_start(str(state), {"carbon.zone": "XX"})
    assert str(raised.value) == f"{election} is a symbolic link: not followed"
    election.unlink()
    Path(f"{election}.log").symlink_to(victim)
    with pytest.raises(MeterError) as raised:
        find_or_start(str(state), {"carbon.zone": "XX"})
    assert str(raised.value) == f"{election}.log is a symbolic link: not followed"
    # A registration's temporary file planted as a link: written beside it, not through.
    registry = tmp_path / "shared" / "state.json.lock.trackers"
    registry.mkdir()
    (registry / f".{os.getpid()}-7.json.tmp").symlink_to(victim)
    path = register(str(registry), Registration(os.getpid(), 7, "job", "pid1"))
    assert json.loads(Path(path).read_text()) == {"workload": "job", "tracker": "pid1"}
    assert victim.read_text() == "keep"


def test_registering_removes_the_registrations_of_processes_gone(tmp_path: Path) -> None:
    from wattprint.host.identity.tracked import Registration, register
    from wattprint.host.procfs import read_proc

    registry = tmp_path / "state.json.lock.trackers"
    registry.mkdir()
    parent = read_proc(os.getppid())
    assert parent is not None
    live = registry / f"{parent.pid}-{parent.start_ticks}.json"  # another rank, running
    killed = registry / "999999999-5.json"  # a rank SIGKILLed: no such process now
    reused = registry / f"{parent.pid}-{parent.start_ticks + 1}.json"  # its pid, reused
    for path in (live, killed, reused):
        path.write_text('{"workload": "w", "tracker": "t"}')
    mine = register(str(registry), Registration(os.getpid(), 7, "job", "pid1"))
    assert sorted(p.name for p in registry.iterdir()) == sorted([live.name, Path(mine).name])


def test_the_sampler_reads_no_registration_through_a_link_or_a_fifo(tmp_path: Path) -> None:
    import threading

    from wattprint.host.identity.resolver import IdentityResolver
    from wattprint.host.identity.tracked import TrackedResolver
    from wattprint.host.procfs import read_proc

    me, parent = read_proc(os.getpid()), read_proc(os.getppid())
    assert me is not None and parent is not None
    registry = tmp_path / "trackers"
    registry.mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"workload": "w", "tracker": "planted"}')
    (registry / f"{me.pid}-{me.start_ticks}.json").symlink_to(elsewhere)
    resolved = TrackedResolver(IdentityResolver(), str(registry)).resolve(me.pid, me.start_ticks)
    assert resolved is None or "planted" not in resolved.pod
    # A FIFO where the sampler reads a registration: skipped, not waited on.
    (registry / f"{me.pid}-{me.start_ticks}.json").unlink()
    os.mkfifo(registry / f"{parent.pid}-{parent.start_ticks}.json")
    (registry / f"{me.pid}-{me.start_ticks}.json").write_text(
        '{"workload": "w", "tracker": "pid1"}'
    )
    found: list[Any] = []
    tracked = TrackedResolver(IdentityResolver(), str(registry))
    reader = threading.Thread(
        target=lambda: found.append(tracked.resolve(me.pid, me.start_ticks)), daemon=True
    )
    reader.start()
    reader.join(5)
    assert found and found[0].pod.endswith("pid1")


def test_the_nodes_sampler_is_recognised_however_its_url_names_this_node() -> None:
    import socket

    from wattprint.jobs.meter import same_endpoint

    lock_url = "http://127.0.0.1:9950/metrics"  # as a node lock's listen address reads
    for given in ("localhost:9950", f"http://{socket.gethostname()}:9950/", "http://[::1]:9950"):
        assert same_endpoint(lock_url, given), given
    assert not same_endpoint(lock_url, "http://127.0.0.1:9951")
    assert not same_endpoint(lock_url, "http://exporter.elsewhere:9950")


def test_stop_and_flush_write_their_row_to_the_moment_of_the_call(node: dict[str, Any]) -> None:
    # The GPU's energy between the calls (tests/livenvml.py's trace) brackets each row:
    # at least what it used from start()'s return to the call, at most from start()'s
    # call to the call's return. The row is in the file when the call returns.
    code = """
        import csv
        trace, t0 = livenvml.Trace(), float(os.environ["WATTPRINT_TEST_NVML_T0"])
        def joules():
            return livenvml.gpu_energy_j(trace, t0, nvml, 3, time.time())
        held = livenvml.hold(nvml, 3, 90)
        tracker = EmissionsTracker(output_dir=out, output_file="e.csv", gpu_ids=[3])
        a0 = joules(); tracker.start(); a1 = joules()
        time.sleep(1.2)
        for call in ("flush", "stop"):
            b0 = joules(); kg = getattr(tracker, call)(); b1 = joules()
            rows = list(csv.DictReader(open(out + "/e.csv")))
            print(call, len(rows), float(rows[-1]["gpu_energy"]) * 3.6e6, b0 - a1, b1 - a0,
                  kg == float(rows[-1]["emissions"]), float(rows[-1]["duration"]))
            time.sleep(0.7)
        first = tracker.run_id
        tracker.start()  # after stop(): a new run, its own run_id and rows
        tracker.stop()
        rows = list(csv.DictReader(open(out + "/e.csv")))
        print("again", len(rows), rows[-1]["run_id"] == str(tracker.run_id) != str(first))
    """
    status, stdout, stderr = finish(python(node, code))
    assert status == 0, stderr
    *lines, again = [line.split() for line in stdout.splitlines()]
    assert [(line[0], line[1]) for line in lines] == [("flush", "1"), ("stop", "2")]
    assert again == ["again", "3", "True"]
    for _, _, row_j, least, most, same, duration in lines:
        assert float(least) * 0.98 <= float(row_j) <= float(most) * 1.02, (row_j, least, most)
        assert same == "True" and float(duration) > 1.0


def test_sampler_takes_one_sample_for_many_callers_at_once() -> None:
    import threading

    from wattprint.core.model import DeviceReading, SourceResult
    from wattprint.sampler.loop import Sampler, SamplerParts

    class SlowGpu:
        """One GPU at 1 J per read, each read 30 ms long."""

        name = "slow"
        reads = 0

        def read(self) -> SourceResult:
            SlowGpu.reads += 1
            time.sleep(0.03)
            energy = SlowGpu.reads * 1_000_000
            reading = DeviceReading("gpu", "0", energy, None, "nvml-energy")
            return SourceResult(devices=[reading])

        def explain(self) -> list[str]:
            return []

        def close(self) -> None:
            pass

    sampler = Sampler(SamplerParts(sources=[SlowGpu()], interval=3600))
    sampler.sample_once()
    before = SlowGpu.reads
    answers: list[bool] = []
    callers = [
        threading.Thread(target=lambda: answers.append(sampler.sample_fresh())) for _ in range(8)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(10)
    # Eight at once: one sample begun after each call, one or two in all.
    assert answers == [True] * 8 and 1 <= SlowGpu.reads - before <= 2
    # Asked again: a new sample, begun after this call.
    latest = sampler.latest
    assert sampler.sample_fresh() and sampler.latest is not latest
    # Every joule once: the device's counter from its first read to the last sample.
    assert sum(d.energy_uj for d in sampler.latest.devices) == (SlowGpu.reads - 1) * 1_000_000


def test_outputs_that_fail_never_stop_the_job(node: dict[str, Any]) -> None:
    # What issue 43 found raising out of flush(): each is now one line, a note in the
    # rows that could be written, and the job runs on; the return values are the rows'.
    code = """
        import json
        (Path(out) / "dir.csv").mkdir(parents=True)
        (Path(out) / "latin1.csv").write_bytes(b"caf\\xe9,d\\xe9j\\xe0\\n1,2\\n")
        (Path(out) / "wide.csv").write_text("x" * 200_000 + "\\n")

        class Broken:
            def out(self, total, delta):
                raise RuntimeError("the handler's own bug")

        cases = {
            "dir": dict(output_file="dir.csv"),
            "latin1": dict(output_file="latin1.csv"),
            "wide": dict(output_file="wide.csv"),
            "cjk": dict(output_file="cjk.csv", project_name="\\u8a13" * 80),
            "handler": dict(output_file="h.csv", output_handlers=[Broken()]),
        }
        for name, kwargs in cases.items():
            tracker = EmissionsTracker(output_dir=out, **kwargs)
            tracker.start()
            flushed, stopped = tracker.flush(), tracker.stop()
            print(name, type(flushed).__name__, type(stopped).__name__, flush=True)
        print("the job ran on")
    """
    status, stdout, stderr = finish(python(node, code))
    assert status == 0, stderr
    assert stdout.splitlines() == [
        *(f"{name} float float" for name in ("dir", "latin1", "wide", "cjk", "handler")),
        "the job ran on",
    ]
    failed = [line for line in stderr.splitlines() if "cannot write to" in line]
    # One line for the tracker whose CSV cannot be appended to (a directory), said once
    # (not again at stop()); no traceback.
    assert len(failed) == 1 and "dir.csv" in failed[0] and "Traceback" not in stderr, stderr
    # A CSV that cannot be read as codecarbon's (not UTF-8, a field over csv's limit) is
    # set aside as codecarbon does with a foreign file, in one line, and the rows go on.
    for name in ("latin1.csv", "wide.csv"):
        assert f"{name} has other columns than codecarbon's: moved to" in stderr
        assert (node["out"] / f"{name}.bak").exists()
        assert len(list(csv.DictReader((node["out"] / name).open()))) == 2
    assert "output handler Broken.out: RuntimeError: the handler's own bug" in stderr
    # The JSON file holds the rows and says why the CSV has none.
    notes = [n for d in documents(node) for n in d["job"]["notes"] if "cannot write" in n]
    assert len(notes) == 1 and "dir.csv" in notes[0]
    # A project of 80 three-byte letters: its files are written, names cut by bytes.
    assert len(list(csv.DictReader((node["out"] / "cjk.csv").open()))) == 2
    assert any(d["project_name"] == "\u8a13" * 80 for d in documents(node))


def test_a_wall_clock_step_changes_no_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    # The sampler's /metrics stamps its samples with the wall clock: a tracker times its
    # readings by its own monotonic clock, so a step of an hour, forward or back,
    # mid-job changes neither the duration nor the power.
    from wattprint.jobs import tracker as module
    from wattprint.jobs.meter import Reading, job_report

    tracker = module.Tracker(output_dir="unused")
    real = time.time
    start = tracker._local(Reading(time=real()), fresh=True)
    for step in (3600.0, -3600.0):
        time.sleep(0.2)
        monkeypatch.setattr(module.time, "time", lambda step=step: real() + step)
        for fresh in (True, False):
            end = tracker._local(Reading(time=real() + step - 0.05), fresh=fresh)
            duration = job_report(start, end, None).duration
            assert 0.1 < duration < 1.0, (step, fresh, duration)


def test_an_exporter_that_takes_no_sample_on_request_is_never_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An older exporter on the node (a sample every 3 s, no /metrics?fresh): flush() and
    # stop() write from its latest sample at once, and say so once, instead of waiting
    # up to 3 s each for its next one.
    import http.server
    import threading

    import wattprint

    class OldExporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server calls it by this name
            sampled = born + 3 * ((time.time() - born) // 3)
            body = (
                "# TYPE wattprint_sampler_last_success_timestamp_seconds gauge\n"
                f"wattprint_sampler_last_success_timestamp_seconds {sampled}\n"
                "# TYPE wattprint_sampler_interval_seconds gauge\n"
                "wattprint_sampler_interval_seconds 3\n"
            ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    born = time.time()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OldExporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    try:
        tracker = wattprint.track(
            output_dir=str(tmp_path / "out"),
            exporter_url=f"http://127.0.0.1:{server.server_address[1]}/metrics",
            state_file=str(tmp_path / "state" / "state.json"),
        )
        assert tracker.start()
        began = time.monotonic()
        tracker.flush()
        tracker.flush()
        job = tracker.stop()
        took = time.monotonic() - began
    finally:
        server.shutdown()
    assert job is not None and took < 2, took
    said = [n for n in job.notes if "takes no sample on request" in n]
    assert len(said) == 1 and said[0].endswith("before each flush() and stop()")
