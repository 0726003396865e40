"""Where a job's cost goes in one sample and one scrape: the sampler's parts, in process.

Makes the processes and job cgroups of bench_exporter.py (20 processes to a Slurm job,
each holding memory, one of each 20 using CPU once the exporter measures, so every job
has its series), builds the exporter as `python -m wattprint --gpu.source=none
--carbon.zone=DE` does, without HTTP, and takes --samples samples 1 s apart (so caches
are as cold as in the exporter, not a tight loop's), each followed by a render of
/metrics in the same thread. Prints, per size, the thread CPU of a sample, of a render,
and of the sampler's parts (the /proc and job cgroup table, usage, shares, snapshot,
state file and the rest), in ms per sample; then, per part, the difference between the
sizes divided by the difference in jobs: what one more job costs. The jobs are still
between samples, as most of a node's are; --busy wakes one process of every job before
each sample, so that every job's CPU time moves and the exporter reads its memory.stat
each time (host/cgroupfs.py). Needs root (cgroups).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import record
from bench_exporter import PER_JOB, REPO, JobCgroups, processes

sys.path.insert(0, str(REPO / "exporter"))

from wattprint.app import build_exporter
from wattprint.attribution import split as attribution
from wattprint.cli import main as cli

# The sampler's parts, timed where each lives: (name, the part's path on the sampler, method).
PARTS = (
    ("read_procs", "", "_read_procs"),
    ("usage", "usage", "usage"),
    ("snapshot", "", "_snapshot"),
    ("save_state", "restarts", "save"),
    ("add", "book", "add"),
    ("read_source", "", "_read_source"),
)
NAMES = tuple(name for name, _, _ in PARTS)


def measure(
    count: int, samples: int, cgroups: JobCgroups, tmp: Path, busy: bool
) -> dict[str, float]:
    with processes(count, cgroups) as workers:
        args = cli.make_parser().parse_args(
            [
                "--gpu.source=none",
                "--carbon.zone=DE",
                "--log.level=error",
                f"--state.file={tmp / f'state-{count}.json'}",
                "--web.listen-address=127.0.0.1:0",
            ]
        )
        exporter = build_exporter(cli.load(args), serve=False)
        sampler = exporter.sampler
        spent: Counter[str] = Counter()

        def timed(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
            def run(*a: Any, **k: Any) -> Any:
                start = time.thread_time_ns()
                try:
                    return call(*a, **k)
                finally:
                    spent[name] += time.thread_time_ns() - start

            return run

        for name, path, method in PARTS:
            part = getattr(sampler, path) if path else sampler
            setattr(part, method, timed(name, getattr(part, method)))
        by_share = attribution.attribute_by_share
        attribution.attribute_by_share = timed("shares", by_share)  # type: ignore[assignment]
        try:
            sampler.sample_once()
            workers.tell(b"c", 1)  # every job uses CPU: its CPU series are born
            time.sleep(1.5)
            for _ in range(3):
                sampler.sample_once()
                exporter.collector.render()
                time.sleep(1)
            spent.clear()
            for _ in range(samples):
                if busy:
                    workers.tell(b"w", 1)
                    time.sleep(0.05)  # woken and asleep again before the sample
                start = time.thread_time_ns()
                sampler.sample_once()
                spent["sample"] += time.thread_time_ns() - start
                start = time.thread_time_ns()
                exporter.collector.render()
                spent["render"] += time.thread_time_ns() - start
                time.sleep(1)
            # Before stop(): its last save (synced) belongs to no sample.
            figures = {name: ns / samples / 1e6 for name, ns in spent.items()}
        finally:
            attribution.attribute_by_share = by_share
            exporter.stop()
        figures["other"] = figures["sample"] - sum(figures.get(n, 0.0) for n in (*NAMES, "shares"))
        return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--procs", type=int, nargs=2, default=[100, 2000])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument(
        "--busy",
        action="store_true",
        help="wake one process of every job before each sample: each job's CPU time moves, "
        "so the exporter reads its memory.stat every sample (the busy path)",
    )
    record.add_option(parser)
    args = parser.parse_args()
    record.start(args.results)
    cgroups = JobCgroups()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {n: measure(n, args.samples, cgroups, Path(tmp), args.busy) for n in args.procs}
    small, large = args.procs
    jobs = (large - small) / PER_JOB
    names = ["sample", "render", *NAMES, "shares", "other"]
    jobs_were = "every job woken before each sample" if args.busy else "jobs still"
    print(f"\nThread CPU, ms per sample (mean of {args.samples}, 1 s apart, {jobs_were})\n")
    print(
        "| part | "
        + " | ".join(f"{n} processes ({n // PER_JOB} jobs)" for n in args.procs)
        + " | one more job, us |"
    )
    print("|---|---|---|---|")
    for name in names:
        a, b = rows[small].get(name, 0.0), rows[large].get(name, 0.0)
        print(f"| {name} | {a:.3f} | {b:.3f} | {(b - a) / jobs * 1000:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
