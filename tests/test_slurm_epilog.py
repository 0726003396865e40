"""`wattprint slurm-epilog` without a Slurm (tests/test_slurm.py runs it under a real
one): the document's totals, parts that are not figures, the output path from squeue's
JSON, the summary's file checks (it runs as root on a path the user chose), an exporter
that trickles, and deploy/slurm/epilog.sh's log."""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from wattprint.cli.slurm import append_as_owner, compact, document, ours, stdout_path

REPO = Path(__file__).resolve().parent.parent


def part(joules: float, pue: float, intensity: float) -> dict[str, object]:
    """A node's part as node_part() writes it: emissions = energy x PUE x intensity."""
    return {
        "energy_j": {"cpu": joules},
        "emissions_g": joules / 3.6e6 * pue * intensity,
        "intensity_g_per_kwh": intensity,
        "pue": pue,
        "measured": ["cpu"],
        "estimated": [],
    }


def test_the_documents_intensity_is_the_grids_like_each_nodes_and_its_pue_apart() -> None:
    """PUE 1.5 at 400 g/kWh: the total says 400 g/kWh and PUE 1.5, as the node does,
    not the 600 g per device kWh that emissions over energy would give."""
    one = document({"n1": part(3.6e6, 1.5, 400.0)})
    assert one["intensity_g_per_kwh"] == pytest.approx(400.0, rel=1e-6)
    assert one["pue"] == pytest.approx(1.5)
    assert one["emissions_g"] == pytest.approx(600.0)
    # Nodes of one grid with different PUEs: still the grid's intensity, the PUE the
    # energy-weighted one, and the totals' product the emissions.
    two = document({"n1": part(3.6e6, 1.5, 400.0), "n2": part(7.2e6, 1.2, 400.0)})
    assert two["intensity_g_per_kwh"] == pytest.approx(400.0, rel=1e-6)
    assert two["pue"] == pytest.approx((1.5 + 2 * 1.2) / 3, rel=1e-6)
    kwh = sum(two["energy_j"].values()) / 3.6e6
    assert two["emissions_g"] == pytest.approx(kwh * two["pue"] * 400.0, rel=1e-6)


def test_the_output_path_is_sbatchs_pattern_expanded_as_slurmstepd_does() -> None:
    """squeue's JSON gives `sbatch --output` as written; the name slurmstepd made."""
    info = {
        "job_id": 7, "array_job_id": 0, "array_task_id": None, "name": "train run",
        "user_name": "ada", "batch_host": "n1", "current_working_directory": "/home/ada/w",
    }  # fmt: skip
    for pattern, path in (
        ("/home/ada/run 3/out %j.log", "/home/ada/run 3/out 7.log"),
        ("slurm-%j.out", "/home/ada/w/slurm-7.out"),
        ("%x-%u-%N-%5j-%J-%%.out", "/home/ada/w/train run-ada-n1-00007-7.batch-%.out"),
        ("/tmp/\\%j.out", "/tmp/%j.out"),
    ):
        assert stdout_path({**info, "standard_output": pattern}) == path, pattern
    task = {**info, "job_id": 12, "array_job_id": 10, "array_task_id": 2}
    assert stdout_path({**task, "standard_output": "/o/%A_%a.out"}) == "/o/10_2.out"
    assert stdout_path({**info, "standard_output": ""}) == ""


def test_a_part_that_is_not_a_figure_is_left_out_never_added() -> None:
    """A document in the AdminComment with NaN, infinite or negative figures: those
    parts are refused, the others kept, and the totals written are never NaN."""
    good = part(3.6e6, 1.0, 400.0)
    for bad in ("NaN", "Infinity", "-1.0", "1" + "0" * 400):
        bad_part = '{"energy_j":{"gpu":%s},"emissions_g":1,"pue":null}' % bad  # noqa: UP031
        comment = f'{{"wattprint":1,"nodes":{{"n1":{json.dumps(good)},"n2":{bad_part}}}}}'
        nodes = ours(comment)
        assert nodes == {"n1": good}, bad
        written = compact(document(nodes))
        assert "NaN" not in written and "Infinity" not in written
        assert json.loads(written)["energy_j"] == {"cpu": 3.6e6}
    assert ours("project:climate-42") is None
    assert ours("[" * 100_000) is None


