"""`wattprint slurm-epilog`: a finished Slurm job's energy and emissions on this node,
read from the node's exporter, written into the job's AdminComment as compact JSON.

slurmd runs its Epilog once the job's processes are gone (the job is COMPLETING). The
command waits for the exporter's first sample after that, so the job's counters are
final, and writes what they say. Slurm 22.05 refuses `scontrol update` of a job that
is COMPLETING, so the comment goes to the accounting database with `sacctmgr modify
job` when slurmctld refuses; sacctmgr turns every quote into a backtick (its parser
has no escape), which `tr '`' '"'` undoes (docs/slurm.md). Each node adds its part to
the document and reads it back, writing again while a part is missing (write_part).

Whatever goes wrong (no exporter, a job the exporter never saw, an AdminComment that
another tool wrote), it says so in one line and exits 0: an epilog that fails drains
the node, and the job's own result must never depend on its energy figure.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import socket
import stat
import subprocess
import time
from typing import Any

from wattprint.cli.slurmdoc import (
    compact,
    document,
    node_part,
    node_report,
    ours,
    paragraph,
    raw_parts,
    wall_text,
)
from wattprint.core.deadline import within
from wattprint.core.safeio import BadDocument, loads_json, printable
from wattprint.jobs.meter import ExporterReader, MeterError, Reading

log = logging.getLogger("wattprint.slurm")

DEFAULT_URL = "http://127.0.0.1:9950/metrics"
_SLURM_TIMEOUT_S = 30.0
# Writes of the document before giving up, and the random pause between two (s).
WRITE_TRIES = 6
WRITE_PAUSE_S = (0.2, 2.0)
# `sbatch --output`'s filename pattern: %[width]letter.
FILENAME_PATTERN = re.compile(r"%(\d*)([%AabJjNnstux])")
NO_VAL = 4294967294  # Slurm's "not set", which %a gives outside an array


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--job-id",
        default=os.environ.get("SLURM_JOB_ID", ""),
        help="the job (default $SLURM_JOB_ID, which slurmd gives its epilog)",
    )
    parser.add_argument(
        "--exporter-url",
        default=os.environ.get("WATTPRINT_EXPORTER_URL", DEFAULT_URL),
        help=f"this node's exporter (default $WATTPRINT_EXPORTER_URL, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--node",
        default=os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0],
        help="this node's name in the document (default $SLURMD_NODENAME)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=15.0,
        help="seconds to wait for the exporter's next sample (default 15)",
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        default=os.environ.get("WATTPRINT_EPILOG_SUMMARY", "") not in ("", "0"),
        help="also append a one-paragraph summary to the job's output file, on its batch "
        "host (default $WATTPRINT_EPILOG_SUMMARY)",
    )
    parser.add_argument(
        "--print-only",
        action="store_true",
        help="print the document instead of writing it to the job",
    )


class EpilogError(Exception):
    """Why nothing was written; str() is the one log line."""


def main(args: argparse.Namespace) -> int:
    """Write the job's figure; always 0 (see the module docstring)."""
    logging.basicConfig(level=logging.INFO, format="wattprint slurm-epilog: %(message)s")
    try:
        message = epilog(args)
    except EpilogError as err:
        log.warning("job %s: %s", args.job_id or "?", err)
    except Exception as err:  # never fail the job, never a traceback in slurmd's log
        log.error("job %s: nothing written: %s: %s", args.job_id or "?", type(err).__name__, err)
    else:
        log.info("job %s: %s", args.job_id, message)
    return 0


