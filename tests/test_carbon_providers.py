"""Every live provider against a local server replaying the recorded response shapes:
good answers, and each way an answer can go wrong. After every failure the service
still answers accounting(), keeps the last good value and its timestamp, and counts
the error."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from carbon_fakes import (
    FakeApi,
    FakeClock,
    Reply,
    electricitymaps_body,
    make_service,
    uk_national_body,
    uk_regional_body,
    watttime_body,
)
from wattprint.carbon.base import HttpClient, Secret, parse_retry_after
from wattprint.carbon.embedded import lookup
from wattprint.carbon.service import CarbonService
from wattprint.carbon.watttime import WattTime
from wattprint.core.model import Intensity

TOKEN = "em-token-3f9a1c"
USER, PASSWORD = "wt-user", "wt-pass-77c2e"
LBS_PER_MWH_IN_G_PER_KWH = 453.59237 / 1000  # grams per pound over kWh per MWh


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with FakeApi() as fake:
        yield fake


@dataclass
class Spec:
    """How one provider is configured and what its answers look like."""

    id: str
    settings: dict[str, Any]
    environ: dict[str, str]
    path: str
    good: Callable[[Any, float], dict[str, Any]]  # (value in the API's unit, time)
    to_grams: Callable[[float], float]
    signal: str
    zone: str
    wrong_unit: Callable[[float], dict[str, Any]] | None = None
    wrong_zone: Callable[[float], dict[str, Any]] | None = None
    routes: dict[str, Reply] = field(default_factory=dict)


SPECS = [
    Spec(
        id="electricitymaps",
        settings={"provider": "electricitymaps", "zone": "DE"},
        environ={"WATTPRINT_CARBON_TOKEN": TOKEN},
        path="/v3/carbon-intensity/latest",
        good=lambda v, ts: electricitymaps_body(v, ts),
        to_grams=lambda v: v,
        signal="average",
        zone="DE",
        wrong_unit=lambda ts: {**electricitymaps_body(0.3, ts), "unit": "kgCO2eq/kWh"},
        wrong_zone=lambda ts: electricitymaps_body(300, ts, zone="FR"),
    ),
    Spec(
        id="watttime",
        settings={"provider": "watttime", "zone": "US", "provider_region": "CAISO_NORTH"},
        environ={"WATTPRINT_WATTTIME_USERNAME": USER, "WATTPRINT_WATTTIME_PASSWORD": PASSWORD},
        path="/v3/forecast",
        good=lambda v, ts: watttime_body(v, ts),
        to_grams=lambda v: v * LBS_PER_MWH_IN_G_PER_KWH,
        signal="marginal",
        zone="CAISO_NORTH",
        wrong_unit=lambda ts: watttime_body(300, ts, units="kg_co2_per_mwh"),
        wrong_zone=lambda ts: watttime_body(300, ts, region="PJM_DC"),
        routes={"/login": Reply(body={"token": "bearer-abc123"})},
    ),
    Spec(
        id="uk-grid",
        settings={"provider": "uk-grid", "zone": "GB"},
        environ={},
        path="/intensity",
        good=lambda v, ts: uk_national_body(v, 999 if v is None else v + 7, ts),
        to_grams=lambda v: v,
        signal="average",
        zone="GB",
    ),
    Spec(
        id="uk-grid-regional",
        settings={"provider": "uk-grid", "zone": "GB", "provider_region": "13"},
        environ={},
        path="/regional/regionid/13",
        good=lambda v, ts: uk_regional_body(13, v, ts),
        to_grams=lambda v: v,
        signal="average",
        zone="GB-region-13",
        wrong_zone=lambda ts: uk_regional_body(12, 300, ts),
    ),
]


@dataclass
class Failure:
    id: str
    reply: Callable[[Spec, float], Reply | None]  # None: not applicable to this provider
    reason: str  # errors_by_reason key
    text: str  # in last_error


def _null(spec: Spec, now: float) -> Reply:
    body = spec.good(None, now)
    if spec.id == "uk-grid":
        body["data"][0]["intensity"]["forecast"] = None
    return Reply(body=body)


FAILURES = [
    Failure("http-500", lambda s, now: Reply(500, {"error": "boom"}), "http_status", "HTTP 500"),
    Failure(
        "rate-limited",
        lambda s, now: Reply(429, {}, headers={"Retry-After": "120"}),
        "rate_limited",
        "HTTP 429",
    ),
    Failure(
        "timeout", lambda s, now: Reply(body=s.good(300, now), delay_s=3), "timeout", "timed out"
    ),
    Failure(
        "trickle",
        lambda s, now: Reply(body=s.good(300, now), trickle_s=0.05),
        "timeout",
        "not complete",
    ),
    Failure("cut", lambda s, now: Reply(body=s.good(300, now), cut=True), "truncated", "cut short"),
    Failure(
        "not-json",
        lambda s, now: Reply(200, "<html>bad gateway</html>"),
        "invalid_response",
        "invalid JSON",
    ),
    Failure("null", _null, "invalid_value", "null"),
    Failure(
        "too-large",
        lambda s, now: Reply(body=s.good(344140.0, now)),  # mg/kWh, or lbs not converted
        "invalid_value",
        "outside 0..2000",
    ),
    Failure(
        "negative",
        lambda s, now: Reply(body=s.good(-5, now)),
        "invalid_value",
        "outside 0..2000",
    ),
    Failure(
        "wrong-unit",
        lambda s, now: Reply(body=s.wrong_unit(now)) if s.wrong_unit else None,
        "invalid_value",
        "unit",
    ),
    Failure(
        "wrong-zone",
        lambda s, now: Reply(body=s.wrong_zone(now)) if s.wrong_zone else None,
        "invalid_value",
        "answer is for",
    ),
    Failure(
        "stale",
        lambda s, now: Reply(body=s.good(300, now - 3 * 86400)),
        "invalid_value",
        "before this host's clock",
    ),
]

CASES = [
    pytest.param(spec, failure, id=f"{spec.id}-{failure.id}")
    for spec in SPECS
    for failure in FAILURES
    if failure.reply(spec, 0.0) is not None
]


def _service(api: FakeApi, clock: FakeClock, spec: Spec) -> CarbonService:
    for path, reply in spec.routes.items():
        api.on(path, reply)
    return make_service(api, clock, spec.environ, **spec.settings)


def _live(service: CarbonService) -> Intensity:
    (live,) = [i for i in service.status().signals if i.provider != "static"]
    return live


def _half_hour(ts: float) -> float:
    # The UK API gives minutes only; aligned times make every shape exact.
    return float(int(ts) // 1800 * 1800)


@pytest.mark.parametrize(("spec", "failure"), CASES)
def test_failure_keeps_last_good_value_and_is_counted(
    api: FakeApi, spec: Spec, failure: Failure
) -> None:
    clock = FakeClock()
    service = _service(api, clock, spec)
    t1 = _half_hour(clock.now) - 1800
    bad = failure.reply(spec, clock.now)
    assert bad is not None
    api.on(spec.path, Reply(body=spec.good(300, t1)), bad, Reply(body=spec.good(200, t1 + 1800)))

    service.poll_once()
    first = _live(service)
    assert (first.zone, first.provider, first.signal) == (
        spec.zone,
        spec.settings["provider"],
        spec.signal,
    )
    assert first.grams_per_kwh == pytest.approx(spec.to_grams(300))
    assert first.timestamp == t1

    started = time.monotonic()
    delay = service.poll_once()
    assert time.monotonic() - started < 2.0  # bounded by the 0.3 s timeout, not the server
    status = service.status()
    assert status.errors_total == 1
    assert status.errors_by_reason == {failure.reason: 1}
    assert status.last_error is not None and failure.text in status.last_error
    assert status.last_error_time == clock.now
    # The gauge and its timestamp still say: last good value, from t1.
    assert _live(service) == first
    assert not status.fallback_active
    expected = first if spec.signal == "average" else service.default
    assert service.accounting() == expected
    if failure.id == "rate-limited":
        assert delay >= 120
    else:
        assert delay <= 1.0  # first retry: backoff base 1 s with jitter

    service.poll_once()
    recovered = _live(service)
    assert recovered.grams_per_kwh == pytest.approx(spec.to_grams(200))
    assert recovered.timestamp == t1 + 1800
    assert service.status().errors_total == 1
    assert service.status().last_success == clock.now


def test_electricitymaps_sends_token_header_and_alpha2_zone(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(
        api, clock, {"WATTPRINT_CARBON_TOKEN": TOKEN}, provider="electricitymaps", zone="DEU"
    )
    api.on("/v3/carbon-intensity/latest", Reply(body=electricitymaps_body(321.5, clock.now)))
    service.poll_once()
    (seen,) = api.requests_to("/v3/carbon-intensity/latest")
    assert seen.headers["auth-token"] == TOKEN
    assert seen.query == {"zone": "DE"}
    assert service.accounting().grams_per_kwh == 321.5
    assert service.accounting().provider == "electricitymaps"


def test_electricitymaps_refused_token_is_counted_without_the_token(api: FakeApi) -> None:
    clock = FakeClock()
    environ = {"WATTPRINT_CARBON_TOKEN": TOKEN}
    service = make_service(api, clock, environ, provider="electricitymaps", zone="DE")
    api.on("/v3/carbon-intensity/latest", Reply(401, {"message": f"bad token {TOKEN}"}))
    service.poll_once()
    status = service.status()
    assert status.errors_by_reason == {"unauthorized": 1}
    assert status.last_error is not None
    assert "WATTPRINT_CARBON_TOKEN" in status.last_error
    assert TOKEN not in status.last_error
    assert service.accounting() == lookup("DE")


def test_redirect_is_not_followed(api: FakeApi) -> None:
    # requests would carry the auth-token header along to wherever Location points.
    clock = FakeClock()
    environ = {"WATTPRINT_CARBON_TOKEN": TOKEN}
    service = make_service(api, clock, environ, provider="electricitymaps", zone="DE")
    api.on("/v3/carbon-intensity/latest", Reply(302, {}, headers={"Location": "/elsewhere"}))
    api.on("/elsewhere", Reply(body=electricitymaps_body(100, clock.now)))
    service.poll_once()
    assert api.requests_to("/elsewhere") == []
    assert service.status().errors_by_reason == {"http_status": 1}


def test_watttime_logs_in_again_after_401(api: FakeApi) -> None:
    clock = FakeClock()
    spec = SPECS[1]
    service = make_service(api, clock, spec.environ, **spec.settings)
    api.on("/login", Reply(body={"token": "tok-1"}), Reply(body={"token": "tok-2"}))
    api.on("/v3/forecast", Reply(401, {}), Reply(body=watttime_body(870, clock.now)))
    service.poll_once()

    status = service.status()
    assert status.errors_total == 0
    assert _live(service).grams_per_kwh == pytest.approx(870 * LBS_PER_MWH_IN_G_PER_KWH)
    logins = api.requests_to("/login")
    assert len(logins) == 2
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert all(seen.headers["Authorization"] == f"Basic {basic}" for seen in logins)
    bearers = [s.headers["Authorization"] for s in api.requests_to("/v3/forecast")]
    assert bearers == ["Bearer tok-1", "Bearer tok-2"]
    assert api.requests_to("/v3/forecast")[0].query == {
        "region": "CAISO_NORTH",
        "signal_type": "co2_moer",
        "horizon_hours": "0",
    }


def test_watttime_reuses_its_token_and_renews_it_before_30_minutes(api: FakeApi) -> None:
    now = [1000.0]
    http = HttpClient(0.3)
    http.session.trust_env = False
    provider = WattTime(
        "CAISO_NORTH",
        Secret("WATTPRINT_WATTTIME_USERNAME", USER),
        Secret("WATTPRINT_WATTTIME_PASSWORD", PASSWORD),
        http,
        api.url,
        monotonic=lambda: now[0],
    )
    api.on("/login", Reply(body={"token": "tok"}))
    api.on("/v3/forecast", Reply(body=watttime_body(500, time.time())))
    provider.fetch()
    now[0] += 20 * 60
    provider.fetch()
    assert len(api.requests_to("/login")) == 1
    now[0] += 10 * 60  # 30 min after login: the token would expire any moment
    provider.fetch()
    assert len(api.requests_to("/login")) == 2


def test_watttime_401_after_fresh_login_is_an_error(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(api, clock, SPECS[1].environ, **SPECS[1].settings)
    api.on("/login", Reply(body={"token": "tok"}))
    api.on("/v3/forecast", Reply(401, {}))
    service.poll_once()
    status = service.status()
    assert status.errors_by_reason == {"unauthorized": 1}
    assert status.last_error is not None and "after a new login" in status.last_error


def test_watttime_refused_login_names_the_variables_not_the_password(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(api, clock, SPECS[1].environ, **SPECS[1].settings)
    api.on("/login", Reply(401, {}))
    service.poll_once()
    error = service.status().last_error
    assert error is not None
    assert "WATTPRINT_WATTTIME_PASSWORD" in error
    assert PASSWORD not in error and USER not in error
    assert api.requests_to("/v3/forecast") == []


def test_watttime_marginal_is_not_used_for_accounting_by_default(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(api, clock, SPECS[1].environ, **SPECS[1].settings)
    api.on("/login", Reply(body={"token": "tok"}))
    api.on("/v3/forecast", Reply(body=watttime_body(1000, clock.now)))
    service.poll_once()
    status = service.status()
    assert [(i.provider, i.signal) for i in status.signals] == [
        ("watttime", "marginal"),
        ("static", "average"),
    ]
    assert service.accounting() == lookup("US")
    assert not status.fallback_active


def test_watttime_marginal_accounting_when_asked(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(
        api, clock, SPECS[1].environ, accounting_signal="marginal", **SPECS[1].settings
    )
    api.on("/login", Reply(body={"token": "tok"}))
    api.on("/v3/forecast", Reply(body=watttime_body(1000, clock.now)))
    assert service.status().fallback_active  # nothing fetched yet
    service.poll_once()
    accounting = service.accounting()
    assert (accounting.provider, accounting.signal) == ("watttime", "marginal")
    assert accounting.grams_per_kwh == pytest.approx(1000 * LBS_PER_MWH_IN_G_PER_KWH)


def test_uk_national_uses_forecast_while_actual_is_null(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(api, clock, provider="uk-grid", zone="GB")
    api.on("/intensity", Reply(body=uk_national_body(None, 183, clock.now)))
    service.poll_once()
    assert service.accounting().grams_per_kwh == 183
    api.on("/intensity", Reply(body=uk_national_body(176, 183, clock.now)))
    service.poll_once()
    assert service.accounting().grams_per_kwh == 176


def test_connection_refused_is_counted() -> None:
    closed = FakeApi()
    closed.close()
    service = make_service(closed, FakeClock(), provider="uk-grid", zone="GB")
    service.poll_once()
    status = service.status()
    assert status.errors_by_reason == {"connection": 1}
    assert service.accounting() == lookup("GB")


def test_retry_after_as_http_date() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:15:20 GMT", now) == pytest.approx(120.0)
    assert parse_retry_after("30", now) == 30.0
    assert parse_retry_after("soon", now) is None
