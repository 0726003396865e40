"""A job's energy at the wall: its chips (GPUs, CPUs, memory: the job report's energy
and codecarbon's energy_consumed) plus, where a platform source reads the node's input,
its share of the rest of the server (component="platform": NICs, fans, the power
supplies' losses). Kept beside the chips, never added into them; without a platform
source the wall is "not measured", never the chips' figure under another name."""

from __future__ import annotations

from wattprint.jobs.meter import series_of
from wattprint.jobs.reading import Reading, same_exporter
from wattprint.jobs.trackfiles import energy_text
from wattprint.report.jobs import JobReport

PLATFORM = ("platform", "node")  # the rest of the server's device (sampler/platform.py)


def platform_share(
    start: Reading, end: Reading, workload: str | None, pod: str | None
) -> float | None:
    """The job's platform energy between the readings (J); None: no platform source."""
    if PLATFORM not in end.devices:
        return None
    mine = series_of(workload, pod)
    total = 0.0
    for key, (after, _) in end.series.items():
        if key[0] != "platform" or not mine(key):
            continue
        before = start.series.get(key, (0.0, 0.0))[0]
        if after < before:  # held (one exporter): nothing since; restarted: all since
            before = before if same_exporter(start, end) else 0.0
            after = max(after, before)
        total += after - before
    return total


def wall_fields(
    job: JobReport, start: Reading, end: Reading, workload: str | None, pod: str | None = None
) -> dict[str, float | None]:
    """The job file's "platform_energy_j" and "wall_energy_j" (null: not measured)."""
    share = platform_share(start, end, workload, pod)
    wall = None if share is None else job.energy_j + share
    return {"platform_energy_j": share, "wall_energy_j": wall}


def wall_text(fields: dict[str, float | None], chips: float) -> str:
    """The summary's line: at the wall, or why not."""
    wall, share = fields["wall_energy_j"], fields["platform_energy_j"]
    if wall is None or share is None:
        return "wall: not measured (no platform source reads this node's input): chips only"
    return (
        f"at the wall: {energy_text(wall)} (chips {energy_text(chips)} + the rest of "
        f"the server {energy_text(share)})"
    )
