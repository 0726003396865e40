"""The files an EmissionsTracker writes: codecarbon's CSV (output_dir/output_file, one row
appended per flush() and stop(), its columns in its order, shared by every tracker that
names the same file, as codecarbon's are) and the wattprint-job/v1 JSON that
`wattprint report --from-files` adds up."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wattprint.jobs.meter import Reading, node_energy, render, safe_stem
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
    new file; several processes may append to one file at once (flock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8", newline="") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            opened, now = os.fstat(handle.fileno()), os.stat(path)
            moved = (opened.st_dev, opened.st_ino) != (now.st_dev, now.st_ino)
        except FileNotFoundError:
            moved = True
        if moved:  # set aside by the one that held the lock: the new file is the one
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return append_row(path, row)
        handle.seek(0)
        header = next(csv.reader(handle), None)
        if header is not None and sorted(header) != sorted(CODECARBON_COLUMNS):
            # As codecarbon does with a file of another format: kept aside, not mixed in.
            backup = _backup_name(path)
            os.rename(path, backup)
            log.warning("%s has other columns than codecarbon's: moved to %s", path, backup)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return append_row(path, row)
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if header is None:
            writer.writerow(CODECARBON_COLUMNS)
            header = list(CODECARBON_COLUMNS)
        writer.writerow([row.get(column, "") for column in header])
        handle.seek(0, os.SEEK_END)
        handle.write(buffer.getvalue())
    return str(path)


def _backup_name(path: Path) -> Path:
    n = 0
    while (candidate := path.with_name(f"{path.name}.bak{n or ''}")).exists():
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
    out.mkdir(parents=True, exist_ok=True)
    stem = "-".join(["wattprint", *(safe_stem(name) for name in names)])
    document = {**extra, "node_energy_j": node_energy(start, end)}
    path = out / f"{stem}.json"
    tmp = out / f".{stem}.json.tmp"
    tmp.write_text(json.dumps(job_document(job, source, document), indent=2) + "\n", "utf-8")
    os.replace(tmp, path)
    return str(path)


def energy_text(joules: float) -> str:
    """J, Wh or kWh, as the size suits."""
    if joules < 3600:
        return f"{joules:.3g} J"
    if joules < 3.6e6:
        return f"{joules / 3600:.3g} Wh"
    return f"{joules / 3.6e6:.4g} kWh"


def mass_text(grams: float) -> str:
    return f"{grams:.3g} g CO2e" if grams < 1000 else f"{grams / 1000:.4g} kg CO2e"
