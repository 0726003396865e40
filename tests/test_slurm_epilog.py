"""`wattprint slurm-epilog` without a Slurm (tests/test_slurm.py runs it under a real
one): the document's totals, scontrol's fields, the summary's file checks (it runs as
root on a path the user chose), and deploy/slurm/epilog.sh's log."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from wattprint.cli.slurm import append_as_owner, document, job_fields

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


def test_scontrols_fields_keep_a_path_with_spaces_whole() -> None:
    line = (
        "JobId=7 UserId=ada(1001) GroupId=ada(1001) AllocNode:Sid=login1:42 "
        "CPUs/Task=1 BatchHost=n1 StdErr=/home/ada/run 3/out 7.log StdIn=/dev/null "
        "StdOut=/home/ada/run 3/out 7.log Power= \n"
    )
    fields = job_fields(line)
    assert fields["StdOut"] == fields["StdErr"] == "/home/ada/run 3/out 7.log"
    assert fields["UserId"] == "ada(1001)" and fields["BatchHost"] == "n1"
    assert fields["CPUs/Task"] == "1" and fields["Power"] == ""


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
