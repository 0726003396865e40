"""Carbon provider faults, against a local server misbehaving on purpose: a timeout, 429,
5xx, invalid JSON, a body that trickles in byte by byte, and a long outage."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator

import pytest

from carbon_fakes import FakeApi, Reply, uk_national_body
from wattprint.carbon.base import CarbonSettings
from wattprint.carbon.embedded import lookup

from .faultrig import Node, Rig, RigFactory, use_app_part, value, wait_for, warnings_about

LIVE_G_PER_KWH = 123.0
J_PER_KWH = 3.6e6


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApi]:
    # Production waits 10 s for a provider; a test cannot.
    use_app_part(monkeypatch, "CarbonSettings", functools.partial(CarbonSettings, timeout_s=0.3))
    with FakeApi() as fake:
        fake.on("/intensity", good())
        yield fake


def good() -> Reply:
    return Reply(200, uk_national_body(None, LIVE_G_PER_KWH, time.time() - 60))


def carbon_rig(rig_factory: RigFactory, api: FakeApi, fallback_after: str = "1h") -> Rig:
    rig = rig_factory(
        **{
            "carbon.provider": "uk-grid",
            "carbon.zone": "GB",
            "carbon.api-url": api.url,
            "carbon.refresh-interval": "100ms",  # and retries sooner than that after a failure
            "carbon.fallback-after": fallback_after,
        }
    )
    wait_for(lambda: rig.exporter.carbon.status().last_success is not None, what="a live value")
    rig.steps(2)
    return rig


def emissions_and_energy(rig: Rig) -> tuple[float, float]:
    grams = value(rig.series, "wattprint_workload_emissions_grams_total") + value(
        rig.series, "wattprint_unattributed_emissions_grams_total"
    )
    joules = value(rig.series, "wattprint_workload_energy_joules_total") + value(
        rig.series, "wattprint_unattributed_energy_joules_total"
    )
    return grams, joules


def accounted_intensity(rig: Rig) -> float:
    """g/kWh the last step's emissions were accounted with (PUE 1)."""
    grams_before, joules_before = emissions_and_energy(rig)
    rig.step()
    grams, joules = emissions_and_energy(rig)
    return (grams - grams_before) / (joules - joules_before) * J_PER_KWH


FAULTS = {
    "timeout": Reply(200, {}, delay_s=1.0),
    "429": Reply(429, {"error": "rate limited"}, headers={"Retry-After": "0"}),
    "503": Reply(503, {"error": "unavailable"}),
    "invalid-json": Reply(200, "<html><body>maintenance</body></html>"),
    "trickle": Reply(200, uk_national_body(None, 99.0, time.time()), trickle_s=0.05),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_provider_fault_keeps_the_last_good_value(
    node: Node,
    rig_factory: RigFactory,
    api: FakeApi,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    rig = carbon_rig(rig_factory, api)
    assert accounted_intensity(rig) == pytest.approx(LIVE_G_PER_KWH)
    caplog.set_level(logging.INFO)

    api.on("/intensity", FAULTS[fault])
    wait_for(lambda: rig.exporter.carbon.status().errors_total >= 3, what="three failures")
    # Emissions go on with the last good value, inside --carbon.fallback-after.
    assert accounted_intensity(rig) == pytest.approx(LIVE_G_PER_KWH)
    assert value(rig.series, "wattprint_carbon_errors_total", provider="uk-grid") >= 3
    assert value(rig.series, "wattprint_carbon_fallback_active") == 0
    said = warnings_about(caplog, "carbon intensity from uk-grid failed")
    assert len(said) == 1, said

    api.on("/intensity", good())
    failed = rig.exporter.carbon.status().errors_total
    wait_for(
        lambda: (rig.exporter.carbon.status().last_success or 0) > time.time() - 0.2,
        what="a good answer again",
    )
    rig.step()
    assert value(rig.series, "wattprint_carbon_errors_total", provider="uk-grid") >= failed


def test_long_outage_falls_back_to_the_embedded_default(
    node: Node, rig_factory: RigFactory, api: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:

    rig = carbon_rig(rig_factory, api, fallback_after="1s")
    caplog.set_level(logging.INFO)
    api.on("/intensity", Reply(503, {"error": "unavailable"}))
    # The switch is said by the first failure after --carbon.fallback-after.
    wait_for(lambda: warnings_about(caplog, "embedded default"), timeout=5, what="the fallback")
    errors = rig.exporter.carbon.status().errors_total
    rig.steps(2)
    assert value(rig.series, "wattprint_carbon_fallback_active", zone="GB") == 1
    assert accounted_intensity(rig) == pytest.approx(lookup("GB").grams_per_kwh)
    wait_for(lambda: rig.exporter.carbon.status().errors_total >= errors + 3, what="retries")
    assert len(warnings_about(caplog, "embedded default")) == 1

    api.on("/intensity", good())
    wait_for(lambda: not rig.exporter.carbon.status().fallback_active, timeout=5, what="recovery")
    rig.step()
    assert value(rig.series, "wattprint_carbon_fallback_active", zone="GB") == 0
    assert accounted_intensity(rig) == pytest.approx(LIVE_G_PER_KWH)
