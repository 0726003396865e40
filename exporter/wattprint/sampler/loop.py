"""The background sampler: reads every source once per interval, attributes the energy,
accumulates counters and publishes an immutable Snapshot for the collector.

All hardware access and all arithmetic happen here, on one thread; a scrape only
serializes the latest Snapshot.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from wattprint.attribution import embodied
from wattprint.attribution import split as attribution
from wattprint.attribution.cardinality import WorkloadCap
from wattprint.carbon import forecast
from wattprint.core.model import (
    DEFAULT_MAX_WORKLOADS,
    CarbonStatus,
    CollectorStatus,
    DeviceReading,
    EnergySeries,
    GpuProcess,
    Intensity,
    Snapshot,
    Source,
    SourceResult,
    Workload,
)
from wattprint.durability.document import DocumentText
from wattprint.durability.statefile import StateFile
from wattprint.host.procfs import ProcTable
from wattprint.sampler import restarts as resume
from wattprint.sampler.clock import StampClock
from wattprint.sampler.embodied import EmbodiedMixin
from wattprint.sampler.restarts import RestartMixin
from wattprint.sampler.series import Accumulator
from wattprint.sampler.usage import UsageMixin

log = logging.getLogger(__name__)

UJ_PER_KWH = 3.6e12


class Resumable(Protocol):
    """A source with state of its own to carry across restarts (the replay's position)."""

    name: str

    def save_state(self) -> dict[str, object]: ...
    def restore_state(self, data: dict[str, object]) -> None: ...


class Resolver(Protocol):
    def resolve(
        self, pid: int, start_ticks: int, table: ProcTable | None = None
    ) -> Workload | None: ...


class Carbon(Protocol):
    """What the sampler needs from the carbon service (wattprint.carbon.CarbonService)."""

    def accounting(self) -> Intensity: ...
    def status(self) -> CarbonStatus: ...


@dataclass
class _CollectorState:
    errors_total: int = 0
    last_error: str = ""


@dataclass
class SamplerParts:
    """What the sampler is wired to; only sources are required."""

    sources: Sequence[Source]
    read_procs: Callable[[], ProcTable] | None = None
    resolver: Resolver | None = None
    carbon: Carbon | None = None
    extra_status: Callable[[], Sequence[CollectorStatus]] | None = None
    pue: float = 1.0
    interval: float = 1.0
    retention: float = 600.0
    max_workloads: int = DEFAULT_MAX_WORKLOADS  # --workload.max-series
    clock: Callable[[], float] = time.time
    stamp_clock: StampClock = field(default_factory=StampClock)
    log_once: dict[str, str] = field(default_factory=dict)
    state: StateFile | None = None  # None: nothing survives a restart
    boot_id: str = ""  # raw counters compare only within one boot
    monotonic: Callable[[], float] = time.monotonic  # system-wide: spans restarts
    embodied: embodied.EmbodiedSettings | None = None  # None: no embodied accrual


# _snapshot makes each EnergySeries by tuple.__new__ from these, in this order: a field
# added to EnergySeries must be added there too (tuple.__new__ fills in no default).
assert EnergySeries._fields == (
    *("component", "gpu", "workload"),  # the series' key
    *("energy_uj", "grams", "born", "resumed", "embodied_ug"),  # its Accumulator's
), "sampler._snapshot no longer makes EnergySeries with all of its fields"


class Sampler(RestartMixin, EmbodiedMixin, UsageMixin):
    def __init__(self, parts: SamplerParts) -> None:
        self.parts = parts
        self._devices: dict[tuple[str, str], DeviceReading] = {}
        self._device_raw: dict[tuple[str, str], int] = {}
        self._device_total: dict[tuple[str, str], int] = {}
        self._previous_time: float | None = None
        self._energy: dict[tuple[str, str, Workload | None], Accumulator] = {}
        self._energy_keys: frozenset[tuple[str, str, Workload | None]] = frozenset()
        self._energy_order: list[tuple[str, str, Workload | None]] = []
        self._last_seen: dict[Workload, float] = {}
        self._cap = WorkloadCap(parts.max_workloads, parts.retention)
        self._collectors: dict[str, _CollectorState] = {}
        self._prev_ticks: dict[tuple[int, int], int] = {}
        self._prev_cpu_total: int | None = None
        self._prev_cgroup: dict[str, int] = {}  # job cgroup -> CPU microseconds
        self._cgroups_resumed = False
        self._job_workloads: dict[str, Workload] = {}  # job cgroup -> its workload
        self._latest: Snapshot | None = None
        self._last_success_monotonic: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Restarts: the saved state waiting for the first reads, what gaps added, and
        # how loading and saving went; all carried over in the state file itself.
        self._state_loaded = False
        self._resume: dict[str, Any] | None = None
        self._rebase_from: tuple[float, float] | None = None
        self._writable = parts.state is not None
        self._read_monotonic = 0.0
        self._last_sync = -math.inf
        self._gap_uj: dict[tuple[str, bool], int] = {}
        self._restarts: dict[str, int] = {}
        self._state_errors: dict[str, int] = {}
        self._holders: tuple[tuple[Workload, str, str], ...] = ()
        self._read_at: dict[tuple[str, str], float] = {}  # monotonic time of each device's read
        self._pending: dict[tuple[str, str], resume.SavedDevice] = {}  # gaps not yet booked
        self._held_before: dict[str, set[Workload]] = {}  # GPU -> its holders at the save
        self._document = DocumentText()  # the state file's text, row by row
        # Embodied accrual per device: micro-grams so far and the fraction carried.
        self._embodied_ug: dict[tuple[str, str], int] = {}
        self._embodied_carry: dict[tuple[str, str], float] = {}

    # -- public ---------------------------------------------------------------

    @property
    def latest(self) -> Snapshot | None:
        return self._latest

    def healthy(self, now_monotonic: float | None = None) -> bool:
        """False once the sampler has missed three intervals (or never sampled)."""
        last = self._last_success_monotonic
        if last is None:
            return False
        now = time.monotonic() if now_monotonic is None else now_monotonic
        return now - last <= 3 * self.parts.interval + 0.5

    def start(self) -> None:
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="wattprint-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            if self._previous_time is not None:
                self._save_state(sync=True)

    def _run(self) -> None:
        interval = self.parts.interval
        next_at = time.monotonic() + interval
        while not self._stop.wait(max(next_at - time.monotonic(), 0)):
            try:
                self.sample_once()
            except Exception:  # the sampler must outlive any bug in one sample
                log.exception("sample failed")
            now = time.monotonic()
            next_at += interval
            if next_at < now:  # fell behind (a slow device): skip, don't burst
                next_at = now + interval

    def sample_once(self) -> Snapshot:
        with self._lock:
            if not self._state_loaded:
                self._state_loaded = True
                self._load_state()
            snapshot = self._sample()
            # Saved before it is served: whatever a scraper has seen, a restart
            # continues from at least that, so no counter ever goes back.
            self._save_state()
        self._latest = snapshot
        self._last_success_monotonic = time.monotonic()
        return snapshot

    # -- one sample -------------------------------------------------------------

    def _read_source(self, source: Source) -> tuple[SourceResult, CollectorStatus]:
        start = time.perf_counter()
        try:
            result = source.read()
        except Exception as err:  # a source bug must not stop the others
            result = SourceResult(errors=[f"{type(err).__name__}: {err}"])
            self._log_once(source.name, f"source {source.name} failed: {err}")
        return result, self._status(source.name, result.errors, time.perf_counter() - start)

    def _status(self, name: str, errors: Sequence[str], duration: float) -> CollectorStatus:
        state = self._collectors.setdefault(name, _CollectorState())
        state.errors_total += len(errors)
        return CollectorStatus(name, not errors, duration, state.errors_total)

    def _sample(self) -> Snapshot:
        parts = self.parts
        statuses: list[CollectorStatus] = []
        deltas: dict[tuple[str, str], int] = {}
        for source in parts.sources:
            result, status = self._read_source(source)
            statuses.append(status)
            read_at = parts.monotonic()
            for reading in result.devices:
                deltas[reading.key] = self._account_device(reading)
                self._read_at[reading.key] = read_at
        self._read_monotonic = parts.monotonic()
        if self._resume is not None:
            self._apply_resume(deltas)
        gap_gpus = self._book_gaps(deltas) if self._pending else set()
        # Taken after the reads, before /proc: every energy total is true as of this
        # moment, the samples' timestamp for devices and workloads alike when the clock
        # is trusted. `now` is monotonic: no clock step moves it (clock.py).
        now = parts.stamp_clock.read(parts.clock).time
        if self._rebase_from is not None:
            self._rebase(now)

        table = self._read_procs(statuses)
        resolve_pid = self._pid_resolver(table)

        def resolve(process: GpuProcess) -> Workload | None:
            if process.identity is not None:
                return self._admit(process.identity)
            return resolve_pid(process.pid)

        factor = self._grams_per_uj()
        holders: set[tuple[Workload, str, str]] = set()
        for key, delta in deltas.items():
            reading = self._devices[key]
            if reading.component != "gpu":
                continue
            if reading.device in gap_gpus:
                held = self._held_before.get(reading.device, set())
                gpu_parts = _attribute_gap(reading, delta, resolve, held)
            else:
                gpu_parts = self._attribute_gpu(reading, delta, resolve)
            self._add("gpu", reading.device, gpu_parts, factor, now)
            for process in reading.processes:
                workload = resolve(process)
                if workload is not None:
                    holders.add((workload, reading.device, reading.uuid))
                    self._last_seen[workload] = now

        cpu_delta = sum(d for (c, _), d in deltas.items() if c == "cpu")
        mem_delta = sum(d for (c, _), d in deltas.items() if c == "memory")
        cpu_usage, rss = self._usage(table, resolve_pid, now)
        if cpu_delta:
            node_ticks = self._node_ticks(table)
            self._add(
                "cpu",
                "",
                attribution.attribute_by_share(cpu_delta, cpu_usage, node_ticks),
                factor,
                now,
            )
        if mem_delta:
            capacity = table.mem_total_bytes if table is not None else 0
            self._add(
                "memory", "", attribution.attribute_by_share(mem_delta, rss, capacity), factor, now
            )
        held_before = {gpu: self._held_before.get(gpu, set()) for gpu in gap_gpus}
        self._accrue_embodied(now, resolve, held_before, cpu_usage, self._node_ticks(table))
        if table is not None:
            self._prev_cpu_total = table.cpu_ticks_total

        self._expire(now)
        if parts.extra_status is not None:
            statuses.extend(parts.extra_status())
        snapshot = self._snapshot(now, statuses, holders, deltas.keys())
        self._previous_time = now
        self._holders = snapshot.gpu_holders
        return snapshot

    def _account_device(self, reading: DeviceReading) -> int:
        """Add a device's increase to its exported counter; return the increase."""
        key = reading.key
        previous = self._device_raw.get(key)
        if previous is None:
            delta = 0  # first sight: the source's cumulative is the baseline
        elif reading.energy_uj >= previous:
            delta = reading.energy_uj - previous
        else:
            delta = reading.energy_uj  # the source itself restarted from 0
        self._device_raw[key] = reading.energy_uj
        self._device_total[key] = self._device_total.get(key, 0) + delta
        self._devices[key] = reading
        return delta

    def _attribute_gpu(
        self,
        reading: DeviceReading,
        delta: int,
        resolve: attribution.Resolve,
    ) -> attribution.Parts:
        mig = dict(reading.mig_slices)
        gpu_parts: attribution.Parts = {}
        remaining = delta
        for energy, processes in reading.segments:
            energy = min(energy, remaining)
            attribution.merge(gpu_parts, attribution.attribute_gpu(energy, processes, resolve, mig))
            remaining -= energy
        attribution.merge(
            gpu_parts, attribution.attribute_gpu(remaining, reading.processes, resolve, mig)
        )
        return gpu_parts

    def _read_procs(self, statuses: list[CollectorStatus]) -> ProcTable | None:
        if self.parts.read_procs is None:
            return None
        start = time.perf_counter()
        try:
            table = self.parts.read_procs()
            errors: list[str] = []
        except Exception as err:  # /proc unreadable: energy goes unattributed
            self._log_once("procfs", f"cannot read processes: {err}")
            table, errors = None, [str(err)]
        statuses.append(self._status("procfs", errors, time.perf_counter() - start))
        return table

    def _node_ticks(self, table: ProcTable | None) -> int:
        if table is None or self._prev_cpu_total is None:
            return 0
        return max(table.cpu_ticks_total - self._prev_cpu_total, 0)

    def _grams_per_uj(self) -> float:
        carbon = self.parts.carbon
        if carbon is None:
            return 0.0
        intensity = carbon.accounting()
        return float(intensity.grams_per_kwh) * self.parts.pue / UJ_PER_KWH

    def _add(
        self, component: str, gpu: str, parts: attribution.Parts, factor: float, now: float
    ) -> None:
        for workload, energy in parts.items():
            acc = self._series(component, gpu, workload, now)
            acc.energy_uj += energy
            acc.grams += energy * factor

    def _expire(self, now: float) -> None:
        retention = self.parts.retention
        gone = {w for w, seen in self._last_seen.items() if now - seen > retention}
        if not gone:
            return
        for workload in gone:
            del self._last_seen[workload]
        for key in [k for k in self._energy if k[2] in gone]:
            del self._energy[key]

    def _snapshot(
        self,
        now: float,
        statuses: list[CollectorStatus],
        holders: set[tuple[Workload, str, str]],
        read: Collection[tuple[str, str]],
    ) -> Snapshot:
        # A device its source could not read this time (a lost GPU) keeps its counter,
        # but its last power reading would be a stale claim: it has none.
        devices = tuple(
            _with_energy(self._devices[key], self._device_total[key], key in read)
            for key in sorted(self._devices)
        )
        keys = self._energy.keys()
        if keys != self._energy_keys:  # sorted again only when a series comes or goes
            self._energy_keys = frozenset(keys)
            self._energy_order = sorted(keys, key=repr)
        # One per series and sample, hundreds on a node of a hundred jobs: made by
        # tuple.__new__, without the named tuple's own __new__ (a Python call), from the
        # key and the accumulator's numbers in field order (asserted above Sampler).
        energy, new = self._energy, tuple.__new__
        series = [
            new(
                EnergySeries,
                (*key, acc.energy_uj, acc.grams, acc.born, acc.resumed, acc.embodied_ug),
            )
            for key in self._energy_order
            for acc in (energy[key],)
        ]
        intensities: tuple[Intensity, ...] = ()
        fallback: tuple[tuple[str, bool], ...] = ()
        carbon_errors: tuple[tuple[str, int], ...] = ()
        signals: forecast.ForecastSignals | None = None
        if self.parts.carbon is not None:
            status = self.parts.carbon.status()
            intensities = tuple(status.signals)
            fallback = ((status.accounting.zone, status.fallback_active),)
            carbon_errors = ((status.provider, status.errors_total),)
            upcoming = status.forecast
            signals = forecast.signals(upcoming, now) if upcoming is not None else None
        return Snapshot(
            time=now,
            devices=devices,
            energy=tuple(series),
            gpu_holders=tuple(sorted(holders, key=repr)),
            collectors=tuple(statuses),
            intensities=intensities,
            carbon_fallback=fallback,
            carbon_errors=carbon_errors,
            workload_cap=self._cap.status(self._last_seen),
            pue=self.parts.pue,
            sample_interval=self.parts.interval,
            restart_gap=tuple((c, e, uj) for (c, e), uj in sorted(self._gap_uj.items())),
            restarts=tuple(sorted(self._restarts.items())),
            state_errors=tuple(sorted(self._state_errors.items())),
            embodied=self._embodied_devices(),
            forecast=signals,
            clock=self.parts.stamp_clock.last,
            series_keys=self._energy_keys,
        )


def _attribute_gap(
    reading: DeviceReading,
    energy: int,
    resolve: attribution.Resolve,
    held_before: set[Workload],
) -> attribution.Parts:
    """A GPU's gap energy goes, by the usual policy, to the workloads that held it both
    before and after the gap: nothing says who used it in between otherwise."""
    processes = tuple(p for p in reading.processes if resolve(p) in held_before)
    return attribution.attribute_gpu(energy, processes, resolve, dict(reading.mig_slices))


def _with_energy(reading: DeviceReading, total: int, fresh: bool) -> DeviceReading:
    from dataclasses import replace

    power = reading.power_w if fresh else None
    return replace(reading, energy_uj=total, segments=(), power_w=power)
