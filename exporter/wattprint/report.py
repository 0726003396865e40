"""`wattprint report`: what a job used and emitted, asked from a Prometheus server.

For every job (scheduler, namespace, workload) in the range: duration, energy per
component and per GPU, emissions, the intensity it ran under, PUE, the share that was
estimated rather than measured, and its emission budget where one is recorded.

Energy is the exact rise of the exporter's counters over (since, until], not
increase(): increase() extrapolates, and a job's series is born inside the range with
a first value that already holds the energy drawn before the first scrape, which
increase() leaves out. Here the counters are read at a grid of steps that ends
exactly at `until` (last_over_time over max(step, 5m), so a scrape gap does not break
the chain), a series absent before counts from zero, and where resets() sees an
exporter restart the raw samples are added up. docs/report.md has the details.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import dataclasses
import datetime as dt
import io
import json
import math
import os
import re
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import ghg, registry, sci
from .config import parse_duration
from .promapi import PrometheusClient, PrometheusError, format_ms, quote

ENERGY = "wattprint_workload_energy_joules_total"
EMISSIONS = "wattprint_workload_emissions_grams_total"
EMBODIED = "wattprint_workload_embodied_grams_total"
MEASUREMENT = "wattprint_measurement_info"
PUE = "wattprint_pue_ratio"
GPU_COUNTER = "wattprint_gpu_energy_joules_total"
INTENSITY = "wattprint_grid_carbon_intensity_grams_per_kwh"
BUDGET = "namespace_workload:wattprint_emissions_budget_grams:30d"
# The methods the sources declare as estimated (registry.py); unknown ones count too.
ESTIMATED_METHODS = registry.estimated_methods()
COMPONENTS = ("gpu", "cpu", "memory")
JOULES_PER_KWH = 3.6e6

MAX_STEPS = 1000
# VictoriaMetrics replaces the points of a range query within -search.latencyOffset
# (30 s) of now by the point before, at steps under -search.maxStepForPointsAdjustment
# (1m): a running job would lose its last half minute. From a minute up it leaves
# them alone; the totals do not depend on the step.
MIN_STEP_S = 60.0
LOOKBACK_S = 300.0  # Prometheus's default lookback delta
BASELINE_LOOKBACK_S = 86400.0
DEFAULT_RETENTION_S = 15 * 86400.0  # Prometheus's default
# How far back to look for the oldest data on a server that does not report its
# retention (VictoriaMetrics, Thanos, Mimir): a tenth of VictoriaMetrics' maximum.
PROBE_SPAN_S = 10 * 365 * 86400.0
MAX_INSTANCE_FILTER = 200
PROGRESS_AFTER_S = 1.0
FORMATS = ("table", "csv", "json", "codecarbon-csv", "ghg-csv", "ghg-json")

# codecarbon 3.x emissions.csv, in its order (tests/fixtures/h200/codecarbon-4-processes).
CODECARBON_COLUMNS = (
    "timestamp",
    "project_name",
    "run_id",
    "experiment_id",
    "duration",
    "emissions",
    "emissions_rate",
    "cpu_power",
    "gpu_power",
    "ram_power",
    "cpu_energy",
    "gpu_energy",
    "ram_energy",
    "energy_consumed",
    "water_consumed",
    "country_name",
    "country_iso_code",
    "region",
    "cloud_provider",
    "cloud_region",
    "os",
    "python_version",
    "codecarbon_version",
    "cpu_count",
    "cpu_model",
    "gpu_count",
    "gpu_model",
    "longitude",
    "latitude",
    "ram_total_size",
    "tracking_mode",
    "cpu_utilization_percent",
    "gpu_utilization_percent",
    "ram_utilization_percent",
    "ram_used_gb",
    "on_cloud",
    "pue",
    "wue",
)


class ReportError(Exception):
    """Nothing to report (unknown workload, empty range); str() is one line."""


class UsageError(Exception):
    """A bad combination of flags; str() is one line. Exit status 2."""


# -- command line ------------------------------------------------------------------------


def _arg_type(parse: Any) -> Any:
    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    wrapped.__name__ = getattr(parse, "__name__", "value")
    return wrapped


def _url(text: str) -> str:
    if not re.match(r"^https?://[^\s/]+", text):
        raise ValueError(f"{text!r} is not an http(s) URL (e.g. http://prometheus:9090)")
    return text.rstrip("/")


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"{text!r} must be longer than 0")
    return value


def parse_time(text: str, now: float | None = None) -> float:
    """A point in time: now, Unix seconds, RFC 3339 / ISO 8601 (UTC unless it says
    otherwise), or a duration meaning that long ago (6h)."""
    now = time.time() if now is None else now
    value = text.strip()
    if value == "now":
        return now
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return now - parse_duration(value)
    except ValueError:
        pass
    iso = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        moment = dt.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (use 2024-05-01T12:00:00Z, Unix seconds, now, "
            "or 6h for 6 hours ago)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp()


def _time(text: str) -> float:
    return parse_time(text)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Energy (kWh per component and per GPU), emissions (kg CO2e), intensity, PUE and "
        "the estimated share of each job, from the Prometheus server that scrapes the "
        "exporters. How each number is computed: docs/report.md."
    )
    env = os.environ
    url = env.get("WATTPRINT_PROMETHEUS_URL")
    server = parser.add_argument_group("Prometheus server")
    server.add_argument(
        "--prometheus.url",
        dest="prometheus_url",
        type=_arg_type(_url),
        default=url,
        metavar="URL",
        help="base URL of the Prometheus (or compatible) server (env WATTPRINT_PROMETHEUS_URL)",
    )
    server.add_argument(
        "--prometheus.bearer-token-file",
        dest="bearer_token_file",
        default=env.get("WATTPRINT_PROMETHEUS_BEARER_TOKEN_FILE"),
        metavar="PATH",
        help="send the token in this file as 'Authorization: Bearer' "
        "(env WATTPRINT_PROMETHEUS_BEARER_TOKEN_FILE)",
    )
    server.add_argument(
        "--prometheus.username",
        dest="username",
        default=env.get("WATTPRINT_PROMETHEUS_USERNAME"),
        metavar="NAME",
        help="basic auth user; the password comes from env WATTPRINT_PROMETHEUS_PASSWORD "
        "(env WATTPRINT_PROMETHEUS_USERNAME)",
    )
    server.add_argument(
        "--prometheus.ca-file",
        dest="ca_file",
        default=env.get("WATTPRINT_PROMETHEUS_CA_FILE"),
        metavar="PATH",
        help="CA certificate(s) to verify the server with (env WATTPRINT_PROMETHEUS_CA_FILE)",
    )
    server.add_argument(
        "--prometheus.insecure-skip-verify",
        dest="insecure_skip_verify",
        action="store_true",
        default=env.get("WATTPRINT_PROMETHEUS_INSECURE_SKIP_VERIFY", "").lower()
        in ("1", "true", "yes"),
        help="do not verify the server's TLS certificate",
    )
    server.add_argument(
        "--prometheus.timeout",
        dest="timeout",
        type=_arg_type(_positive_duration),
        default=env.get("WATTPRINT_PROMETHEUS_TIMEOUT", "2m"),
        metavar="DURATION",
        help="give up on a request after this long (default 2m)",
    )
    what = parser.add_argument_group("what to report")
    what.add_argument("--workload", metavar="NAME", help="one workload (default: all)")
    what.add_argument("--namespace", metavar="NS", help="only workloads in this namespace")
    what.add_argument(
        "--range",
        dest="range",
        type=_arg_type(_positive_duration),
        metavar="DURATION",
        help="this long before --until (e.g. 24h); default: each job's whole life",
    )
    what.add_argument(
        "--since",
        type=_arg_type(_time),
        metavar="TIME",
        help="start: 2024-05-01T12:00:00Z, Unix seconds, or 6h (ago)",
    )
    what.add_argument("--until", type=_arg_type(_time), metavar="TIME", help="end (default now)")
    parser.add_argument(
        "--from-files",
        dest="from_files",
        metavar="DIR",
        help="no Prometheus: add up the files `wattprint run` and wattprint.track() wrote "
        "under DIR (one per node or rank), per node and for the job",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (default), csv, json, codecarbon-csv (codecarbon's emissions.csv columns), "
        "or ghg-csv / ghg-json (Scope 2 location-based and Scope 3 embodied, with factors)",
    )
    sci.add_arguments(parser)


def _client(args: argparse.Namespace) -> PrometheusClient:
    token: str | None = None
    if args.bearer_token_file:
        if args.username:
            raise UsageError(
                "use either --prometheus.bearer-token-file or --prometheus.username, not both"
            )
        try:
            with open(args.bearer_token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError as err:
            raise UsageError(
                f"cannot read --prometheus.bearer-token-file={args.bearer_token_file}: "
                f"{err.strerror}"
            ) from None
        if not token:
            raise UsageError(f"--prometheus.bearer-token-file={args.bearer_token_file} is empty")
    basic: tuple[str, str] | None = None
    if args.username:
        password = os.environ.get("WATTPRINT_PROMETHEUS_PASSWORD")
        if password is None:
            raise UsageError(
                "--prometheus.username needs the password in env WATTPRINT_PROMETHEUS_PASSWORD"
            )
        basic = (args.username, password)
    verify: bool | str = True
    if args.insecure_skip_verify:
        verify = False
        import urllib3

        # The user asked for it; one warning per request would bury the report.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    elif args.ca_file:
        if not os.path.isfile(args.ca_file):
            raise UsageError(f"--prometheus.ca-file={args.ca_file}: no such file")
        verify = args.ca_file
    return PrometheusClient(
        args.prometheus_url,
        bearer_token=token,
        basic_auth=basic,
        verify=verify,
        timeout=args.timeout,
    )


# -- the time grid ---------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Steps since + k*step for k = 0..steps; the last one is `until` exactly."""

    since: float
    until: float
    step: float
    steps: int
    whole_life: bool  # no range given: since is the oldest data the server keeps
    server: str = "Prometheus"  # the engine that answered, as the output names it
    retention_reported: bool = True  # whole life: since came from the server's retention

    @property
    def lookback(self) -> float:
        # At least one step, so that consecutive steps see every sample; at least
        # Prometheus's lookback, so that a slow scrape interval leaves no hole.
        return max(self.step, LOOKBACK_S)

    def at(self, k: int) -> float:
        return self.since + k * self.step

    def index(self, t: float) -> int:
        return round((t - self.since) / self.step)


