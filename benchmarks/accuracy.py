"""Accuracy of Wattprint's energy against the GPU's hardware energy counter.

Replays the recorded H200 trace (tests/fixtures/h200/phased-load.jsonl) through the real
exporter into a real Prometheus (scrape and rule evaluation every 1 s, rules/ loaded)
and compares, for the job's whole life and for every 1-minute window of trace time:

  Wattprint      increase() of the joule counters asked from Prometheus, the
                 recording rules' increase1h series, and the job counter's last value;
                 the same counters scraped every 15 s / 30 s (offline: Prometheus 2.42's
                 increase() applied to what such scrapes would see, checked against the
                 live server on the 1 s scrapes)
  watts gauge    avg_over_time(power[w]) * w, the common practice, from the trace's
                 power readings sampled as 1 s / 15 s / 30 s scrapes at 10 phase offsets
                 (exactly what a scraper of wattprint_gpu_power_watts sees)
  codecarbon     one tracker per process, summed, and one tracker in the parent
                 (tests/fixtures/h200/codecarbon-4-processes: a separate recorded run)

against the truth: the trace's NVML energy counter (energy_mj), read every 100 ms.
Prints the tables (Markdown) and, with --plot, draws the chart.

    python benchmarks/accuracy.py [--runs 3] [--speed 1] [--plot docs/accuracy.png]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "h200"
WINDOW_S = 60.0
STAMPED = "sample timestamps"
UNSTAMPED = "scrape-time timestamps"
WINDOW_STEP_S = 0.5
PHASES = 10
JOULES_PER_KWH = 3.6e6


# -- the truth: the recorded trace -------------------------------------------------------


@dataclass
class Trace:
    """One GPU's samples; energies in joules since the first sample."""

    t: list[float]
    energy: list[float]
    power: list[float]
    job: list[float]  # cumulative energy of the intervals the workload held the GPU
    workload: str
    job_start: float  # start of the first interval the workload held the GPU
    phases: list[dict[str, Any]]  # from the trace's header

    @property
    def start(self) -> float:
        return self.t[0]

    @property
    def end(self) -> float:
        return self.t[-1]

    def at(self, series: Sequence[float], t: float) -> float:
        """The counter at trace time t; linear between 100 ms samples."""
        if t <= self.t[0]:
            return series[0]
        if t >= self.t[-1]:
            return series[-1]
        i = bisect.bisect_right(self.t, t) - 1
        frac = (t - self.t[i]) / (self.t[i + 1] - self.t[i])
        return series[i] + frac * (series[i + 1] - series[i])

    def held(self, series: Sequence[float], t: float) -> float:
        """What the exporter shows at trace time t: the last sample applied."""
        return series[max(bisect.bisect_right(self.t, t) - 1, 0)]

    def index_of_energy(self, joules: float) -> int:
        i = bisect.bisect_left(self.energy, joules - 1e-3)
        if i >= len(self.energy) or abs(self.energy[i] - joules) > 1e-3:
            raise ValueError(f"{joules} J is not a counter value of the trace")
        return i


def load_trace(path: Path) -> Trace:
    header, *lines = path.read_text().splitlines()
    samples = [json.loads(line)["gpus"] for line in lines if line.strip()]
    times = [json.loads(line)["t"] for line in lines if line.strip()]
    if any(len(gpus) != 1 for gpus in samples):
        raise SystemExit("this benchmark expects a one-GPU trace")
    gpus = [g[0] for g in samples]
    workloads = {
        p["identity"]["workload"] for g in gpus for p in g["processes"] if p.get("identity")
    }
    if len(workloads) != 1:
        raise SystemExit(f"this benchmark expects one workload in the trace, found {workloads}")
    (workload,) = workloads
    base = gpus[0]["energy_mj"]
    energy = [(g["energy_mj"] - base) / 1000 for g in gpus]
    job = [0.0]
    job_start = None
    for i in range(1, len(gpus)):
        holds = any(p.get("identity") for p in gpus[i]["processes"])
        # The state in a sample applies to the interval that ends at it.
        job.append(job[-1] + (energy[i] - energy[i - 1] if holds else 0.0))
        if holds and job_start is None:
            job_start = times[i - 1]
    if job_start is None:
        raise SystemExit("the workload never holds the GPU")
    power = [g["power_mw"] / 1000 for g in gpus]
    phases = list(json.loads(header).get("phases", []))
    return Trace(times, energy, power, job, workload, job_start, phases)


