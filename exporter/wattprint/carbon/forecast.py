"""Intensity forecasts and the carbon-aware signal derived from them: the forecast at a
few fixed horizons, and for a few look-ahead spans and job lengths the start that
gives the lowest mean intensity. Pure: no I/O, no clock; callers pass "now".

Only a provider that publishes a forecast has one (uk-grid); the static provider and
the embedded defaults never do, so no forecast series exists for them rather than a
flat line that would look like a prediction.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from wattprint.carbon.base import ProviderError, checked_intensity, json_object, parse_time, shown
from wattprint.core.model import Forecast, ForecastPoint, ForecastSignals, Greenest

HOUR = 3600.0
# Bounded label sets: each is a few series per zone, whatever the forecast's length.
HORIZONS_H = (0, 1, 2, 4, 8, 12, 24, 36)
WITHIN_H = (6, 12, 24, 36)  # how far ahead a start may be
DURATIONS_H = (1, 4)  # how long the job runs
# A forecast this old is no longer exported: a stuck fetch must not steer schedulers.
MAX_FORECAST_AGE_S = 6 * HOUR


def parse_uk(body: object, region_id: int | None) -> list[ForecastPoint]:
    """Points of a UK Carbon Intensity API fw48h answer, national or regional.

    National: {"data": [{"from", "to", "intensity": {"forecast", ...}}, ...]}.
    Regional: {"data": {"regionid", ..., "data": [...]}}; the documentation shows the
    outer "data" as a one-element list, so both are accepted.
    """
    entries: object = json_object(body, "answer").get("data")
    if region_id is not None:
        region = entries[0] if isinstance(entries, list) and entries else entries
        region = json_object(region, "data")
        if region.get("regionid") != region_id:
            raise ProviderError(
                f"forecast is for region {shown(region.get('regionid'))}, not {region_id}"
            )
        entries = region.get("data")
    if not isinstance(entries, list) or not entries:
        raise ProviderError("forecast data is missing or empty")
    points = []
    for i, item in enumerate(entries):
        entry = json_object(item, f"data[{i}]")
        intensity = json_object(entry.get("intensity"), f"data[{i}].intensity")
        grams = checked_intensity(intensity.get("forecast"), f"data[{i}].intensity.forecast")
        start = parse_time(entry.get("from"), f"data[{i}].from")
        end = parse_time(entry.get("to"), f"data[{i}].to")
        if end <= start:
            raise ProviderError(f"data[{i}] ends before it starts")
        points.append(ForecastPoint(start, end, grams))
    points.sort(key=lambda p: p.start)
    for before, after in itertools.pairwise(points):
        if after.start < before.end:
            raise ProviderError("forecast periods overlap")
    return points


class _Integral:
    """Mean intensity over any span in O(log n), None where the forecast has a gap."""

    def __init__(self, points: Sequence[ForecastPoint]) -> None:
        self.points = points
        self.starts = [p.start for p in points]
        # cumulative g/kWh x s and covered seconds up to each point's start
        self.area = [0.0]
        self.covered = [0.0]
        for p in points:
            self.area.append(self.area[-1] + p.grams_per_kwh * (p.end - p.start))
            self.covered.append(self.covered[-1] + (p.end - p.start))

    def _upto(self, t: float) -> tuple[float, float]:
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return 0.0, 0.0
        p = self.points[i]
        inside = min(t, p.end) - p.start
        return self.area[i] + p.grams_per_kwh * inside, self.covered[i] + inside

    def mean(self, a: float, b: float) -> float | None:
        area_a, cov_a = self._upto(a)
        area_b, cov_b = self._upto(b)
        if (cov_b - cov_a) < (b - a) - 1e-6:
            return None
        return (area_b - area_a) / (b - a)


def at(points: Sequence[ForecastPoint], t: float) -> float | None:
    """The forecast for the period that contains t."""
    i = bisect.bisect_right([p.start for p in points], t) - 1
    if i >= 0 and t < points[i].end:
        return points[i].grams_per_kwh
    return None


def greenest(
    points: Sequence[ForecastPoint], now: float, within_s: float, duration_s: float
) -> tuple[float, float] | None:
    """(offset from now, mean g/kWh) of the start in [now, now + within_s] whose next
    duration_s has the lowest forecast mean; the earliest of equals. None when no start
    in the span has its whole run covered by the forecast.

    The mean as a function of the start is piecewise linear, bending where the start
    crosses a period's start or the run's end crosses a period's end, so its minimum is
    at one of those or at either end of the span: only those are tried.
    """
    integral = _Integral(points)
    last = now + within_s
    candidates = {now, last}
    for p in points:
        candidates.update((p.start, p.end - duration_s))
    best: tuple[float, float] | None = None
    for s in sorted(c for c in candidates if now <= c <= last):
        mean = integral.mean(s, s + duration_s)
        if mean is not None and (best is None or mean < best[1] - 1e-9):
            best = (s - now, mean)
    return best


def signals(forecast: Forecast, now: float) -> ForecastSignals | None:
    """What to export at `now`, or None for a forecast too old to steer anyone."""
    if now - forecast.fetched_at > MAX_FORECAST_AGE_S:
        return None
    points = [p for p in forecast.points if p.end > now]
    horizons = []
    for h in HORIZONS_H:
        value = at(points, now + h * HOUR)
        if value is not None:
            horizons.append((h, value))
    found = []
    for within in WITHIN_H:
        for duration in DURATIONS_H:
            best = greenest(points, now, within * HOUR, duration * HOUR)
            if best is not None:
                found.append(Greenest(within, duration, best[0], best[1]))
    return ForecastSignals(
        forecast.zone, forecast.provider, forecast.fetched_at, tuple(horizons), tuple(found)
    )


def describe(forecast: Forecast, now: float) -> str:
    """One line for `wattprint doctor`."""
    left = [p for p in forecast.points if p.end > now]
    if not left:
        return f"{forecast.provider} forecast for {forecast.zone}: all in the past"
    hours = (left[-1].end - now) / HOUR
    low = min(left, key=lambda p: p.grams_per_kwh)
    return (
        f"{forecast.provider} forecast for {forecast.zone}: {len(left)} periods, "
        f"{hours:.1f} h ahead; lowest {low.grams_per_kwh:g} gCO2e/kWh in "
        f"{(max(low.start, now) - now) / HOUR:.1f} h"
    )
