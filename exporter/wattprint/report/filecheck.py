"""What `report --from-files` says about the files it adds: where they disagree, a rank
that never stopped, and the files it did not read (other JSON, codecarbon's CSVs)."""

from __future__ import annotations

import os
import re
import stat
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wattprint.core import safeio
from wattprint.core.safeio import printable
from wattprint.report.jobreport import JobReport

# codecarbon's emissions.csv, any 2.x or 3.x: these columns are in every one.
CODECARBON_MARKS = ("run_id", "energy_consumed", "codecarbon_version")
SHOWN_NAMES = 3
HEADER_BYTES = 65536  # codecarbon's header is under 1 kB


@dataclass
class JobFile:
    """One file that `wattprint run` or a tracker wrote, read back."""

    path: Path
    job: JobReport
    host: str
    tracker: str | None  # None: `wattprint run`'s file, the whole workload on its node
    final: bool
    launch: str | None = None  # None: a file that does not say (a tracker's, an older run's)
    command: tuple[str, ...] | None = None  # `wattprint run`'s
    codecarbon_file: str | None = None  # the codecarbon CSV an EmissionsTracker also wrote
    shown: str = ""  # the file's name as printed: without escape codes


def relative(path: Path, directory: Path) -> str:
    """A path as printed: relative to the directory, without escape codes."""
    return printable(str(path.relative_to(directory) if path.is_relative_to(directory) else path))


def names(paths: Sequence[Path], directory: Path) -> str:
    """The first few paths, relative to the directory, and how many more."""
    shown = [relative(p, directory) for p in paths[:SHOWN_NAMES]]
    more = len(paths) - SHOWN_NAMES
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def is_codecarbon_csv(path: Path) -> bool:
    """Whether its header is codecarbon's, read without following a link or waiting on a
    FIFO (a planted `x.csv` must not hang the report)."""
    try:
        fd = os.open(path, os.O_RDONLY | safeio.NOFOLLOW | safeio.NONBLOCK | safeio.CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.read(fd, HEADER_BYTES)
    except OSError:
        return False
    finally:
        os.close(fd)
    header = head.decode("utf-8", "replace").partition("\n")[0].strip().split(",")
    return all(mark in header for mark in CODECARBON_MARKS)


def skipped_line(skipped: Sequence[Path], directory: Path, job_format: str) -> str:
    listed = names(skipped, directory)
    return f"skipped {len(skipped)} JSON file(s) that are not {job_format}: {listed}"


def unreadable_line(lines: Sequence[str]) -> str:
    """The job files left out because they cannot be read: the first few, each with why."""
    more = len(lines) - SHOWN_NAMES
    listed = "; ".join(lines[:SHOWN_NAMES]) + (f"; and {more} more" if more > 0 else "")
    return f"left out {len(lines)} file(s) that cannot be read: {listed}"


def codecarbon_line(found: Sequence[Path], directory: Path) -> str:
    return (
        f"{len(found)} codecarbon CSV file(s) not added ({names(found, directory)}): each "
        "counts the whole node (every GPU it sees, all of its CPU and memory), so adding "
        "them would count the node once per file"
    )


def unfinished(f: JobFile, total: JobReport) -> str:
    """How much of the job's time a file that was never stopped (its rank killed) covers."""
    into = f.job.end - total.start
    head = f"{f.shown}: its tracker never stopped (killed?): counted to its last flush"
    if f.job.end >= total.end:
        return f"{head}, {into:.1f} s into the job; no file says when the job ended"
    span = total.end - total.start
    return (
        f"{head}, which covers {into:.1f} s of the job's {span:.1f} s ({into / span:.0%}); "
        f"its last {span - into:.1f} s are not counted"
    )


def disagreements(name: str, files: Sequence[JobFile]) -> list[str]:
    """Warnings where the files added into one job do not look like parts of one run."""
    warnings = []
    for what, value in (
        ("carbon zone", lambda f: ", ".join(sorted(f.job.zones))),
        ("PUE", lambda f: "" if f.job.pue is None else f"{f.job.pue:.3g}"),
        ("command", lambda f: " ".join(f.command or ())),
    ):
        by_value: dict[str, list[str]] = defaultdict(list)
        for f in files:
            if value(f):
                by_value[value(f)].append(f.shown)
        if len(by_value) > 1:
            each = "; ".join(f"{v}: {', '.join(ps)}" for v, ps in sorted(by_value.items()))
            warnings.append(f"the files of {name!r} disagree on the {what} ({each}): added up")
    warnings += _two_launches(name, [f for f in files if f.launch is None])
    return warnings


def _two_launches(name: str, files: Sequence[JobFile]) -> list[str]:
    """Files without a launch id that look like two launches under one name."""
    ranks: dict[tuple[str, str], list[str]] = defaultdict(list)
    for f in files:
        match = re.fullmatch(r"rank(\d+)-\d+", f.tracker or "")
        if match:
            ranks[(f.host, match.group(1))].append(f.shown)
    hint = "two launches under one name? Added up as one job"
    warnings = [
        f"{len(ps)} files of {name!r} are rank {rank} on {host} ({', '.join(ps)}): {hint}"
        for (host, rank), ps in sorted(ranks.items())
        if len(ps) > 1
    ]
    spans = sorted((f.job.start, f.job.end) for f in files)
    reach = spans[0][1] if spans else 0.0
    for begin, end in spans[1:]:
        if begin > reach:
            warnings.append(f"the files of {name!r} do not overlap in time: {hint}")
            break
        reach = max(reach, end)
    return warnings
