"""Plain data shared by the layers: sources -> sampler -> attribution -> collector.

Nothing here does I/O. Energy is carried as integer micro-joules so that splitting
a device's energy among workloads can be exact (the parts always add up).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

UJ_PER_J = 1_000_000


@dataclass(frozen=True, order=True)
class Workload:
    """Who pays: a Kubernetes job/pod, a Slurm job, or a self-declared name."""

    scheduler: str  # kubernetes | slurm | env
    workload: str
    namespace: str = ""
    pod: str = ""


@dataclass(frozen=True)
class GpuProcess:
    """One compute process holding a GPU during the interval that ends at the sample."""

    pid: int
    used_memory_bytes: int | None = None
    sm_util: int | None = None  # percent over NVML's last window; None = no sample
    gpu_instance_id: int | None = None  # MIG GPU instance, None without MIG
    identity: Workload | None = None  # given by a replayed trace; otherwise resolved


@dataclass(frozen=True)
class DeviceReading:
    """One device at one sample.

    energy_uj is cumulative since the source started and never decreases: each source
    corrects wraps, resets and integration itself, so consumers only take differences.
    """

    component: str  # gpu | cpu | memory
    device: str  # GPU index, RAPL package index, "" for node-wide memory
    energy_uj: int
    power_w: float | None
    method: str  # a Method registered by its source (registry.py): measured or estimated
    uuid: str = ""
    model: str = ""
    processes: tuple[GpuProcess, ...] = ()
    # MIG: slice count per GPU instance id, so instances share the GPU by size.
    mig_slices: tuple[tuple[int, int], ...] = ()
    # Replay applies many trace samples between two reads, each with its own process
    # state; each segment is (energy_uj added, processes holding the GPU meanwhile), so
    # the energy is split by who held the GPU when it was drawn. Empty: the whole
    # increase since the previous read belongs to `processes`.
    segments: tuple[tuple[int, tuple[GpuProcess, ...]], ...] = ()
    # Where the hardware counter itself stands (all energy since the driver loaded or
    # the package powered up; None for integrated or modelled energy) and where it wraps.
    # It outlives the exporter, so a restarted exporter can tell what the gap used.
    raw_uj: int | None = None
    raw_wrap_uj: int | None = None
    # The most the device can draw (its power limit, or a stated ceiling): a counter
    # rise beyond it over the elapsed time is a glitch, not energy.
    max_power_w: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.component, self.device)


@dataclass
class SourceResult:
    """What one read of a source gave: the devices it could read and what went wrong.

    A source that can read some devices but not others returns the ones it could and
    one error string per failure; each error counts in wattprint_collector_errors_total.
    """

    devices: list[DeviceReading] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Source(Protocol):
    """A hardware (or replayed, or modelled) energy source."""

    name: str  # collector label, e.g. "nvml", "rapl", "cpu_model"

    def read(self) -> SourceResult: ...

    def explain(self) -> list[str]:
        """Lines for `wattprint doctor`: each device or component, its method, and why."""
        ...

    def close(self) -> None: ...