# -- windows and errors --------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


def minute_windows(trace: Trace) -> list[Window]:
    """Every 60 s window of trace time, starting every WINDOW_STEP_S."""
    out = []
    start = trace.start
    while start + WINDOW_S <= trace.end + 1e-9:
        out.append(Window(start, start + WINDOW_S))
        start += WINDOW_STEP_S
    return out


def error_pct(measured: float, truth: float) -> float:
    return (measured / truth - 1) * 100


@dataclass
class Result:
    """Errors (%) of one method against the hardware counter."""

    method: str
    scrape: str
    job: list[float] = field(default_factory=list)  # the job's whole life (or the run)
    windows: list[float] = field(default_factory=list)  # fixed 1-minute windows
    between: list[float] = field(default_factory=list)  # >= 1 min, from a scrape to a scrape
    note: str = ""

    def worst(self, values: Sequence[float]) -> float:
        return max((abs(v) for v in values), default=float("nan"))


def span(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    if abs(hi - lo) < 0.005:
        return f"{lo:+.2f} %"
    return f"{lo:+.2f} .. {hi:+.2f} %"


# -- Prometheus semantics, offline ---------------------------------------------------------


def prom_increase(samples: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """increase() as Prometheus 2.42 computes it (extrapolatedRate, range [start, end])."""
    pts = [(t, v) for t, v in samples if start <= t <= end]
    if len(pts) < 2:
        return None
    result = pts[-1][1] - pts[0][1]
    previous = 0.0
    for _, v in pts:
        if v < previous:
            result += previous
        previous = v
    to_start = pts[0][0] - start
    to_end = end - pts[-1][0]
    sampled = pts[-1][0] - pts[0][0]
    average = sampled / (len(pts) - 1)
    if result > 0 and pts[0][1] >= 0:
        to_start = min(to_start, sampled * pts[0][1] / result)
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    return result * interval / sampled


def scrape_times(trace: Trace, every: float, phase: float) -> list[float]:
    """Scrapes from the trace's start until one after its end (the exporter holds)."""
    out = [trace.start + phase]
    while out[-1] < trace.end:
        out.append(out[-1] + every)
    return out


def spans_of_a_minute(times: Sequence[float]) -> Iterator[tuple[int, int]]:
    """(i, j) for every pair of scrapes at least WINDOW_S apart."""
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            if times[j] - times[i] >= WINDOW_S - 1e-9:
                yield i, j


def counter_between(
    trace: Trace, series: Sequence[float], points: Sequence[tuple[float, float]]
) -> list[float]:
    """Counter deltas between two scrapes (trace time, value) against the truth."""
    times = [t for t, _ in points]
    return [
        error_pct(
            points[j][1] - points[i][1], trace.at(series, times[j]) - trace.at(series, times[i])
        )
        for i, j in spans_of_a_minute(times)
    ]


def offline_results(trace: Trace, windows: list[Window], sampler: float) -> list[Result]:
    """What a scraper of the exporter sees at 15 s / 30 s (and the gauge at 1 s).

    A scrape reads the exporter's last sample: the trace as it was at the sampler's
    last tick, whose phase against the scrapes differs from one phase offset to the next.
    With sample timestamps (the default) Prometheus files that value under the tick's
    time; without, under the scrape's. A new series is first served at 0: stamped, at
    the tick before its first energy; unstamped, at its first scrape.
    """
    job = Window(trace.job_start, trace.end)

    def job_truth(w: Window) -> float:
        return trace.at(trace.job, w.end) - trace.at(trace.job, w.start)

    def gpu_truth(w: Window) -> float:
        return trace.at(trace.energy, w.end) - trace.at(trace.energy, w.start)

    out = []
    for every in (1.0, 15.0, 30.0):
        scrape = f"{every:g} s, {PHASES} phases"
        stamped = Result("Wattprint job counter, increase()", scrape, note=STAMPED)
        unstamped = Result("Wattprint job counter, increase()", scrape, note=UNSTAMPED)
        last = Result("Wattprint job counter, last value", scrape)
        windowed = Result(
            "wattprint report --since --until (ends interpolated)", scrape, note=STAMPED
        )
        gauge = Result("GPU watts gauge, avg_over_time x window", scrape)
        for k in range(PHASES):
            times = scrape_times(trace, every, every * k / PHASES)
            tick = sampler * ((k * 0.618034) % 1)  # spreads the sampler's phase over [0, 1)

            def last_tick(s: float, tick: float = tick) -> float:
                return trace.start + tick + (s - trace.start - tick) // sampler * sampler

            def exported(series: Sequence[float], s: float) -> float:
                return trace.held(series, last_tick(s))

            after = times[-1]
            seen_at = [s for s in times if exported(trace.job, s) > 0]
            born = last_tick(seen_at[0]) - sampler
            while trace.held(trace.job, born) > 0:  # the tick before its first energy
                born -= sampler
            for counter, seen in (
                (
                    stamped,
                    [(born, 0.0)] + [(last_tick(s), exported(trace.job, s)) for s in seen_at],
                ),
                (
                    unstamped,
                    [(seen_at[0], 0.0)] + [(s, exported(trace.job, s)) for s in seen_at[1:]],
                ),
            ):
                seen = sorted(dict(seen).items())  # one sample per timestamp, as Prometheus
                got = prom_increase(seen, after - (after - job.start + every), after)
                if got is not None:
                    counter.job.append(error_pct(got, job_truth(job)))
                for w in windows:
                    got = prom_increase(seen, w.start, w.end)
                    if got is not None:
                        counter.windows.append(error_pct(got, job_truth(w)))
                counter.between += counter_between(trace, trace.job, seen)
                if counter is stamped:
                    for w in windows:
                        got = interpolated(seen, w.end) - interpolated(seen, w.start)
                        windowed.windows.append(error_pct(got, job_truth(w)))
            last.job.append(error_pct(exported(trace.job, after), job_truth(job)))

            watts = [(s, exported(trace.power, s)) for s in times]
            for w, sink in [(job, gauge.job)] + [(w, gauge.windows) for w in windows]:
                inside = [p for s, p in watts if w.start < s <= w.end]
                if inside:
                    sink.append(error_pct(sum(inside) / len(inside) * w.length, gpu_truth(w)))
            for i, j in spans_of_a_minute(times):
                joules = sum(p for _, p in watts[i + 1 : j + 1]) * every
                gauge.between.append(error_pct(joules, gpu_truth(Window(times[i], times[j]))))
        out += [stamped, unstamped, last, windowed, gauge] if every > 1 else [gauge]
    return out


def interpolated(samples: Sequence[tuple[float, float]], t: float) -> float:
    """What wattprint report reads at t: linear between the samples around it."""
    times = [s for s, _ in samples]
    i = bisect.bisect_right(times, t)
    if i == 0:
        return 0.0  # before the series' first sample (its stamped 0): nothing yet
    if i == len(samples):
        return samples[-1][1]
    (t0, v0), (t1, v1) = samples[i - 1], samples[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def codecarbon_results(folder: Path) -> list[Result]:
    truth = json.loads((folder / "cc_truth.json").read_text())

    def gpu_joules(name: str) -> float:
        with open(folder / name, newline="") as handle:
            return sum(float(row["gpu_energy"]) * JOULES_PER_KWH for row in csv.DictReader(handle))

    ranks = sorted(p.name for p in folder.glob("cc_per_process_*.csv"))
    summed = sum(gpu_joules(name) for name in ranks)
    parent = gpu_joules("cc_single_parent.csv")
    per_process = truth["per_process"]["gpu_counter_delta_j"]
    single = truth["single_parent"]["gpu_counter_delta_j"]
    return [
        Result(
            f"codecarbon, one tracker per process, {len(ranks)} summed",
            "1 s power poll",
            [error_pct(summed, per_process)],
            note=f"{summed / 1000:.2f} kJ vs {per_process / 1000:.2f} kJ, separate run",
        ),
        Result(
            "codecarbon, one tracker in the parent",
            "1 s power poll",
            [error_pct(parent, single)],
            note=f"{parent / 1000:.2f} kJ vs {single / 1000:.2f} kJ, separate run",
        ),
    ]


# -- the live run --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def rule_files(folder: Path) -> list[Path]:
    """Rule files (not promtool tests) under folder."""
    out = []
    for path in sorted(folder.glob("*.y*ml")):
        doc = yaml.safe_load(path.read_text())
        if isinstance(doc, dict) and "groups" in doc:
            out.append(path)
    return out


@contextmanager
def running(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Prom:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: Any) -> Any:
        reply = requests.get(self.url + path, params=params, timeout=10)
        body = reply.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('error', reply.text)}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query", query=expr, time=f"{at:.3f}")["result"])

    def scalar(self, expr: str, at: float) -> float | None:
        result = self.query(expr, at)
        if len(result) > 1:
            raise RuntimeError(f"{expr}: {len(result)} series, expected one")
        return float(result[0]["value"][1]) if result else None

    def raw(self, selector: str, at: float) -> list[tuple[float, float]]:
        result = self.query(f"{selector}[10m]", at)
        if len(result) != 1:
            raise RuntimeError(f"{selector}: {len(result)} series, expected one")
        return [(float(t), float(v)) for t, v in result[0]["values"]]


@dataclass
class Live:
    results: list[Result]
    scrapes: int
    start_uncertainty_s: float
    read_lag_s: float  # median time from the sampler's read to the scrape
    emulation_gap_pct: float
    rule_files: list[str]
    rule_errors: list[str]


def live_run(
    trace: Trace, windows: list[Window], args: argparse.Namespace, stamped: bool, phase: float
) -> Live:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus is not installed (Debian package prometheus)")
    rules = rule_files(ROOT / "rules")
    with tempfile.TemporaryDirectory(prefix="wattprint-accuracy-") as tmp:
        work = Path(tmp)
        prom_port, exporter_port = free_port(), free_port()
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(p) for p in rules],
            "scrape_configs": [
                {
                    "job_name": "wattprint",
                    "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
                }
            ],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = Prom(f"http://127.0.0.1:{prom_port}")
        server = [
            prometheus,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        exporter = [
            sys.executable,
            "-m",
            "wattprint",
            f"--web.listen-address=127.0.0.1:{exporter_port}",
            "--gpu.source=replay",
            f"--gpu.replay-file={args.trace}",
            f"--replay.speed={args.speed:g}",
            "--carbon.zone=DE",
            f"--sample.interval={round(args.sampler * 1000)}ms",
            "--cpu.source=model",
            "--memory.source=model",
            f"--sample.timestamps={'true' if stamped else 'false'}",
        ]
        with running(server, work / "prometheus.log"):
            wait_for("Prometheus", lambda: requests.get(prom.url + "/-/ready", timeout=1).ok, 30)

            # Start the exporter only once the scrape loop runs, so that the first
            # seconds of the trace are scraped too.
            def scraping() -> bool:
                targets = prom.get("/api/v1/targets")["activeTargets"]
                return bool(targets) and not targets[0]["lastScrape"].startswith("0001")

            wait_for("the first scrape attempt", scraping, 30)
            # Each run starts the sampler at another phase of the scrapes: the age of
            # the sample a scrape serves runs from 0 to one sample interval.
            time.sleep(phase * args.sampler)
            with running(exporter, work / "exporter.log") as proc:
                wall_s = (trace.end - trace.start) / args.speed
                time.sleep(wall_s + 4)
                if proc.poll() is not None:
                    raise SystemExit(f"the exporter exited: {(work / 'exporter.log').read_text()}")
                now = time.time()
                counter = prom.raw("wattprint_gpu_energy_joules_total", now)
                # Unstamped, at the scrape's time: the time of the read the scrape served.
                reads = prom.raw("wattprint_sampler_last_success_timestamp_seconds", now)
                stamps = {ts: ts for ts, _ in counter} if stamped else dict(reads)
                start, uncertainty = replay_start(trace, counter, stamps, args.speed)
                live, checked = measure(prom, trace, windows, start, args.speed, now, stamped)
                groups = prom.get("/api/v1/rules")["groups"]
                rule_errors = [
                    f"{r['name']}: {r.get('lastError')}"
                    for g in groups
                    for r in g["rules"]
                    if r.get("health") not in ("ok", None) and r.get("type") == "recording"
                ]
        lag = statistics.median(ts - read for ts, read in reads)
        return Live(
            live,
            len(counter),
            uncertainty,
            lag,
            checked,
            [str(p.relative_to(ROOT)) for p in rules],
            rule_errors,
        )


def replay_start(
    trace: Trace,
    counter: list[tuple[float, float]],
    stamps: dict[float, float],
    speed: float,
) -> tuple[float, float]:
    """Wall time at which the exporter's replay began, from what Prometheus scraped.

    Each scrape shows the counter of the last trace sample applied and the wall time of
    the sampler read that applied it, so t_i <= t0 + (read - start) * speed < t_i+1;
    intersecting these over all scrapes pins the start to a few milliseconds.
    """
    lo, hi = -float("inf"), float("inf")
    for ts, value in counter:
        read = stamps.get(ts)
        if read is None:
            continue
        i = trace.index_of_energy(value)
        hi = min(hi, read - (trace.t[i] - trace.start) / speed)
        if i + 1 < len(trace.t):
            lo = max(lo, read - (trace.t[i + 1] - trace.start) / speed)
    # Stamped samples are filed to the millisecond, and stamped just after the read:
    # the bounds may cross by that much.
    if lo - hi > 0.005:
        raise RuntimeError(
            f"the scraped counters do not fit the trace's timeline ({(lo - hi) * 1000:.1f} ms)"
        )
    return (lo + hi) / 2, abs(hi - lo)


def range_ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def measure(
    prom: Prom,
    trace: Trace,
    windows: list[Window],
    start: float,
    speed: float,
    now: float,
    stamped: bool,
) -> tuple[list[Result], float]:
    """The live results, and the largest gap (%) between prom_increase() and the server."""
    job_sel = (
        f'wattprint_workload_energy_joules_total{{component="gpu",workload="{trace.workload}"}}'
    )
    gpu_sel = "wattprint_gpu_energy_joules_total"
    job = Window(trace.job_start, trace.end)
    run = Window(trace.start, trace.end)

    def wall(t: float) -> float:
        return round(start + (t - trace.start) / speed, 3)

    after = wall(trace.end) + 2.5  # the last scrape and rule evaluation are in

    def job_truth(w: Window) -> float:
        return trace.at(trace.job, w.end) - trace.at(trace.job, w.start)

    def gpu_truth(w: Window) -> float:
        return trace.at(trace.energy, w.end) - trace.at(trace.energy, w.start)

    scrape = f"1 s (= {speed:g} s of trace)"
    mode = STAMPED if stamped else UNSTAMPED
    out = []
    gap = 0.0
    for name, selector, series, truth, whole in (
        ("Wattprint job counter, increase()", job_sel, trace.job, job_truth, job),
        ("Wattprint GPU counter, increase()", gpu_sel, trace.energy, gpu_truth, run),
    ):
        r = Result(name, scrape, note=mode if series is trace.job else f"{mode}; against the GPU")
        samples = prom.raw(selector, now)
        # The whole job: a range that holds all of it, as a report over its life asks.
        got = prom.scalar(f"increase({selector}[{range_ms(whole.length / speed + 5)}])", after)
        if got is not None:
            r.job.append(error_pct(got, truth(whole)))
        for w in windows:
            length = round(w.length / speed, 3)
            got = prom.scalar(f"increase({selector}[{range_ms(length)}])", wall(w.end))
            if got is not None:
                r.windows.append(error_pct(got, truth(w)))
                ours = prom_increase(samples, wall(w.end) - length, wall(w.end))
                if ours is not None:
                    gap = max(gap, abs(error_pct(ours, got)))
        in_trace_time = [(trace.start + (ts - start) * speed, v) for ts, v in samples]
        r.between = counter_between(trace, series, in_trace_time)
        out.append(r)
    # The one command users run: wattprint report, over the job's whole life, and
    # over each 1-minute window (--since/--until, ends between two scrapes).
    joules = report_gpu_joules(prom.url, trace.workload)
    if joules is not None:
        out.append(
            Result(
                "wattprint report, the job's GPU energy",
                scrape,
                [error_pct(joules, job_truth(job))],
                note=mode,
            )
        )
    windowed = Result("wattprint report --since --until, the job's GPU energy", scrape, note=mode)
    for w in windows:
        joules = report_gpu_joules(prom.url, trace.workload, wall(w.start), wall(w.end))
        if joules is not None:
            windowed.windows.append(error_pct(joules, job_truth(w)))
    out.append(windowed)
    last = prom.scalar(f"max_over_time({job_sel}[10m])", now)
    if last is not None:
        out.insert(
            1,
            Result(
                "Wattprint job counter, last value",
                scrape,
                [error_pct(last, job_truth(job))],
                note=mode,
            ),
        )
    # Recording rules that hold an energy increase: the workload ones against the
    # job, the device ones against the GPU over the run.
    found = prom.get("/api/v1/series", **{"match[]": '{__name__=~".+:.*energy_joules:increase.*"}'})
    for name in sorted({s["__name__"] for s in found}):
        is_job = "workload_energy" in name
        labels = 'component="gpu"'
        if "workload" in name.split(":")[0]:
            labels += f',workload="{trace.workload}"'
        got = prom.scalar(f"sum({name}{{{labels}}})", after)
        if got is not None:
            expected = job_truth(job) if is_job else gpu_truth(run)
            note = mode if is_job else f"{mode}; against the GPU"
            out.append(Result(f"rule {name}", "eval 1 s", [error_pct(got, expected)], note=note))
    return out, gap


def report_gpu_joules(
    url: str, workload: str, since: float | None = None, until: float | None = None
) -> float | None:
    command = [
        sys.executable,
        "-m",
        "wattprint",
        "report",
        f"--prometheus.url={url}",
        f"--workload={workload}",
        "--format=json",
    ]
    if since is not None and until is not None:
        command += [f"--since={since:.3f}", f"--until={until:.3f}"]
    report = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if report.returncode != 0:
        print(f"wattprint report failed: {report.stderr.strip()}", file=sys.stderr)
        return None
    jobs = json.loads(report.stdout)["jobs"]
    return float(sum(j["energy_kwh"]["gpu"] for j in jobs) * JOULES_PER_KWH)


# -- output ------------------------------------------------------------------------------


def table(results: Sequence[Result]) -> str:
    lines = [
        "| method | scrape interval | job | 1-min windows | >= 1-min windows between two scrapes |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        name = r.method + (f" ({r.note})" if r.note else "")
        lines.append(
            f"| {name} | {r.scrape} | {span(r.job)} | {span(r.windows)} | {span(r.between)} |"
        )
    return "\n".join(lines)


CATEGORIES = (
    ("job", "the job", "#2ca02c"),
    ("windows", "1-min windows", "#1f77b4"),
    ("between", ">= 1 min between two scrapes", "#9467bd"),
)


def plot(trace: Trace, results: Sequence[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 11), height_ratios=[1, 2.2])
    rel = [t - trace.start for t in trace.t]
    top.plot(rel, trace.power, lw=0.8, color="#444", label="GPU power, 100 ms readings")
    for phase, color in ((0.0, "#d62728"), (7.5, "#1f77b4")):
        times = scrape_times(trace, 15.0, phase)
        top.step(
            [s - trace.start for s in times],
            [trace.held(trace.power, s) for s in times],
            where="pre",
            color=color,
            lw=1.5,
            label=f"what a 15 s scrape of the watts gauge sees (phase {phase:g} s)",
        )
    top.axvspan(trace.job_start - trace.start, trace.end - trace.start, color="#2ca02c", alpha=0.08)
    for named in trace.phases:
        middle = (named["start"] + named["end"]) / 2 - trace.start
        top.text(middle, 740, named["name"], ha="center", fontsize=7, color="#555")
    top.set_ylim(0, 780)
    top.set_xlim(0, trace.end - trace.start)
    top.set_xlabel("trace time (s); shaded: the job holds the GPU")
    top.set_ylabel("W")
    top.set_title("NVIDIA H200, phased load (recorded)")
    top.legend(fontsize=8, loc="center right")

    # The rules' increase1h series differ only in how far they aggregate: one row.
    rules = [r for r in results if r.method.startswith("rule ")]
    results = [r for r in results if not r.method.startswith("rule ")]
    if rules:
        pooled = Result("Wattprint recording rules, every *:energy_joules:increase1h", "eval 1 s")
        pooled.job = [e for r in rules for e in r.job]
        live = sum("(=" in r.scrape for r in results)  # the live rows come first
        results.insert(live, pooled)
    height = 0.8 / len(CATEGORIES)
    for k, (attr, label, color) in enumerate(CATEGORIES):
        ys, xs = [], []
        for i, r in enumerate(results):
            values = getattr(r, attr)
            if values:
                ys.append(i - 0.4 + height * (k + 0.5))
                xs.append(max(r.worst(values), 1e-3))
        bottom.barh(ys, xs, height=height, color=color, label=label)
        for y, x in zip(ys, xs):
            text = "0 %" if x < 0.005 else f"{x:.2g} %"
            bottom.text(x * 1.12, y, text, va="center", fontsize=6)
    bottom.axvline(1.0, color="black", ls="--", lw=1, label="1 % target")
    bottom.set_xscale("log")
    bottom.set_xlim(1e-3, 3000)
    names = [f"{r.method}{' (' + r.note + ')' if r.note else ''}\n{r.scrape}" for r in results]
    bottom.set_yticks(
        range(len(results)),
        [n.split(" (")[0] if "codecarbon" in n else n for n in names],
        fontsize=7,
    )
    bottom.set_ylim(len(results) - 0.5, -0.5)
    bottom.set_xlabel("worst |error| against the GPU's hardware energy counter (%, log scale)")
    bottom.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=FIXTURES / "phased-load.jsonl")
    ap.add_argument("--codecarbon", type=Path, default=FIXTURES / "codecarbon-4-processes")
    ap.add_argument("--speed", type=float, default=1.0, help="replay speed (trace s per wall s)")
    ap.add_argument("--sampler", type=float, default=1.0, help="exporter's sample interval, s")
    ap.add_argument("--runs", type=int, default=3, help="live runs per mode (scrape phases vary)")
    ap.add_argument(
        "--unstamped-runs",
        type=int,
        default=2,
        help="live runs with --sample.timestamps=false, for comparison",
    )
    ap.add_argument("--offline", action="store_true", help="skip the live Prometheus run")
    ap.add_argument("--plot", type=Path, help="write the chart (needs matplotlib: the bench extra)")
    args = ap.parse_args()

    trace = load_trace(args.trace)
    windows = minute_windows(trace)
    print(
        f"trace {args.trace.name}: {len(trace.t)} samples, {trace.end - trace.start:.1f} s, "
        f"{trace.energy[-1] / 1000:.2f} kJ; job {trace.workload!r} holds the GPU for "
        f"{trace.end - trace.job_start:.1f} s, {trace.job[-1] / 1000:.2f} kJ; "
        f"{len(windows)} windows of {WINDOW_S:g} s, every {WINDOW_STEP_S:g} s"
    )
    results: list[Result] = []
    if not args.offline:
        runs = [
            live_run(trace, windows, args, stamped=True, phase=k / args.runs)
            for k in range(args.runs)
        ]
        runs += [
            live_run(trace, windows, args, stamped=False, phase=k / args.unstamped_runs)
            for k in range(args.unstamped_runs)
        ]
        pooled: dict[tuple[str, str, str], Result] = {}
        for live in runs:
            for r in live.results:
                into = pooled.setdefault(
                    (r.method, r.scrape, r.note), Result(r.method, r.scrape, note=r.note)
                )
                into.job += r.job
                into.windows += r.windows
                into.between += r.between
        results += pooled.values()
        lags = ", ".join(str(round(live.read_lag_s * 1000)) for live in runs)
        print(
            f"\nLive: {args.runs} + {args.unstamped_runs} runs of the exporter (with and "
            f"without sample timestamps, sampling every {args.sampler:g} s) "
            f"replaying at {args.speed:g}x into Prometheus, scrape and rule evaluation every "
            f"1 s; {sum(live.scrapes for live in runs)} scrapes; "
            f"scrapes came {lags} ms after the sampler's read (median per run); replay start "
            f"pinned to {max(live.start_uncertainty_s for live in runs) * 1000:.0f} ms; rule "
            f"files: {', '.join(runs[0].rule_files) or 'none'}; increase() recomputed offline "
            f"from the scraped samples differs from the server's by at most "
            f"{max(live.emulation_gap_pct for live in runs):.1g} %"
        )
        for line in sorted({line for live in runs for line in live.rule_errors}):
            print(f"rule error: {line}")
        print()
        print(table(list(pooled.values())))
    offline = offline_results(trace, windows, args.sampler)
    results += offline
    print(
        "\nOffline: what a scraper of the exporter (sampling every "
        f"{args.sampler:g} s) sees at other intervals, from the trace\n"
    )
    print(table(offline))
    cc = codecarbon_results(args.codecarbon)
    results += cc
    print("\ncodecarbon 3.3.2 on the same GPU (tests/fixtures/h200/codecarbon-4-processes)\n")
    print(table(cc))
    print()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {platform.node()}: {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {prometheus_version()}"
    )
    if args.plot:
        plot(trace, results, args.plot)
        print(f"wrote {args.plot}")


def prometheus_version() -> str:
    try:
        out = subprocess.run(
            ["prometheus", "--version"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "prometheus: unknown version"
    return (out.stdout or out.stderr).split("(")[0].strip()


if __name__ == "__main__":
    main()