def epilog(args: argparse.Namespace) -> str:
    job = str(args.job_id).strip()
    if not re.fullmatch(r"[0-9]+", job):
        raise EpilogError("no job id (--job-id, or $SLURM_JOB_ID as slurmd sets it)")
    started = time.time()
    reader = ExporterReader(args.exporter_url, timeout=min(args.timeout, 5.0))
    # Each of its reads has a timeout, the whole none: an exporter (or whatever squats
    # its port) that trickles would hold the epilog, and the node, for as long as it likes.
    overall = 2 * args.timeout + 5

    def read() -> Reading:
        first = reader.read(patience=args.timeout)
        return reader.read_after(started, first.interval, patience=args.timeout)

    try:
        end = within(overall, read)
    except MeterError as err:
        raise EpilogError(f"nothing written: {err}") from None
    except TimeoutError:
        raise EpilogError(
            f"nothing written: the exporter at {reader.url} did not answer in full within "
            f"{overall:g} s (--timeout={args.timeout:g})"
        ) from None
    report = node_report(end, job, args.node)
    if report is None:
        raise EpilogError(
            f"nothing written: the exporter at {reader.url} has no series of Slurm job {job} "
            "(it ran on another node, or ended more than --workload.retention ago)"
        )
    part = node_part(report)
    if args.print_only:
        return "document " + compact(document({args.node: part}))
    info = job_info(job)
    summary = append_summary(job, args.node, part, info) if args.summary else ""
    current = admin_comment(job, info)
    nodes = ours(current)
    if current and nodes is None:
        raise EpilogError(
            f"nothing written: its AdminComment is another tool's ({current[:60]!r}), "
            f"not overwritten; this node's part: {compact(part)}{summary}"
        )
    refused = sorted(set(raw_parts(current) or {}) - set(nodes or {}))
    where = write_part(job, args.node, part, nodes or {})
    joules = ", ".join(f"{name} {value:.6g} J" for name, value in part["energy_j"].items())
    dropped = (
        f"; the parts of {', '.join(printable(n, 40) for n in refused)} in it were not "
        "figures (NaN, infinite, negative): left out"
        if refused
        else ""
    )
    return (
        f"chips {joules}, {part['emissions_g']:.6g} g CO2e; {wall_text(part, 6)}; written to "
        f"its AdminComment ({where}){dropped}{summary}"
    )


def write_part(job: str, node: str, part: dict[str, Any], seen: dict[str, dict[str, Any]]) -> str:
    """Add this node's part to the parts already written, and check that it stayed.

    Slurm has no append: the epilogs of a job's nodes run at once, and each reads the
    document, adds its part and writes the whole back, so one can overwrite another's
    part, even after that one has read its own back. So each node reads back only after
    a pause longer than another's write takes (any write begun from an older document
    has then landed); while its own part or one it had seen is missing, it reads the
    document again, merges, and writes at once, after a random pause that sets the
    nodes apart."""
    seen = dict(seen)
    for attempt in range(1, WRITE_TRIES + 1):
        seen[node] = part
        began = time.monotonic()
        where = write_admin_comment(job, compact(document(seen)))
        took = time.monotonic() - began
        time.sleep(2 * took + random.uniform(*WRITE_PAUSE_S))
        back = _ours_or_fail(read_back(job, where))
        if seen.keys() <= back.keys() and back[node] == part:
            return where if attempt == 1 else f"{where}, written {attempt} times: nodes at once"
        time.sleep(random.uniform(*WRITE_PAUSE_S))
        # Read again just before writing: the parts written during the pause count too.
        seen = {**back, **_ours_or_fail(read_back(job, where)), **seen}
    raise EpilogError(
        f"nothing kept: {WRITE_TRIES} writes, each replaced by another node's before it "
        f"was read back; this node's part: {compact(part)}"
    )


def _ours_or_fail(comment: str) -> dict[str, dict[str, Any]]:
    nodes = ours(comment)
    if nodes is None:
        raise EpilogError("written, but its AdminComment is now another tool's: not written again")
    return nodes


def append_summary(job: str, node: str, part: dict[str, Any], info: dict[str, Any] | None) -> str:
    """Append paragraph() to the job's output file if this node is its batch host; a
    note for the log line."""
    out = stdout_path(info) if info is not None else ""
    owner = info.get("user_id") if info is not None else None
    if info is None or not out or type(owner) is not int:
        return "; no summary: Slurm did not say where the job's output is"
    if info.get("batch_host") != node:
        return ""  # another node's job output: its batch host writes the summary
    try:
        append_as_owner(out, owner, paragraph(job, node, part))
    except OSError as err:
        return f"; no summary: {printable(out)}: {err.strerror or err}"
    return f"; summary appended to {printable(out)}"


def job_info(job: str) -> dict[str, Any] | None:
    """The job as slurmctld has it, from `squeue --json` (Slurm 22.05's scontrol has no
    --json): a structure, so that no text a user sets (a job name, a comment, a mail
    address) can pass for another field, as it could in `scontrol show job`'s text.
    None once slurmctld has forgotten the job."""
    shown = _slurm("squeue", "--json", f"--jobs={job}", "--states=all")
    if shown.returncode != 0:
        if "Invalid job id" in shown.stderr:
            return None
        raise EpilogError(f"nothing written: squeue: {_said(shown)}")
    try:
        data = loads_json(shown.stdout, "squeue --json")
    except BadDocument as err:
        raise EpilogError(f"nothing written: {err}") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    for entry in jobs if isinstance(jobs, list) else []:
        if isinstance(entry, dict) and str(entry.get("job_id")) == job:
            return entry
    return None


