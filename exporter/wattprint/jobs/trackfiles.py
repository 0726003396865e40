"""The files an EmissionsTracker writes: codecarbon's CSV (output_dir/output_file, one row
appended per flush() and stop(), its columns in its order, shared by every tracker that
names the same file, as codecarbon's are) and the wattprint-job/v1 JSON that
`wattprint report --from-files` adds up."""

from __future__ import annotations

import csv
import errno
import io
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wattprint.core import safeio
from wattprint.jobs.meter import (
    Reading,
    file_stem,
    first_line,
    node_energy,
    render,
    written_to,
)
from wattprint.report.common import CODECARBON_COLUMNS
from wattprint.report.jobdoc import job_document
from wattprint.report.jobs import JobReport

log = logging.getLogger("wattprint.tracker")


def codecarbon_row(job: JobReport, overrides: Mapping[str, object]) -> dict[str, str]:
    """The job as codecarbon's row (report/render.py's), with the tracker's own columns."""
    text = render(job, "", "codecarbon-csv")
    row = next(csv.DictReader(io.StringIO(text)))
    for column, value in overrides.items():
        row[column] = "" if value is None else str(value)
    return row


def append_row(path: Path, row: Mapping[str, str]) -> str:
    """Append one row as codecarbon's FileOutput does ("append"), the header first in a
    new file; several processes may append to one file at once (flock). Never through a
    link, onto a FIFO or into a directory; any failure is one line (CannotWrite)."""
    with written_to(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(8):  # set aside meanwhile by another process: the new file then
            fd = safeio.open_append(str(path))
            try:
                _flock(fd, path)
                if _appended(fd, path, row):
                    return str(path)
            finally:
                os.close(fd)
        raise OSError(errno.EAGAIN, "moved away while appending, again and again")


# Another rank appends in milliseconds; a lock held longer is someone else's (a reader's
# LOCK_SH, a stopped process, a hung NFS lock) and must not hold the job.
FLOCK_PATIENCE_S = 5.0


def _flock(fd: int, path: Path) -> None:
    if not safeio.flock_within(fd, FLOCK_PATIENCE_S):
        raise OSError(errno.EWOULDBLOCK, f"{path} stays locked by another process")


def _appended(fd: int, path: Path, row: Mapping[str, str]) -> bool:
    """Under the flock: the row appended (header first in an empty file); False where
    the file is no longer the one at `path`."""
    try:
        opened, now = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    if (opened.st_dev, opened.st_ino) != (now.st_dev, now.st_ino):
        return False
    header = _header(path) if opened.st_size else None
    if header is not None and sorted(header) != sorted(CODECARBON_COLUMNS):
        # As codecarbon does with a file of another format: kept aside, not mixed in.
        backup = _backup_name(path)
        os.rename(path, backup)
        log.warning("%s has other columns than codecarbon's: moved to %s", path, backup)
        return False
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header is None:
        writer.writerow(CODECARBON_COLUMNS)
        header = list(CODECARBON_COLUMNS)
    writer.writerow([row.get(column, "") for column in header])
    safeio.write_all(fd, buffer.getvalue().encode("utf-8", "replace"))
    return True


def _header(path: Path) -> list[str]:
    """The columns a non-empty CSV names (none where its first line is no CSV header:
    not UTF-8, a field over csv's limit, no line end in the first 64 KiB)."""
    line = first_line(path)
    if line is None or "\ufffd" in line:
        return []
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return []


def _backup_name(path: Path) -> Path:
    n = 0
    while os.path.lexists(candidate := path.with_name(f"{path.name}.bak{n or ''}")):
        n += 1
    return candidate


def write_document(
    job: JobReport,
    start: Reading,
    end: Reading,
    directory: str,
    names: list[str],
    source: str,
    extra: dict[str, Any],
) -> str:
    """wattprint-<names...>.json, replaced atomically, as `wattprint run`'s are."""
    out = Path(directory)
    document = {**extra, "node_energy_j": node_energy(start, end)}
    path = out / f"{file_stem(names)}.json"
    body = json.dumps(job_document(job, source, document), indent=2) + "\n"
    with written_to(directory):
        out.mkdir(parents=True, exist_ok=True)
        safeio.write_atomic(str(path), body.encode("utf-8", "replace"))
    return str(path)


def energy_text(joules: float) -> str:
    """J, Wh or kWh, as the size suits."""
    if joules < 3600:
        return f"{joules:.3g} J"
    if joules < 3.6e6:
        return f"{joules / 3600:.3g} Wh"
    return f"{joules / 3.6e6:.4g} kWh"


def wall_text(job: JobReport) -> str:
    """A tracker's stop line's words for the job at the wall (the chips plus its share of
    the rest of the server, report/jobreport.py), or why there is no such figure."""
    wall = job.wall_energy_j
    if wall is None:
        return f"wall: not measured ({job.wall_unavailable})"
    return (
        f"at the wall: {energy_text(wall)} (chips {energy_text(job.energy_j)} + the rest "
        f"of the server {energy_text(job.platform.energy_j)})"
    )


def mass_text(grams: float) -> str:
    return f"{grams:.3g} g CO2e" if grams < 1000 else f"{grams / 1000:.4g} kg CO2e"
