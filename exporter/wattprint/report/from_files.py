"""`wattprint report --from-files DIR`: each job's report from the files that
`wattprint run` (one per node) and the trackers (one per rank) wrote.

The files' raw joules and grams add up: per node, then for the job; a job is a
workload's launch (the files' "launch", where they name one), and two are never added.
A file that cannot be read is an error, not a gap in the total; a file another one
already holds (a rank's file next to its node's `wattprint run` file) is left out and
said so; codecarbon's CSVs are named and never added (each counts the whole node).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wattprint.core import safeio
from wattprint.core.safeio import printable
from wattprint.report import filecheck
from wattprint.report.common import COMPONENTS
from wattprint.report.filecheck import JobFile
from wattprint.report.jobdoc import JOB_FORMAT, job_from_document, merge
from wattprint.report.jobreport import JobReport
from wattprint.report.queries import make_window
from wattprint.report.render import (
    Units,
    _aligned,
    _num,
    job_dict,
    render_codecarbon,
    render_csv,
    render_json,
    render_table,
)

__all__ = ["FilesError", "JobFile", "report_from_files"]


class FilesError(Exception):
    """The files cannot be merged; str() is one line."""


# A job file is a few kB per GPU; this bounds what one planted file can make it read.
MAX_FILE_BYTES = 16 << 20


@dataclass
class Found:
    """What a directory holds: job files, other JSON files, job files that cannot be read
    (each a line naming it and why), and codecarbon's CSVs."""

    files: list[JobFile] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    codecarbon: list[Path] = field(default_factory=list)


def read_file(path: Path, label: str) -> JobFile | None:
    """The job file at `path` (`label`: its name as shown); None if it is some other
    JSON file; FilesError (one line naming it) if it is a job file that cannot be read."""
    ours = path.name.startswith("wattprint-")
    try:
        raw = safeio.read_regular(str(path), MAX_FILE_BYTES)
        document = safeio.loads_json(raw, label)
    except safeio.Refused as err:  # a link, a FIFO, a device, too large: never read
        if not ours:
            return None
        raise FilesError(printable(str(err.strerror).replace(str(path), label))) from None
    except (OSError, ValueError) as err:
        if not ours:
            return None
        reason = str(err.strerror if isinstance(err, OSError) else err)
        shown = f"{label}: {reason}" if label not in reason else reason
        raise FilesError(printable(shown)) from None
    if not isinstance(document, dict) or document.get("format") != JOB_FORMAT:
        if ours:
            raise FilesError(f"{label}: not a {JOB_FORMAT} file")
        return None
    try:
        job = job_from_document(document)
    except ValueError as err:
        raise FilesError(f"{label}: {err}") from None
    host = str(document.get("host") or next(iter(sorted(job.instances)), ("", "?"))[1])
    tracker, launch, command = (document.get(k) for k in ("tracker", "launch", "command"))
    csv_name = document.get("codecarbon_file")
    return JobFile(
        path,
        job,
        printable(host),
        None if tracker is None else printable(str(tracker)),
        document.get("final", True) is not False,
        printable(str(launch)) if launch else None,
        tuple(printable(str(c)) for c in command) if isinstance(command, list) else None,
        csv_name if isinstance(csv_name, str) and csv_name else None,
        printable(path.name),
    )


def read_dir(directory: Path) -> Found:
    """Every job file under `directory`, the other JSON files, and codecarbon's CSVs (those
    no job file wrote beside itself)."""
    if not directory.is_dir():
        raise FilesError(f"--from-files={directory}: not a directory")
    found, ours = Found(), set()
    for path in sorted(directory.rglob("*.json")):
        try:
            job_file = read_file(path, filecheck.relative(path, directory))
        except FilesError as err:
            found.unreadable.append(str(err))
            continue
        if job_file is None:
            found.skipped.append(path)
            continue
        found.files.append(job_file)
        ours.add(path.with_name(f"{path.stem}.emissions.csv"))
        if job_file.codecarbon_file is not None:
            ours.add(path.parent / job_file.codecarbon_file)
    for path in sorted(directory.rglob("*.csv")):
        if path not in ours and filecheck.is_codecarbon_csv(path):
            found.codecarbon.append(path)
    if not found.files:
        if found.unreadable:
            raise FilesError(
                f"no readable {JOB_FORMAT} files under {directory}: "
                + filecheck.unreadable_line(found.unreadable)
            )
        if found.codecarbon:
            raise FilesError(
                f"no {JOB_FORMAT} files under {directory}, only codecarbon's: "
                + filecheck.codecarbon_line(found.codecarbon, directory)
            )
        raise FilesError(f"no {JOB_FORMAT} files (wattprint-*.json) under {directory}")
    return found


