"""The counter ledger: the exact rise of each energy counter step by step over a window,
across scrape gaps and exporter restarts."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from wattprint.report.common import BASELINE_LOOKBACK_S, LOOKBACK_S
from wattprint.report.promapi import PrometheusClient, Series, format_ms
from wattprint.report.queries import Window, exact_selector, on_grid, series_key, shared_selector

SeriesKey = tuple[tuple[str, str], ...]
Samples = list[tuple[float, float]]


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
) -> dict[SeriesKey, Counter]:
    # The value at `since` of every series that existed in the day before it: what
    # the range's rise starts from. Older ones count as born inside the range.
    baseline = format_ms(max(BASELINE_LOOKBACK_S, window.lookback))
    base = client.instant(f"last_over_time({metric}{selector}[{baseline}])", window.since)
    grid = on_grid(client, metric, selector, window)
    counters: dict[SeriesKey, Counter] = {}
    for series in base:
        if series.samples:
            key = series_key(series.labels)
            counters[key] = Counter(series.labels, baseline=series.samples[-1][1])
    restarts = _steps_with_resets(client, metric, selector, window)
    raw = _raw_samples(client, metric, window, grid, restarts)
    for series in grid:
        key = series_key(series.labels)
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
                # climbs past its old value before the step ends): the raw samples
                # of the whole run of steps around it (_raw_samples read them).
                raw_until = _run_end(k, flagged)
                raw_rise = _rise(raw.get((key, last_k, raw_until), []), window, start)
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
    counters: dict[SeriesKey, Counter],
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
            found[series_key(series.labels)] = (before[-1], after[0])
    return found


def _drawn_before(before: tuple[float, float], after: tuple[float, float], t: float) -> float:
    """Of the rise between two samples, the part drawn before t, at a steady power."""
    (t0, v0), (t1, v1) = before, after
    if v1 < v0:  # a restart between them: what came before t is unknown, count none
        return 0.0
    return (v1 - v0) * (t - t0) / (t1 - t0)


def _steps_with_resets(
    client: PrometheusClient, metric: str, selector: str, window: Window
) -> dict[SeriesKey, set[int]]:
    """Per series that went down (an exporter restart) in the range, the steps to read
    sample by sample: one query for all series, whose answer holds only those steps."""
    # Windows of a step plus the lookback overlap, so that a reset between the last
    # sample before a step and the first one in it is seen too.
    steps = client.range(
        f"resets({metric}{selector}[{format_ms(window.step + window.lookback)}]) > 0",
        window.since,
        window.until,
        window.step,
    )
    found: dict[SeriesKey, set[int]] = {}
    for series in steps:
        flagged = {window.index(t) for t, count in series.samples if count > 0}
        if flagged:
            found.setdefault(series_key(series.labels), set()).update(flagged)
    return found


def _run_end(k: int, flagged: set[int]) -> int:
    """The last step of the run of flagged steps that starts at k."""
    while k + 1 in flagged:
        k += 1
    return k


def _raw_samples(
    client: PrometheusClient,
    metric: str,
    window: Window,
    grid: list[Series],
    flagged: dict[SeriesKey, set[int]],
) -> dict[tuple[SeriesKey, int, int], Samples]:
    """The raw samples of each series over each run of its steps with a reset, keyed
    (series, step before the run, its last step) as read_counters walks them. One
    query per run for all the series that share it: a restart resets every series of
    its node at once, so a thousand series that reset cost one query, not a thousand."""
    runs: dict[tuple[int, int], list[dict[str, str]]] = defaultdict(list)
    for series in grid:
        steps = flagged.get(series_key(series.labels))
        if not steps:
            continue
        last_k, until_k = 0, -1
        for t, _ in series.samples:
            k = window.index(t)
            if k <= 0:
                continue
            if k in steps and k > until_k:
                until_k = _run_end(k, steps)
                runs[(last_k, until_k)].append(series.labels)
            last_k = k
    found: dict[tuple[SeriesKey, int, int], Samples] = {}
    for (from_k, to_k), members in runs.items():
        wanted = {series_key(labels) for labels in members}
        t0, t1 = window.at(from_k), window.at(to_k)
        for series in client.instant(
            f"{shared_selector(metric, members)}[{format_ms(t1 - t0)}]", t1
        ):
            key = series_key(series.labels)
            if key in wanted:
                found[(key, from_k, to_k)] = sorted(s for s in series.samples if s[0] > t0)
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
    raw = client.instant(f"{exact_selector(metric, labels)}[{format_ms(t1 - t0)}]", t1)
    return _rise(sorted(s for series in raw for s in series.samples if s[0] > t0), window, start)


def _rise(samples: Sequence[tuple[float, float]], window: Window, start: float) -> dict[int, float]:
    """Per step, the rise of raw samples (oldest first) from the value `start`."""
    since_ms, step_ms = round(window.since * 1000), round(window.step * 1000)
    rise: dict[int, float] = defaultdict(float)
    last = start
    for t, value in samples:
        # The step k whose interval (at(k-1), at(k)] holds the sample, in whole ms.
        k = -(-(round(t * 1000) - since_ms) // step_ms)
        rise[k] += value - last if value >= last else value
        last = value
    return rise
