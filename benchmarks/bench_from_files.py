"""`wattprint report --from-files` over many files: seconds against the number of files.

Each size is a directory of one job's files as a large training run leaves them, in two
shapes: per node, one `wattprint run` file and one tracker file per rank beside it (left
out: the node's run file holds them), or the ranks' tracker files alone (all added); and
one other JSON file (a checkpoint's). The
report runs as a user runs it, in a fresh process; the time is its wall clock. A run
linear in the files takes about as long per file at every size.

    python benchmarks/bench_from_files.py --files 1000 5000 20000 --results benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "exporter"))

from wattprint.jobs import meter as jobmeter  # noqa: E402

RANKS = 8  # tracker files per node, beside its run file


def document(host: str, joules: float, tracker: str | None) -> str:
    job = jobmeter.JobReport("env", "", "train", start=1000.0, end=2000.0)
    job.components["gpu"].energy_j = joules
    job.components["gpu"].pue_energy_j = joules
    job.components["gpu"].emissions_g = joules / 3.6e6 * 344
    job.instances.add(("wattprint", host))
    job.zones = {"DE"}
    extra = {"host": host, "launch": "L1"}
    if tracker is None:
        extra["command"] = ["python", "train.py"]
    else:
        extra.update(tracker=tracker, final=True)
    return json.dumps(jobmeter.job_document(job, "bench", extra))


def make(directory: Path, files: int, runs: bool) -> float:
    """`files` job files (per node: a run file if `runs`, and RANKS tracker files); their
    total in J (a run file holds its node's trackers)."""
    total, written, node = 0.0, 0, 0
    while written < files:
        host = f"n{node:05d}"
        sub = directory / host
        sub.mkdir()
        if runs:
            (sub / f"wattprint-train-{host}.json").write_text(document(host, 3600.0, None))
            total += 3600.0
            written += 1
        for rank in range(min(RANKS, files - written)):
            tracker = f"rank{rank}-{100 + rank}"
            name = f"wattprint-train-{host}-{tracker}.json"
            (sub / name).write_text(document(host, 400.0, tracker))
            total += 0.0 if runs else 400.0
            written += 1
        node += 1
    (directory / "config.json").write_text("{}")
    return total


def run(directory: Path, package: Path) -> tuple[float, dict[str, object]]:
    env = dict(os.environ, PYTHONPATH=str(package))
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "wattprint", "report", f"--from-files={directory}", "--format=json"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"report failed: {done.stderr.strip()}")
    return took, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, nargs="+", default=[1000, 5000, 20000])
    parser.add_argument(
        "--exporter",
        type=Path,
        default=REPO / "exporter",
        help="the directory holding the wattprint package to run (default this checkout's; "
        "another's, e.g. from `git archive REV exporter`, to compare)",
    )
    record.add_option(parser)
    args = parser.parse_args()
    record.start(args.results)
    print("| files | shape | nodes | seconds | ms per file | total GPU kWh | expected kWh |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for files, runs in ((f, r) for f in args.files for r in (True, False)):
        with tempfile.TemporaryDirectory(prefix="wattprint-bench-") as tmp:
            print(f"writing {files} files...", file=sys.stderr)
            expected = make(Path(tmp), files, runs)
            took, result = run(Path(tmp), args.exporter)
            jobs = result["jobs"]
            assert isinstance(jobs, list)
            kwh = sum(j["energy_kwh"]["gpu"] for j in jobs)
            nodes = len({n["node"] for n in result["nodes"]})  # type: ignore[attr-defined]
            shape = "run + ranks" if runs else "ranks"
            print(
                f"| {files:,} | {shape} | {nodes:,} | {took:.2f} | {took / files * 1000:.2f} "
                f"| {kwh:.4f} | {expected / 3.6e6:.4f} |"
            )


if __name__ == "__main__":
    main()
