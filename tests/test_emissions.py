"""Emissions counters: energy x the intensity in force when it was used x PUE."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pytest

from test_attribution import A, ScriptedGpus
from wattprint.carbon.base import CarbonSettings
from wattprint.carbon.embedded import lookup
from wattprint.carbon.service import CarbonService
from wattprint.core.model import CarbonStatus, GpuProcess, Intensity, Snapshot
from wattprint.sampler.loop import Sampler, SamplerParts


def grams_by_key(snapshot: Snapshot) -> dict[tuple[str, str, object], float]:
    return {(s.component, s.gpu, s.workload): s.grams for s in snapshot.energy}


def test_constant_intensity_gives_joules_times_intensity_times_pue() -> None:
    gpus = ScriptedGpus(raw={0: 0, 1: 0}, processes={0: (GpuProcess(7, sm_util=50),)})
    carbon = CarbonService(CarbonSettings(zone="DE", pue=1.3), environ={})
    intensity = lookup("DE").grams_per_kwh

    class Resolver:
        def resolve(self, pid: int, start_ticks: int, table: object = None) -> object:
            return A

    sampler = Sampler(SamplerParts(sources=[gpus], carbon=carbon, pue=1.3))
    sampler.parts.resolver = Resolver()  # type: ignore[assignment]
    sampler.sample_once()
    for step in range(1, 50):
        gpus.raw[0] += 700_000_000 + step  # ~700 J per sample
        gpus.raw[1] += 90_000_000
        snapshot = sampler.sample_once()
    for series in snapshot.energy:
        expected = series.energy_uj / 1e6 / 3.6e6 * intensity * 1.3
        assert series.grams == pytest.approx(expected, rel=1e-9)
    # Conservation holds for emissions as for energy.
    device_grams = sum(d.energy_uj for d in snapshot.devices) / 1e6 / 3.6e6 * intensity * 1.3
    assert sum(s.grams for s in snapshot.energy) == pytest.approx(device_grams, rel=1e-9)


@dataclass
class ChangingIntensity:
    """The carbon service's interface, with a value the test sets (a live signal)."""

    value: float = 100.0

    def accounting(self) -> Intensity:
        return Intensity("DE", "electricitymaps", "average", self.value, 0.0)

    def status(self) -> CarbonStatus:
        return CarbonStatus(
            self.accounting(), [self.accounting()], False, 0, None, None, "electricitymaps"
        )


def test_energy_used_while_intensity_was_high_weighs_more() -> None:
    gpus = ScriptedGpus(raw={0: 0})
    carbon = ChangingIntensity()
    sampler = Sampler(SamplerParts(sources=[gpus], carbon=carbon))
    sampler.sample_once()
    used = defaultdict(float)
    # Busy while the grid is dirty (500 g/kWh), idle once it is clean (50 g/kWh).
    for intensity, joules in [(500.0, 600.0)] * 10 + [(50.0, 80.0)] * 10:
        carbon.value = intensity
        gpus.raw[0] += int(joules * 1e6)
        used["grams"] += joules / 3.6e6 * intensity
        used["joules"] += joules
        snapshot = sampler.sample_once()
    grams = sum(s.grams for s in snapshot.energy)
    assert grams == pytest.approx(used["grams"], rel=1e-9)
    naive = used["joules"] / 3.6e6 * carbon.value  # all energy x the final intensity
    assert grams > 5 * naive
