"""The carbon service: eager validation, fallback to the embedded default and back, a
fetch thread that never delays accounting(), backoff, and credentials kept secret."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from carbon_fakes import (
    FakeApi,
    FakeClock,
    Reply,
    electricitymaps_body,
    make_service,
    uk_national_body,
    watttime_body,
)
from wattprint.carbon.base import CarbonConfigError, CarbonSettings, UnknownZoneError
from wattprint.carbon.embedded import lookup
from wattprint.carbon.service import CarbonService

TOKEN = "em-secret-7d41b9"
PASSWORD = "wt-secret-c0ffee"
WATTTIME_ENV = {"WATTPRINT_WATTTIME_USERNAME": "alice", "WATTPRINT_WATTTIME_PASSWORD": PASSWORD}
UK = "/intensity"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with FakeApi() as fake:
        yield fake


def test_static_provider_answers_offline_and_starts_nothing() -> None:
    service = CarbonService(CarbonSettings(zone="DE", pue=1.2), environ={})
    service.start()
    assert service._thread is None
    status = service.status()
    assert service.accounting() == lookup("DE")
    assert status.signals == [lookup("DE")]
    assert not status.fallback_active and status.errors_total == 0
    text = "\n".join(service.explain())
    assert "carbon zone DE" in text and "Germany" in text and "2024" in text
    assert "PUE 1.2" in text
    service.stop()


@pytest.mark.parametrize(
    ("settings", "environ", "expected"),
    [
        ({"provider": "electricitymap"}, {}, "unknown carbon provider 'electricitymap'"),
        ({"provider": "electricitymaps", "zone": "DE"}, {}, "WATTPRINT_CARBON_TOKEN"),
        (
            {"provider": "electricitymaps", "zone": "DE"},
            {"WATTPRINT_CARBON_TOKEN": "a", "WATTPRINT_CARBON_TOKEN_FILE": "/x"},
            "only one of",
        ),
        (
            {"provider": "electricitymaps", "zone": "DE"},
            {"WATTPRINT_CARBON_TOKEN_FILE": "/nonexistent/token"},
            "/nonexistent/token",
        ),
        (
            {"provider": "electricitymaps", "zone": "gcp:europe-west3"},
            {"WATTPRINT_CARBON_TOKEN": "a"},
            "not an Electricity Maps zone",
        ),
        ({"provider": "watttime", "zone": "US"}, WATTTIME_ENV, "provider region"),
        (
            {"provider": "watttime", "zone": "US", "provider_region": "CAISO_NORTH"},
            {"WATTPRINT_WATTTIME_USERNAME": "alice"},
            "WATTPRINT_WATTTIME_PASSWORD",
        ),
        ({"provider": "uk-grid", "zone": "GB", "provider_region": "99"}, {}, "1-18"),
        ({"zone": "DE", "accounting_signal": "marginal"}, {}, "needs the watttime provider"),
        ({"zone": "DE", "pue": 0.8}, {}, "PUE"),
        ({"zone": "DE", "refresh_interval_s": 0}, {}, "refresh interval"),
        (
            {"provider": "uk-grid", "fallback_after_s": 60, "refresh_interval_s": 300},
            {},
            "fallback",
        ),
        ({"provider": "uk-grid", "api_url": "ftp://x"}, {}, "api-url"),
        ({"zone": ""}, {}, "zone is empty"),
        # The same limits as --pue (config.check_pue), for settings built in code.
        ({"pue": 0.9}, {}, "not a plausible PUE (1.0 to 5.0)"),
        ({"pue": 5.5}, {}, "not a plausible PUE (1.0 to 5.0)"),
        ({"pue": float("nan")}, {}, "not a plausible PUE"),
    ],
)
def test_bad_settings_fail_at_startup_with_one_line(
    settings: dict[str, Any], environ: dict[str, str], expected: str
) -> None:
    with pytest.raises(CarbonConfigError) as err:
        CarbonService(CarbonSettings(**settings), environ=environ)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_zone_fails_at_startup() -> None:
    with pytest.raises(UnknownZoneError, match="Did you mean"):
        CarbonService(CarbonSettings(zone="DX"), environ={})


def test_uk_grid_with_empty_zone_falls_back_to_gb() -> None:
    service = CarbonService(CarbonSettings(provider="uk-grid", zone=""), environ={})
    assert service.default == lookup("GB")


def test_construction_does_no_network_io(api: FakeApi) -> None:
    clock = FakeClock()
    make_service(
        api, clock, {"WATTPRINT_CARBON_TOKEN": TOKEN}, provider="electricitymaps", zone="DE"
    )
    make_service(
        api, clock, WATTTIME_ENV, provider="watttime", provider_region="CAISO_NORTH", zone="US"
    )
    make_service(api, clock, provider="uk-grid", zone="GB")
    assert api.seen == []


def test_falls_back_after_threshold_and_returns_on_recovery(
    api: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wattprint.carbon")
    clock = FakeClock()
    service = make_service(
        api, clock, provider="uk-grid", zone="GB", refresh_interval_s=60, fallback_after_s=600
    )
    default = lookup("GB")
    assert service.accounting() == default
    assert service.status().fallback_active  # no answer yet: the default stands in

    answered_at = clock.now
    api.on(UK, Reply(body=uk_national_body(150, 150, clock.now)), Reply(500, {}))
    service.poll_once()
    live = service.accounting()
    assert (live.provider, live.grams_per_kwh) == ("uk-grid", 150)
    assert not service.status().fallback_active

    for _ in range(9):  # fails for 9 minutes: the last good value still holds
        clock.advance(60)
        service.poll_once()
        assert service.accounting() == live
    clock.advance(61)  # more than 600 s without a good answer
    service.poll_once()
    status = service.status()
    assert service.accounting() == default
    assert status.accounting.provider == "static"
    assert status.fallback_active
    assert status.errors_total == 10
    assert status.last_success == answered_at
    assert status.signals[0] == live  # the stale live gauge keeps its own timestamp
    assert "FALLBACK" in "\n".join(service.explain())
    assert sum("embedded default" in r.getMessage() for r in caplog.records) == 1

    clock.advance(60)
    api.on(UK, Reply(body=uk_national_body(140, 140, clock.now)))
    service.poll_once()
    status = service.status()
    assert (status.accounting.provider, status.accounting.grams_per_kwh) == ("uk-grid", 140)
    assert not status.fallback_active
    assert status.errors_total == 10
    assert any("back" in r.getMessage() for r in caplog.records)


def test_slow_provider_never_delays_accounting(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(api, clock, provider="uk-grid", zone="GB", timeout_s=10.0)
    api.on(UK, Reply(body=uk_national_body(150, 150, clock.now), delay_s=5))
    service.start()
    try:
        deadline = time.monotonic() + 2
        while not api.requests_to(UK) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert api.requests_to(UK), "the thread never asked"
        worst = 0.0
        for _ in range(50):
            started = time.perf_counter()
            value = service.accounting()
            service.status()
            worst = max(worst, time.perf_counter() - started)
        assert worst < 0.05
        assert value == lookup("GB")
    finally:
        service.stop(timeout_s=0.1)


def test_thread_feeds_live_values(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(
        api, clock, provider="uk-grid", zone="GB", refresh_interval_s=0.05, fallback_after_s=600
    )
    api.on(UK, Reply(body=uk_national_body(120, 120, clock.now)))
    service.start()
    try:
        deadline = time.monotonic() + 3
        while len(api.requests_to(UK)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(api.requests_to(UK)) >= 3  # it keeps refreshing
        assert service.accounting().provider == "uk-grid"
    finally:
        service.stop()
    asked = len(api.requests_to(UK))
    time.sleep(0.2)
    assert len(api.requests_to(UK)) <= asked + 1  # stopped (one may have been in flight)


def test_backoff_grows_with_jitter_and_is_capped_by_the_refresh_interval(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(api, clock, provider="uk-grid", zone="GB", refresh_interval_s=20)
    api.on(UK, Reply(503, {}))
    delays = [service.poll_once() for _ in range(8)]
    for n, delay in enumerate(delays[:5]):  # base 1 s: ceilings 1, 2, 4, 8, 16
        assert 2**n / 2 <= delay <= 2**n
    assert all(10 <= d <= 20 for d in delays[5:])
    assert len(set(delays)) == len(delays)  # jittered, so a fleet does not retry in step
    api.on(UK, Reply(body=uk_national_body(100, 100, clock.now)))
    assert 18 <= service.poll_once() <= 22  # refresh interval, ±10 %


def test_retry_after_beyond_the_refresh_interval_is_honoured(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(
        api, clock, provider="uk-grid", zone="GB", refresh_interval_s=20, fallback_after_s=3600
    )
    api.on(UK, Reply(429, {}, headers={"Retry-After": "900"}))
    assert service.poll_once() == 900
    assert service.status().errors_by_reason == {"rate_limited": 1}


def test_a_huge_retry_after_waits_no_longer_than_the_fallback_and_the_switch_is_said(
    api: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    """One 429 asking for 6 h stopped live data for 6 h, and the fallback meanwhile was
    never logged: the thread slept through it."""
    caplog.set_level(logging.INFO, logger="wattprint.carbon")
    clock = FakeClock()
    service = make_service(
        api, clock, provider="uk-grid", zone="GB", refresh_interval_s=60, fallback_after_s=600
    )
    api.on(UK, Reply(body=uk_national_body(150, 150, clock.now)))
    service.poll_once()
    api.on(UK, Reply(429, {}, headers={"Retry-After": "21600"}))
    clock.advance(60)
    assert service.poll_once() == 600  # asked again when it would fall back, not in 6 h
    assert any("asks to wait 6h" in r.getMessage() for r in caplog.records)
    clock.advance(541)  # no poll meanwhile: the thread waits
    assert service.accounting() == lookup("GB")
    service.accounting()
    said = [r for r in caplog.records if "embedded default" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


def test_a_provider_bug_is_counted_not_fatal(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    service = make_service(api, clock, provider="uk-grid", zone="GB")

    def broken() -> list[Any]:
        raise KeyError("surprise")

    monkeypatch.setattr(service._provider, "fetch", broken)
    service.poll_once()
    status = service.status()
    assert status.errors_by_reason == {"internal": 1}
    assert service.accounting() == lookup("GB")


def test_tokens_never_reach_logs_status_or_explain(
    api: FakeApi, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, urllib3's included
    clock = FakeClock()
    path = "/v3/carbon-intensity/latest"
    em = make_service(
        api, clock, {"WATTPRINT_CARBON_TOKEN": TOKEN}, provider="electricitymaps", zone="DE"
    )
    api.on(
        path,
        Reply(body=electricitymaps_body(200, clock.now)),
        Reply(body=electricitymaps_body(200, clock.now, zone=TOKEN)),  # echoes it back
        Reply(401, {"detail": TOKEN}),
        Reply(500, {"detail": TOKEN}),
    )
    for _ in range(4):
        em.poll_once()
    assert [s.headers["auth-token"] for s in api.requests_to(path)] == [TOKEN] * 4
    assert em.status().errors_total == 3

    token_file = tmp_path / "wt-password"
    token_file.write_text(PASSWORD + "\n")
    environ = {
        "WATTPRINT_WATTTIME_USERNAME": "alice",
        "WATTPRINT_WATTTIME_PASSWORD_FILE": str(token_file),
    }
    wt = make_service(
        api, clock, environ, provider="watttime", provider_region="CAISO_NORTH", zone="US"
    )
    api.on("/login", Reply(body={"token": "bearer-9e8d7c"}), Reply(401, {}))
    api.on("/v3/forecast", Reply(body=watttime_body(PASSWORD, clock.now)), Reply(401, {}))
    wt.poll_once()
    wt.poll_once()
    assert wt.status().errors_total == 2

    exported = [em.status(), wt.status()]
    text = "\n".join([caplog.text, *em.explain(), *wt.explain(), repr(exported), repr(em.settings)])
    for secret in (TOKEN, PASSWORD, "bearer-9e8d7c"):
        assert secret not in text
    assert "<redacted>" in text  # the echoed token was caught, not just never there


def test_token_file_is_read_again_when_rotated(api: FakeApi, tmp_path: Path) -> None:
    clock = FakeClock()
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    service = make_service(
        api,
        clock,
        {"WATTPRINT_CARBON_TOKEN_FILE": str(token_file)},
        provider="electricitymaps",
        zone="DE",
    )
    path = "/v3/carbon-intensity/latest"
    api.on(path, Reply(body=electricitymaps_body(200, clock.now)))
    service.poll_once()
    token_file.write_text("second-token\n")
    service.poll_once()
    assert [s.headers["auth-token"] for s in api.requests_to(path)] == [
        "first-token",
        "second-token",
    ]


def test_explain_shows_live_value_age_and_provider(api: FakeApi) -> None:
    clock = FakeClock()
    service = make_service(api, clock, provider="uk-grid", zone="GB")
    assert any("no answer from uk-grid yet" in line for line in service.explain())
    api.on(UK, Reply(body=uk_national_body(150, 150, clock.now - 600)))
    service.poll_once()
    clock.advance(120)
    text = "\n".join(service.explain())
    assert "carbon provider uk-grid" in text
    assert "live average intensity for GB: 150.00" in text
    assert "fetched 2m ago" in text
    assert "emissions use uk-grid average 150.00" in text


def test_explain_names_a_yearly_average_by_its_year_not_an_age(api: FakeApi) -> None:
    """An embedded average holds for its whole year: dating it from 1 January would make
    it look stale ("1065d old") on the day it is the newest there is."""
    service = make_service(api, FakeClock(), provider="static", zone="DE", api_url="")
    (line,) = [line for line in service.explain() if line.startswith("emissions use")]
    year = lookup("DE").year
    assert f"({year} yearly average) x PUE 1" in line, line
    assert " old" not in line, line
