"""What "at the wall" adds to a job's figure: the recorded H200 trace on a modelled 8-GPU
node, split by the exporter's own platform policy (wattprint.attribution.platform), and
how a BMC's refresh and averaging move the figure. Prints Markdown; --results DIR also
appends it to DIR/<date>-<commit>.md (benchmarks/record.py). docs/accuracy.md, "The wall",
quotes it.

The node (a model, stated so that it can be argued with; the figures the issue cites for
NVIDIA's DGX H100: up to 10.2 kW, typically 6.5-8.5 kW, eight GPUs 5.6 kW at most, two
CPUs and memory about 1 kW):
- 8 GPUs, each drawing what the recorded H200 drew, in step (one data-parallel job);
- CPUs and memory: 400 W idle (no one's) plus 600 W x u, the job's while it holds the
  GPUs, u = the GPUs' load between idle (85 W) and full (690 W);
- the platform's own DC load: 800 W fixed (4 NVSwitches, 10 NICs, 2 DPUs, drives, BMC,
  board) plus fans from 150 W to 800 W with u;
- 6 power supplies of 3.3 kW sharing the load, with an 80 PLUS Titanium efficiency
  curve (90 % at 10 % load, 94 % at 20 %, 96 % at 50 %, 91 % at 100 %), linear between.
The node's input is the DC load over that efficiency; Wattprint's platform is the input
less the chips (GPUs, CPUs, memory): the platform's DC load plus every supply loss.

    PYTHONPATH=exporter python benchmarks/wall.py [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record
from accuracy import FIXTURES, Trace, load_trace
from wattprint.attribution.platform import PlatformBook
from wattprint.core.model import Workload

GPUS = 8
GPU_IDLE_W, GPU_FULL_W = 85.0, 690.0
CPU_IDLE_W, CPU_JOB_W = 400.0, 600.0
PLATFORM_FIXED_W, FANS_W = 800.0, (150.0, 800.0)
PSU_CAPACITY_W = 6 * 3300.0
TITANIUM = ((0.10, 0.90), (0.20, 0.94), (0.50, 0.96), (1.00, 0.91))
JOB = Workload("slurm", "job")
SAMPLE_S = 1.0  # the exporter's sample interval
UJ = 1_000_000


def efficiency(load: float) -> float:
    """The supplies' efficiency at a fraction of their capacity (flat outside 10-100 %)."""
    xs = [x for x, _ in TITANIUM]
    if load <= xs[0]:
        return TITANIUM[0][1]
    if load >= xs[-1]:
        return TITANIUM[-1][1]
    i = bisect.bisect_right(xs, load)
    (x0, y0), (x1, y1) = TITANIUM[i - 1], TITANIUM[i]
    return y0 + (y1 - y0) * (load - x0) / (x1 - x0)


@dataclass
class Interval:
    """One 100 ms interval of the trace on the modelled node (joules)."""

    t: float  # its end
    dt: float
    held: bool  # the job held the GPUs
    gpus: float
    cpu_idle: float
    cpu_job: float
    platform_dc: float
    node: float  # the input

    @property
    def chips(self) -> float:
        return self.gpus + self.cpu_idle + self.cpu_job

    @property
    def platform(self) -> float:
        return self.node - self.chips


def model(trace: Trace) -> list[Interval]:
    out = []
    for i in range(1, len(trace.t)):
        dt = trace.t[i] - trace.t[i - 1]
        gpu_w = (trace.energy[i] - trace.energy[i - 1]) / dt
        u = min(1.0, max(0.0, (gpu_w - GPU_IDLE_W) / (GPU_FULL_W - GPU_IDLE_W)))
        held = trace.job[i] > trace.job[i - 1]
        dc_w = GPUS * gpu_w + CPU_IDLE_W + CPU_JOB_W * u + PLATFORM_FIXED_W
        dc_w += FANS_W[0] + (FANS_W[1] - FANS_W[0]) * u
        node_w = dc_w / efficiency(dc_w / PSU_CAPACITY_W)
        out.append(
            Interval(
                trace.t[i], dt, held, GPUS * gpu_w * dt, CPU_IDLE_W * dt, CPU_JOB_W * u * dt,
                (PLATFORM_FIXED_W + FANS_W[0] + (FANS_W[1] - FANS_W[0]) * u) * dt, node_w * dt,
            )
        )  # fmt: skip
    return out


