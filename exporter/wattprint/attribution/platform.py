"""The rest of the server: the node's input energy less what the measured components
(GPUs, CPU packages, memory) used, and its split among workloads. Pure: no I/O.

The policy (docs/power-models.md, "The platform"): each interval's remainder goes to
the workloads in proportion to their share of the measured components' energy in that
interval; the components' unattributed share (idle, system) takes the same share of the
remainder, unattributed. A node reading below the components' sum is not at once an
error: the shortfall is carried: a node reading lags its components (a BMC's cached answer, a
counter of 1 J updated every 100 ms), so the components' energy it does not yet cover is
held for the next reading, as a stale reading's is; only a shortfall that lasts
SHORT_PATIENCE readings is an error, and then the platform counts 0 for it. Nothing is
invented (the node's energy is set against the components' once) and nothing is lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from wattprint.attribution import split
from wattprint.attribution.split import Parts
from wattprint.core.model import Workload

# Node readings in a row below the components' energy before that is an error and
# not a lag.
SHORT_PATIENCE = 10


def remainder(node_uj: int, components_uj: int) -> int | None:
    """The platform's energy over one interval; None where the node read below its parts."""
    rest = node_uj - components_uj
    return rest if rest >= 0 else None


def share(platform_uj: int, components: Mapping[Workload | None, int]) -> Parts:
    """The platform's energy by each workload's share of the components' energy (key None:
    unattributed); all unattributed where the components used nothing."""
    if platform_uj <= 0:
        return {}
    return split.split(platform_uj, components) or {None: platform_uj}


@dataclass
class PlatformBook:
    """The platform's state between samples: the components' energy since the node's
    last fresh reading, and who used it."""

    held_uj: int = 0  # the components' energy not yet set against a node reading
    weights: Parts = field(default_factory=dict)  # who used it
    errors_total: int = 0
    last_error: str = ""
    short: int = 0  # node readings in a row below the components' energy held

    def close(self, node_uj: int | None, components_uj: int) -> int | None:
        """The platform energy of the interval that ends at this sample, or None while
        the node's reading is stale or short of its components (the components' energy
        it does not cover is held for the next one)."""
        self.held_uj += components_uj
        if node_uj is None:
            return None
        rest = remainder(node_uj, self.held_uj)
        if rest is not None:
            self.held_uj, self.short = 0, 0
            return rest
        self.short += 1
        if self.short < SHORT_PATIENCE:
            self.held_uj -= node_uj  # a lag: what the node has covered is set against it
            return None
        self.errors_total += 1
        self.last_error = (
            f"the node read {node_uj / 1e6:.1f} J, below its components' "
            f"{self.held_uj / 1e6:.1f} J, {self.short} readings in a row: the platform "
            "counts 0 for them"
        )
        self.held_uj, self.short = 0, 0
        return 0

    def rebase(self) -> None:
        """The node's reading starts over after a gap: nothing held is set against it."""
        self.held_uj, self.short, self.weights = 0, 0, {}

    def attribute(self, platform_uj: int | None, used: Mapping[Workload | None, int]) -> Parts:
        """Add this sample's components' parts to the weights; split the platform's
        energy by them when the interval closed (platform_uj not None)."""
        split.merge(self.weights, used)
        if platform_uj is None:
            return {}
        parts = share(platform_uj, self.weights)
        self.weights = {}
        return parts
