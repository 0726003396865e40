"""No run lost to the node sampler's idle exit (issue 45): N short tracker processes
started back to back, each GAP seconds after the one before ended, the gaps straddling
the sampler's idle time (5 s by default), on the live fake NVML of the tests. Prints how
many wrote their row and how many said `not tracking`.

    python benchmarks/bench_trackers_idle.py --trackers 30 --gaps 4.5,4.8,5.0,5.2,5.5,6.0
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

SHORT = """
import sys
from wattprint import EmissionsTracker
tracker = EmissionsTracker(project_name="short", output_dir=sys.argv[1], output_file="rows.csv")
tracker.start()
tracker.stop()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trackers", type=int, default=30)
    parser.add_argument("--gaps", default="4.5,4.8,5.0,5.2,5.5,6.0", help="seconds, cycled")
    args = parser.parse_args()
    gaps = [float(g) for g in args.gaps.split(",")]
    package = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or str(REPO / "exporter")
    with tempfile.TemporaryDirectory() as tmp:
        nvml = Path(tmp) / "nvml"
        nvml.mkdir()
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(TESTS / "livefake"), package]),
            WATTPRINT_TEST_NVML_DIR=str(nvml),
            WATTPRINT_TEST_NVML_T0=str(time.time()),
            WATTPRINT_STATE_FILE=f"{tmp}/state/state.json",
            WATTPRINT_GPU_SOURCE="nvml",
            WATTPRINT_CPU_SOURCE="model",
            WATTPRINT_MEMORY_SOURCE="model",
            WATTPRINT_SAMPLE_INTERVAL="100ms",
            WATTPRINT_CARBON_ZONE="DE",
        )
        lost = 0
        began = time.monotonic()
        for i in range(args.trackers):
            proc = subprocess.run(
                [sys.executable, "-c", SHORT, f"{tmp}/out"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if proc.returncode != 0 or "not tracking" in proc.stderr:
                lost += 1
                print(f"tracker {i}: {proc.stderr.strip()[-200:]}", file=sys.stderr)
            time.sleep(gaps[i % len(gaps)])
        rows_path = Path(tmp) / "out" / "rows.csv"
        rows = len(list(csv.DictReader(rows_path.open()))) if rows_path.exists() else 0
    print("| trackers | gaps (s) | rows written | not tracking | took (s) |")
    print("|---|---|---|---|---|")
    took = time.monotonic() - began
    print(f"| {args.trackers} | {args.gaps} | {rows} | {lost} | {took:.0f} |")


if __name__ == "__main__":
    main()
