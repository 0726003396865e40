"""No run is lost to the node sampler's idle exit (issue 45, item 5): short tracker
processes started back to back, at gaps straddling the sampler's idle time (shortened
here through WATTPRINT_SAMPLER_IDLE_EXIT_S), all write their rows.
benchmarks/bench_trackers_idle.py runs 30 at the default idle time of 5 s."""

from __future__ import annotations

import csv
import time

from .jobnode import JobNode, job_node

__all__ = ["job_node"]

IDLE_S = 0.5
# Around the idle time and the sampler's check (every idle/2): before, at, just after
# and well after its exit.
GAPS_S = (0.0, 0.3, 0.45, 0.5, 0.55, 0.7, 1.0, 1.6)

SHORT = """
from wattprint import EmissionsTracker
tracker = EmissionsTracker(project_name="short", output_dir=sys.argv[1],
                           output_file="rows.csv")
tracker.start()
tracker.stop()
"""


def test_back_to_back_trackers_straddling_the_idle_exit_all_write_their_rows(
    job_node: JobNode,
) -> None:
    job_node.env["WATTPRINT_SAMPLER_IDLE_EXIT_S"] = str(IDLE_S)
    lost = []
    runs = 2 * len(GAPS_S)
    for i in range(runs):
        proc = job_node.python(SHORT, str(job_node.out))
        _, stderr = proc.communicate(timeout=90)
        if proc.returncode != 0 or "not tracking" in stderr or "Traceback" in stderr:
            lost.append((i, stderr.strip()[-300:]))
        time.sleep(GAPS_S[i % len(GAPS_S)])
    assert lost == []
    rows = list(csv.DictReader((job_node.out / "rows.csv").open()))
    assert len(rows) == runs
