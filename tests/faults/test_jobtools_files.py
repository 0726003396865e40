"""The job tools' files (issue 43): never written through a link planted in the output
directory; a file that is not what it should be (a directory, not UTF-8, a field over
csv's limit), a name too long for the file system, a directory that cannot be written:
one line, no traceback, the job goes on."""

from __future__ import annotations

import csv
import os
import socket
from pathlib import Path

import pytest

from wattprint.jobs.trackfiles import append_row
from wattprint.report.common import CODECARBON_COLUMNS

from .jobnode import JobNode, job_node, one_line

__all__ = ["job_node"]

ROW = dict.fromkeys(CODECARBON_COLUMNS, "1")


def test_run_never_writes_through_a_link_planted_in_the_output_dir(job_node: JobNode) -> None:
    out = job_node.out
    out.mkdir()
    os.chmod(out, 0o2775)  # a group's shared directory: another member can plant links
    victim = job_node.tmp / "victim.txt"
    victim.write_text("the victim's own\n")
    host = socket.gethostname()
    for name in (f"wattprint-nightly-{host}.json", f"wattprint-nightly-{host}.emissions.csv"):
        (out / f".{name}.tmp").symlink_to(victim)
    env_host = job_node.env.pop("SLURMD_NODENAME", None)
    assert env_host is None or env_host == host
    result = job_node.run("--workload=nightly")
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "the victim's own\n"
    assert (out / f"wattprint-nightly-{host}.json").is_file()
    rows = list(csv.DictReader((out / f"wattprint-nightly-{host}.emissions.csv").open()))
    assert len(rows) == 1 and rows[0]["run_id"] == "nightly"


def test_run_into_an_output_dir_that_is_a_file_says_so_in_one_line(job_node: JobNode) -> None:
    job_node.out.write_text("not a directory\n")
    result = job_node.run("--workload=nightly", command=("sh", "-c", "exit 3"))
    assert result.returncode == 3  # the command's status, not the tool's trouble
    line = one_line(result.stderr, "wattprint run: cannot write to --output.dir=")
    assert str(job_node.out) in line


@pytest.mark.parametrize(
    ("content", "kept_aside"),
    [
        (b"\xff\xfe\x00t\x00i\x00m\x00e\x00s\x00t\x00a\x00m\x00p\n", True),  # UTF-16
        (b"timestamp,project_name\n\xff\xfe bad bytes\n", True),
        (b'"' + b"x" * (200 << 10) + b'"\n', True),  # one field over csv's 128 KiB
        (",".join(CODECARBON_COLUMNS).encode() + b"\nrow with \xff bytes\n", False),
    ],
    ids=["utf16", "not-utf8-rows", "huge-field", "codecarbon-with-bad-bytes"],
)
def test_an_existing_csv_that_cannot_be_parsed_is_set_aside_not_a_crash(
    tmp_path: Path, content: bytes, kept_aside: bool
) -> None:
    path = tmp_path / "emissions.csv"
    path.write_bytes(content)
    assert append_row(path, ROW) == str(path)
    if kept_aside:
        assert (tmp_path / "emissions.csv.bak").read_bytes() == content
        rows = list(csv.DictReader(path.open()))
        assert len(rows) == 1 and tuple(rows[0]) == CODECARBON_COLUMNS
    else:
        data = path.read_bytes()
        assert data.startswith(content) and data.count(b"\n") == 3


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink"])
def test_an_output_file_that_is_no_regular_file_is_one_oserror_line(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "emissions.csv"
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(victim)
    with pytest.raises(OSError) as raised:
        append_row(path, ROW)  # a FIFO never blocks it
    assert "\n" not in str(raised.value) and str(path) in str(raised.value)
    assert victim.read_text() == "kept\n"


TRACKER = """
from wattprint import EmissionsTracker
out = sys.argv[1]
tracker = EmissionsTracker(project_name=sys.argv[2], output_dir=out, output_file=sys.argv[3])
tracker.start()
time.sleep(0.5)
tracker.stop()
print("stopped", flush=True)
"""


def test_a_project_name_of_80_cjk_characters_still_writes_its_files(job_node: JobNode) -> None:
    name = "深度学习模型训练" * 10  # 80 characters, 240 bytes of UTF-8
    proc = job_node.python(TRACKER, str(job_node.out), name, "emissions.csv")
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0 and stdout.split() == ["stopped"], stderr
    assert "Traceback" not in stderr and "cannot write" not in stderr, stderr
    [document] = job_node.out.glob("wattprint-*.json")
    assert len(document.name.encode()) <= 255 and document.name.startswith("wattprint-深度")
    rows = list(csv.DictReader((job_node.out / "emissions.csv").open(encoding="utf-8")))
    assert [row["project_name"] for row in rows] == [name]


def test_a_tracker_appending_to_a_csv_that_is_not_utf8_keeps_it_aside(job_node: JobNode) -> None:
    job_node.out.mkdir()
    old = job_node.out / "emissions.csv"
    old.write_bytes(b"\xff\xfe\x00t\x00i\x00m\x00e\n")
    proc = job_node.python(TRACKER, str(job_node.out), "nightly", "emissions.csv")
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0 and stdout.split() == ["stopped"], stderr
    assert "Traceback" not in stderr, stderr
    assert (job_node.out / "emissions.csv.bak").read_bytes() == b"\xff\xfe\x00t\x00i\x00m\x00e\n"
    rows = list(csv.DictReader(old.open(encoding="utf-8")))
    assert [row["project_name"] for row in rows] == ["nightly"]


def test_a_csv_held_locked_by_another_process_fails_the_append_not_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Anyone who can read a 0644 CSV can flock it: the rank's append gives up in one line
    # instead of waiting inside the user's flush() forever.
    import fcntl
    import time

    from wattprint.jobs import trackfiles

    monkeypatch.setattr(trackfiles, "FLOCK_PATIENCE_S", 0.3)
    path = tmp_path / "emissions.csv"
    path.write_text(",".join(CODECARBON_COLUMNS) + "\n")
    holder = os.open(path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_SH)
    try:
        began = time.monotonic()
        with pytest.raises(OSError, match="stays locked by another process") as caught:
            append_row(path, {"project_name": "p"})
        assert time.monotonic() - began < 3
        assert "\n" not in str(caught.value)
    finally:
        os.close(holder)
    assert append_row(path, {"project_name": "p"}) == str(path)  # free again: appended
    assert len(list(csv.DictReader(path.open()))) == 1
