"""What measuring a job costs: `wattprint run -- JOB` against codecarbon's
EmissionsTracker around the same job, side by side in each round.

Every round starts three copies of a job that sleeps --seconds (so that what the
processes use is the measuring, not the job) at the same moment:
  bare        python job.py                       (the baseline)
  codecarbon  python job.py --codecarbon          (OfflineEmissionsTracker around it)
  wattprint   wattprint run -- python job.py      (our own process, and the job)
and reads each one's CPU time from wait4() (the process and the children it waited
for) and its peak RSS from /proc every 0.2 s. The cost of measuring is the CPU time
above the bare job's, as a share of one core over the job's wall time; memory is the
tracker's own: codecarbon's is inside the job's process (its RSS above the bare
job's), Wattprint's is its own process (its whole RSS).

    python benchmarks/bench_run.py --seconds 60 --runs 3

Needs codecarbon (`pip install codecarbon`, in the test extra). Both use their
defaults (Wattprint samples every 1 s, codecarbon every 15 s) and whatever this
machine has (no GPU here: CPU and memory modelled by both).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

JOB = """
import sys, time
seconds = float(sys.argv[1])
tracker = None
if "--codecarbon" in sys.argv:
    from codecarbon import OfflineEmissionsTracker
    tracker = OfflineEmissionsTracker(
        country_iso_code="DEU", output_dir=sys.argv[2], log_level="error", save_to_file=True
    )
    tracker.start()
time.sleep(seconds)
if tracker is not None:
    tracker.stop()
"""


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Run:
    """One process: its CPU seconds (with its reaped children) and peak RSS (its own)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.started = time.monotonic()
        self.peak_kb = 0
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.status = 0
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        pid = self.proc.pid
        while True:
            self.peak_kb = max(self.peak_kb, _rss_kb(pid))
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                self.wall_s = time.monotonic() - self.started
                self.cpu_s = usage.ru_utime + usage.ru_stime
                self.status = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.status
                return
            time.sleep(0.2)

    def join(self) -> Run:
        self._thread.join()
        if self.status != 0:
            assert self.proc.stderr is not None
            sys.exit(f"{self.proc.args} failed ({self.status}): {self.proc.stderr.read()!r}")
        return self


def one_round(seconds: float, tmp: Path) -> dict[str, Run]:
    job = tmp / "job.py"
    job.write_text(JOB)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO / "exporter"),
        WATTPRINT_STATE_FILE=str(tmp / "state" / "state.json"),
        WATTPRINT_CARBON_ZONE="DE",
    )
    for name in ("cc", "wp"):
        (tmp / name).mkdir(exist_ok=True)
    py, s = sys.executable, str(seconds)
    runs = {
        "bare": Run([py, str(job), s], env),
        "codecarbon": Run([py, str(job), s, str(tmp / "cc"), "--codecarbon"], env),
        "wattprint": Run(
            [py, "-m", "wattprint", "run", f"--output.dir={tmp / 'wp'}", "--", py, str(job), s],
            env,
        ),
    }
    return {name: run.join() for name, run in runs.items()}


def spread(values: list[float], fmt: str) -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the job's length")
    parser.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args()
    try:
        import codecarbon
    except ImportError:
        sys.exit("bench_run.py needs codecarbon: pip install codecarbon")
    cpu: dict[str, list[float]] = {"codecarbon": [], "wattprint": []}
    rss: dict[str, list[float]] = {"codecarbon": [], "wattprint": []}
    wall: dict[str, list[float]] = {"codecarbon": [], "wattprint": []}
    for k in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
            runs = one_round(args.seconds, Path(tmp))
        bare = runs["bare"]
        for name in cpu:
            extra = max(0.0, runs[name].cpu_s - bare.cpu_s)
            cpu[name].append(100 * extra / runs[name].wall_s)
            wall[name].append(runs[name].wall_s - bare.wall_s)
        rss["codecarbon"].append((runs["codecarbon"].peak_kb - bare.peak_kb) / 1024)
        rss["wattprint"].append(runs["wattprint"].peak_kb / 1024)
        print(
            f"round {k + 1}: bare {bare.cpu_s:.2f} s CPU {bare.peak_kb / 1024:.0f} MB; "
            + "; ".join(
                f"{n} {runs[n].cpu_s:.2f} s CPU {runs[n].peak_kb / 1024:.0f} MB "
                f"over {runs[n].wall_s:.1f} s"
                for n in cpu
            ),
            file=sys.stderr,
        )
    print(
        f"\nA {args.seconds:.0f} s job, {args.runs} rounds (min / median / max); "
        f"codecarbon {codecarbon.__version__}\n"
    )
    print(
        "| tracker | CPU above the bare job, % of one core | tracker's memory, MB "
        "| wall time added (start + report), s |"
    )
    print("|---|---|---|---|")
    for name in cpu:
        print(
            f"| {name} | {spread(cpu[name], '{:.2f}')} | {spread(rss[name], '{:.0f}')} "
            f"| {spread(wall[name], '{:.1f}')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
