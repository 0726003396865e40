"""What the report says of one job: its life, and its energy and emissions per component,
per GPU and at the wall.

"The chips" are the components every node measures (COMPONENTS: GPUs, CPU packages,
memory): energy_j and emissions_g. "At the wall" adds the job's share of the platform,
the rest of the server, which exists only where a platform source read the node's
input: the wall figures are None unless every node the job ran on had one, never the
chips' figure in their place."""

from __future__ import annotations

from dataclasses import dataclass, field

from wattprint.report.common import COMPONENTS, JOULES_PER_KWH


@dataclass
class Component:
    """A job's energy and emissions on one component (gpu, cpu, memory)."""

    energy_j: float = 0.0
    emissions_g: float = 0.0
    estimated_j: float = 0.0
    pue_energy_j: float = 0.0  # sum of energy x PUE, to divide PUE out of emissions
    methods: set[str] = field(default_factory=set)


@dataclass
class GpuUse:
    """A job's energy and emissions on one GPU of one node."""

    instance: str
    gpu: str
    model: str = ""
    energy_j: float = 0.0
    emissions_g: float = 0.0
    estimated_j: float = 0.0


@dataclass
class JobReport:
    """What the report says of one job: its life, energy, emissions, GPUs and notes."""

    scheduler: str
    namespace: str
    workload: str
    start: float = 0.0
    end: float = 0.0
    components: dict[str, Component] = field(
        default_factory=lambda: {name: Component() for name in COMPONENTS}
    )
    gpus: dict[tuple[str, str], GpuUse] = field(default_factory=dict)
    instances: set[tuple[str, str]] = field(default_factory=set)  # (job, instance)
    zones: set[str] = field(default_factory=set)
    budget_grams: float | None = None
    notes: list[str] = field(default_factory=list)
    embodied_g: float = 0.0  # Scope 3: the hardware's embodied emissions it accrued
    # The job's share of the rest of the server, and the (job, instance) of its nodes
    # that read their input (a platform source).
    platform: Component = field(default_factory=Component)
    platform_nodes: set[tuple[str, str]] = field(default_factory=set)

    @property
    def footprint_g(self) -> float:
        """Operational (Scope 2, location-based) plus embodied (Scope 3)."""
        return self.emissions_g + self.embodied_g

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def energy_j(self) -> float:
        return sum(c.energy_j for c in self.components.values())

    @property
    def emissions_g(self) -> float:
        return sum(c.emissions_g for c in self.components.values())

    @property
    def estimated_j(self) -> float:
        return sum(c.estimated_j for c in self.components.values())

    @property
    def pue(self) -> float | None:
        energy = self.energy_j
        pue_energy = sum(c.pue_energy_j for c in self.components.values())
        return pue_energy / energy if energy > 0 else None

    @property
    def intensity(self) -> float | None:
        """g CO2e per kWh drawn by the devices, the facility overhead (PUE) divided out."""
        pue_energy = sum(c.pue_energy_j for c in self.components.values())
        return self.emissions_g / (pue_energy / JOULES_PER_KWH) if pue_energy > 0 else None

    @property
    def budget_used(self) -> float | None:
        if self.budget_grams is None or self.budget_grams <= 0:
            return None
        return self.emissions_g / self.budget_grams

    @property
    def without_platform(self) -> list[str]:
        """The job's nodes that had no platform source (so no wall figure)."""
        return sorted({instance for _, instance in self.instances - self.platform_nodes})

    @property
    def wall_energy_j(self) -> float | None:
        """The chips plus the platform; None unless every node read its input."""
        if not self.instances or self.without_platform:
            return None
        return self.energy_j + self.platform.energy_j

    @property
    def wall_emissions_g(self) -> float | None:
        if not self.instances or self.without_platform:
            return None
        return self.emissions_g + self.platform.emissions_g

    @property
    def wall_unavailable(self) -> str:
        """Why there is no wall figure ("" when there is one)."""
        if not self.instances:
            return "no node"
        missing = self.without_platform
        if not missing:
            return ""
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        shown = ", ".join(missing[:5]) + more
        return f"no platform reading (the node's input: a BMC, pm_counters) on {shown}"