def _overlap(a: JobReport, b: JobReport) -> bool:
    return a.start < b.end and b.start < a.end


def _inside(inner: JobReport, outer: JobReport) -> bool:
    return outer.start <= inner.start and inner.end <= outer.end


def _one_launch(a: JobFile, b: JobFile) -> bool:
    """Whether two files may be of one launch: a file that names none may be of any."""
    return a.launch is None or b.launch is None or a.launch == b.launch


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
    # The counted files by workload and host, then tracker: a file is only compared with
    # those it could be a copy of, so that the files of thousands of ranks are not
    # compared each with each.
    by_place: dict[tuple[str, str], dict[str | None, list[JobFile]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for f in files:
        place = (f.job.workload, f.host)
        if f.tracker is not None and any(
            _inside(f.job, r.job) and _one_launch(f, r) for r in runs.get(place, [])
        ):
            notes.append(f"{f.shown}: left out, {f.host}'s `wattprint run` file holds it")
            continue
        by_tracker = by_place[place]
        # A run file (no tracker) may hold any tracker's part; a tracker's, a run's or its own.
        alike = (
            [o for group in by_tracker.values() for o in group]
            if f.tracker is None
            else by_tracker.get(None, []) + by_tracker.get(f.tracker, [])
        )
        for other in alike:
            if _one_launch(other, f) and _overlap(other.job, f.job):
                raise FilesError(
                    f"{printable(str(other.path))} and {printable(str(f.path))} both measured "
                    f"{f.job.workload!r} on {f.host} at the same time: adding them would count "
                    "it twice; keep one"
                )
        by_tracker[f.tracker].append(f)
        counted.append(f)
    return counted, notes


@dataclass
class Merged:
    """One job put together from the files: each node's report and the job's."""

    workload: str  # the job's name in the report: its workload, and its launch if need be
    launch: str | None
    nodes: list[tuple[str, list[JobFile], JobReport]]
    total: JobReport
    warnings: list[str] = field(default_factory=list)


def merge_files(files: list[JobFile], workload: str | None = None) -> list[Merged]:
    """Per job (a workload's launch): each node's report and the job's; two launches are
    never added, whatever their name."""
    by_job: dict[tuple[str, str | None], list[JobFile]] = defaultdict(list)
    for f in files:
        # A file that names no launch joins the one launch of its workload, if just one.
        by_job[(f.job.workload, f.launch)].append(f)
    launched: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for key in by_job:
        if key[1] is not None:
            launched[key[0]].append(key)
    for name, launch in list(by_job):
        if launch is None and len(launched[name]) == 1:
            by_job[launched[name][0]] += by_job.pop((name, launch))
    launches_of: dict[str, int] = defaultdict(int)
    for name, _ in by_job:
        launches_of[name] += 1
    named = {
        key: key[0] if launches_of[key[0]] == 1 else f"{key[0]}#{key[1] or '?'}" for key in by_job
    }
    if workload is not None:
        chosen = [k for k in by_job if workload in (k[0], named[k])]
        if not chosen:
            raise FilesError(
                f"no file of workload {workload!r} (the files hold {sorted(set(named.values()))})"
            )
        by_job = {k: by_job[k] for k in chosen}
    merged = []
    for key, parts in sorted(by_job.items(), key=lambda item: named[item[0]]):
        name = named[key]
        by_host: dict[str, list[JobFile]] = defaultdict(list)
        for f in parts:
            by_host[f.host].append(f)
        nodes = [
            (host, group, merge([f.job for f in group], name))
            for host, group in sorted(by_host.items())
        ]
        total = merge([f.job for f in parts], name)
        total.notes += [filecheck.unfinished(f, total) for f in parts if not f.final]
        warnings = filecheck.disagreements(name, parts)
        if launches_of[key[0]] > 1:
            warnings.append(
                f"{launches_of[key[0]]} launches are named {key[0]!r}: each is its own job "
                f"({name} is one)"
            )
        total.notes += warnings
        merged.append(Merged(name, key[1], nodes, total, warnings))
    return merged


def render(merged: list[Merged], directory: str, fmt: str, notes: list[str]) -> str:
    """The report's own renderers, one row per job; the table and the JSON also give
    each node's part of a job."""
    totals = [m.total for m in merged]
    window = make_window(min(j.start for j in totals), max(j.end for j in totals), whole_life=False)
    if fmt == "json":
        document: dict[str, Any] = json.loads(render_json(totals, window, ""))
        del document["prometheus"]
        document = {"from_files": directory, **document}
        for job, m in zip(document["jobs"], merged):
            job["launch"] = m.launch
        document["nodes"] = [
            {"node": host, "files": [str(f.path) for f in group], **job_dict(job)}
            for m in merged
            for host, group, job in m.nodes
        ]
        document["skipped"] = notes
        return json.dumps(document, indent=2) + "\n"
    if fmt == "csv":
        return render_csv(totals, window, "")
    if fmt == "codecarbon-csv":
        return render_codecarbon(totals, window, "")
    files = sum(len(group) for m in merged for _, group, _ in m.nodes)
    nodes = len({host for m in merged for host, _, _ in m.nodes})
    title = f"files under {directory}: {files} files from {nodes} node(s)"
    units = Units.suited(totals)
    body = render_table(totals, window, "", units).split("\n", 1)[1].rstrip("\n")
    per_node = "".join(
        "\n" + line for line in _per_node([m for m in merged if len(m.nodes) > 1], units)
    )
    table, notes_at, job_notes = body.partition("\n\nNotes\n")  # the parts before the notes
    body = table + per_node + notes_at + job_notes
    skipped = ["", "Files left out", *[f"  {n}" for n in notes]] if notes else []
    return "\n".join([title, body, *skipped]) + "\n"


def _per_node(merged: list[Merged], units: Units) -> list[str]:
    """Each node's part of a job of several nodes."""
    if not merged:
        return []
    e, m = units.energy, units.mass
    header = ["WORKLOAD", "NODE", "FILES", f"ENERGY {e.name}", f"GPU {e.name}", f"CPU {e.name}"]
    header += [f"MEMORY {e.name}", f"CO2e {m.name}"]
    rows = [
        [
            job.workload,
            host,
            str(len(group)),
            *(
                _num(e.of(j))
                for j in (node.energy_j, *(node.components[c].energy_j for c in COMPONENTS))
            ),
            _num(m.of(node.emissions_g)),
        ]
        for job in merged
        for host, group, node in job.nodes
    ]
    return ["", "Energy per node", _aligned(header, rows, set(range(2, 8)))]


def report_from_files(args: argparse.Namespace) -> int:
    for flag, value in (("--since", args.since), ("--until", args.until), ("--range", args.range)):
        if value is not None:
            print(
                f"wattprint: {flag} needs a Prometheus; --from-files reports the files' whole jobs",
                file=sys.stderr,
            )
            return 2
    if args.format.startswith("ghg-"):
        # The GHG export cites the intensity factors of each hour, which only the
        # Prometheus holds; the files keep each job's totals.
        print(
            f"wattprint: --format={args.format} needs a Prometheus; --from-files writes "
            "table, json, csv or codecarbon-csv",
            file=sys.stderr,
        )
        return 2
    directory = Path(args.from_files)
    try:
        found = read_dir(directory)
        files = found.files
        if args.namespace is not None:
            files = [f for f in files if f.job.namespace == args.namespace]
        if not files:
            raise FilesError(f"no file of namespace {args.namespace!r}")
        counted, notes = choose(files)
        merged = merge_files(counted, args.workload)
    except FilesError as err:
        print(f"wattprint: {err}", file=sys.stderr)
        return 1
    said = []
    if found.unreadable:
        said.append(filecheck.unreadable_line(found.unreadable))
    notes = [f"{line}: left out, cannot be read" for line in found.unreadable] + notes
    if found.skipped:
        said.append(filecheck.skipped_line(found.skipped, directory, JOB_FORMAT))
    if found.codecarbon:
        said.append(filecheck.codecarbon_line(found.codecarbon, directory))
    said += [f"warning: {w}" for m in merged for w in m.warnings]
    if args.format not in ("table", "json"):  # those two say it in their output
        said += notes[len(found.unreadable) :]  # those are in the line above
    for line in said:
        print(f"wattprint: {line}", file=sys.stderr)
    sys.stdout.write(render(merged, args.from_files, args.format, notes))
    return 0
