"""Embodied (Scope 3, cradle to gate) emissions of the hardware, amortized over its
service life and accrued per second to whoever holds it. Pure: no I/O, no clocks.

The sampler splits each interval's accrual with the same policy as a GPU's energy
(attribution.attribute_gpu), in integer micro-grams, so the parts add up to the
device's accrual exactly; a free GPU's accrual goes to unattributed, as its idle
energy does. A device with no known figure accrues nothing: a figure is never made up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wattprint.core.model import Figure
from wattprint.core.units import SECONDS_PER_YEAR

UG_PER_G = 1_000_000
DEFAULT_LIFETIME_YEARS = 4.0


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
    """How embodied emissions accrue: the hardware's service life and the user's kgCO2e figures."""

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
