"""Plain data shared by the layers: sources -> sampler -> attribution -> collector.

Nothing here does I/O. Energy is carried as integer micro-joules so that splitting
a device's energy among workloads can be exact (the parts always add up).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from wattprint.core.units import UJ_PER_J as UJ_PER_J  # re-exported: the layers import it from here

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")


def fields_from(kind: type[D], source: object, **values: Any) -> D:
    """A `kind` dataclass with `values`; each other field is `source`'s attribute of the
    same name where it has one, else the field's default."""
    names = {f.name for f in fields(kind)} - values.keys()
    taken = {name: getattr(source, name) for name in names if hasattr(source, name)}
    return kind(**taken, **values)


class Workload(NamedTuple):
    """Who pays: a Kubernetes job/pod, a Slurm job, or a self-declared name."""

    # A named tuple, not a dataclass: every sample looks each workload up some twenty
    # times (the dicts of usage, shares, series, last seen), and a tuple's hash is the
    # interpreter's own, where a dataclass's is a Python call. It is the same number (the
    # hash of the fields' tuple), and the repr and the order are the dataclass's, so sets
    # and dicts of workloads iterate, and series sort, as before.
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
    method: str  # a Method registered by its source (sources/registry.py): measured or estimated
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
    # Devices whose last reading stands (a BMC's, refreshed less often than sampled):
    # nothing new to count, nothing wrong; their power is still served.
    held: list[tuple[str, str]] = field(default_factory=list)
    # Devices whose reading starts over after a gap not bridged (a BMC silent for
    # minutes): what they used in the gap is not known, and nothing is set against it.
    rebased: list[tuple[str, str]] = field(default_factory=list)


class Source(Protocol):
    """A hardware (or replayed, or modelled) energy source."""

    name: str  # collector label, e.g. "nvml", "rapl", "cpu_model"

    def read(self) -> SourceResult: ...

    def explain(self) -> list[str]:
        """Lines for `wattprint doctor`: each device or component, its method, and why."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class CollectorStatus:
    """How one collector's last read went, for the wattprint_collector_* self-metrics."""

    name: str
    success: bool
    duration_s: float
    errors_total: int


class EnergySeries(NamedTuple):
    """A workload's (or, with workload None, the unattributed) share of one component.

    A named tuple, not a frozen dataclass: every sample makes one per series, hundreds
    on a node of a hundred jobs, and a frozen dataclass sets each field through
    object.__setattr__ (five times the cost)."""

    component: str
    gpu: str
    workload: Workload | None
    energy_uj: int
    grams: float
    # Unix time at which this series was last 0: the sample before its first energy.
    born: float = 0.0
    # Continued from a state file: the series existed before this process started, so
    # no scraper must be sent its 0 again.
    resumed: bool = False
    embodied_ug: int = 0  # embodied (Scope 3) micro-grams accrued to it (sampler/embodied.py)


@dataclass(frozen=True)
class Intensity:
    """One carbon-intensity value and what it refers to.

    timestamp is the unix time the value refers to: the start of the hour, half-hour or
    5-minute period for live providers, and 00:00 UTC on 1 January of the dataset's year
    for the embedded yearly averages (a yearly mean has no better instant).
    """

    zone: str  # as configured ("DE", "gcp:europe-west3"), or the provider's region
    provider: str  # static | electricitymaps | watttime | uk-grid
    signal: str  # average | marginal
    grams_per_kwh: float
    timestamp: float
    year: int | None = None  # dataset year, embedded values only


