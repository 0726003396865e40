"""How long flush() and stop() take on the seed's 8-rank job: the codecarbon script of
tests/test_codecarbon_dropin.py under a real `accelerate launch --num_processes 8` on the
live fake NVML, each rank timing its own three flush() calls and its stop(). Each call
takes a sample of its own (the 8 ranks call at once, after wait_for_everyone) and writes
its row before it returns; the target is 100 ms.

    python benchmarks/bench_flush.py [--runs 3] [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "benchmarks")]

import record  # noqa: E402
import test_codecarbon_dropin as dropin  # noqa: E402


def node(tmp: Path) -> dict[str, object]:
    """The test's node fixture, outside pytest."""
    return dropin.node.__wrapped__(tmp)  # type: ignore[attr-defined, no-any-return]


def one_run(tmp: Path) -> tuple[list[float], list[float], int]:
    """(every flush's seconds, every stop's seconds, extra samples the sampler took)."""
    setup = node(tmp)
    proc = dropin.launch(setup, tmp / "runs")
    stdout, stderr = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"the job failed ({proc.returncode}): {stderr[-2000:]}")
    ranks = dropin.results(stdout)
    if len(ranks) != dropin.GPUS:
        raise SystemExit(f"{len(ranks)} ranks answered: {stderr[-2000:]}")
    flushes = [f for r in ranks for f in r["flushes"]]
    stops = [r["stop_s"] for r in ranks]
    return flushes, stops, len(ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    record.add_option(parser)
    args = parser.parse_args()
    record.start(args.results)
    print("| run | ranks | flush() median | flush() max | stop() median | stop() max |")
    print("|---|---|---|---|---|---|")
    every_flush: list[float] = []
    every_stop: list[float] = []
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.monotonic()
            flushes, stops, ranks = one_run(Path(tmp))
            print(f"run {run}: {time.monotonic() - started:.0f} s", file=sys.stderr)
        every_flush += flushes
        every_stop += stops
        print(
            f"| {run} | {ranks} | {1000 * statistics.median(flushes):.0f} ms "
            f"| {1000 * max(flushes):.0f} ms | {1000 * statistics.median(stops):.0f} ms "
            f"| {1000 * max(stops):.0f} ms |"
        )
    print(
        f"| all | {len(every_stop)} | {1000 * statistics.median(every_flush):.0f} ms "
        f"| {1000 * max(every_flush):.0f} ms | {1000 * statistics.median(every_stop):.0f} ms "
        f"| {1000 * max(every_stop):.0f} ms |"
    )


if __name__ == "__main__":
    main()
