"""The time grid a report reads counters on, the range it covers, and PromQL selectors."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from wattprint.core.units import parse_duration
from wattprint.report.common import (
    DEFAULT_RETENTION_S,
    ENERGY,
    LOOKBACK_S,
    MAX_STEPS,
    MIN_STEP_S,
    PROBE_SPAN_S,
    UsageError,
    iso,
)
from wattprint.report.promapi import PrometheusClient, Series, format_ms, quote

# -- the time grid ---------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Steps since + k*step for k = 0..steps; the last one is `until` exactly."""

    since: float
    until: float
    step: float
    steps: int
    whole_life: bool  # no range given: since is just before the oldest data the server has
    server: str = "Prometheus"  # the engine that answered, as the output names it
    retention_reported: bool = True  # whole life: the server reports its retention
    data_from: float | None = None  # whole life: the oldest workload sample the server has

    @property
    def lookback(self) -> float:
        # At least one step, so that consecutive steps see every sample; at least
        # Prometheus's lookback, so that a slow scrape interval leaves no hole.
        return max(self.step, LOOKBACK_S)

    def at(self, k: int) -> float:
        return self.since + k * self.step

    def index(self, t: float) -> int:
        return round((t - self.since) / self.step)


def on_grid(client: PrometheusClient, metric: str, selector: str, window: Window) -> list[Series]:
    """Every series of metric{selector} at each step of the window: its last sample
    within the lookback, so that a scrape gap does not break the chain."""
    return client.range(
        f"last_over_time({metric}{selector}[{format_ms(window.lookback)}])",
        window.since,
        window.until,
        window.step,
    )


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


def resolve_range(args: argparse.Namespace, client: PrometheusClient, now: float) -> Window:
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
        raise UsageError(f"the range is empty: {iso(since)} is not before {iso(until)}")
    server = client.server()
    whole_life = since is None
    retention = _parse_retention(server.retention)
    data_from = None
    if since is None:
        # From where the data starts, not from now minus the retention: the header says
        # so, and the window, and so the report, is the same whenever it is asked.
        data_from = _oldest_sample(client, now)
        if data_from is not None:
            since = data_from - LOOKBACK_S
        else:
            since = now - (retention or DEFAULT_RETENTION_S)
    if since >= until:
        raise UsageError(f"the range is empty: {iso(since)} is not before {iso(until)}")
    window = make_window(since, until, whole_life)
    return dataclasses.replace(
        window,
        server=server.engine,
        retention_reported=retention is not None,
        data_from=data_from,
    )


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


def _oldest_sample(client: PrometheusClient, now: float) -> float | None:
    """The time of the oldest workload energy sample the server holds, or None: a search
    of ten years in a thousand steps, narrowed to the step that holds it until a step is
    under a second, and then its raw samples."""
    span, end = PROBE_SPAN_S, now
    while True:
        step = span / MAX_STEPS
        found = client.range(
            f"count(last_over_time({ENERGY}[{format_ms(step)}]))", end - span, end, step
        )
        times = [t for series in found for t, _ in series.samples]
        if not times:
            return None
        end = min(times)  # the oldest sample is in (end - step, end]
        if step <= 1.0:
            break
        span = step
    raw = client.instant(f"{ENERGY}[{format_ms(step)}]", end)
    stamps = [t for series in raw for t, _ in series.samples]
    return min(stamps) if stamps else end


# -- reading counters ------------------------------------------------------------------


def label_selector(matchers: dict[str, str], negative: Sequence[str] = ()) -> str:
    parts = [f"{name}={quote(value)}" for name, value in matchers.items()]
    parts += [f"{name}!=''" for name in negative]
    return "{" + ",".join(parts) + "}"


def workload_selector(workload: str | None, namespace: str | None) -> str:
    matchers: dict[str, str] = {}
    if workload is not None:
        matchers["workload"] = workload
    if namespace is not None:
        matchers["namespace"] = namespace
    return label_selector(matchers, () if workload is not None else ("workload",))


def series_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def job_key(labels: dict[str, str]) -> tuple[str, str, str]:
    return (labels.get("scheduler", ""), labels.get("namespace", ""), labels.get("workload", ""))


# The exporter's labels on the workload counters; Prometheus drops the empty ones.
WORKLOAD_LABELS = ("component", "gpu", "scheduler", "namespace", "workload", "pod")


def exact_selector(metric: str, labels: dict[str, str]) -> str:
    """A selector for this one series: an absent label must stay absent, or a job's
    pod-less series would also match its pods'."""
    matchers = {name: "" for name in WORKLOAD_LABELS}
    matchers.update({k: v for k, v in labels.items() if k != "__name__"})
    return metric + label_selector(matchers)