def make_window(since: float, until: float, whole_life: bool) -> Window:
    until_ms = round(until * 1000)
    span_ms = max(1, until_ms - round(since * 1000))
    # A whole number of milliseconds per step, so that the server evaluates exactly at
    # our steps, and at least MIN_STEP_S each. Prefer a count of steps that divides the
    # range (down to half the most that fit); failing that, the range grows by less
    # than `steps` ms at its start to fit.
    most = max(1, min(MAX_STEPS, span_ms // round(MIN_STEP_S * 1000)))
    steps = next((n for n in range(most, (most - 1) // 2, -1) if span_ms % n == 0), most)
    step_ms = -(-span_ms // steps)
    since_ms = until_ms - steps * step_ms
    return Window(since_ms / 1000, until_ms / 1000, step_ms / 1000, steps, whole_life)


def _resolve_range(args: argparse.Namespace, client: PrometheusClient, now: float) -> Window:
    given = [name for name in ("range", "since", "until") if getattr(args, name) is not None]
    if len(given) == 3:
        raise UsageError("give at most two of --range, --since and --until")
    until = args.until if args.until is not None else now
    if args.range is not None and args.since is not None:
        until = args.since + args.range
    since = args.since
    if since is None and args.range is not None:
        since = until - args.range
    if since is not None and since >= until:
        raise UsageError(f"the range is empty: {_iso(since)} is not before {_iso(until)}")
    server = client.server()
    whole_life = since is None
    reported = True
    if since is None:
        retention = _parse_retention(server.retention)
        if retention is None:
            reported = False
            selector = _workload_selector(args.workload, args.namespace)
            since = _oldest_data(client, selector, now) or now - DEFAULT_RETENTION_S
        else:
            since = now - retention
    if since >= until:
        raise UsageError(f"the range is empty: {_iso(since)} is not before {_iso(until)}")
    window = make_window(since, until, whole_life)
    return dataclasses.replace(window, server=server.engine, retention_reported=reported)


def _parse_retention(text: str | None) -> float | None:
    # "15d", "15d or 10GiB", "10GiB": the time part, if any.
    for part in (text or "").split():
        try:
            value = parse_duration(part)
        except ValueError:
            continue
        if value > 0:
            return value
    return None


def _oldest_data(client: PrometheusClient, selector: str, now: float) -> float | None:
    """A time before the oldest sample of the selected workload counters (by at most a
    thousandth of the span searched), or None where there is none."""
    step = PROBE_SPAN_S / MAX_STEPS
    found = client.range(
        f"count(last_over_time({ENERGY}{selector}[{format_ms(step)}]))",
        now - PROBE_SPAN_S,
        now,
        step,
    )
    times = [t for series in found for t, _ in series.samples]
    return min(times) - step if times else None


# -- reading counters ------------------------------------------------------------------


def _selector(matchers: dict[str, str], negative: Sequence[str] = ()) -> str:
    parts = [f"{name}={quote(value)}" for name, value in matchers.items()]
    parts += [f"{name}!=''" for name in negative]
    return "{" + ",".join(parts) + "}"


def _workload_selector(workload: str | None, namespace: str | None) -> str:
    matchers: dict[str, str] = {}
    if workload is not None:
        matchers["workload"] = workload
    if namespace is not None:
        matchers["namespace"] = namespace
    return _selector(matchers, () if workload is not None else ("workload",))


def _series_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def _job_key(labels: dict[str, str]) -> tuple[str, str, str]:
    return (labels.get("scheduler", ""), labels.get("namespace", ""), labels.get("workload", ""))


# The exporter's labels on the workload counters; Prometheus drops the empty ones.
WORKLOAD_LABELS = ("component", "gpu", "scheduler", "namespace", "workload", "pod")


def _exact_selector(metric: str, labels: dict[str, str]) -> str:
    """A selector for this one series: an absent label must stay absent, or a job's
    pod-less series would also match its pods'."""
    matchers = {name: "" for name in WORKLOAD_LABELS}
    matchers.update({k: v for k, v in labels.items() if k != "__name__"})
    return metric + _selector(matchers)


@dataclass
class Counter:
    """One counter series over the window: its rise per step."""

    labels: dict[str, str]
    deltas: dict[int, float] = field(default_factory=dict)
    values: dict[int, float] = field(default_factory=dict)
    baseline: float | None = None  # its value at `since`, when it existed before
    first_step: int | None = None  # the first step it is seen at, after `since`
    rising_at_until: bool = False  # it rose between the samples around `until`

    @property
    def total(self) -> float:
        return sum(self.deltas.values())

    def value_before(self, k: int) -> float:
        earlier = [j for j in self.values if j < k]
        if earlier:
            return self.values[max(earlier)]
        return self.baseline if self.baseline is not None else 0.0


def read_counters(
    client: PrometheusClient, metric: str, selector: str, window: Window
) -> dict[tuple[tuple[str, str], ...], Counter]:
    # The value at `since` of every series that existed in the day before it: what
    # the range's rise starts from. Older ones count as born inside the range.
    baseline = format_ms(max(BASELINE_LOOKBACK_S, window.lookback))
    base = client.instant(f"last_over_time({metric}{selector}[{baseline}])", window.since)
    grid = client.range(
        f"last_over_time({metric}{selector}[{format_ms(window.lookback)}])",
        window.since,
        window.until,
        window.step,
    )
    counters: dict[tuple[tuple[str, str], ...], Counter] = {}
    for series in base:
        if series.samples:
            key = _series_key(series.labels)
            counters[key] = Counter(series.labels, baseline=series.samples[-1][1])
    restarts = _steps_with_resets(client, metric, selector, window)
    for series in grid:
        key = _series_key(series.labels)
        counter = counters.setdefault(key, Counter(series.labels))
        flagged = restarts.get(key, set())
        last = counter.baseline
        last_k = 0
        raw_rise: dict[int, float] = {}
        raw_until = -1
        for t, value in series.samples:
            k = window.index(t)
            if k <= 0:
                continue  # the value at `since` is the baseline
            if counter.first_step is None and counter.baseline is None:
                counter.first_step = k
            start = 0.0 if last is None else last
            if k in flagged and k > raw_until:
                # A restart can hide inside a step (the counter starts over and
                # climbs past its old value before the step ends): read the raw
                # samples of the whole run of steps around it, in one query.
                raw_until = k
                while raw_until + 1 in flagged:
                    raw_until += 1
                raw_rise = _raw_rise(
                    client, metric, counter.labels, window, last_k, raw_until, start
                )
            if k <= raw_until:
                delta = raw_rise.get(k, 0.0)
            elif last is not None and value < last:
                delta = sum(
                    _raw_rise(client, metric, counter.labels, window, last_k, k, last).values()
                )
            elif last is None:
                delta = value  # born in the range: its counter started at zero
            else:
                delta = value - last
            if delta:
                counter.deltas[k] = delta
            counter.values[k] = value
            last, last_k = value, k
    _interpolate_edges(client, metric, selector, window, counters)
    # A series seen only before the range holds no energy of it.
    return {key: c for key, c in counters.items() if c.values}


def _interpolate_edges(
    client: PrometheusClient,
    metric: str,
    selector: str,
    window: Window,
    counters: dict[tuple[tuple[str, str], ...], Counter],
) -> None:
    """Cut the rise between the samples around `since` and `until` at those instants.

    Counter differencing alone covers the range from the last sample at or before
    `since` to the last at or before `until`: each end up to one scrape interval early.
    Taking the power as steady between the two samples around an end puts it where the
    range asks, within what that power varied by between them. A range of the whole
    life has no start to cut, and at its end no sample after `until` unless it was
    given in the past.
    """
    since_ms, step_ms = round(window.since * 1000), round(window.step * 1000)
    last = window.steps
    starts = {} if window.whole_life else _edges(client, metric, selector, window.since)
    paired = set()
    for key, (before, after) in starts.items():
        counter = counters.get(key)
        if counter is None or counter.baseline is None:
            continue
        if after[0] > window.until:
            # No sample inside the range: its share of the rise around it is all there is.
            paired.add(key)
            drawn = _drawn_before(before, after, window.until)
            drawn -= _drawn_before(before, after, window.since)
            counter.deltas = {last: drawn} if drawn > 0 else {}
            counter.values.setdefault(last, before[1])
            counter.rising_at_until = drawn > 0
            continue
        # The rise up to `after` is in the step that holds it.
        k = min(-(-(round(after[0] * 1000) - since_ms) // step_ms), last)
        _add_delta(counter, k, -_drawn_before(before, after, window.since))
    for key, (before, after) in _edges(client, metric, selector, window.until).items():
        counter = counters.get(key)
        if counter is None or key in paired or last not in counter.values:
            continue
        drawn = _drawn_before(before, after, window.until)
        _add_delta(counter, last, drawn)
        counter.rising_at_until = drawn > 0


def _add_delta(counter: Counter, k: int, joules: float) -> None:
    if not joules:
        return
    total = counter.deltas.get(k, 0.0) + joules
    # A step whose whole rise came before `since` rose by nothing in the range.
    if total > 1e-9 * max(abs(joules), 1.0):
        counter.deltas[k] = total
    else:
        counter.deltas.pop(k, None)


def _edges(
    client: PrometheusClient, metric: str, selector: str, t: float
) -> dict[tuple[tuple[str, str], ...], tuple[tuple[float, float], tuple[float, float]]]:
    """Per series, its last sample at or before t and its first after it, each within
    Prometheus's lookback of t (farther apart, they say little about t)."""
    raw = client.instant(f"{metric}{selector}[{format_ms(2 * LOOKBACK_S)}]", t + LOOKBACK_S)
    found = {}
    for series in raw:
        before = [s for s in series.samples if s[0] <= t]
        after = [s for s in series.samples if s[0] > t]
        if before and after:
            found[_series_key(series.labels)] = (before[-1], after[0])
    return found


def _drawn_before(before: tuple[float, float], after: tuple[float, float], t: float) -> float:
    """Of the rise between two samples, the part drawn before t, at a steady power."""
    (t0, v0), (t1, v1) = before, after
    if v1 < v0:  # a restart between them: what came before t is unknown, count none
        return 0.0
    return (v1 - v0) * (t - t0) / (t1 - t0)


def _steps_with_resets(
    client: PrometheusClient, metric: str, selector: str, window: Window
) -> dict[tuple[tuple[str, str], ...], set[int]]:
    """Per series that went down (an exporter restart) in the range, the steps to read
    sample by sample. Rare, so the search runs only for series that have any."""
    span = format_ms(window.until - window.since + window.lookback)
    found: dict[tuple[tuple[str, str], ...], set[int]] = {}
    for series in client.instant(f"resets({metric}{selector}[{span}])", window.until):
        if not series.samples or series.samples[-1][1] <= 0:
            continue
        # Windows of a step plus the lookback overlap, so that a reset between the
        # last sample before a step and the first one in it is seen too.
        steps = client.range(
            f"resets({_exact_selector(metric, series.labels)}"
            f"[{format_ms(window.step + window.lookback)}])",
            window.since,
            window.until,
            window.step,
        )
        found[_series_key(series.labels)] = {
            window.index(t) for s in steps for t, count in s.samples if count > 0
        }
    return found


def _raw_rise(
    client: PrometheusClient,
    metric: str,
    labels: dict[str, str],
    window: Window,
    from_k: int,
    to_k: int,
    start: float,
) -> dict[int, float]:
    """The exact rise of one series per step over steps from_k+1..to_k, from its raw
    samples, starting from its value `start` at step from_k."""
    t0, t1 = window.at(from_k), window.at(to_k)
    raw = client.instant(f"{_exact_selector(metric, labels)}[{format_ms(t1 - t0)}]", t1)
    samples = sorted(s for series in raw for s in series.samples if s[0] > t0)
    since_ms, step_ms = round(window.since * 1000), round(window.step * 1000)
    rise: dict[int, float] = defaultdict(float)
    last = start
    for t, value in samples:
        # The step k whose interval (at(k-1), at(k)] holds the sample, in whole ms.
        k = -(-(round(t * 1000) - since_ms) // step_ms)
        rise[k] += value - last if value >= last else value
        last = value
    return rise


# -- putting a job together ------------------------------------------------------------


@dataclass
class Component:
    energy_j: float = 0.0
    emissions_g: float = 0.0
    estimated_j: float = 0.0
    pue_energy_j: float = 0.0  # sum of energy x PUE, to divide PUE out of emissions
    methods: set[str] = field(default_factory=set)


@dataclass
class GpuUse:
    instance: str
    gpu: str
    model: str = ""
    energy_j: float = 0.0
    emissions_g: float = 0.0
    estimated_j: float = 0.0


@dataclass
class JobReport:
    scheduler: str
    namespace: str
    workload: str
    start: float = 0.0
    end: float = 0.0
    components: dict[str, Component] = field(
        default_factory=lambda: {name: Component() for name in COMPONENTS}
    )
    gpus: dict[tuple[str, str], GpuUse] = field(default_factory=dict)
    instances: set[tuple[str, str]] = field(default_factory=set)  # (job, instance)
    zones: set[str] = field(default_factory=set)
    budget_grams: float | None = None
    notes: list[str] = field(default_factory=list)
    embodied_g: float = 0.0  # Scope 3: the hardware's embodied emissions it accrued

    @property
    def footprint_g(self) -> float:
        """Operational (Scope 2, location-based) plus embodied (Scope 3)."""
        return self.emissions_g + self.embodied_g

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def energy_j(self) -> float:
        return sum(c.energy_j for c in self.components.values())

    @property
    def emissions_g(self) -> float:
        return sum(c.emissions_g for c in self.components.values())

    @property
    def estimated_j(self) -> float:
        return sum(c.estimated_j for c in self.components.values())

    @property
    def pue(self) -> float | None:
        energy = self.energy_j
        pue_energy = sum(c.pue_energy_j for c in self.components.values())
        return pue_energy / energy if energy > 0 else None

    @property
    def intensity(self) -> float | None:
        """g CO2e per kWh drawn by the devices, the facility overhead (PUE) divided out."""
        pue_energy = sum(c.pue_energy_j for c in self.components.values())
        return self.emissions_g / (pue_energy / JOULES_PER_KWH) if pue_energy > 0 else None

    @property
    def budget_used(self) -> float | None:
        if self.budget_grams is None or self.budget_grams <= 0:
            return None
        return self.emissions_g / self.budget_grams


def _instance_key(labels: dict[str, str]) -> tuple[str, str]:
    return (labels.get("job", ""), labels.get("instance", ""))


def _instance_filter(instances: set[tuple[str, str]]) -> str:
    names = sorted({instance for _, instance in instances})
    if not names or len(names) > MAX_INSTANCE_FILTER:
        return ""
    return "instance=~" + quote("|".join(re.escape(n) for n in names))


class _StepLookup:
    """A per-step value of a gauge, keyed by labels, carried forward over gaps."""

    def __init__(self) -> None:
        self._steps: dict[Any, dict[int, Any]] = defaultdict(dict)
        self._order: dict[Any, list[int]] = {}

    def add(self, key: Any, k: int, value: Any) -> None:
        self._steps[key][k] = value
        self._order.pop(key, None)

    def collect(self, key: Any, k: int, item: Any) -> None:
        """Add an item to the set at a step (several series can be seen at one step)."""
        self._steps[key].setdefault(k, set()).add(item)
        self._order.pop(key, None)

    def get(self, key: Any, k: int) -> Any:
        steps = self._steps.get(key)
        if not steps:
            return None
        if k in steps:
            return steps[k]
        order = self._order.get(key)
        if order is None:
            order = self._order[key] = sorted(steps)
        i = bisect.bisect_right(order, k)
        return steps[order[i - 1] if i else order[0]]


def build_reports(
    client: PrometheusClient,
    window: Window,
    workload: str | None,
    namespace: str | None,
    progress: Progress,
) -> list[JobReport]:
    selector = _workload_selector(workload, namespace)

    progress.say("reading energy counters")
    energy = read_counters(client, ENERGY, selector, window)
    progress.say("reading emissions counters")
    emissions = read_counters(client, EMISSIONS, selector, window)

    jobs: dict[tuple[str, str, str], JobReport] = {}
    for counter in [*energy.values(), *emissions.values()]:
        key = _job_key(counter.labels)
        if key not in jobs:
            jobs[key] = JobReport(*key)
        jobs[key].instances.add(_instance_key(counter.labels))
    if not jobs:
        raise ReportError(_why_empty(client, window, workload, namespace))

    instances = set().union(*(job.instances for job in jobs.values()))
    where = _instance_filter(instances)
    progress.say("reading measurement methods and PUE")
    methods = _StepLookup()
    for series in client.range(
        f"last_over_time({MEASUREMENT}{{{where}}}[{format_ms(window.lookback)}])",
        window.since,
        window.until,
        window.step,
    ):
        labels = series.labels
        device = (*_instance_key(labels), labels.get("component", ""))
        for t, _ in series.samples:
            methods.collect(
                device, window.index(t), (labels.get("device", ""), labels.get("method", ""))
            )
    pues = _StepLookup()
    for series in client.range(
        f"last_over_time({PUE}{{{where}}}[{format_ms(window.lookback)}])",
        window.since,
        window.until,
        window.step,
    ):
        for t, value in series.samples:
            pues.add(_instance_key(series.labels), window.index(t), value)

    for counter in energy.values():
        job = jobs[_job_key(counter.labels)]
        _add_energy(job, counter, methods, pues)
    for counter in emissions.values():
        job = jobs[_job_key(counter.labels)]
        component = counter.labels.get("component", "")
        if component in job.components:
            job.components[component].emissions_g += counter.total
        if component == "gpu":
            gpu = job.gpus.setdefault(
                (counter.labels.get("instance", ""), counter.labels.get("gpu", "")),
                GpuUse(counter.labels.get("instance", ""), counter.labels.get("gpu", "")),
            )
            gpu.emissions_g += counter.total

    progress.say("reading embodied emissions counters")
    for counter in read_counters(client, EMBODIED, selector, window).values():
        job_key = _job_key(counter.labels)
        if job_key in jobs:
            jobs[job_key].embodied_g += counter.total

    active = [job for job in jobs.values() if job.energy_j > 0]
    if not active:
        raise ReportError(_why_flat(window, workload, namespace))

    by_job: dict[tuple[str, str, str], list[Counter]] = defaultdict(list)
    for counter in energy.values():
        by_job[_job_key(counter.labels)].append(counter)
    for number, job in enumerate(active, start=1):
        progress.say(f"finding when job {number}/{len(active)} ran")
        _find_life(client, window, job, by_job[(job.scheduler, job.namespace, job.workload)])
        _note_restarts(client, job)

    progress.say("reading GPU models, zones and budgets")
    _add_context(client, window, active, where)
    active.sort(key=lambda j: (j.start, j.namespace, j.workload, j.scheduler))
    return active


def _add_energy(job: JobReport, counter: Counter, methods: _StepLookup, pues: _StepLookup) -> None:
    labels = counter.labels
    component = labels.get("component", "")
    if component not in job.components:
        return
    totals = job.components[component]
    node = _instance_key(labels)
    gpu_label = labels.get("gpu", "")
    gpu: GpuUse | None = None
    if component == "gpu":
        gpu = job.gpus.setdefault(
            (labels.get("instance", ""), gpu_label), GpuUse(labels.get("instance", ""), gpu_label)
        )
    missing_pue = False
    for k, delta in counter.deltas.items():
        seen = methods.get((*node, component), k) or set()
        used = {m for device, m in seen if component != "gpu" or device == gpu_label}
        # A device whose method is unknown, or changed within the step, counts as
        # estimated: the report never claims more measurement than there was.
        estimated = not used or bool(used & ESTIMATED_METHODS)
        totals.methods |= used
        pue = pues.get(node, k)
        if pue is None:
            missing_pue, pue = True, 1.0
        totals.energy_j += delta
        totals.pue_energy_j += delta * pue
        if estimated:
            totals.estimated_j += delta
        if gpu is not None:
            gpu.energy_j += delta
            if estimated:
                gpu.estimated_j += delta
    if missing_pue:
        note = f"no {PUE} from {node[1]}: PUE 1.0 assumed"
        if note not in job.notes:
            job.notes.append(note)


def _note_restarts(client: PrometheusClient, job: JobReport) -> None:
    """Say so when an exporter serving the job restarted during its life: resumed from
    its state file (the gap's energy booked from the hardware counters), or not (the
    device counters reset: what the devices used while it was down is missing)."""
    where = _instance_filter(job.instances)
    span = format_ms(max(job.end - job.start, 1.0) + LOOKBACK_S)
    device = '__name__=~"wattprint_(gpu|cpu|memory)_energy_joules_total"'
    resumed = client.instant(
        f'sum by (instance) (changes(wattprint_restarts_total{{outcome="resumed"'
        f"{',' + where if where else ''}}}[{span}]))",
        job.end,
    )
    lost = client.instant(
        f"sum by (instance) (resets({{{device}{',' + where if where else ''}}}[{span}]))",
        job.end,
    )
    for series in resumed:
        count = round(series.samples[-1][1]) if series.samples else 0
        if count:
            job.notes.append(
                f"the exporter on {series.labels.get('instance', '?')} restarted {count} "
                "time(s) and resumed: the energy used while it was down was booked from "
                "the devices' counters (wattprint_restart_gap_energy_joules_total)"
            )
    for series in lost:
        if series.samples and series.samples[-1][1] > 0:
            job.notes.append(
                f"the exporter on {series.labels.get('instance', '?')} restarted without "
                "its state file: the energy used while it was down is missing"
            )


def _started(samples: Sequence[tuple[float, float]], after: float) -> float:
    """When a counter born at zero started.

    Its first sample already holds what was drawn before it, so the start moves back
    by the time that took at the rate of the next interval; at most one scrape
    interval, because the scrape before did not see the series, and never before
    `after`."""
    (t0, v0), rest = samples[0], samples[1:]
    if rest and v0 > 0:
        t1, v1 = rest[0]
        if v1 > v0 and t1 > t0:
            interval = t1 - t0
            return max(after, t0 - interval, t0 - v0 * interval / (v1 - v0))
    return t0


def _ended(samples: Sequence[tuple[float | None, float]]) -> float | None:
    """When a counter last rose: the sample that shows the last rise, moved back to
    where the rate of the interval before would have reached its final value."""
    changes = [i for i in range(1, len(samples)) if samples[i][1] != samples[i - 1][1]]
    if not changes:
        return None
    i = changes[-1]
    t_end, v_end = samples[i]
    t_prev, v_prev = samples[i - 1]
    if t_end is None:
        return None
    if i >= 2 and t_prev is not None and samples[i - 2][0] is not None:
        t_before, v_before = samples[i - 2]
        assert t_before is not None
        if v_prev > v_before and v_end > v_prev and t_prev > t_before:
            rate = (v_prev - v_before) / (t_prev - t_before)
            return min(t_end, t_prev + (v_end - v_prev) / rate)
    return t_end


def _find_life(
    client: PrometheusClient, window: Window, job: JobReport, counters: list[Counter]
) -> None:
    """Start and end of the job in the range, from the raw samples around them."""
    selector = ENERGY + _selector(
        {"scheduler": job.scheduler, "namespace": job.namespace, "workload": job.workload}
    )
    rising = [c for c in counters if c.deltas]
    if not rising:
        return

    def raw(at: float, span: float) -> dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]:
        result = client.instant(f"{selector}[{format_ms(span)}]", at)
        return {_series_key(s.labels): s.samples for s in result}

    if any(c.baseline is not None for c in rising):
        job.start = window.since
        if window.whole_life:
            job.notes.append(f"ran before {_iso(window.since)}, the oldest data kept")
    else:
        first = min(c.first_step for c in rising if c.first_step is not None)
        before = window.at(first - 1)
        at = min(window.until, window.at(first) + window.lookback)
        samples = raw(at, at - before)
        starts = [
            _started(after, before)
            for c in rising
            if c.first_step == first
            and (after := [p for p in samples.get(_series_key(c.labels), []) if p[0] > before])
        ]
        job.start = min(starts) if starts else window.at(first)
        if first == 1 and window.whole_life:
            job.notes.append(f"may have run before {_iso(window.since)}, the oldest data kept")
    last = max(max(c.deltas) for c in rising)
    before = window.at(last - 1)
    samples = raw(window.at(last), window.lookback + window.step)
    ends: list[float] = []
    for counter in rising:
        if last not in counter.deltas:
            continue
        points: list[tuple[float | None, float]] = list(
            samples.get(_series_key(counter.labels), [])
        )
        if points and points[0][0] is not None and points[0][0] > before:
            # No sample at or before the previous step in reach: its value there is known.
            points.insert(0, (None, counter.value_before(last)))
        end = _ended(points)
        if end is not None:
            ends.append(end)
    job.end = max(max(ends) if ends else window.at(last), job.start)
    if any(c.rising_at_until for c in rising):
        job.end = window.until  # still drawing when the range ends


def _add_context(
    client: PrometheusClient, window: Window, jobs: list[JobReport], where: str
) -> None:
    first = min(job.start for job in jobs)
    last = max(job.end for job in jobs)
    at = min(window.until, last + window.step)
    span = format_ms(max(at - first + window.lookback, window.step))
    for series in client.instant(
        f"group by (instance, gpu, model) (last_over_time({GPU_COUNTER}{{{where}}}[{span}]))", at
    ):
        key = (series.labels.get("instance", ""), series.labels.get("gpu", ""))
        for job in jobs:
            if key in job.gpus:
                job.gpus[key].model = series.labels.get("model", "")
    zone_filter = ",".join(x for x in (where, 'signal="average"') if x)
    for series in client.instant(
        f"group by (job, instance, zone) (last_over_time({INTENSITY}{{{zone_filter}}}[{span}]))",
        at,
    ):
        node = _instance_key(series.labels)
        for job in jobs:
            if node in job.instances and series.labels.get("zone"):
                job.zones.add(series.labels["zone"])
    names = sorted({job.workload for job in jobs})
    matcher = "workload=~" + quote("|".join(re.escape(n) for n in names))
    for series in client.instant(f"last_over_time({BUDGET}{{{matcher}}}[{span}])", at):
        if not series.samples:
            continue
        key = (series.labels.get("namespace", ""), series.labels.get("workload", ""))
        for job in jobs:
            if (job.namespace, job.workload) == key:
                job.budget_grams = series.samples[-1][1]


def _why_empty(
    client: PrometheusClient, window: Window, workload: str | None, namespace: str | None
) -> str:
    span = f"between {_iso(window.since)} and {_iso(window.until)}"
    hint = "" if window.whole_life else " (try a wider --range, or none for whole lives)"

    def unknown(label: str, value: str, known: list[str]) -> str:
        if not client.label_values("workload", ENERGY):
            return (
                f"no wattprint workload data on {client.url} at all: "
                "does this Prometheus scrape the wattprint exporter?"
            )
        import difflib

        close = difflib.get_close_matches(value, known, n=3, cutoff=0.6)
        suggestion = f"; did you mean {', '.join(close)}?" if close else ""
        return f"unknown {label} {value!r} on {client.url}{suggestion}"

    if workload is not None:
        known = client.label_values("workload", ENERGY)
        if workload not in known:
            return unknown("workload", workload, known)
        if namespace is not None:
            where = client.label_values("namespace", f"{ENERGY}{{workload={quote(workload)}}}")
            if namespace not in where:
                found = ", ".join(repr(n) for n in where) or "no namespace"
                return f"workload {workload!r} never ran in namespace {namespace!r} (only {found})"
        return f"workload {workload!r} has no data {span}{hint}"
    if namespace is not None:
        known = client.label_values("namespace", ENERGY)
        if namespace not in known:
            return unknown("namespace", namespace, known)
        return f"namespace {namespace!r} has no data {span}{hint}"
    if not client.label_values("workload", ENERGY):
        return unknown("workload", "", [])
    return f"no workload has data {span}{hint}"


def _why_flat(window: Window, workload: str | None, namespace: str | None) -> str:
    what = f"workload {workload!r}" if workload is not None else "no workload"
    if namespace is not None:
        what += f" in namespace {namespace!r}"
    span = f"between {_iso(window.since)} and {_iso(window.until)}"
    if workload is not None:
        return f"{what} used no energy {span}"
    return f"{what} used energy {span}"


# -- progress --------------------------------------------------------------------------


class Progress:
    """One self-rewriting line on a terminal once the queries take over a second.

    Nothing on a pipe or in a log: there a progress line is noise, and an error must
    stay the only line on stderr.
    """

    def __init__(self, stream: TextIO, enabled: bool, after: float = PROGRESS_AFTER_S) -> None:
        self._stream = stream
        self._enabled = enabled
        self._after = after
        self._what = "asking Prometheus"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False
        self._started = 0.0

    def say(self, what: str) -> None:
        self._what = what

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self._enabled:
            self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()

    def _run(self) -> None:
        if self._stop.wait(self._after):
            return
        while not self._stop.is_set():
            elapsed = time.monotonic() - self._started
            self._stream.write(f"\r\x1b[Kwattprint: {self._what} ({elapsed:.0f} s)")
            self._stream.flush()
            self._shown = True
            self._stop.wait(0.25)


# -- output ----------------------------------------------------------------------------


def _iso(t: float, ms: bool = False) -> str:
    moment = dt.datetime.fromtimestamp(t, tz=dt.timezone.utc)
    if ms:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _kwh(joules: float) -> float:
    return joules / JOULES_PER_KWH


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _num(value: float | None, digits: int = 4) -> str:
    """`digits` significant digits without an exponent: 0.005988, 344.1, 21557."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s"


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def _sorted_gpus(job: JobReport) -> list[GpuUse]:
    def order(gpu: GpuUse) -> tuple[str, int, str]:
        return (gpu.instance, int(gpu.gpu) if gpu.gpu.isdigit() else 1 << 30, gpu.gpu)

    return sorted(job.gpus.values(), key=order)


def render_table(jobs: Sequence[JobReport], window: Window, url: str) -> str:
    if window.whole_life and window.retention_reported:
        span = f"each job's whole life (data kept from {_iso(window.since)})"
    elif window.whole_life:
        span = (
            f"each job's whole life (data found from {_iso(window.since)}; "
            "the server does not report its retention)"
        )
    else:
        span = f"{_iso(window.since)} to {_iso(window.until)}"
    out = [f"{window.server} {url}: {span}", ""]
    rows = []
    for job in jobs:
        c = job.components
        rows.append(
            [
                job.workload,
                job.namespace or "-",
                job.scheduler,
                _iso(job.start),
                _duration(job.duration),
                _num(_kwh(job.energy_j)),
                _num(_kwh(c["gpu"].energy_j)),
                _num(_kwh(c["cpu"].energy_j)),
                _num(_kwh(c["memory"].energy_j)),
                _num(job.emissions_g / 1000),
                _num(job.intensity),
                _num(job.pue, 3),
                _percent(_share(job.estimated_j, job.energy_j)),
                _percent(job.budget_used),
            ]
        )
    header = [
        "WORKLOAD",
        "NAMESPACE",
        "SCHEDULER",
        "START",
        "DURATION",
        "ENERGY kWh",
        "GPU kWh",
        "CPU kWh",
        "MEMORY kWh",
        "CO2e kg",
        "g/kWh",
        "PUE",
        "ESTIMATED",
        "BUDGET USED",
    ]
    out.append(_aligned(header, rows, set(range(4, 14))))
    gpu_rows = [
        [
            job.workload,
            gpu.instance,
            gpu.gpu,
            gpu.model or "-",
            _num(_kwh(gpu.energy_j)),
            _num(gpu.emissions_g / 1000),
            _percent(_share(gpu.estimated_j, gpu.energy_j)),
        ]
        for job in jobs
        for gpu in _sorted_gpus(job)
    ]
    if gpu_rows:
        out += ["", "Energy per GPU"]
        header = ["WORKLOAD", "INSTANCE", "GPU", "MODEL", "ENERGY kWh", "CO2e kg", "ESTIMATED"]
        out.append(_aligned(header, gpu_rows, {4, 5, 6}))
    part_rows = [
        [
            job.workload,
            name,
            _num(_kwh(part.energy_j)),
            _num(_kwh(part.energy_j - part.estimated_j)),
            _num(_kwh(part.estimated_j)),
            ",".join(sorted(part.methods)) or "unknown",
        ]
        for job in jobs
        for name, part in job.components.items()
        if part.energy_j > 0
    ]
    out += ["", "Measured and estimated"]
    header = ["WORKLOAD", "COMPONENT", "ENERGY kWh", "MEASURED kWh", "ESTIMATED kWh", "METHOD"]
    out.append(_aligned(header, part_rows, {2, 3, 4}))
    if any(job.embodied_g > 0 for job in jobs):
        out += ["", "Operational and embodied"]
        header = ["WORKLOAD", "OPERATIONAL CO2e kg", "EMBODIED CO2e kg", "TOTAL CO2e kg"]
        scope_rows = [
            [
                job.workload,
                _num(job.emissions_g / 1000),
                _num(job.embodied_g / 1000),
                _num(job.footprint_g / 1000),
            ]
            for job in jobs
        ]
        out.append(_aligned(header, scope_rows, {1, 2, 3}))
    notes = [f"  {job.workload}: {note}" for job in jobs for note in job.notes]
    budgets = [
        f"  {job.workload}: {_num(job.emissions_g)} g of a 30-day budget of "
        f"{_num(job.budget_grams)} g"
        for job in jobs
        if job.budget_grams is not None
    ]
    if budgets:
        out += ["", "Budgets", *budgets]
    if notes:
        out += ["", "Notes", *notes]
    return "\n".join(out) + "\n"


def job_dict(job: JobReport) -> dict[str, Any]:
    c = job.components

    def per(value: Any) -> dict[str, Any]:
        return {name: value(part) for name, part in c.items()}

    return {
        "scheduler": job.scheduler,
        "namespace": job.namespace,
        "workload": job.workload,
        "start": _iso(job.start, ms=True),
        "end": _iso(job.end, ms=True),
        "duration_seconds": round(job.duration, 3),
        "energy_kwh": {**per(lambda p: _kwh(p.energy_j)), "total": _kwh(job.energy_j)},
        "emissions_kg": {**per(lambda p: p.emissions_g / 1000), "total": job.emissions_g / 1000},
        "embodied_kg": job.embodied_g / 1000,
        "footprint_kg": job.footprint_g / 1000,
        "estimated_kwh": {**per(lambda p: _kwh(p.estimated_j)), "total": _kwh(job.estimated_j)},
        "estimated_share": {
            **per(lambda p: _share(p.estimated_j, p.energy_j)),
            "total": _share(job.estimated_j, job.energy_j),
        },
        "methods": per(lambda p: sorted(p.methods)),
        "intensity_g_per_kwh": job.intensity,
        "pue": job.pue,
        "zones": sorted(job.zones),
        "gpus": [
            {
                "instance": gpu.instance,
                "gpu": gpu.gpu,
                "model": gpu.model,
                "energy_kwh": _kwh(gpu.energy_j),
                "emissions_kg": gpu.emissions_g / 1000,
                "estimated_share": _share(gpu.estimated_j, gpu.energy_j),
            }
            for gpu in _sorted_gpus(job)
        ],
        "budget": None
        if job.budget_grams is None
        else {"grams_30d": job.budget_grams, "used": job.budget_used},
        "notes": list(job.notes),
    }


def render_json(jobs: Sequence[JobReport], window: Window, url: str) -> str:
    document = {
        "prometheus": url,
        "engine": window.server,
        "since": _iso(window.since, ms=True),
        "until": _iso(window.until, ms=True),
        "whole_life": window.whole_life,
        "jobs": [job_dict(job) for job in jobs],
    }
    return json.dumps(document, indent=2) + "\n"


CSV_COLUMNS = (
    "scheduler",
    "namespace",
    "workload",
    "start",
    "end",
    "duration_seconds",
    "energy_kwh",
    "gpu_energy_kwh",
    "cpu_energy_kwh",
    "memory_energy_kwh",
    "emissions_kg",
    "gpu_emissions_kg",
    "cpu_emissions_kg",
    "memory_emissions_kg",
    "intensity_g_per_kwh",
    "pue",
    "estimated_share",
    "gpu_estimated_share",
    "cpu_estimated_share",
    "memory_estimated_share",
    "gpu_count",
    "gpu_energy_kwh_by_device",
    "zones",
    "budget_grams_30d",
    "budget_used",
    "embodied_kg",
    "footprint_kg",
)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def render_csv(jobs: Sequence[JobReport], window: Window, url: str) -> str:
    del window, url  # one row per job says it all; the range is in start/end
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for job in jobs:
        d = job_dict(job)
        row = {
            "scheduler": job.scheduler,
            "namespace": job.namespace,
            "workload": job.workload,
            "start": d["start"],
            "end": d["end"],
            "duration_seconds": d["duration_seconds"],
            "energy_kwh": d["energy_kwh"]["total"],
            "emissions_kg": d["emissions_kg"]["total"],
            "intensity_g_per_kwh": job.intensity,
            "pue": job.pue,
            "estimated_share": d["estimated_share"]["total"],
            "gpu_count": len(job.gpus),
            "gpu_energy_kwh_by_device": " ".join(
                f"{gpu['instance']}/{gpu['gpu']}={gpu['energy_kwh']!r}" for gpu in d["gpus"]
            ),
            "zones": " ".join(d["zones"]),
            "budget_grams_30d": job.budget_grams,
            "budget_used": job.budget_used,
            "embodied_kg": d["embodied_kg"],
            "footprint_kg": d["footprint_kg"],
        }
        for name in COMPONENTS:
            row[f"{name}_energy_kwh"] = d["energy_kwh"][name]
            row[f"{name}_emissions_kg"] = d["emissions_kg"][name]
            row[f"{name}_estimated_share"] = d["estimated_share"][name]
        writer.writerow([_cell(row[column]) for column in CSV_COLUMNS])
    return buffer.getvalue()


def _zone_fields(zones: set[str]) -> dict[str, str]:
    """codecarbon's location columns, where the job ran in one known zone."""
    if len(zones) != 1:
        return {}
    zone = next(iter(zones))
    try:
        from .carbon.embedded import dataset

        entry = dataset().lookup(zone)
    except Exception:
        # An Electricity Maps or WattTime zone the embedded data does not know: say
        # the zone, not a guess.
        return {"region": zone}
    if entry.key.startswith("gcp:"):
        return {"cloud_provider": "gcp", "cloud_region": entry.key[4:], "region": entry.name}
    if entry.key.startswith("OWID_"):
        return {"region": zone}
    return {"country_name": entry.name, "country_iso_code": entry.key}


def render_codecarbon(jobs: Sequence[JobReport], window: Window, url: str) -> str:
    del window, url
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CODECARBON_COLUMNS)
    for job in jobs:
        c = job.components
        duration = job.duration
        models: dict[str, int] = defaultdict(int)
        for gpu in job.gpus.values():
            models[gpu.model or "unknown GPU"] += 1

        def power(part: Component, duration: float = duration) -> float | None:
            return part.energy_j / duration if duration > 0 else None

        row: dict[str, Any] = {
            "timestamp": dt.datetime.fromtimestamp(job.end, tz=dt.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%S"
            ),
            "project_name": job.namespace,
            "run_id": job.workload,
            "duration": duration,
            "emissions": job.emissions_g / 1000,
            "emissions_rate": job.emissions_g / 1000 / duration if duration > 0 else None,
            "cpu_power": power(c["cpu"]),
            "gpu_power": power(c["gpu"]),
            "ram_power": power(c["memory"]),
            "cpu_energy": _kwh(c["cpu"].energy_j),
            "gpu_energy": _kwh(c["gpu"].energy_j),
            "ram_energy": _kwh(c["memory"].energy_j),
            "energy_consumed": _kwh(job.energy_j),
            "gpu_count": len(job.gpus) if job.gpus else None,
            "gpu_model": ", ".join(f"{n} x {m}" for m, n in sorted(models.items())) or None,
            "pue": job.pue,
            # What codecarbon writes without a water figure: WUE 0, so 0 water.
            "water_consumed": 0.0,
            "wue": 0.0,
            **_zone_fields(job.zones),
        }
        row["on_cloud"] = "Y" if row.get("cloud_provider") else "N"
        writer.writerow([_cell(row.get(column)) for column in CODECARBON_COLUMNS])
    return buffer.getvalue()


RENDERERS = {
    "table": render_table,
    "csv": render_csv,
    "json": render_json,
    "codecarbon-csv": render_codecarbon,
}


# -- entry point -----------------------------------------------------------------------


def _fail(message: str, status: int) -> int:
    print(f"wattprint: {message}", file=sys.stderr)
    return status


def run_report(args: argparse.Namespace) -> int:
    if args.from_files is not None:
        from .jobfiles import report_from_files

        return report_from_files(args)
    if args.prometheus_url is None:
        return _fail("--prometheus.url (env WATTPRINT_PROMETHEUS_URL) or --from-files is needed", 2)
    try:
        client = _client(args)
        unit = sci.pick_unit(args)
    except (UsageError, sci.UnitError) as err:
        return _fail(str(err), 2)
    try:
        with Progress(sys.stderr, sys.stderr.isatty()) as progress:
            window = _resolve_range(args, client, time.time())
            jobs = build_reports(client, window, args.workload, args.namespace, progress)
            if unit is not None:
                progress.say(f"reading {unit.metric}")
                per = sci.rows(client, unit, jobs, window.since, window.until)
            if args.format.startswith("ghg-"):
                progress.say("reading emission factors")
                factors = ghg.read_factors(client, window.since, window.until)
    except UsageError as err:
        return _fail(str(err), 2)
    except (PrometheusError, ReportError) as err:
        return _fail(str(err), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    finally:
        client.close()
    if args.format.startswith("ghg-"):
        rows = ghg.emission_rows(jobs, window.since, window.until) + factors
        text = ghg.render(rows, args.format, client.url)
    else:
        text = RENDERERS[args.format](jobs, window, client.url)
    if unit is not None:
        text = sci.render_rows(unit, per, args.format)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `wattprint report | head`: the reader has what it wanted.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0