def stdout_path(info: dict[str, Any]) -> str:
    """The batch script's output file as slurmstepd names it: squeue gives the pattern
    of `sbatch --output` (`man sbatch`, filename pattern), expanded here the same way."""
    pattern = str(info.get("standard_output") or "")
    if not pattern:
        return ""
    job_id = info.get("job_id")
    array_job, task = info.get("array_job_id"), info.get("array_task_id")
    in_array = isinstance(array_job, int) and array_job > 0 and isinstance(task, int)
    values: dict[str, object] = {
        "%": "%",
        "A": array_job if in_array else job_id,
        "a": task if in_array else NO_VAL,
        "b": task % 10 if in_array and isinstance(task, int) else 0,
        "J": f"{job_id}.batch",
        "j": job_id,
        "N": info.get("batch_host") or "",
        "n": 0,
        "s": "batch",
        "t": 0,
        "u": info.get("user_name") or "",
        "x": info.get("name") or "",
    }

    def expand(match: re.Match[str]) -> str:
        value = values[match.group(2)]
        width = int(match.group(1) or 0)
        return str(value).zfill(width) if isinstance(value, int) else str(value)

    # A backslash anywhere turns the expansion off (and is dropped).
    path = pattern.replace("\\", "") if "\\" in pattern else FILENAME_PATTERN.sub(expand, pattern)
    return os.path.join(str(info.get("current_working_directory") or "/"), path)


def append_as_owner(path: str, uid: int, text: str) -> None:
    """Append text to path only if it is a regular file of uid, never opening anything
    else for writing (this runs as root, the path is the user's choice: a link, a
    device, a FIFO are refused before they are opened)."""
    where = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(where)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not written: {_kind(info.st_mode)}, not a regular file")
        if info.st_uid != uid:
            raise OSError(f"not written: owned by uid {info.st_uid}, not the job's user {uid}")
        # The file that was checked, reopened by its descriptor: not the path again.
        fd = os.open(f"/proc/self/fd/{where}", os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    finally:
        os.close(where)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "something else"


def _slurm(*argv: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=_SLURM_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise EpilogError(f"nothing written: {argv[0]}: {err}") from None


def _said(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def admin_comment(job: str, info: dict[str, Any] | None) -> str:
    """The job's AdminComment as slurmctld has it (squeue's `info`), else as the
    accounting database has it (another tool may have written it there), "" if neither
    has one."""
    if info is not None and info.get("admin_comment"):
        return str(info["admin_comment"])
    # A job that had finished when it was written has it in the database alone.
    stored = _slurm("sacct", "-n", "-P", "-X", "-j", job, "-o", "JobIDRaw,AdminComment")
    if stored.returncode != 0:
        raise EpilogError(f"nothing written: sacct: {_said(stored)}")
    for line in stored.stdout.splitlines():
        raw, _, comment = line.partition("|")
        if raw == job:
            return comment
    if info is None:
        raise EpilogError("nothing written: Slurm knows no such job")
    return ""


def read_back(job: str, where: str) -> str:
    """The AdminComment where write_admin_comment() said it wrote it."""
    if where == "scontrol":
        return admin_comment(job, job_info(job))
    stored = _slurm("sacct", "-n", "-P", "-X", "-j", job, "-o", "JobIDRaw,AdminComment")
    if stored.returncode != 0:
        raise EpilogError(f"written, but not read back: sacct: {_said(stored)}")
    rows = (line.partition("|") for line in stored.stdout.splitlines())
    return next((comment for raw, _, comment in rows if raw == job), "")


def write_admin_comment(job: str, text: str) -> str:
    """Set the AdminComment through slurmctld, or where it refuses a job that has
    finished, in the accounting database; says which."""
    done = _slurm("scontrol", "update", f"jobid={job}", f"AdminComment={text}")
    if done.returncode == 0:
        return "scontrol"
    if "finished" not in done.stderr:
        raise EpilogError(f"nothing written: scontrol update: {_said(done)}")
    stored = _slurm(
        "sacctmgr", "-i", "modify", "job", "where", f"jobid={job}", "set", f"AdminComment={text}"
    )
    if stored.returncode != 0:
        raise EpilogError(f"nothing written: sacctmgr modify job: {_said(stored)}")
    return "sacctmgr: the job had finished"
