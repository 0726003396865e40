"""How far one Prometheus goes with Wattprint: a synthetic fleet, backfilled and queried.

For each fleet size N (nodes of 8 GPUs each):
  1. simulate N nodes for --days at --interval: jobs of 1-8 GPUs arrive (--jobs per node
     per day), run for hours and end; GPU, CPU and memory power follow them; every
     series the exporter exports is written as OpenMetrics with the exporter's names
     and labels (counters that only rise, conserved between workloads and unattributed,
     job series that appear and, 10 minutes after the job, disappear);
  2. backfill it with `promtool tsdb create-blocks-from openmetrics` (one file per
     2-hour block, so that promtool reads each sample once);
  3. backfill the recorded series that the Fleet dashboard and the budget windows read
     with `promtool tsdb create-blocks-from rules`;
  4. start Prometheus on those blocks with every rules/*.rules.yml file (and budgets for
     every namespace and 50 jobs), scraping the fleet live (a local server continues
     each node's counters); once the backfilled blocks are compacted, read each rule
     group's evaluation time from /api/v1/rules;
  5. time the Fleet dashboard's queries over its default range, as Grafana sends them.
Prints one table per fleet size and a summary with a linear fit to 10,000 GPUs.

    python benchmarks/scale.py [--nodes 10 100 1000] [--days 1] [--interval 30] [--jobs 12]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import requests
import yaml

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8
BLOCK_S = 7200  # promtool cuts blocks at 2-hour boundaries
RETENTION_S = 600  # the exporter keeps a finished job's series this long
NAMESPACES = 30
PUE = 1.2
GPU_MODEL = "NVIDIA H100 80GB HBM3"
ZONES = ("DE", "FR")
COLLECTORS = ("nvml", "rapl", "procfs", "identity", "carbon")


# -- the fleet ---------------------------------------------------------------------------


@dataclass
class Job:
    workload: str
    namespace: str
    gpus: list[int]
    start: int  # first step it holds its GPUs (may be before the window)
    end: int  # first step it no longer does
    util: float


@dataclass
class Series:
    labels: str  # name{labels}, as written, with the target's labels instance and job
    exported: str  # name{labels} as the exporter shows it (the scrape adds the target's)
    values: np.ndarray  # one per step
    first: int  # first step the series exists
    last: int  # one past the last step
    counter: bool


@dataclass
class Fleet:
    steps: int
    interval: int
    t0: int  # unix seconds of step 0
    jobs_per_day: float
    seed: int

    def times(self) -> np.ndarray:
        return self.t0 + self.interval * np.arange(self.steps, dtype=np.int64)

    def intensity(self, zone: int) -> np.ndarray:
        """Grid intensity, g/kWh: an hourly step with a daily cycle per zone."""
        hours = (self.times() // 3600).astype(np.float64)
        base, swing = (380.0, 90.0) if zone == 0 else (60.0, 25.0)
        return base + swing * np.sin(2 * np.pi * (hours % 24) / 24)

    def jobs(self, rng: np.random.Generator, node: int) -> list[Job]:
        """Jobs on one node: Poisson arrivals; GPUs free at arrival, else it goes elsewhere."""
        horizon = self.steps * self.interval
        lead = 2 * 86400  # jobs that started before the window are running in it
        count = rng.poisson(self.jobs_per_day * (horizon + lead) / 86400)
        arrivals = np.sort(rng.uniform(-lead, horizon, count))
        busy_until = np.full(GPUS, -math.inf)
        out = []
        for n, at in enumerate(arrivals):
            size = int(rng.choice([1, 2, 4, 8], p=[0.25, 0.25, 0.2, 0.3]))
            free = np.flatnonzero(busy_until <= at)
            if len(free) < size:
                continue
            duration = float(np.clip(rng.lognormal(math.log(3 * 3600), 1.0), 600, 3 * 86400))
            gpus = sorted(int(g) for g in free[:size])
            busy_until[gpus] = at + duration
            start = int(at // self.interval)
            end = int((at + duration) // self.interval)
            if end + RETENTION_S // self.interval < 0 or start >= self.steps:
                continue
            out.append(
                Job(
                    workload=f"train-{node:04d}-{n:04d}",
                    namespace=f"team-{int(rng.integers(NAMESPACES)):02d}",
                    gpus=gpus,
                    start=start,
                    end=end,
                    util=float(rng.uniform(0.35, 0.98)),
                )
            )
        return out

    def node(self, node: int) -> list[Series]:
        """Every series one node's exporter exports over the window."""
        rng = np.random.default_rng([self.seed, node])
        T, S = self.steps, self.interval
        instance = f'instance="node-{node:04d}:9950",job="wattprint"'
        zone = node % len(ZONES)
        intensity = self.intensity(zone) * PUE / 3.6e6  # grams per joule
        jobs = self.jobs(rng, node)
        out: list[Series] = []

        def add(name: str, labels: str, values: np.ndarray, first: int = 0, last: int = T) -> None:
            sep = "," if labels else ""
            out.append(
                Series(
                    f"{name}{{{labels}{sep}{instance}}}",
                    f"{name}{{{labels}}}" if labels else name,
                    values,
                    max(first, 0),
                    min(last, T),
                    name.endswith("_total"),
                )
            )

        def const(value: float) -> np.ndarray:
            return np.full(T, value)

        def counter(increments: np.ndarray, start: float) -> np.ndarray:
            return start + np.cumsum(increments, axis=-1)

        # Power per step: idle draw, and each job's draw on the GPUs it holds.
        gpu_w = 70 + rng.normal(0, 2, (GPUS, T))
        held = np.zeros((GPUS, T), dtype=bool)
        for job in jobs:
            a, b = max(job.start, 0), min(job.end, T)
            if a < b:
                noise = rng.normal(1, 0.08, (len(job.gpus), b - a))
                gpu_w[job.gpus, a:b] = np.clip(70 + 630 * job.util * noise, 70, 700)
                held[job.gpus, a:b] = True
        busy = held.mean(axis=0)
        cpu_w = np.stack([45 + 60 * busy + rng.normal(0, 3, T) for _ in range(2)])
        mem_w = np.stack([12 + 6 * busy + rng.normal(0, 0.5, T) for _ in range(2)])
        gpu_j, cpu_j, mem_j = gpu_w * S, cpu_w * S, mem_w * S
        uptime = float(rng.uniform(0, 30 * 86400))  # the exporter started before the window

        add("wattprint_build_info", 'version="0.1.0"', const(1))
        for g in range(GPUS):
            gl = f'gpu="{g}",model="{GPU_MODEL}",uuid="GPU-{node:04x}{g:02x}-5f1e-7d3c"'
            add("wattprint_gpu_power_watts", gl, gpu_w[g])
            add("wattprint_gpu_energy_joules_total", gl, counter(gpu_j[g], uptime * 150))
            add(
                "wattprint_measurement_info",
                f'component="gpu",device="{g}",method="nvml_energy_counter"',
                const(1),
            )
        for p in range(2):
            add("wattprint_cpu_power_watts", f'package="{p}"', cpu_w[p])
            add(
                "wattprint_cpu_energy_joules_total",
                f'package="{p}"',
                counter(cpu_j[p], uptime * 70),
            )
            add("wattprint_memory_power_watts", f'package="{p}"', mem_w[p])
            add(
                "wattprint_memory_energy_joules_total",
                f'package="{p}"',
                counter(mem_j[p], uptime * 15),
            )
            for component in ("cpu", "memory"):
                add(
                    "wattprint_measurement_info",
                    f'component="{component}",device="{p}",method="rapl"',
                    const(1),
                )

        # Split each step's energy: a GPU's holder gets all of it; CPU and memory by the
        # job's share of the node; the rest is unattributed, so the parts add up.
        left_gpu = gpu_j * ~held
        left_cpu, left_mem = cpu_j.sum(axis=0), mem_j.sum(axis=0)
        for job in jobs:
            a, b = max(job.start, 0), min(job.end, T)
            hold = np.zeros(T, dtype=bool)
            hold[a:b] = True
            share = len(job.gpus) / GPUS
            before = max(-job.start, 0) * S  # seconds it ran before the window
            ident = (
                f'scheduler="kubernetes",namespace="{job.namespace}",'
                f'workload="{job.workload}",pod="{job.workload}-0"'
            )
            parts = [(f'component="gpu",gpu="{g}"', gpu_j[g] * hold, 500.0) for g in job.gpus]
            parts += [
                ('component="cpu",gpu=""', cpu_j.sum(axis=0) * hold * share * 0.9, 80 * share),
                ('component="memory",gpu=""', mem_j.sum(axis=0) * hold * share * 0.7, 20 * share),
            ]
            left_cpu = left_cpu - parts[-2][1]
            left_mem = left_mem - parts[-1][1]
            last = job.end + RETENTION_S // S
            for labels, joules, watts in parts:
                start = before * watts
                add(
                    "wattprint_workload_energy_joules_total",
                    f"{labels},{ident}",
                    counter(joules, start),
                    job.start,
                    last,
                )
                grams = joules * intensity
                add(
                    "wattprint_workload_emissions_grams_total",
                    f"{labels},{ident}",
                    counter(grams, start * intensity[0]),
                    job.start,
                    last,
                )
            for g in job.gpus:
                add(
                    "wattprint_workload_gpu_info",
                    f'{ident},gpu="{g}",uuid="GPU-{node:04x}{g:02x}-5f1e-7d3c"',
                    const(1),
                    job.start,
                    last,
                )
        for labels, joules in [(f'component="gpu",gpu="{g}"', left_gpu[g]) for g in range(GPUS)] + [
            ('component="cpu",gpu=""', left_cpu),
            ('component="memory",gpu=""', left_mem),
        ]:
            add("wattprint_unattributed_energy_joules_total", labels, counter(joules, uptime * 40))
            add(
                "wattprint_unattributed_emissions_grams_total",
                labels,
                counter(joules * intensity, uptime * 40 * 3e-4),
            )

        z = f'zone="{ZONES[zone]}",provider="electricitymaps",signal="average"'
        add("wattprint_grid_carbon_intensity_grams_per_kwh", z, self.intensity(zone))
        add(
            "wattprint_grid_carbon_intensity_timestamp_seconds",
            z,
            (self.times() // 3600 * 3600).astype(np.float64),
        )
        add("wattprint_carbon_fallback_active", f'zone="{ZONES[zone]}"', const(0))
        add("wattprint_carbon_errors_total", 'provider="electricitymaps"', const(0))
        add("wattprint_pue_ratio", "", const(PUE))
        for c in COLLECTORS:
            add("wattprint_collector_success", f'collector="{c}"', const(1))
            add(
                "wattprint_collector_duration_seconds",
                f'collector="{c}"',
                np.abs(rng.normal(0.003, 0.001, T)),
            )
            add("wattprint_collector_errors_total", f'collector="{c}"', const(0))
        add("wattprint_sampler_last_success_timestamp_seconds", "", self.times().astype(np.float64))
        add("wattprint_sampler_interval_seconds", "", const(1))
        return [s for s in out if s.first < s.last]


# -- history as OpenMetrics, backfilled ---------------------------------------------------


@dataclass
class Live:
    """What one series shows at the end of the history, to continue it live."""

    labels: str
    value: float
    rate: float  # per second; 0 for gauges and finished jobs


@dataclass
class History:
    samples: int = 0
    series: int = 0
    active_at_end: int = 0
    jobs: int = 0
    bytes: int = 0
    write_s: float = 0.0  # simulating and writing OpenMetrics
    backfill_s: float = 0.0  # until the last block is made
    live: list[list[Live]] = field(default_factory=list)  # per node


def promtool(*args: str) -> None:
    done = subprocess.run(["promtool", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"promtool {' '.join(args[:4])} failed: {done.stderr.strip()[-2000:]}")


def blocks_from_openmetrics(path: Path, data: Path) -> None:
    promtool("tsdb", "create-blocks-from", "openmetrics", "-q", str(path), str(data))
    path.unlink()  # the block holds it now; the text is the biggest thing on disk


def backfill_history(fleet: Fleet, nodes: int, work: Path, data: Path) -> History:
    """Write one OpenMetrics file per 2-hour block and backfill each as it is written.

    promtool reads its whole input once per block it makes, so one file per block keeps
    that to one read per sample; and while promtool turns a file into a block, the next
    one is written, on the other core.
    """
    started = time.monotonic()
    times = fleet.times()
    block_of = times // BLOCK_S
    cuts = [0, *(np.flatnonzero(np.diff(block_of)) + 1).tolist(), fleet.steps]
    stamps = [f" {t}\n" for t in times.tolist()]
    history = History()
    workload = re.compile(r'workload="([^"]+)"')
    fleet_series = []
    for node in range(nodes):
        series = fleet.node(node)
        fleet_series.append(series)
        history.series += len(series)
        history.jobs += len({m.group(1) for s in series for m in workload.finditer(s.labels)})
        live = [
            Live(
                s.exported,
                float(s.values[-1]),
                float(s.values[-1] - s.values[-2]) / fleet.interval if s.counter else 0.0,
            )
            for s in series
            if s.last == fleet.steps
        ]
        history.active_at_end += len(live)
        history.live.append(live)
    writing = 0.0
    with ThreadPoolExecutor(max_workers=max((os.cpu_count() or 2) - 1, 1)) as pool:
        pending = []
        for a, b in itertools.pairwise(cuts):
            begun = time.monotonic()
            path = work / f"block-{int(block_of[a])}.om"
            with open(path, "w") as out:
                for series in fleet_series:
                    for s in series:
                        lo, hi = max(a, s.first), min(b, s.last)
                        if lo < hi:
                            prefix = s.labels + " "
                            values = s.values[lo:hi].tolist()
                            out.write(
                                "".join(
                                    [f"{prefix}{v:.3f}{t}" for v, t in zip(values, stamps[lo:hi])]
                                )
                            )
                            history.samples += hi - lo
                out.write("# EOF\n")
            history.bytes += path.stat().st_size
            writing += time.monotonic() - begun
            pending.append(pool.submit(blocks_from_openmetrics, path, data))
            # Bound the disk: at most two files wait for promtool.
            while sum(not f.done() for f in pending) > 2:
                time.sleep(0.2)
        for future in pending:
            future.result()
    history.write_s = writing
    history.backfill_s = time.monotonic() - started
    return history


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- Prometheus ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if check():
                return time.monotonic() - started
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


class Prometheus:
    def __init__(
        self, work: Path, data: Path, config: dict[str, Any], compact: bool = True
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.cmd = [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=30d",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        if not compact:  # a hidden flag: blocks stay 2 h, nothing competes for the CPU
            self.cmd.append("--storage.tsdb.max-block-duration=2h")
        self.log = work / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        self.ready_s = wait_for(
            "Prometheus", lambda: requests.get(self.url + "/-/ready", timeout=2).ok, 600
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def get(self, path: str, **params: Any) -> Any:
        reply = requests.get(self.url + path, params=params, timeout=600)
        body = reply.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body.get('error', reply.text)[:300]}")
        return body["data"]

    def value(self, expr: str) -> float:
        result = self.get("/api/v1/query", query=expr)["result"]
        return float(result[0]["value"][1]) if result else float("nan")

    def settle(self, timeout: float) -> float:
        """Seconds until a whole compaction cycle (one a minute) has compacted nothing."""
        started = time.monotonic()

        def done() -> float:
            names = (
                "prometheus_tsdb_compactions_total",
                "prometheus_tsdb_vertical_compactions_total",
            )
            return sum(v for v in map(self.own_metric, names) if not math.isnan(v))

        count, since = done(), 0.0
        while time.monotonic() - started < timeout:
            triggered = self.own_metric("prometheus_tsdb_compactions_triggered_total")
            now = done()
            if now != count:
                count, since = now, triggered
            # The trigger counts up as a cycle starts; two more cycles started since the
            # last change means the one between them had nothing left to do.
            elif triggered >= since + 2:
                return time.monotonic() - started
            time.sleep(2)
        raise SystemExit(f"compaction still running after {timeout:g} s")

    def own_metric(self, name: str) -> float:
        """A sample of Prometheus's own /metrics (summed over label sets)."""
        text = requests.get(self.url + "/metrics", timeout=30).text
        total = math.nan
        for line in text.splitlines():
            if line.startswith(name) and line[len(name)] in " {":
                total = (0.0 if math.isnan(total) else total) + float(line.rsplit(" ", 1)[1])
        return total


# -- recording rules ---------------------------------------------------------------------------

NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+")
SUBQUERY = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+)\s*\[[^\]]*:([0-9]+[smhd])\]")


def rule_files() -> list[Path]:
    return sorted((ROOT / "rules").glob("*.rules.yml"))


def recording_rules(files: Sequence[Path]) -> dict[str, dict[str, Any]]:
    rules: dict[str, dict[str, Any]] = {}
    for path in files:
        for group in yaml.safe_load(path.read_text()).get("groups", []):
            for rule in group.get("rules", []):
                if "record" in rule:
                    rules[rule["record"]] = rule
    return rules


def seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", duration))


def backfill_rules(
    rules: dict[str, dict[str, Any]],
    wanted: dict[str, tuple[int, int]],
    prom: Prometheus,
    data: Path,
    work: Path,
    end: int,
) -> tuple[float, list[str]]:
    """Backfill recorded series (name -> (eval interval, start)) and what they read.

    promtool evaluates rules against a server, so a rule that reads another recorded
    series waits for a later round, after the server has reloaded the earlier blocks.
    """

    def deps(name: str) -> set[str]:
        return set(NAME.findall(rules[name]["expr"])) & rules.keys() - {name}

    need = dict(wanted)
    todo = list(wanted)
    while todo:
        name = todo.pop()
        for dep in deps(name):
            merged = tuple(min(x, y) for x, y in zip(need.get(dep, need[name]), need[name]))
            if need.get(dep) != merged:
                need[dep] = (merged[0], merged[1])
                todo.append(dep)

    level: dict[str, int] = {}

    def depth(name: str) -> int:
        if name not in level:
            level[name] = 1 + max((depth(d) for d in deps(name)), default=0)
        return level[name]

    rounds = sorted({depth(n) for n in need})
    took = 0.0
    for i, lvl in enumerate(rounds):
        batches: dict[int, dict[int, list[dict[str, Any]]]] = {}
        for name in sorted(n for n in need if level[n] == lvl):
            every, start = need[name]
            start = -(-start // every) * every  # on the step grid subqueries read
            rule = {k: v for k, v in rules[name].items() if k in ("record", "expr", "labels")}
            batches.setdefault(start, {}).setdefault(every, []).append(rule)
        for start, groups in batches.items():
            path = work / f"backfill-{lvl}-{start}.yml"
            doc = {
                "groups": [
                    {"name": f"backfill-{lvl}-{every}", "interval": f"{every}s", "rules": rs}
                    for every, rs in groups.items()
                ]
            }
            path.write_text(yaml.safe_dump(doc))
            out = work / f"rules-{lvl}-{start}"
            begun = time.monotonic()
            promtool(
                "tsdb",
                "create-blocks-from",
                "rules",
                "-q",
                f"--url={prom.url}",
                f"--start={start}",
                f"--end={end}",
                f"--output-dir={out}",
                str(path),
            )
            took += time.monotonic() - begun
            if out.exists():
                for block in out.iterdir():
                    shutil.move(str(block), str(data / block.name))
        if i + 1 < len(rounds):  # the server reads new blocks at startup
            prom.__exit__()
            prom.__enter__()
    return took, sorted(need)


# -- the live fleet ------------------------------------------------------------------------------


@contextmanager
def live_fleet(history: History, end: int) -> Iterator[int]:
    """Serve /node/<i>: each node's series, counters rising at their last rate."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                series = history.live[int(self.path.rsplit("/", 1)[1])]
            except (ValueError, IndexError):
                self.send_error(404)
                return
            dt = time.time() - end
            body = "".join(f"{s.labels} {s.value + s.rate * dt:.3f}\n" for s in series).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


# -- the Fleet dashboard ----------------------------------------------------------------------


@dataclass
class Query:
    panel: str
    expr: str
    instant: bool


def fleet_dashboard() -> tuple[str, list[Query], list[str], int]:
    """(title, queries, variable queries, default range in seconds) of the Fleet dashboard."""
    candidates = sorted((ROOT / "dashboards").glob("*.json"))
    for path in candidates:
        board = json.loads(path.read_text())
        if "fleet" in path.stem.lower() or "fleet" in str(board.get("title", "")).lower():
            break
    else:
        raise SystemExit("no Fleet dashboard in dashboards/")
    variables: dict[str, str] = {}
    variable_queries = []
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            variables[var["name"]] = var.get("allValue") or ".*"
            query = var.get("query")
            variable_queries.append(query["query"] if isinstance(query, dict) else str(query))
    queries = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                if target.get("expr") and not target.get("hide"):
                    instant = bool(target.get("instant")) and not target.get("range")
                    queries.append(Query(str(panel.get("title", "")), target["expr"], instant))

    walk(board.get("panels", []))
    range_s = seconds(str(board.get("time", {}).get("from", "now-6h")).removeprefix("now-"))
    expanded = []
    for q in queries:
        expr = q.expr
        for name, value in variables.items():
            expr = re.sub(r"\$\{" + name + r"(:[a-z]+)?\}|\$" + name + r"\b", value, expr)
        expanded.append(Query(q.panel, expr, q.instant))
    return str(board.get("title", "")), expanded, variable_queries, range_s


def grafana_step(range_s: int, interval: int) -> int:
    """Grafana's $__interval: range / ~1000 points, not below the scrape interval."""
    return max(interval, math.ceil(range_s / 1000))


def time_dashboard(
    prom: Prometheus, queries: list[Query], variable_queries: list[str], range_s: int, interval: int
) -> list[tuple[str, str, float, float, int]]:
    """(panel, kind, first s, median of 3 s, series) for each query, as Grafana asks it."""
    step = grafana_step(range_s, interval)
    rate_interval = max(step + interval, 4 * interval)
    now = time.time()
    out = []
    for q in queries:
        expr = (
            q.expr.replace("$__rate_interval", f"{rate_interval}s")
            .replace("$__interval", f"{step}s")
            .replace("$__range", f"{range_s}s")
        )
        if q.instant:
            params = {"query": expr, "time": f"{now:.3f}"}
            path = "/api/v1/query"
        else:
            params = {
                "query": expr,
                "start": f"{now - range_s:.3f}",
                "end": f"{now:.3f}",
                "step": str(step),
            }
            path = "/api/v1/query_range"
        took = []
        series, error = 0, ""
        for _ in range(3):
            started = time.monotonic()
            try:
                series = len(prom.get(path, **params)["result"])
            except RuntimeError as err:  # a broken query is a finding, not a crash
                series = -1
                error = str(err).split(": ", 1)[-1]
            took.append(time.monotonic() - started)
        kind = "instant" if q.instant else f"range, step {step}s"
        if series < 0:
            kind += f"; ERROR: {error}"
        out.append((q.panel, kind, took[0], statistics.median(took), series))
    for query in variable_queries:
        match = re.match(r"label_values\((.*),\s*(\w+)\)$", query.strip())
        if not match:
            continue
        selector, label = match.groups()
        selector = re.sub(r"\$\w+", ".*", selector)
        took = []
        for _ in range(3):
            started = time.monotonic()
            values = prom.get(
                f"/api/v1/label/{label}/values",
                **{"match[]": selector, "start": f"{now - range_s:.0f}", "end": f"{now:.0f}"},
            )
            took.append(time.monotonic() - started)
        out.append(
            (f"variable: {label}", "label values", took[0], statistics.median(took), len(values))
        )
    return out


# -- one fleet size ----------------------------------------------------------------------


@dataclass
class Run:
    nodes: int
    history: History
    blocks_bytes: int
    rule_backfill_s: float
    backfilled_rules: list[str]
    ready_s: float
    settle_s: float
    head_series: float
    rss_bytes: float
    groups: dict[str, list[float]]
    rule_times: dict[str, list[float]]
    missed: float
    outputs: dict[str, int]  # recorded series per rule, at the end
    silent: list[str]  # recording rules of rules/ without output
    errors: dict[str, str]  # rule -> its last evaluation error
    queries: list[tuple[str, str, float, float, int]]


def budgets_file(work: Path, history: History) -> Path:
    """A budget per namespace and for 50 running jobs, made by the project's generator."""
    running = re.compile(r'namespace="([^"]+)",workload="([^"]+)"')
    jobs = sorted(
        {m.groups() for live in history.live for s in live for m in running.finditer(s.labels)}
    )
    budgets: list[dict[str, str]] = [
        {"namespace": f"team-{n:02d}", "budget": "500kg"} for n in range(NAMESPACES)
    ]
    budgets += [{"namespace": ns, "workload": w, "budget": "20kg"} for ns, w in jobs[:50]]
    data = work / "budgets.yaml"
    data.write_text(yaml.safe_dump({"budgets": budgets}))
    out = work / "budgets.rules.yml"
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_budget_rules.py"), str(data), "-o", str(out)],
        check=True,
    )
    return out


def run(nodes: int, args: argparse.Namespace) -> Run:
    interval = args.interval
    steps = int(args.days * 86400 // interval)
    end = int(time.time()) // interval * interval
    fleet = Fleet(steps, interval, end - (steps - 1) * interval, args.jobs, args.seed)
    with tempfile.TemporaryDirectory(prefix="wattprint-scale-", dir=args.tmp) as tmp:
        work = Path(tmp)
        data = work / "data"
        data.mkdir()
        print(f"[{nodes} nodes] {steps} steps of history ...", file=sys.stderr, flush=True)
        history = backfill_history(fleet, nodes, work, data)
        blocks_bytes = du(data)

        files = rule_files()
        rules = recording_rules(files)
        _, queries, variable_queries, range_s = fleet_dashboard()
        # What the dashboard reads over its range, and what the rules' subqueries read
        # over the whole history, at the subquery's step.
        wanted = {
            n: (interval, end - range_s)
            for q in queries
            for n in NAME.findall(q.expr)
            if n in rules
        }
        # promtool evaluates a group at an offset within its interval (as Prometheus
        # does), so a point every 5 minutes is what keeps one inside the lookback of
        # every hourly subquery step.
        for path in files:
            for name, step in SUBQUERY.findall(path.read_text()):
                if name in rules:
                    every = min(wanted.get(name, (300, 0))[0], seconds(step), 300)
                    wanted[name] = (every, fleet.t0)
        print(
            f"[{nodes} nodes] backfilling rules {sorted(wanted)} ...", file=sys.stderr, flush=True
        )
        no_scrapes = {"global": {"scrape_interval": f"{interval}s"}}
        with Prometheus(work, data, no_scrapes, compact=False) as prom:
            rule_s, backfilled = backfill_rules(rules, wanted, prom, data, work, end)

        with live_fleet(history, end) as port:
            targets = [
                {
                    "targets": [f"127.0.0.1:{port}"],
                    "labels": {"instance": f"node-{i:04d}:9950", "__metrics_path__": f"/node/{i}"},
                }
                for i in range(nodes)
            ]
            config = {
                "global": {
                    "scrape_interval": f"{interval}s",
                    "scrape_timeout": f"{min(interval, 10)}s",
                    "evaluation_interval": f"{interval}s",
                },
                "rule_files": [str(p) for p in [*files, budgets_file(work, history)]],
                "scrape_configs": [{"job_name": "wattprint", "static_configs": targets}],
            }
            print(
                f"[{nodes} nodes] Prometheus with rules, scraping live ...",
                file=sys.stderr,
                flush=True,
            )
            with Prometheus(work, data, config) as prom:
                wait_for(
                    "every node scraped",
                    lambda: prom.value("count(up == 1)") >= nodes,
                    10 * interval,
                )
                # Measure the steady state: the backfilled blocks (which overlap) are
                # compacted first, and rate5m has two live samples by then.
                settle_s = prom.settle(1800)
                groups: dict[str, list[float]] = {}
                seen: dict[str, str] = {}
                errors: dict[str, str] = {}
                slowest: dict[str, list[float]] = {}
                deadline = time.monotonic() + (args.evaluations + 1) * interval + 30
                while (
                    time.monotonic() < deadline
                    and min((len(v) for v in groups.values()), default=0) < args.evaluations
                ):
                    for group in prom.get("/api/v1/rules")["groups"]:
                        for rule in group["rules"]:
                            if rule.get("lastError"):
                                errors[rule["name"]] = rule["lastError"]
                        if seen.get(group["name"]) != group["lastEvaluation"]:
                            seen[group["name"]] = group["lastEvaluation"]
                            groups.setdefault(group["name"], []).append(
                                float(group["evaluationTime"])
                            )
                            for rule in group["rules"]:
                                key = rule.get("name", "")
                                slowest.setdefault(key, []).append(float(rule["evaluationTime"]))
                    time.sleep(1)
                queries_timed = time_dashboard(prom, queries, variable_queries, range_s, interval)
                recorded = prom.get(
                    "/api/v1/query", query='count by (__name__) ({__name__=~".+:.+"})'
                )
                outputs = {
                    r["metric"]["__name__"]: int(float(r["value"][1])) for r in recorded["result"]
                }
                head = prom.own_metric("prometheus_tsdb_head_series")
                rss = prom.own_metric("process_resident_memory_bytes")
                missed = prom.own_metric("prometheus_rule_group_iterations_missed_total")
                ready = prom.ready_s
    return Run(
        nodes,
        history,
        blocks_bytes,
        rule_s,
        backfilled,
        ready,
        settle_s,
        head,
        rss,
        groups,
        slowest,
        missed,
        outputs,
        sorted(set(rules) - set(outputs)),
        errors,
        queries_timed,
    )


# -- output -----------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 1024:,.0f} KiB"


def report(r: Run, args: argparse.Namespace) -> None:
    h = r.history
    n = r.nodes
    print(f"\n### {n} nodes, {n * GPUS} GPUs\n")
    print("| measure | value |\n|---|---|")
    rows = [
        (
            "history",
            f"{args.days * 24:g} h at {args.interval} s; {h.jobs:,} jobs on the nodes in that time",
        ),
        ("series written (over the window)", f"{h.series:,} ({h.series / n:.0f} per node)"),
        ("series per node at the end (active)", f"{h.active_at_end / n:.0f}"),
        ("samples", f"{h.samples:,}"),
        ("OpenMetrics written", f"{mib(h.bytes)}; simulating and writing took {h.write_s:.0f} s"),
        (
            "create-blocks-from openmetrics",
            f"done {h.backfill_s:.0f} s after the start of writing; blocks {mib(r.blocks_bytes)} "
            f"({r.blocks_bytes / max(h.samples, 1):.2f} B/sample)",
        ),
        (
            "create-blocks-from rules",
            f"{r.rule_backfill_s:.0f} s for {', '.join(r.backfilled_rules) or 'nothing'}",
        ),
        ("Prometheus ready after start", f"{r.ready_s:.1f} s"),
        ("compaction of the backfilled blocks settled after", f"{r.settle_s:.0f} s"),
        ("head series (live scrape + rules)", f"{r.head_series:,.0f}"),
        ("Prometheus resident memory", mib(r.rss_bytes)),
        ("rule group iterations missed", f"{r.missed:.0f}"),
        (
            "recording rules with output",
            f"{len(r.outputs)} rules, {sum(r.outputs.values()):,} series; none from "
            + (", ".join(r.silent) or "-"),
        ),
    ]
    rows += [(f"ERROR in rule {name}", error) for name, error in sorted(r.errors.items())]
    for name, value in rows:
        print(f"| {name} | {value} |")
    print("\n| rule group | evaluations | median | max |\n|---|---|---|---|")
    for name, times in sorted(r.groups.items()):
        print(
            f"| {name} | {len(times)} | {statistics.median(times) * 1000:,.1f} ms "
            f"| {max(times) * 1000:,.1f} ms |"
        )
    total = sum(statistics.median(t) for t in r.groups.values())
    print(f"| all groups | | {total * 1000:,.1f} ms | |")
    ranked = sorted(r.rule_times.items(), key=lambda kv: -statistics.median(kv[1]))
    print("\n| slowest rules | median |\n|---|---|")
    for name, times in ranked[:6]:
        print(f"| {name} | {statistics.median(times) * 1000:,.1f} ms |")
    print(
        "\n| Fleet dashboard panel | query | first | median of 3 | series |\n|---|---|---|---|---|"
    )
    for panel, kind, first, median, series in r.queries:
        print(f"| {panel} | {kind} | {first * 1000:,.0f} ms | {median * 1000:,.0f} ms | {series} |")
    print(
        f"| all, one after another | | {sum(q[2] for q in r.queries) * 1000:,.0f} ms "
        f"| {sum(q[3] for q in r.queries) * 1000:,.0f} ms | |"
    )


def fit(xs: Sequence[float], ys: Sequence[float], at: float) -> float:
    """Least-squares line through (xs, ys), read at `at`."""
    if len(xs) < 2:
        return math.nan
    slope, intercept = np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)
    return float(slope * at + intercept)


def summary(runs: Sequence[Run], target_gpus: int) -> None:
    target = target_gpus / GPUS
    cols = [f"{r.nodes} nodes" for r in runs] + [f"{target:,.0f} nodes (fit)"]
    print(f"\n### Summary, and a straight-line fit to {target_gpus:,} GPUs\n")
    print("| measure | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    xs = [r.nodes for r in runs]

    def row(name: str, ys: list[float], fmt: Callable[[float], str]) -> None:
        print(f"| {name} | " + " | ".join(fmt(y) for y in ys) + f" | {fmt(fit(xs, ys, target))} |")

    row("head series", [r.head_series for r in runs], lambda v: f"{v:,.0f}")
    row("series written over the window", [r.history.series for r in runs], lambda v: f"{v:,.0f}")
    row(
        "Prometheus resident memory (MiB)",
        [r.rss_bytes / 2**20 for r in runs],
        lambda v: f"{v:,.0f}",
    )
    row("blocks on disk (MiB)", [r.blocks_bytes / 2**20 for r in runs], lambda v: f"{v:,.0f}")
    row(
        "all rule groups, one evaluation (ms)",
        [sum(statistics.median(t) for t in r.groups.values()) * 1000 for r in runs],
        lambda v: f"{v:,.0f}",
    )
    row(
        "Fleet dashboard, all queries (ms)",
        [sum(q[3] for q in r.queries) * 1000 for r in runs],
        lambda v: f"{v:,.0f}",
    )
    row(
        "slowest dashboard query (ms)",
        [max(q[3] for q in r.queries) * 1000 for r in runs],
        lambda v: f"{v:,.0f}",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--days", type=float, default=1.0, help="history to backfill")
    ap.add_argument("--interval", type=int, default=30, help="scrape and rule interval, s")
    ap.add_argument("--jobs", type=float, default=12, help="jobs arriving per node per day")
    ap.add_argument("--evaluations", type=int, default=3, help="rule evaluations to time")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tmp", help="where to write (needs ~130 bytes per sample)")
    args = ap.parse_args()
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian package prometheus)")
    started = time.monotonic()
    runs = []
    for nodes in args.nodes:
        runs.append(run(nodes, args))
        report(runs[-1], args)
    summary(runs, 10_000)
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} CPUs, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
        f"total {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
