"""Embodied (Scope 3, cradle to gate) emissions of the hardware, amortized over its
service life and accrued per second to whoever holds it. Pure: no I/O, no clocks.

The sampler splits each interval's accrual with the same policy as a GPU's energy
(attribution.attribute_gpu), in integer micro-grams, so the parts add up to the
device's accrual exactly; a free GPU's accrual goes to unattributed, as its idle
energy does. A device with no known figure accrues nothing: a figure is never made up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import attribution
from .model import DeviceReading, EmbodiedDevice, Workload
from .parsers import parse_gpu_figures as parse_gpu_figures  # the flags' parsers, re-exported
from .parsers import parse_lifetime as parse_lifetime
from .resume import Accumulator
from .units import SECONDS_PER_YEAR

if TYPE_CHECKING:
    from .sampler import SamplerParts

UG_PER_G = 1_000_000
DEFAULT_LIFETIME_YEARS = 4.0


@dataclass(frozen=True)
class Figure:
    """One device's embodied emissions, cradle to gate, and where the number is from."""

    kgco2e: float
    source: str  # short citation, exported as a label and written into GHG exports
    date: str  # when the source was published (or "user" for a figure given by flag)


# Per GPU, keyed by the model name exactly as NVML reports it. Only figures with a
# published product carbon footprint; add or override others with
# --embodied.gpu-kgco2e. NVIDIA's PCF covers the whole 8-GPU HGX baseboard (GPUs,
# HBM, NVSwitch, board): 1,312 kgCO2e / 8 = 164 kgCO2e per GPU.
GPU_FIGURES: dict[str, Figure] = {
    "NVIDIA H100 80GB HBM3": Figure(
        1312.0 / 8,
        "NVIDIA Product Carbon Footprint Summary, HGX H100 (1312 kgCO2e per 8-GPU "
        "baseboard, cradle to gate)",
        "2025",
    ),
}
USER_SOURCE = "--embodied.gpu-kgco2e"
NODE_SOURCE = "--embodied.node-kgco2e"


@dataclass(frozen=True)
class EmbodiedSettings:
    lifetime_s: float = DEFAULT_LIFETIME_YEARS * SECONDS_PER_YEAR
    gpu_overrides: tuple[tuple[str, float], ...] = ()
    node_kgco2e: float = 0.0  # the rest of the server; 0: unknown, nothing accrues

    def gpu_figure(self, model: str) -> Figure | None:
        for name, kg in reversed(self.gpu_overrides):  # the last one given wins
            if name == model:
                return Figure(kg, USER_SOURCE, "user")
        return GPU_FIGURES.get(model)

    def node_figure(self) -> Figure | None:
        if self.node_kgco2e <= 0:
            return None
        return Figure(self.node_kgco2e, NODE_SOURCE, "user")


def accrue(kgco2e: float, lifetime_s: float, elapsed_s: float, carry: float) -> tuple[int, float]:
    """Micro-grams a device embodies over elapsed_s of its life, and the fraction of a
    micro-gram to carry to the next interval so that no rounding is ever lost."""
    if kgco2e <= 0 or lifetime_s <= 0 or elapsed_s <= 0:
        return 0, carry
    exact = kgco2e * 1e9 * elapsed_s / lifetime_s + carry
    whole = math.floor(exact)
    return whole, exact - whole


def explain(settings: EmbodiedSettings, gpu_models: list[str]) -> list[str]:
    """Lines for `wattprint doctor`: which figure each device accrues by, or why none."""
    years = settings.lifetime_s / SECONDS_PER_YEAR
    lines = [f"service life {years:g} years (--embodied.lifetime)"]
    for model in sorted(set(gpu_models)):
        figure = settings.gpu_figure(model)
        if figure is None:
            lines.append(
                f"gpu {model}: no embodied figure known, counts nothing; give one with "
                f"--embodied.gpu-kgco2e='{model}=KG'"
            )
        else:
            grams_h = figure.kgco2e * 1000 * 3600 / settings.lifetime_s
            lines.append(
                f"gpu {model}: {figure.kgco2e:g} kgCO2e ({figure.source}, {figure.date}), "
                f"{grams_h:.2f} g per GPU-hour"
            )
    node = settings.node_figure()
    if node is None:
        lines.append(
            "node (rest of the server): no figure, counts nothing; give one with "
            "--embodied.node-kgco2e"
        )
    else:
        grams_h = node.kgco2e * 1000 * 3600 / settings.lifetime_s
        lines.append(f"node (rest of the server): {node.kgco2e:g} kgCO2e, {grams_h:.2f} g per hour")
    return lines


