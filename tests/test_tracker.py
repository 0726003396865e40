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
        try:
            wattprint.track(output_dir=out, carbon_zone="XX").start()
        except Exception as err:
            print(type(err).__name__, round(time.monotonic() - t, 2), err)
    """
    procs = [python(node, code) for _ in range(4)]
    lines = [finish(p)[1].strip() for p in procs]
    for line in lines:
        kind, seconds, message = line.split(" ", 2)
        assert kind == "MeterError" and float(seconds) < 10, line
        assert message.startswith(
            "the node's sampler did not start: unknown carbon zone 'XX' (not a known zone)"
        ), line
    # One of them started it; the others read its error instead of starting their own.
    assert (node["dir"] / "inits").exists() is False  # it failed before opening NVML
    # The drop-in logs it and does not raise, as codecarbon's start() never does.
    status, _, stderr = finish(
        python(node, "t = EmissionsTracker(country_iso_code='XX'); t.start(); print(t.stop())")
    )
    assert status == 0
    assert (
        "wattprint: not tracking: the node's sampler did not start: unknown carbon zone 'XX'"
    ) in stderr
    assert "wattprint: Tracker already stopped or never started." in stderr


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
    assert all(float(line.split()[1]) < 0.05 for line in stdout.splitlines() if "stop_s" in line)
    starts = [line for line in stderr.splitlines() if " at each flush() and stop()" in line]
    assert len(starts) == 4, stderr
    assert starts[0].startswith("wattprint: tracking script-") and "(process) as pid" in starts[0]
    assert "with the node's sampler http://127.0.0.1:" in starts[0]
    assert starts[0].endswith(f"writing to {node['out']} at each flush() and stop()")
    stops = [line for line in stderr.splitlines() if " stopped: " in line]
    assert len(stops) == 4
    assert " J, " in stops[0] or " Wh, " in stops[0]
    assert "(this process tree); the job on " in stops[0] and " meanwhile: " in stops[0]
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
            t.start(); t.stop()
            """,
        )
    )
    first.kill()
    assert status == 0, stderr
    line = next(s for s in stderr.splitlines() if "was already running" in s)
    assert (
        "it accounts with carbon zone DE, not FRA and PUE 1, not 1.5 and a sample every "
        "0.1 s, not 5 s; country_iso_code='FRA', pue=1.5, measure_power_secs=5 cannot change it"
    ) in line
    second = next(d for d in documents(node) if d.get("codecarbon_file") == "second.csv")
    assert any("was already running" in n for n in second["job"]["notes"])


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
    assert row["project_name"] == "codecarbon" and row["run_id"].startswith("script-")


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
        print("stop", tracker.stop() > 0, time.perf_counter() - t < 0.05, flush=True)
    """
    status, stdout, stderr = finish(python(node, code), timeout=90)
    assert status == 0, stderr
    assert stdout.split() == ["stop", "True", "True"]
    [lost] = [line for line in stderr.splitlines() if "cannot read the exporter" in line]
    assert lost.startswith("wattprint: cannot read the exporter at http://127.0.0.1:")
    assert lost.endswith("; rows stay at its last sample until it answers")
    [document] = documents(node)
    assert document["final"] is True and document["job"]["energy_kwh"]["gpu"] > 0
    assert (
        "no sample of the node's sampler came within 10 s of stop(): counted to its last sample"
    ) in document["job"]["notes"]


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
    ids = [
        [r["run_id"] for r in csv.DictReader((node["out"] / f"spawned_{i}.csv").open())]
        for i in range(2)
    ]
    # Each launch: both ranks one job; the second launch another one.
    assert ids[0][0] == ids[1][0] and ids[0][1] == ids[1][1] and ids[0][0] != ids[0][1]
    assert ids[0][0].startswith("spawner-")
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
