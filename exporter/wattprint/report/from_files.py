"""`wattprint report --from-files DIR`: one job's report from the files that
`wattprint run` (one per node) and `wattprint.track()` (one per rank) wrote.

The files' raw joules and grams add up: per node, then for the job. A file that
cannot be read is an error, not a gap in the total; a file another one already holds
(a rank's file next to its node's `wattprint run` file) is left out and said so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from wattprint.report.jobdoc import JOB_FORMAT, job_from_document, merge
from wattprint.report.jobs import JobReport
from wattprint.report.queries import make_window
from wattprint.report.render import (
    job_dict,
    render_codecarbon,
    render_csv,
    render_json,
    render_table,
)


class FilesError(Exception):
    """The files cannot be merged; str() is one line."""


@dataclass
class JobFile:
    """One file that `wattprint run` or `wattprint.track()` wrote, read back."""

    path: Path
    job: JobReport
    host: str
    tracker: str | None  # None: `wattprint run`'s file, the whole workload on its node
    final: bool


def read_file(path: Path) -> JobFile | None:
    """The job file at `path`; None if it is some other JSON file."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        if not path.name.startswith("wattprint-"):
            return None
        raise FilesError(f"{path}: cannot read it ({err})") from None
    if not isinstance(document, dict) or document.get("format") != JOB_FORMAT:
        if path.name.startswith("wattprint-"):
            raise FilesError(f"{path}: not a {JOB_FORMAT} file")
        return None
    try:
        job = job_from_document(document)
    except ValueError as err:
        raise FilesError(f"{path}: {err}") from None
    host = str(document.get("host") or next(iter(sorted(job.instances)), ("", "?"))[1])
    tracker = document.get("tracker")
    return JobFile(
        path, job, host, None if tracker is None else str(tracker), document.get("final", True)
    )


def read_dir(directory: Path) -> tuple[list[JobFile], list[str]]:
    """Every job file under `directory`, and what it skipped (one line each)."""
    if not directory.is_dir():
        raise FilesError(f"--from-files={directory}: not a directory")
    files, skipped = [], []
    for path in sorted(directory.rglob("*.json")):
        found = read_file(path)
        if found is None:
            skipped.append(f"{path}: not a {JOB_FORMAT} file")
        else:
            files.append(found)
    if not files:
        raise FilesError(f"no {JOB_FORMAT} files (wattprint-*.json) under {directory}")
    return files, skipped


def _overlap(a: JobReport, b: JobReport) -> bool:
    return a.start < b.end and b.start < a.end


def _inside(inner: JobReport, outer: JobReport) -> bool:
    return outer.start <= inner.start and inner.end <= outer.end


def choose(files: list[JobFile]) -> tuple[list[JobFile], list[str]]:
    """The files whose energy adds up without counting anything twice.

    A `wattprint run` file holds every process of its workload on its node, the
    trackers' ones too: a tracker's file inside its node's run is left out. Two files
    of the same measurement (a copy, or two runs of one workload on one node at once)
    cannot be told apart from two halves of the job: that is an error."""
    counted: list[JobFile] = []
    notes: list[str] = []
    runs: dict[tuple[str, str], list[JobFile]] = defaultdict(list)
    for f in files:
        if f.tracker is None:
            runs[(f.job.workload, f.host)].append(f)
    for f in files:
        covering = runs.get((f.job.workload, f.host), [])
        if f.tracker is not None and any(_inside(f.job, r.job) for r in covering):
            notes.append(f"{f.path.name}: left out, {f.host}'s `wattprint run` file holds it")
            continue
        for other in counted:
            same = (other.job.workload, other.host) == (f.job.workload, f.host)
            one = other.tracker is None or f.tracker is None or other.tracker == f.tracker
            if same and one and _overlap(other.job, f.job):
                raise FilesError(
                    f"{other.path} and {f.path} both measured {f.job.workload!r} on "
                    f"{f.host} at the same time: adding them would count it twice; keep one"
                )
        if not f.final:
            f.job.notes.append(f"{f.path.name}: its tracker never stopped; counted to its flush")
        counted.append(f)
    return counted, notes