class EmbodiedMixin:
    """The sampler's embodied accrual: each device's share of its embodied emissions per
    sample, split like its energy. Sampler owns the fields below."""

    parts: SamplerParts
    _devices: dict[tuple[str, str], DeviceReading]
    _energy: dict[tuple[str, str, Workload | None], Accumulator]
    _embodied_ug: dict[tuple[str, str], int]
    _embodied_carry: dict[tuple[str, str], float]
    _last_seen: dict[Workload, float]
    _previous_time: float | None

    def _accrue_embodied(
        self,
        now: float,
        resolve: attribution.Resolve,
        held_before: Mapping[str, set[Workload]],
        cpu_usage: Mapping[Workload, int],
        node_ticks: int,
    ) -> None:
        """Each device's embodied emissions since the last sample, to whoever held it by
        the policy of its energy: a GPU's holders (a free GPU: unattributed), the rest
        of the server by CPU share (series component=cpu), like idle energy."""
        settings = self.parts.embodied
        if settings is None or self._previous_time is None:
            return
        elapsed = now - self._previous_time
        for key, reading in self._devices.items():
            if reading.component != "gpu":
                continue
            figure = settings.gpu_figure(reading.model)
            if figure is None:
                continue
            ug = self._accrue_device(key, figure, elapsed)
            processes = reading.processes
            if reading.device in held_before:
                processes = tuple(p for p in processes if resolve(p) in held_before[reading.device])
            mig = dict(reading.mig_slices)
            self._add_embodied(
                "gpu", reading.device, attribution.attribute_gpu(ug, processes, resolve, mig), now
            )
        figure = settings.node_figure()
        if figure is not None:
            ug = self._accrue_device(("node", ""), figure, elapsed)
            self._add_embodied(
                "cpu", "", attribution.attribute_by_share(ug, cpu_usage, node_ticks), now
            )

    def _accrue_device(self, key: tuple[str, str], figure: Figure, elapsed: float) -> int:
        settings = self.parts.embodied
        assert settings is not None  # only called while accruing
        lifetime = settings.lifetime_s
        ug, carry = accrue(figure.kgco2e, lifetime, elapsed, self._embodied_carry.get(key, 0.0))
        self._embodied_carry[key] = carry
        self._embodied_ug[key] = self._embodied_ug.get(key, 0) + ug
        return ug

    def _add_embodied(self, component: str, gpu: str, parts: attribution.Parts, now: float) -> None:
        for workload, ug in parts.items():
            self._series(component, gpu, workload, now).embodied_ug += ug

    def _series(
        self, component: str, gpu: str, workload: Workload | None, now: float
    ) -> Accumulator:
        """The series that is paid now (energy or embodied), created if new, and its
        workload seen now."""
        key = (component, gpu, workload)
        acc = self._energy.get(key)
        if acc is None:
            # What is added now was drawn after the previous sample, so the series' true
            # zero is at that sample's time.
            born = now if self._previous_time is None else self._previous_time
            acc = self._energy[key] = Accumulator(born)
        if workload is not None:
            # A workload paid only through replay segments (it held a GPU between two
            # reads) is in no process list: without this its series would never expire.
            self._last_seen[workload] = now
        return acc

    def _embodied_devices(self) -> tuple[EmbodiedDevice, ...]:
        settings = self.parts.embodied
        if settings is None:
            return ()
        out = [
            EmbodiedDevice(
                "gpu",
                r.device,
                r.model,
                settings.gpu_figure(r.model),
                self._embodied_ug.get(key, 0),
            )
            for key, r in sorted(self._devices.items())
            if r.component == "gpu"
        ]
        node = settings.node_figure()
        out.append(EmbodiedDevice("node", "", "", node, self._embodied_ug.get(("node", ""), 0)))
        return tuple(out)