def test_the_summary_is_appended_to_a_regular_file_of_the_jobs_user(tmp_path: Path) -> None:
    out = tmp_path / "job 7.out"
    out.write_text("the job's output\n")
    append_as_owner(str(out), os.getuid(), "Wattprint: job 7\n")
    assert out.read_text() == "the job's output\nWattprint: job 7\n"
    with pytest.raises(OSError, match=r"owned by uid .*, not the job's user"):
        append_as_owner(str(out), os.getuid() + 1, "again\n")
    assert out.read_text().count("Wattprint") == 1


def test_the_summary_never_opens_a_link_or_a_device_for_writing(tmp_path: Path) -> None:
    """Root writes where the user's `#SBATCH -o` points: a symbolic link (to a file root
    owns), a device and a FIFO are refused before anything is opened for writing."""
    target = tmp_path / "victim"
    target.write_text("root's\n")
    link = tmp_path / "out.log"
    link.symlink_to(target)
    with pytest.raises(OSError, match="a symbolic link, not a regular file"):
        append_as_owner(str(link), target.stat().st_uid, "Wattprint\n")
    assert target.read_text() == "root's\n"
    with pytest.raises(OSError, match="a character device, not a regular file"):
        append_as_owner("/dev/null", 0, "Wattprint\n")
    # A FIFO tells whether a writer ever opened it: after one has come and gone, its
    # reader sees POLLHUP (Linux); opening it O_WRONLY would also block or fail.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(OSError, match="a FIFO, not a regular file"):
            append_as_owner(str(fifo), os.getuid(), "Wattprint\n")
        poll = select.poll()
        poll.register(reader, select.POLLIN | select.POLLHUP)
        assert poll.poll(0) == [], "the FIFO was opened for writing"
    finally:
        os.close(reader)


FROZEN = (
    b"# TYPE wattprint_sampler_last_success_timestamp_seconds gauge\n"
    b"wattprint_sampler_last_success_timestamp_seconds 1000\n"
    b"# TYPE wattprint_sampler_interval_seconds gauge\n"
    b"wattprint_sampler_interval_seconds 1e6\n"
)