@dataclass(frozen=True)
class CarbonStatus:
    """The carbon service's state (carbon/service.py), as the sampler and doctor read it."""

    accounting: Intensity  # what emissions are accounted with now
    signals: list[Intensity]  # every gauge to export: live value(s), then the default
    fallback_active: bool  # a live provider should feed accounting but the default does
    errors_total: int  # failed fetches of the live provider since start
    last_success: float | None  # clock time of the last good answer
    last_error: str | None  # the last failure, never with a credential in it
    provider: str  # configured provider
    last_error_time: float | None = None
    fetches_total: int = 0
    errors_by_reason: dict[str, int] = field(default_factory=dict)
    forecast: Forecast | None = None  # the last good one, if the provider has any
    forecast_errors_total: int = 0  # kept apart: a forecast never feeds accounting
    forecast_last_error: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything one sample found, handed whole from the sampler to the collector."""

    time: float  # when the devices were read (sampler/clock.py: monotonic, as Unix time at start)
    devices: tuple[DeviceReading, ...]  # energy_uj: the exported cumulative
    energy: tuple[EnergySeries, ...]
    gpu_holders: tuple[tuple[Workload, str, str], ...]  # (workload, gpu index, uuid)
    collectors: tuple[CollectorStatus, ...]
    intensities: tuple[Intensity, ...] = ()
    carbon_fallback: tuple[tuple[str, bool], ...] = ()  # (zone, active)
    carbon_errors: tuple[tuple[str, int], ...] = ()  # (provider, errors_total)
    workload_cap: CapStatus = field(default_factory=lambda: CapStatus())
    gpus: tuple[int, int] = (0, 0)  # GPUs (expected by --gpu.expect, measured in this sample)
    pue: float = 1.0
    sample_interval: float = 1.0
    # Energy the devices used while the exporter was down: (component, estimated, uJ).
    restart_gap: tuple[tuple[str, bool, int], ...] = ()
    restarts: tuple[tuple[str, int], ...] = ()  # (outcome: resumed|fresh, count)
    state_errors: tuple[tuple[str, int], ...] = ()  # (reason, count)
    embodied: tuple[EmbodiedDevice, ...] = ()
    forecast: ForecastSignals | None = None  # only where the provider has one
    clock: ClockReading | None = None  # the sample's stamp and clock status (sampler/clock.py)
    # (component, gpu, workload) of each of energy's series: the same object from one
    # snapshot to the next while no series comes or goes, so that a scrape tells in one
    # comparison that it has no new series (export/collector.py). None: worked out from energy.
    series_keys: frozenset[tuple[str, str, Workload | None]] | None = None


@dataclass(frozen=True)
class EmbodiedDevice:
    """A device's embodied accrual so far; figure None: no figure known, none accrues."""

    component: str  # gpu | node
    device: str
    model: str
    figure: Figure | None
    embodied_ug: int


DEFAULT_MAX_WORKLOADS = 500


@dataclass(frozen=True)
class CapStatus:
    """What the snapshot exports about the cap."""

    max_workloads: int = DEFAULT_MAX_WORKLOADS
    workloads: int = 0  # workloads with series of their own now
    overflowed_total: int = 0  # workloads sent to OVERFLOW, each counted once
    registered_over_total: int = 0  # registered workloads given series over a full cap


@dataclass(frozen=True)
class Figure:
    """One device's embodied emissions, cradle to gate, and where the number is from."""

    kgco2e: float
    source: str  # short citation, exported as a label and written into GHG exports
    date: str  # when the source was published (or "user" for a figure given by flag)


# The kernel's NTP_PHASE_LIMIT: from this maximum error on, the clock is unsynchronized.
UNSYNCHRONIZED_MAXERROR_S = 16.0


@dataclass(frozen=True)
class KernelClock:
    """What the kernel says of its clock (adjtimex, as node_exporter's timex collector)."""

    synchronized: bool  # the STA_UNSYNC flag is clear (chrony sets it only with rtcsync)
    maxerror_s: float  # how far off the clock may be, as the time daemon last said

    @property
    def disciplined(self) -> bool:
        """A time daemon vouches for the clock: its error is bounded under 16 s."""
        return self.maxerror_s < UNSYNCHRONIZED_MAXERROR_S


@dataclass(frozen=True)
class ClockReading:
    """The clocks at one sample, and the stamp its values get."""

    time: float  # the sampler's time: Unix time at start + monotonic time since (rule 4)
    wall: float  # the wall clock
    stamp: float | None  # the samples' timestamp; None: served without one
    steps_total: int  # wall clock steps seen since start
    kernel: KernelClock | None  # None: adjtimex could not be read

    @property
    def offset_s(self) -> float:
        """How far the wall clock was stepped since start, all steps together."""
        return self.wall - self.time


@dataclass(frozen=True)
class ForecastPoint:
    """One interval of a forecast and the intensity predicted for it."""

    start: float  # unix seconds
    end: float
    grams_per_kwh: float


@dataclass(frozen=True)
class Forecast:
    """A provider's intensity forecast for one zone, as fetched."""

    zone: str
    provider: str
    fetched_at: float
    points: tuple[ForecastPoint, ...]  # sorted by start, not overlapping


@dataclass(frozen=True)
class Greenest:
    """The best time to start a job of a given length within a horizon, and its mean intensity."""

    within_h: int
    duration_h: int
    offset_s: float  # from now to the best start
    grams_per_kwh: float  # mean over [start, start + duration]


@dataclass(frozen=True)
class ForecastSignals:
    """What the exporter shows of a forecast: intensity hours ahead and the greenest starts."""

    zone: str
    provider: str
    fetched_at: float
    horizons: tuple[tuple[int, float], ...]  # (hours ahead, g/kWh)
    greenest: tuple[Greenest, ...]
