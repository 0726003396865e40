"""Intensity forecasts: the UK API's fw48h answer parsed, fetched through the same
HTTP client and fake API as the current value, exported at bounded horizons, and the
greenest-start signal right on a synthetic forecast."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from carbon_fakes import FakeApi, FakeClock, Reply, make_service, uk_national_body
from wattprint.carbon import forecast
from wattprint.carbon.base import ProviderError, parse_time
from wattprint.carbon.forecast import greenest
from wattprint.core.model import Forecast, ForecastPoint

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "carbon"
T0 = parse_time("2024-10-01T12:00Z", "t0")  # the fixtures' first period
H = 3600.0


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with FakeApi() as fake:
        yield fake


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def synthetic(
    values: list[float], start: float = 0.0, period: float = 1800.0
) -> list[ForecastPoint]:
    return [
        ForecastPoint(start + i * period, start + (i + 1) * period, v) for i, v in enumerate(values)
    ]


# ---- parsing -----------------------------------------------------------------------


def test_national_fixture_parses_to_96_half_hours_of_forecast() -> None:
    body = fixture("uk-fw48h-national.json")
    points = forecast.parse_uk(body, None)
    assert len(points) == 96
    assert points[0].start == T0 and points[-1].end == T0 + 48 * H
    assert all(p.end - p.start == 1800 for p in points)
    # the forecast, never the actual of the current period
    assert points[0].grams_per_kwh == body["data"][0]["intensity"]["forecast"]
    assert body["data"][0]["intensity"]["actual"] != points[0].grams_per_kwh


@pytest.mark.parametrize("as_list", [False, True])
def test_regional_fixture_parses_in_object_and_documented_list_form(as_list: bool) -> None:
    body = fixture("uk-fw48h-region3.json")
    if as_list:
        body = {"data": [body["data"]]}
    points = forecast.parse_uk(body, 3)
    assert len(points) == 96
    assert points[68].grams_per_kwh == body_entries(body)[68]["intensity"]["forecast"]
    with pytest.raises(ProviderError, match="region 3, not 4"):
        forecast.parse_uk(body, 4)


def body_entries(body: Any) -> list[Any]:
    data = body["data"]
    return (data[0] if isinstance(data, list) else data)["data"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda b: b["data"][5]["intensity"].update(forecast=None),
            r"data\[5\].intensity.forecast is null",
        ),
        (lambda b: b["data"][5]["intensity"].update(forecast=52000), "wrong unit"),
        (lambda b: b["data"][7].update({"from": "yesterday"}), "not an ISO 8601 time"),
        (lambda b: b["data"][7].update({"to": b["data"][7]["from"]}), "ends before it starts"),
        (lambda b: b["data"].append(b["data"][3]), "overlap"),
        (lambda b: b.update(data=[]), "missing or empty"),
    ],
)
def test_bad_forecast_is_one_clear_error(change: Any, message: str) -> None:
    body = copy.deepcopy(fixture("uk-fw48h-national.json"))
    change(body)
    with pytest.raises(ProviderError, match=message):
        forecast.parse_uk(body, None)


# ---- greenest start ----------------------------------------------------------------


def brute_force(
    points: list[ForecastPoint], now: float, within: float, duration: float
) -> tuple[float, float] | None:
    """Every start on a one-minute grid, means by one-minute steps."""

    def value(t: float) -> float | None:
        for p in points:
            if p.start <= t < p.end:
                return p.grams_per_kwh
        return None

    best = None
    for s in range(int(now), int(now + within) + 1, 60):
        vals = [value(s + m * 60 + 30) for m in range(int(duration // 60))]
        if any(v is None for v in vals):
            continue
        mean = sum(vals) / len(vals)  # type: ignore[arg-type]
        if best is None or mean < best[1] - 1e-9:
            best = (s - now, mean)
    return best


def test_greenest_on_a_hand_made_forecast() -> None:
    # half-hours:      0    1    2    3    4    5    6    7
    points = synthetic([300, 250, 100, 120, 400, 90, 500, 80])
    # 1 h run within 2 h: starts 0..2 h, best the 100+120 pair at 1 h
    assert greenest(points, 0, 2 * H, H) == (H, 110.0)
    # within 3 h the 90 half-hour only pairs with 400 or 500: still the 1 h start
    assert greenest(points, 0, 3 * H, H) == (H, 110.0)
    # a 30 min run: the 80 at 3.5 h once the span reaches it
    assert greenest(points, 0, 3 * H, 0.5 * H) == (2.5 * H, 90.0)
    assert greenest(points, 0, 3.5 * H, 0.5 * H) == (3.5 * H, 80.0)
    # now in the middle of a period: a start at now counts the rest of it
    assert greenest(points, 0.75 * H, 0.5 * H, 0.5 * H) == (0.25 * H, 100.0)
    # a run longer than the forecast left: no answer rather than a guess
    assert greenest(points, 3 * H, 6 * H, 2 * H) is None


def test_greenest_ties_go_to_the_earliest_start() -> None:
    points = synthetic([200, 100, 200, 100, 200])
    assert greenest(points, 0, 2 * H, 0.5 * H) == (0.5 * H, 100.0)


def test_greenest_does_not_cross_a_gap_in_the_forecast() -> None:
    points = synthetic([300, 300]) + synthetic([10, 10], start=2 * H)  # 1 h..2 h missing
    assert greenest(points, 0, 0.5 * H, H) == (0.0, 300.0)
    assert greenest(points, 0, 3 * H, H) == (2 * H, 10.0)


@pytest.mark.parametrize("seed", range(20))
def test_greenest_matches_brute_force_with_uneven_periods(seed: int) -> None:
    rng = random.Random(seed)
    points, t = [], 0.0
    for _ in range(30):
        length = rng.choice([900.0, 1800.0, 2700.0])
        points.append(ForecastPoint(t, t + length, float(rng.randint(50, 400))))
        t += length
    now = rng.randrange(0, 3600, 60)
    within, duration = rng.choice([2 * H, 6 * H]), rng.choice([H, 1.5 * H, 4 * H])
    got = greenest(points, now, within, duration)
    want = brute_force(points, now, within, duration)
    assert got is not None and want is not None
    assert got[1] == pytest.approx(want[1], abs=1e-6)
    assert got[0] <= want[0]  # earliest of equals; the minute grid only finds later ones


def test_signals_on_the_fixture_at_fixed_horizons() -> None:
    points = tuple(forecast.parse_uk(fixture("uk-fw48h-national.json"), None))
    values = [p.grams_per_kwh for p in points]
    now = T0 + 10 * 60  # ten minutes into the first period
    f = Forecast("GB", "uk-grid", now, points)
    s = forecast.signals(f, now)
    assert s is not None
    assert dict(s.horizons) == {
        0: values[0],
        1: values[2],
        2: values[4],
        4: values[8],
        8: values[16],
        12: values[24],
        24: values[48],
        36: values[72],
    }
    by_key = {(g.within_h, g.duration_h): g for g in s.greenest}
    assert set(by_key) == {(w, d) for w in forecast.WITHIN_H for d in forecast.DURATIONS_H}
    # within 36 h the dip around period 68 is reachable: the 30-min-aligned 1 h window
    best = min(range(0, 72), key=lambda i: (values[i] + values[i + 1]) / 2)
    g = by_key[(36, 1)]
    assert g.offset_s == points[best].start - now
    assert g.grams_per_kwh == (values[best] + values[best + 1]) / 2
    # an old forecast steers no one
    assert forecast.signals(f, now + forecast.MAX_FORECAST_AGE_S + 1) is None


# ---- fetched, exported ------------------------------------------------------------


def test_uk_forecast_is_fetched_through_the_fake_api_and_exported(api: FakeApi) -> None:
    from wattprint.export.collector import SnapshotCollector
    from wattprint.sampler.loop import Sampler, SamplerParts

    clock = FakeClock(T0 + 10 * 60)
    service = make_service(api, clock, provider="uk-grid", zone="GB")
    api.on("/intensity", Reply(body=uk_national_body(None, 183, clock.now)))
    api.on("/intensity/2024-10-01T12:00Z/fw48h", Reply(body=fixture("uk-fw48h-national.json")))
    service.poll_once()
    st = service.status()
    assert st.forecast is not None and len(st.forecast.points) == 96
    assert st.errors_total == 0
    assert any("forecast for GB: 96 periods" in line for line in service.explain())

    sampler = Sampler(SamplerParts(sources=[], carbon=service, clock=clock))
    snapshot = sampler.sample_once()
    text = SnapshotCollector(lambda: snapshot).render().decode()
    first = fixture("uk-fw48h-national.json")["data"][0]["intensity"]["forecast"]
    series = "wattprint_grid_carbon_intensity_forecast_grams_per_kwh"
    assert f'{series}{{horizon="0h",provider="uk-grid",zone="GB"}} {float(first)}' in text
    assert text.count("wattprint_grid_carbon_intensity_forecast_grams_per_kwh{") == 8
    assert text.count("wattprint_grid_carbon_greenest_start_offset_seconds{") == 8
    assert (
        'wattprint_grid_carbon_greenest_grams_per_kwh{duration="4h",provider="uk-grid",within="36h",zone="GB"}'
        in text
    )


def test_regional_forecast_url_and_failure_keeps_accounting(api: FakeApi) -> None:
    from carbon_fakes import uk_regional_body

    clock = FakeClock(T0 + 45 * 60)
    service = make_service(api, clock, provider="uk-grid", zone="GB", provider_region="3")
    api.on("/regional/regionid/3", Reply(body=uk_regional_body(3, 150, clock.now)))
    path = "/regional/intensity/2024-10-01T12:30Z/fw48h/regionid/3"
    api.on(path, Reply(500, {"error": {"code": "500 Internal Server Error", "message": "x"}}))
    service.poll_once()
    st = service.status()
    assert st.forecast is None
    assert st.accounting.grams_per_kwh == 150 and not st.fallback_active
    # counted apart from the current value's fetches, which went fine
    assert st.errors_total == 0 and st.forecast_errors_total == 1
    assert "HTTP 500" in (st.forecast_last_error or "")
    assert any("1 forecast fetches failed" in line for line in service.explain())
    # the next poll tries again and gets it
    api.on(path, Reply(body=fixture("uk-fw48h-region3.json")))
    clock.advance(60)
    service.poll_once()
    assert service.status().forecast is not None
    assert len(api.requests_to(path)) == 2
    # and not again before the half-hour is up
    clock.advance(60)
    service.poll_once()
    assert len(api.requests_to(path)) == 2


def test_static_provider_exports_no_forecast() -> None:
    from wattprint.carbon.base import CarbonSettings
    from wattprint.carbon.service import CarbonService
    from wattprint.export.collector import SnapshotCollector
    from wattprint.sampler.loop import Sampler, SamplerParts

    service = CarbonService(CarbonSettings(provider="static", zone="DE"), {})
    assert service.status().forecast is None
    snapshot = Sampler(SamplerParts(sources=[], carbon=service)).sample_once()
    text = SnapshotCollector(lambda: snapshot).render().decode()
    assert "forecast" not in text
    assert "greenest" not in text