@pytest.mark.parametrize("kind", ["trickle", "frozen"])
def test_an_exporter_that_never_gives_a_sample_is_given_up_on_at_the_deadline(kind: str) -> None:
    """Whatever squats the exporter's port: one that sends a byte every 0.5 s, or one
    that answers at once with a sample that never moves and an interval of 11 days
    (the epilog waits 5 intervals for a new sample). One line, exit 0, within
    2 x --timeout + 5 s, not for as long as it likes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                if kind == "frozen":
                    conn.recv(65536)
                    conn.sendall(FROZEN)
                    continue
                while not stop.is_set():
                    try:
                        conn.sendall(b"#")
                    except OSError:
                        break
                    time.sleep(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/metrics"
    env = dict(os.environ, PYTHONPATH=str(REPO / "exporter"))
    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "wattprint", "slurm-epilog", "--job-id=7",
             f"--exporter-url={url}", "--timeout=1"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    took = time.monotonic() - began
    assert done.returncode == 0 and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("wattprint slurm-epilog: job 7: nothing written: ")
    assert "did not answer in full within" in line, line
    if kind == "frozen":  # each read quick, the whole never done
        assert line.endswith(
            f"the exporter at {url} did not answer in full within 7 s (--timeout=1)"
        )
    assert took < 15, took


def run_hook(tmp_path: Path, log: Path) -> subprocess.CompletedProcess[str]:
    """deploy/slurm/epilog.sh with this checkout's wattprint, as slurmd runs it but with
    no SLURM_JOB_ID: the command's one line says so."""
    wrapper = tmp_path / "wattprint"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={REPO / "exporter"} exec {sys.executable} -m wattprint "$@"\n'
    )
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "WATTPRINT_"))}
    env.update(WATTPRINT=str(wrapper), WATTPRINT_EPILOG_LOG=str(log), WATTPRINT_STATE_FILE="")
    return subprocess.run(
        ["/bin/sh", str(REPO / "deploy" / "slurm" / "epilog.sh")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_epilog_script_makes_its_log_directory(tmp_path: Path) -> None:
    log = tmp_path / "var" / "log" / "slurm" / "wattprint-epilog.log"
    done = run_hook(tmp_path, log)
    assert done.returncode == 0
    assert "job ?: no job id" in log.read_text(), (done.stdout, done.stderr)


def test_the_epilog_script_logs_to_stderr_where_it_cannot_write_its_log(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    done = run_hook(tmp_path, blocked / "wattprint-epilog.log")
    assert done.returncode == 0
    assert f"cannot write {blocked}/wattprint-epilog.log" in done.stderr
    assert "job ?: no job id" in done.stderr


def wall_part(chips: float, wall: float | None) -> dict[str, object]:
    return {**part(chips, 1.0, 400.0), "wall_energy_j": wall, "wall_emissions_g": wall}


def test_the_documents_wall_figure_is_every_nodes_or_none() -> None:
    """The chips add up over every node; the wall only where every node has one (a node
    without a platform source, or a part an older epilog wrote, has none), never the
    chips' figure in its place."""
    both = document({"n1": wall_part(100.0, 150.0), "n2": wall_part(200.0, 260.0)})
    assert both["energy_j"] == {"cpu": 300.0}
    assert (both["wall_energy_j"], both["wall_emissions_g"]) == (410.0, 410.0)
    one = document({"n1": wall_part(100.0, 150.0), "n2": wall_part(200.0, None)})
    assert one["energy_j"] == {"cpu": 300.0}
    assert one["wall_energy_j"] is None and one["wall_emissions_g"] is None
    older = document({"n1": wall_part(100.0, 150.0), "n2": part(200.0, 1.0, 400.0)})
    assert older["wall_energy_j"] is None
    # A wall figure that is no figure makes the part no part.
    comment = compact(document({"n1": wall_part(100.0, 150.0), "n2": wall_part(1.0, -5.0)}))
    assert set(ours(comment) or {}) == {"n1"}


def test_on_a_node_running_one_job_its_wall_figure_is_the_nodes_energy(tmp_path: Path) -> None:
    """A Cray node (pm_counters) whose GPUs Slurm job 101 holds: the exporter's counters
    as the epilog reads them give the job's chips and, at the wall, the node's energy
    over the job (within 1 %; here exactly, the job held every component that drew).
    A node that reads no input gives the chips and no wall figure."""
    from test_platform import A, CrayNode
    from wattprint.cli.slurmdoc import node_part, node_report
    from wattprint.core.model import GpuProcess
    from wattprint.export.collector import SnapshotCollector
    from wattprint.jobs.meter import reading_from_text

    node = CrayNode(tmp_path)
    job = GpuProcess(1, sm_util=80, identity=A)
    node.gpus.holders = {"0": (job,), "1": (job,)}
    node.sampler.sample_once()
    for gpu0, gpu1, wall in [(600, 200, 1400), (700, 90, 1900), (300, 300, 1000)]:
        node.step(gpu0, gpu1, 0, wall)
    collector = SnapshotCollector(lambda: node.sampler.latest)
    collector.render()  # new series are first served at 0
    text = collector.render().decode()
    report = node_report(reading_from_text(text), "101", "n1")
    assert report is not None
    got = node_part(report)
    found = re.search(r"^wattprint_node_energy_joules_total (\S+)$", text, re.M)
    assert found is not None
    node_j = float(found[1])
    assert node_j == 1400 + 1900 + 1000
    assert got["energy_j"] == {"gpu": 600 + 200 + 700 + 90 + 300 + 300}
    assert got["wall_energy_j"] == pytest.approx(node_j, rel=0.01)
    assert got["wall_emissions_g"] is not None  # 0 g: this node has no grid intensity
    # The same exposition without the node's input: chips alone, no wall figure.
    chips_only = "\n".join(
        line
        for line in text.splitlines()
        if 'component="node"' not in line and 'component="platform"' not in line
    )
    report = node_report(reading_from_text(chips_only + "\n"), "101", "n1")
    assert report is not None
    got = node_part(report)
    assert got["energy_j"] == {"gpu": 2190.0}
    assert got["wall_energy_j"] is None and got["wall_emissions_g"] is None
