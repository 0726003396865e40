"""`wattprint slurm-epilog`: a finished Slurm job's energy and emissions on this node,
read from the node's exporter, written into the job's AdminComment as compact JSON.

slurmd runs its Epilog once the job's processes are gone (the job is COMPLETING). The
command waits for the exporter's first sample after that, so the job's counters are
final, and writes what they say. Slurm 22.05 refuses `scontrol update` of a job that
is COMPLETING, so the comment goes to the accounting database with `sacctmgr modify
job` when slurmctld refuses; sacctmgr turns every quote into a backtick (its parser
has no escape), which `tr '`' '"'` undoes (docs/slurm.md).

Whatever goes wrong (no exporter, a job the exporter never saw, an AdminComment that
another tool wrote), it says so in one line and exits 0: an epilog that fails drains
the node, and the job's own result must never depend on its energy figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import socket
import stat
import subprocess
import time
from typing import Any

from wattprint.jobs.meter import ExporterReader, MeterError, Reading, job_report
from wattprint.report.jobs import JobReport

log = logging.getLogger("wattprint.slurm")

DEFAULT_URL = "http://127.0.0.1:9950/metrics"
# The document's mark: an AdminComment that has it is ours to update, any other is not.
MARK = "wattprint"
_SLURM_TIMEOUT_S = 30.0


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
    try:
        first = reader.read(patience=args.timeout)
        end = reader.read_after(started, first.interval, patience=args.timeout)
    except MeterError as err:
        raise EpilogError(f"nothing written: {err}") from None
    report = node_report(end, job, args.node)
    if report is None:
        raise EpilogError(
            f"nothing written: the exporter at {reader.url} has no series of Slurm job {job} "
            "(it ran on another node, or ended more than --workload.retention ago)"
        )
    part = node_part(report)
    if args.print_only:
        return "document " + compact(document({args.node: part}))
    summary = append_summary(job, args.node, part) if args.summary else ""
    current = admin_comment(job)
    nodes = ours(current)
    if current and nodes is None:
        raise EpilogError(
            f"nothing written: its AdminComment is another tool's ({current[:60]!r}), "
            f"not overwritten; this node's part: {compact(part)}{summary}"
        )
    text = compact(document({**(nodes or {}), args.node: part}))
    where = write_admin_comment(job, text)
    joules = ", ".join(f"{name} {value:.6g} J" for name, value in part["energy_j"].items())
    return (
        f"{joules}, {part['emissions_g']:.6g} g CO2e written to its AdminComment ({where}){summary}"
    )


def paragraph(job: str, node: str, part: dict[str, Any]) -> str:
    """What the user reads at the end of the job's output."""
    energy = part["energy_j"]
    parts = ", ".join(f"{name} {joules:.4g} J" for name, joules in energy.items())
    estimated = part["estimated"]
    how = f"estimated from models: {', '.join(estimated)}" if estimated else "all measured"
    intensity = part["intensity_g_per_kwh"]
    grid = f" at {intensity:.4g} g CO2e/kWh" if intensity is not None else ""
    return (
        f"\nWattprint: job {job} used {sum(energy.values()):.4g} J on {node} ({parts}; "
        f"{how}), {part['emissions_g']:.4g} g CO2e{grid}. Other nodes' parts, if any, are "
        f"in: sacct -X -n -P -o AdminComment -j {job}\n"
    )


def append_summary(job: str, node: str, part: dict[str, Any]) -> str:
    """Append paragraph() to the job's output file if this node is its batch host; a
    note for the log line. The file is the user's: it is opened without following a
    link and written only if it is a regular file of the job's owner (this runs as root)."""
    shown = _slurm("scontrol", "show", "job", job)
    out = re.search(r"\bStdOut=(\S+)", shown.stdout)
    host = re.search(r"\bBatchHost=(\S+)", shown.stdout)
    owner = re.search(r"\bUserId=\S*?\((\d+)\)", shown.stdout)
    if shown.returncode != 0 or out is None or owner is None:
        return "; no summary: Slurm did not say where the job's output is"
    if host is None or host.group(1) != node:
        return ""  # another node's job output: its batch host writes the summary
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK
    try:
        fd = os.open(out.group(1), flags)
    except OSError as err:
        return f"; no summary: {out.group(1)}: {err.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != int(owner.group(1)):
            return f"; no summary: {out.group(1)} is not a file of the job's owner"
        os.write(fd, paragraph(job, node, part).encode())
    except OSError as err:
        return f"; no summary: {out.group(1)}: {err.strerror}"
    finally:
        os.close(fd)
    return f"; summary appended to {out.group(1)}"