@dataclass
class Split:
    job_chips: float = 0.0
    job_platform: float = 0.0
    idle_platform: float = 0.0
    held_out: float = 0.0  # the components' energy no node reading covered by the end

    @property
    def job_wall(self) -> float:
        return self.job_chips + self.job_platform


def ticks(intervals: Sequence[Interval], tick: float) -> list[list[Interval]]:
    """The trace's intervals grouped into the sampler's (every `tick` s)."""
    out: list[list[Interval]] = [[]]
    start = intervals[0].t - intervals[0].dt
    for iv in intervals:
        if iv.t - start > tick + 1e-6 and out[-1]:
            out.append([])
            start = out[-2][-1].t
        out[-1].append(iv)
    return out


def split(groups: Sequence[Sequence[Interval]], node: Sequence[float] | None = None) -> Split:
    """The job's chips and platform share, sample by sample, with the exporter's own
    PlatformBook (a node reading short of the components is carried, never invented);
    `node[k]`: the node's energy over sample k as read (default: the truth)."""
    out, book = Split(), PlatformBook()
    for k, group in enumerate(groups):
        chips = sum(iv.chips for iv in group)
        job = sum(iv.gpus + iv.cpu_job for iv in group if iv.held)
        read = node[k] if node is not None else sum(iv.node for iv in group)
        rest = book.close(round(read * UJ), round(chips * UJ))
        parts = book.attribute(rest, {JOB: round(job * UJ), None: round((chips - job) * UJ)})
        out.job_chips += job
        out.job_platform += parts.get(JOB, 0) / UJ
        out.idle_platform += parts.get(None, 0) / UJ
    out.held_out = book.held_uj / UJ
    return out


def bmc(groups: Sequence[Sequence[Interval]], refresh: float, average: float) -> list[float]:
    """The node's energy per sample as the exporter integrates a BMC's power reading: the
    BMC refreshes every `refresh` s with the mean power of the last `average` s; the
    sampler books the reading it gets at each sample times the sample's length."""
    intervals = [iv for group in groups for iv in group]
    t0 = intervals[0].t - intervals[0].dt
    ends = [iv.t for iv in intervals]
    cumulative = [0.0]
    for iv in intervals:
        cumulative.append(cumulative[-1] + iv.node)

    def energy_until(t: float) -> float:  # the true input energy from t0 to t
        if t <= t0:
            return 0.0
        i = min(bisect.bisect_left(ends, t), len(intervals) - 1)
        begun = intervals[i].t - intervals[i].dt
        return cumulative[i] + intervals[i].node * min(1.0, max(0.0, (t - begun) / intervals[i].dt))

    booked = []
    for group in groups:
        end = group[-1].t
        # The BMC's refreshes fall half a period off the sampler's (they are unrelated).
        phase = refresh / 2
        refreshed = t0 + phase + refresh * math.floor((end - t0 - phase) / refresh)
        span = min(average, max(0.0, refreshed - t0))
        watts = (
            (energy_until(refreshed) - energy_until(refreshed - span)) / span
            if span > 0
            else intervals[0].node / intervals[0].dt
        )
        booked.append(watts * sum(iv.dt for iv in group))
    return booked


def pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, default=FIXTURES / "phased-load.jsonl")
    record.add_option(parser)
    args = parser.parse_args()
    record.start(args.results)
    intervals = model(load_trace(args.trace))
    node = sum(iv.node for iv in intervals)
    chips = sum(iv.chips for iv in intervals)
    dc = sum(iv.platform_dc for iv in intervals)
    seconds = sum(iv.dt for iv in intervals)
    samples = ticks(intervals, SAMPLE_S)
    truth = split(samples)

    print(f"# The wall: the recorded H200 trace ({args.trace.name}) on a modelled 8-GPU node\n")
    print(
        f"{seconds:.1f} s, {len(intervals)} intervals of the trace; "
        "the model: benchmarks/wall.py.\n"
    )
    print("| | energy (kJ) | mean power (W) | of the node's input |")
    print("|---|---|---|---|")
    for name, joules in (
        ("node input (at the wall)", node),
        ("chips: 8 GPUs + CPUs + memory", chips),
        ("platform (Wattprint: input - chips)", node - chips),
        ("- of which the platform's DC load", dc),
        ("- of which the supplies' losses", node - chips - dc),
    ):
        print(
            f"| {name} | {joules / 1000:.1f} | {joules / seconds:.0f} | "
            f"{joules / node * 100:.1f} % |"
        )
    print("\nThe job (it holds the 8 GPUs from its first kernel to the trace's end):\n")
    print("| | energy (kJ) |")
    print("|---|---|")
    print(f"| chips (what Wattprint counted before the platform) | {truth.job_chips / 1000:.1f} |")
    print(f"| its platform share | {truth.job_platform / 1000:.1f} |")
    print(f"| at the wall | {truth.job_wall / 1000:.1f} |")
    print(f"| platform left unattributed (the idle share) | {truth.idle_platform / 1000:.1f} |")
    print(
        f"\nAt the wall the job's figure is {pct(truth.job_wall / truth.job_chips - 1)} over its "
        f"chips; its chips are {truth.job_chips / truth.job_wall * 100:.1f} % of its wall figure, "
        f"and its wall figure {truth.job_wall / node * 100:.1f} % of the node's input over "
        "the trace.\n"
    )
    print("Per phase of the trace:\n")
    print("| phase | node input (W) | platform of input | job: wall over chips |")
    print("|---|---|---|---|")
    trace = load_trace(args.trace)
    for phase in trace.phases:
        part = [iv for iv in intervals if phase["start"] < iv.t <= phase["end"]]
        if not part:
            continue
        s, n = split(ticks(part, SAMPLE_S)), sum(iv.node for iv in part)
        ratio = pct(s.job_wall / s.job_chips - 1) if s.job_chips > 0 else "no job"
        platform = sum(iv.platform for iv in part) / n * 100
        print(
            f"| {phase['name']} | {n / sum(iv.dt for iv in part):.0f} | {platform:.1f} % | "
            f"{ratio} |"
        )

    print(
        f"\nThe node's input as the exporter reads it (a sample every {SAMPLE_S:g} s; a power "
        "reading is integrated over the samples, `estimated`):\n"
    )
    print(
        "| node reading | node energy over the trace | the job's wall figure | its platform share |"
    )
    print("|---|---|---|---|")
    rows: list[tuple[str, list[float]]] = [
        (
            "an energy counter (pm_counters, Redfish EnergykWh)",
            [sum(iv.node for iv in g) for g in samples],
        ),
        ("power, refreshed every 1 s, 1 s average", bmc(samples, 1.0, 1.0)),
        ("power, refreshed every 5 s, 5 s average", bmc(samples, 5.0, 5.0)),
        ("power, refreshed every 5 s, 30 s average", bmc(samples, 5.0, 30.0)),
    ]
    for gain in (0.98, 1.02, 0.95, 1.05):
        rows.append(
            (
                f"a sensor {pct(gain - 1)} off (BMC accuracy)",
                [sum(iv.node for iv in g) * gain for g in samples],
            )
        )
    for name, booked in rows:
        s = split(samples, booked)
        print(
            f"| {name} | {pct(sum(booked) / node - 1)} | {pct(s.job_wall / truth.job_wall - 1)} | "
            f"{pct(s.job_platform / truth.job_platform - 1)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