@dataclass
class Merged:
    """One workload put together from the files: each node's report and the job's."""

    workload: str
    nodes: list[tuple[str, list[JobFile], JobReport]]
    total: JobReport


def merge_files(files: list[JobFile], workload: str | None = None) -> list[Merged]:
    """Per workload: each node's report and the job's, in the workload's order."""
    by_workload: dict[str, list[JobFile]] = defaultdict(list)
    for f in files:
        by_workload[f.job.workload].append(f)
    if workload is not None:
        if workload not in by_workload:
            raise FilesError(
                f"no file of workload {workload!r} (the files hold {sorted(by_workload)})"
            )
        by_workload = {workload: by_workload[workload]}
    merged = []
    for name, parts in sorted(by_workload.items()):
        by_host: dict[str, list[JobFile]] = defaultdict(list)
        for f in parts:
            by_host[f.host].append(f)
        nodes = [
            (host, group, merge([f.job for f in group], name))
            for host, group in sorted(by_host.items())
        ]
        merged.append(Merged(name, nodes, merge([f.job for f in parts], name)))
    return merged


def render(merged: list[Merged], directory: str, fmt: str, notes: list[str]) -> str:
    """The report's own renderers: a row per node (WORKLOAD@NODE), then the job's."""
    totals = [m.total for m in merged]
    rows = [
        replace(job, workload=f"{m.workload}@{host}") for m in merged for host, _, job in m.nodes
    ]
    rows += totals
    window = make_window(min(j.start for j in totals), max(j.end for j in totals), whole_life=False)
    if fmt == "json":
        document: dict[str, Any] = json.loads(render_json(totals, window, ""))
        del document["prometheus"]
        document = {"from_files": directory, **document}
        document["nodes"] = [
            {"node": host, "files": [str(f.path) for f in group], **job_dict(job)}
            for m in merged
            for host, group, job in m.nodes
        ]
        document["skipped"] = notes
        return json.dumps(document, indent=2) + "\n"
    if fmt == "csv":
        return render_csv(rows, window, "")
    if fmt == "codecarbon-csv":
        return render_codecarbon(rows, window, "")
    files = sum(len(group) for m in merged for _, group, _ in m.nodes)
    nodes = len({host for m in merged for host, _, _ in m.nodes})
    title = f"files under {directory}: {files} files from {nodes} node(s)"
    # The job's GPU rows already name each GPU's node: not again under each node.
    rows = [replace(job, gpus={}) for job in rows[: -len(totals)]] + totals
    body = render_table(rows, window, "").split("\n", 1)[1]
    skipped = ["", "Files left out", *[f"  {n}" for n in notes]] if notes else []
    return "\n".join([title, body.rstrip("\n"), *skipped]) + "\n"


def report_from_files(args: argparse.Namespace) -> int:
    for flag, value in (("--since", args.since), ("--until", args.until), ("--range", args.range)):
        if value is not None:
            print(
                f"wattprint: {flag} needs a Prometheus; --from-files reports the files' whole jobs",
                file=sys.stderr,
            )
            return 2
    try:
        files, skipped = read_dir(Path(args.from_files))
        if args.namespace is not None:
            files = [f for f in files if f.job.namespace == args.namespace]
        if not files:
            raise FilesError(f"no file of namespace {args.namespace!r}")
        counted, notes = choose(files)
        merged = merge_files(counted, args.workload)
    except FilesError as err:
        print(f"wattprint: {err}", file=sys.stderr)
        return 1
    tabled = args.format in ("table", "json")
    for line in skipped + ([] if tabled else notes):
        print(f"wattprint: {line}", file=sys.stderr)
    sys.stdout.write(render(merged, args.from_files, args.format, notes))
    return 0