def node_report(reading: Reading, job: str, node: str) -> JobReport | None:
    """The job's counters on this node (only its Slurm series), or None without any."""
    slurm = Reading(time=reading.time, pue=reading.pue, interval=reading.interval)
    slurm.series = {k: v for k, v in reading.series.items() if k[2] == "slurm" and k[4] == job}
    if not slurm.series:
        return None
    slurm.methods, slurm.gpu_models, slurm.zones = (
        reading.methods,
        reading.gpu_models,
        reading.zones,
    )
    return job_report(Reading(time=math.nan), slurm, job, host=node)


def _round(value: float) -> float:
    return float(f"{value:.7g}")


def node_part(report: JobReport) -> dict[str, Any]:
    """This node's share of the job: energy by component, emissions, intensity, and
    which components were measured and which estimated."""
    used = {name: c for name, c in report.components.items() if c.energy_j > 0}
    intensity = report.intensity
    return {
        "energy_j": {name: _round(c.energy_j) for name, c in used.items()},
        "emissions_g": _round(report.emissions_g),
        "intensity_g_per_kwh": _round(intensity) if intensity is not None else None,
        "pue": _round(report.pue) if report.pue is not None else None,
        "measured": sorted(n for n, c in used.items() if c.estimated_j < c.energy_j),
        "estimated": sorted(n for n, c in used.items() if c.estimated_j > 0),
    }


def document(nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The job's totals over the nodes that wrote their part, and the parts."""
    energy: dict[str, float] = {}
    for part in nodes.values():
        for name, joules in part["energy_j"].items():
            energy[name] = energy.get(name, 0.0) + joules
    grams = sum(part["emissions_g"] for part in nodes.values())
    kwh = sum(energy.values()) / 3.6e6
    return {
        MARK: 1,
        "energy_j": {name: _round(j) for name, j in energy.items()},
        "emissions_g": _round(grams),
        "intensity_g_per_kwh": _round(grams / kwh) if kwh > 0 else None,
        "nodes": nodes,
    }


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def ours(comment: str) -> dict[str, dict[str, Any]] | None:
    """The node parts of a document we wrote (quotes as sacctmgr stores them), or None."""
    try:
        value = json.loads(comment.replace("`", '"'))
    except ValueError:
        return None
    if isinstance(value, dict) and value.get(MARK) == 1 and isinstance(value.get("nodes"), dict):
        return value["nodes"]
    return None


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


def admin_comment(job: str) -> str:
    """The job's AdminComment as slurmctld has it, else as the accounting database has
    it (another tool may have written it there), "" if neither has one."""
    shown = _slurm("scontrol", "show", "job", job)
    if shown.returncode == 0:
        for line in shown.stdout.splitlines():
            if line.strip().startswith("AdminComment="):
                return line.strip()[len("AdminComment=") :]
    elif "Invalid job id" not in shown.stderr:
        raise EpilogError(f"nothing written: scontrol show job: {_said(shown)}")
    stored = _slurm("sacct", "-n", "-P", "-X", "-j", job, "-o", "JobIDRaw,AdminComment")
    if stored.returncode != 0:
        raise EpilogError(f"nothing written: sacct: {_said(stored)}")
    for line in stored.stdout.splitlines():
        raw, _, comment = line.partition("|")
        if raw == job:
            return comment
    if shown.returncode != 0:
        raise EpilogError("nothing written: Slurm knows no such job")
    return ""


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
