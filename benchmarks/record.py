"""--results DIR: a benchmark's printed Markdown also appended to DIR/<date>-<commit>.md.

So that benchmarks/results/ holds what the scripts printed, with the command, the
commit and the machine beside it, rather than a copy made by hand. (Not results.py: a
module of that name beside the results/ folder would be easy to mistake for it.)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results",
        metavar="DIR",
        help="also append the Markdown printed to DIR/<date>-<commit>.md, HEAD's commit and "
        "its date (e.g. benchmarks/results); default: print only",
    )


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"--results needs a git checkout with git installed: {e}") from e
    return done.stdout.strip()


def results_file(directory: Path) -> Path:
    """Named by HEAD's commit date (UTC), not the run's, as the files moved there from the
    README are: every run at one commit goes into one file."""
    commit = _git("rev-parse", "--short", "HEAD")
    stamp = int(_git("show", "-s", "--format=%ct", "HEAD"))
    date = datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).date()
    return directory / f"{date.isoformat()}-{commit}.md"


class _Tee:
    """stdout that also writes to the results file, flushed at every write: a run that
    fails an hour in still leaves what it printed."""

    def __init__(self, stream: TextIO, copy: TextIO) -> None:
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        self.copy.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> object:  # isatty(), encoding, ...: the terminal's
        return getattr(self.stream, name)


def start(directory: str | None) -> None:
    """From here on, what the script prints to stdout is appended to the results file too,
    under a heading with the command, the commit and the machine. Progress on stderr is
    not. Without a directory, nothing changes."""
    if directory is None:
        return
    path = results_file(Path(directory))
    path.parent.mkdir(parents=True, exist_ok=True)
    commit = _git("rev-parse", "--short", "HEAD")
    # Tracked files only: a benchmark measures the working tree, not HEAD, if they differ.
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):  # a script outside the checkout keeps its path
        script = script.relative_to(REPO)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    new = not path.exists()
    copy = path.open("a")
    if new:
        copy.write(f"# Runs at {commit}\n")
    copy.write(
        f"\n## {now}: {script.name}\n\n"
        f"- Command: `{shlex.join(['python', str(script), *sys.argv[1:]])}`\n"
        f"- Tree: {commit}{', with uncommitted changes to tracked files' if dirty else ''}\n"
        f"- Machine: {platform.platform()}, {os.cpu_count()} CPUs, load average {load} "
        f"at the start, Python {platform.python_version()}\n\n"
    )
    copy.flush()
    sys.stdout = _Tee(sys.stdout, copy)  # type: ignore[assignment]
    print(f"--results: appending what is printed to {path}", file=sys.stderr)
