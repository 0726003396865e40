"""The sampler's series: one running total per (component, gpu, workload)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Accumulator:
    """One series' running totals in the sampler."""

    born: float
    energy_uj: int = 0
    grams: float = 0.0
    resumed: bool = False
    embodied_ug: int = 0
