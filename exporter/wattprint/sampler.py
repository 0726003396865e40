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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import attribution, embodied, resume
from .carbon import forecast
from .cardinality import DEFAULT_MAX_WORKLOADS, OVERFLOW, CapStatus, WorkloadCap
from .clock import ClockReading, StampClock
from .model import DeviceReading, GpuProcess, Source, SourceResult, Workload
from .procs import TICKS_PER_S, ProcTable
from .state import StateError, StateFile

log = logging.getLogger(__name__)

UJ_PER_KWH = 3.6e12
# The state is written after every sample (to the page cache) and flushed to disk this
# often: a process kill loses nothing, a power cut at most this much of the state.
STATE_SYNC_S = 10.0


@dataclass(frozen=True)
class CollectorStatus:
    name: str
    success: bool
    duration_s: float
    errors_total: int


@dataclass(frozen=True)
class EnergySeries:
    """A workload's (or, with workload None, the unattributed) share of one component."""

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
    embodied_ug: int = 0  # embodied (Scope 3) micro-grams accrued to it (embodied.py)


@dataclass(frozen=True)
class IntensityValue:
    zone: str
    provider: str
    signal: str
    grams_per_kwh: float
    timestamp: float
    year: int | None = None  # dataset year of an embedded yearly value


@dataclass(frozen=True)
class Snapshot:
    time: float  # when the devices were read (clock.py: monotonic, as Unix time at start)
    devices: tuple[DeviceReading, ...]  # energy_uj: the exported cumulative
    energy: tuple[EnergySeries, ...]
    gpu_holders: tuple[tuple[Workload, str, str], ...]  # (workload, gpu index, uuid)
    collectors: tuple[CollectorStatus, ...]
    intensities: tuple[IntensityValue, ...] = ()
    carbon_fallback: tuple[tuple[str, bool], ...] = ()  # (zone, active)
    carbon_errors: tuple[tuple[str, int], ...] = ()  # (provider, errors_total)
    workload_cap: CapStatus = field(default_factory=CapStatus)
    pue: float = 1.0
    sample_interval: float = 1.0
    # Energy the devices used while the exporter was down: (component, estimated, uJ).
    restart_gap: tuple[tuple[str, bool, int], ...] = ()
    restarts: tuple[tuple[str, int], ...] = ()  # (outcome: resumed|fresh, count)
    state_errors: tuple[tuple[str, int], ...] = ()  # (reason, count)
    embodied: tuple[EmbodiedDevice, ...] = ()
    forecast: forecast.ForecastSignals | None = None  # only where the provider has one
    clock: ClockReading | None = None  # the sample's stamp and clock status (clock.py)


@dataclass(frozen=True)
class EmbodiedDevice:
    """A device's embodied accrual so far; figure None: no figure known, none accrues."""

    component: str  # gpu | node
    device: str
    model: str
    figure: embodied.Figure | None
    embodied_ug: int


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

    def accounting(self) -> object: ...
    def status(self) -> object: ...


@dataclass
class _Accumulator:
    born: float
    energy_uj: int = 0
    grams: float = 0.0
    resumed: bool = False
    embodied_ug: int = 0


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


class Sampler:
    def __init__(self, parts: SamplerParts) -> None:
        self.parts = parts
        self._devices: dict[tuple[str, str], DeviceReading] = {}
        self._device_raw: dict[tuple[str, str], int] = {}
        self._device_total: dict[tuple[str, str], int] = {}
        self._previous_time: float | None = None
        self._energy: dict[tuple[str, str, Workload | None], _Accumulator] = {}
        self._last_seen: dict[Workload, float] = {}
        self._cap = WorkloadCap(parts.max_workloads, parts.retention)
        self._collectors: dict[str, _CollectorState] = {}
        self._prev_ticks: dict[tuple[int, int], int] = {}
        self._prev_cpu_total: int | None = None
        self._prev_cgroup: dict[str, int] = {}  # job cgroup -> CPU microseconds
        self._cgroups_resumed = False
        self._latest: Snapshot | None = None
        self._last_success_monotonic: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Restarts: the saved state waiting for the first reads, what gaps added, and
        # how loading and saving went; all carried over in the state file itself.
        self._state_loaded = False
        self._resume: dict[str, Any] | None = None
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

    # -- restarts ----------------------------------------------------------------

    def _count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1

    def _fresh(self, message: str, error: str = "") -> None:
        log.warning("%s; energy counters start again from 0", message)
        self._count(self._restarts, "fresh")
        if error:
            self._count(self._state_errors, error)

    def _load_state(self) -> None:
        state = self.parts.state
        if state is None:
            return
        try:
            data = state.load()
        except StateError as err:
            if err.reason == "foreign":
                self._writable = False  # someone else's file: never overwrite it
            self._fresh(str(err), err.reason)
            return
        if data is None:
            return
        if not self.parts.boot_id:
            self._fresh(f"not resuming from state file {state.path}: this boot's id is unknown")
            return
        if data.get("boot_id") != self.parts.boot_id:
            # Raw counters restart with the machine: a saved position means nothing.
            self._fresh(f"state file {state.path} is from another boot")
            return
        sources = data.get("sources")
        for source in self.parts.sources:
            saved = sources.get(source.name) if isinstance(sources, dict) else None
            if isinstance(saved, dict) and hasattr(source, "restore_state"):
                source.restore_state(saved)
        self._resume = data

    def _apply_resume(self, deltas: dict[tuple[str, str], int]) -> None:
        """Continue from the saved state if that is safe: counters go on from their
        saved values, and each device's gap is booked once it is read (now, or when a
        device unreadable at the restart comes back)."""
        data, self._resume = self._resume, None
        assert data is not None and self.parts.state is not None
        path = self.parts.state.path
        try:
            saved = resume.saved_devices(data)
            for key, device in saved.items():
                if key in deltas:  # the ones read now must be safe to go on from
                    resume.gap_energy(
                        device, self._devices[key], self._read_at[key] - device.read_at
                    )
            restored = resume.restore(data)
        except resume.Unsafe as err:
            self._fresh(f"not resuming from state file {path}: {err}")
            return
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            self._fresh(f"state file {path} is malformed ({err})", "corrupt")
            return
        self._energy = {
            key: _Accumulator(born, energy, grams, resumed=True)
            for key, (energy, grams, born) in restored.energy.items()
        }
        for series, ug in restored.embodied.items():
            acc = self._energy.get(series)
            if acc is None:
                acc = self._energy[series] = _Accumulator(restored.time, resumed=True)
            acc.embodied_ug = ug
        self._embodied_ug = {k: ug for k, (ug, _) in restored.embodied_devices.items()}
        self._embodied_carry = {k: carry for k, (_, carry) in restored.embodied_devices.items()}
        self._last_seen = dict(restored.last_seen)
        self._prev_ticks = dict(restored.ticks)
        self._prev_cpu_total = restored.cpu_total
        self._prev_cgroup = dict(restored.cgroups)
        self._cgroups_resumed = True
        self._previous_time = restored.time
        self._gap_uj = dict(restored.gap)
        self._restarts = dict(restored.restarts)
        self._state_errors = dict(restored.state_errors)
        self._held_before = restored.holders
        for key, device in saved.items():
            self._device_total[key] = device.total_uj
            self._pending[key] = device
            if key not in deltas:
                # Unreadable now (a lost GPU): it keeps its counter until it comes back.
                self._devices[key] = resume.placeholder(device)
                self._read_at[key] = device.read_at
        self._count(self._restarts, "resumed")
        log.info(
            "resumed from state file %s, saved %.1f s ago",
            path,
            self._read_monotonic - float(data["monotonic"]),
        )

    def _book_gaps(self, deltas: dict[tuple[str, str], int]) -> set[str]:
        """Book what each device resumed from used while the exporter was down; return
        the GPUs whose reading this time is that gap."""
        gpus = set()
        for key in [k for k in self._pending if k in deltas]:
            saved = self._pending.pop(key)
            where = " ".join(key).strip()
            try:
                gap = resume.gap_energy(
                    saved, self._devices[key], self._read_at[key] - saved.read_at
                )
            except resume.Unsafe as err:
                # Only a device unreadable at the restart gets here: the others were
                # checked then. Its counter goes on; the gap is unknown and said so.
                log.warning(
                    "%s: the energy it used while the exporter was down is unknown (%s)", where, err
                )
                self._count(self._state_errors, "gap_unknown")
                continue
            self._device_total[key] += gap.energy_uj
            deltas[key] = gap.energy_uj
            gap_key = (key[0], gap.estimated)
            self._gap_uj[gap_key] = self._gap_uj.get(gap_key, 0) + gap.energy_uj
            log.info(
                "%s used %.1f J while the exporter was down%s",
                where,
                gap.energy_uj / 1e6,
                " (estimated)" if gap.estimated else "",
            )
            if key[0] == "gpu":
                gpus.add(key[1])
        return gpus

    def _save_state(self, sync: bool = False) -> None:
        state = self.parts.state
        if state is None or not self._writable:
            return
        sync = sync or self._read_monotonic - self._last_sync >= STATE_SYNC_S
        document = resume.document(
            resume.Restored(
                energy={k: (a.energy_uj, a.grams, a.born) for k, a in self._energy.items()},
                last_seen=self._last_seen,
                holders={},
                ticks=self._prev_ticks,
                cpu_total=self._prev_cpu_total,
                time=self._previous_time or 0.0,
                gap=self._gap_uj,
                restarts=self._restarts,
                state_errors=self._state_errors,
                embodied={k: a.embodied_ug for k, a in self._energy.items() if a.embodied_ug},
                embodied_devices={
                    k: (ug, self._embodied_carry.get(k, 0.0)) for k, ug in self._embodied_ug.items()
                },
                cgroups=self._prev_cgroup,
            ),
            devices=[
                self._pending.get(key)
                or resume.SavedDevice(
                    key[0],
                    key[1],
                    reading.uuid,
                    self._device_total[key],
                    reading.raw_uj,
                    reading.raw_wrap_uj,
                    reading.power_w,
                    self._read_at.get(key, self._read_monotonic),
                    reading.method,
                    reading.model,
                )
                for key, reading in self._devices.items()
            ],
            held=self._holders,
            boot_id=self.parts.boot_id,
            monotonic=self._read_monotonic,
            sources={
                source.name: source.save_state()
                for source in self.parts.sources
                if hasattr(source, "save_state")
            },
        )
        try:
            state.save(document, sync=sync)
        except OSError as err:
            self._count(self._state_errors, "write")
            self._log_once("state", f"cannot write state file {state.path}: {err}")
            return
        self.parts.log_once.pop("state", None)
        if sync:
            self._last_sync = self._read_monotonic

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

    def _log_once(self, key: str, message: str) -> None:
        if self.parts.log_once.get(key) != message:
            log.warning("%s", message)
            self.parts.log_once[key] = message

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

    def _pid_resolver(self, table: ProcTable | None) -> Callable[[int], Workload | None]:
        resolver = self.parts.resolver
        procs = table.procs if table is not None else {}
        in_job = table.in_job if table is not None else {}
        self._cap.begin(self._last_seen, self._previous_time)

        def resolve_pid(pid: int) -> Workload | None:
            info = procs.get(pid)
            if info is None:
                key = in_job.get(pid)
                return None if key is None or table is None else self._job_workload(key, table)
            if resolver is None:
                return None
            try:
                workload = resolver.resolve(pid, info.start_ticks, table)
            except Exception as err:  # identity is best effort; energy stays conserved
                self._log_once("identity", f"identity resolution failed: {err}")
                return None
            return self._admit(workload) if workload is not None else None

        return resolve_pid

    def _job_workload(self, key: str, table: ProcTable) -> Workload | None:
        resolve_job = getattr(self.parts.resolver, "resolve_job", None)
        if resolve_job is None:
            return None
        try:
            workload: Workload | None = resolve_job(table.jobs[key].job)
        except Exception as err:  # identity is best effort; energy stays conserved
            self._log_once("identity", f"identity resolution failed: {err}")
            return None
        return self._admit(workload) if workload is not None else None

    def _admit(self, workload: Workload) -> Workload:
        """The workload whose series pay for `workload` (see cardinality.py)."""
        admitted = self._cap.admit(workload)
        if admitted is workload:
            return admitted
        if admitted is OVERFLOW:
            if "workload-cap" not in self.parts.log_once:
                self._log_once(
                    "workload-cap",
                    f"{self._cap.max_workloads} workloads have series on this node "
                    '(--workload.max-series): new ones are counted as workload="other" '
                    "(wattprint_workload_overflow_total)",
                )
        elif "workload-label" not in self.parts.log_once:
            longest = max((workload.workload, workload.namespace, workload.pod), key=len)
            self._log_once(
                "workload-label",
                f"a workload label value is {len(longest)} characters long "
                f"({longest[:40]!r}...): exported cut to {self._cap.label_limit}, "
                "ending in a hash of the whole value",
            )
        return admitted

    def _usage(
        self,
        table: ProcTable | None,
        resolve_pid: Callable[[int], Workload | None],
        now: float,
    ) -> tuple[dict[Workload, int], dict[Workload, int]]:
        """CPU ticks used in the interval and resident bytes now, per workload."""
        cpu: dict[Workload, int] = {}
        rss: dict[Workload, int] = {}
        if table is None:
            return cpu, rss
        # A process of a job its cgroup counts, but outside it (it moved in after it was
        # first seen, or carries the job's id in its environment), must not count twice.
        by_cgroup = self._cgroup_usage(table, now, cpu, rss)
        ticks: dict[tuple[int, int], int] = {}
        for pid, info in table.procs.items():
            key = (pid, info.start_ticks)
            ticks[key] = info.cpu_ticks
            workload = resolve_pid(pid)
            if workload is None or workload in by_cgroup:
                continue
            self._last_seen[workload] = now
            # A process absent from the previous table started since then: all of its
            # CPU time belongs to this interval (short-lived workers must count too).
            baseline = self._prev_ticks.get(key, 0 if self._prev_ticks else info.cpu_ticks)
            used = info.cpu_ticks - baseline
            if used > 0:
                cpu[workload] = cpu.get(workload, 0) + used
            rss[workload] = rss.get(workload, 0) + info.rss_bytes
        self._prev_ticks = ticks
        forget = getattr(self.parts.resolver, "forget_missing", None)
        if forget is not None:
            forget(ticks.keys())  # identities of exited processes are not needed again
        return cpu, rss

    def _cgroup_usage(
        self,
        table: ProcTable,
        now: float,
        cpu: dict[Workload, int],
        rss: dict[Workload, int],
    ) -> set[Workload]:
        """Add the job cgroups' CPU ticks and memory; return the workloads they count."""
        first = self._prev_cpu_total is None
        live = set(table.in_job.values())
        usec: dict[str, int] = {}
        counted: set[Workload] = set()
        for key, usage in table.jobs.items():
            usec[key] = usage.cpu_usec
            workload = self._job_workload(key, table)
            if workload is None:
                continue  # a pod the pod list does not know yet: unattributed
            counted.add(workload)
            if key in live:  # an ended job's cgroup lingers a while: it must expire
                self._last_seen[workload] = now
            baseline = self._prev_cgroup.get(key)
            if baseline is None:
                # A job first seen since the previous sample, or since the state was
                # saved, started meanwhile: all of its CPU time is new.
                started = (usage.new and not first) or self._cgroups_resumed
                baseline = 0 if started else usage.cpu_usec
            # In the node's ticks, as a difference of whole ticks so that no fraction
            # is lost or counted twice from one interval to the next.
            used = _ticks(usage.cpu_usec) - _ticks(baseline)
            if used > 0:
                cpu[workload] = cpu.get(workload, 0) + used
            rss[workload] = rss.get(workload, 0) + usage.memory_bytes
        self._prev_cgroup = usec
        self._cgroups_resumed = False
        return counted

    def _node_ticks(self, table: ProcTable | None) -> int:
        if table is None or self._prev_cpu_total is None:
            return 0
        return max(table.cpu_ticks_total - self._prev_cpu_total, 0)

    def _grams_per_uj(self) -> float:
        carbon = self.parts.carbon
        if carbon is None:
            return 0.0
        intensity = carbon.accounting()
        return float(intensity.grams_per_kwh) * self.parts.pue / UJ_PER_KWH  # type: ignore[attr-defined]

    def _add(
        self, component: str, gpu: str, parts: attribution.Parts, factor: float, now: float
    ) -> None:
        for workload, energy in parts.items():
            key = (component, gpu, workload)
            acc = self._energy.get(key)
            if acc is None:
                # The energy just added was drawn after the previous sample, so the
                # series' true zero is at that sample's time.
                born = now if self._previous_time is None else self._previous_time
                acc = self._energy[key] = _Accumulator(born)
            acc.energy_uj += energy
            acc.grams += energy * factor
            if workload is not None:
                # A workload paid only through replay segments (it held a GPU between two
                # reads) is in no process list: without this its series would never expire.
                self._last_seen[workload] = now

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

    def _accrue_device(self, key: tuple[str, str], figure: embodied.Figure, elapsed: float) -> int:
        lifetime = self.parts.embodied.lifetime_s  # type: ignore[union-attr]
        ug, carry = embodied.accrue(
            figure.kgco2e, lifetime, elapsed, self._embodied_carry.get(key, 0.0)
        )
        self._embodied_carry[key] = carry
        self._embodied_ug[key] = self._embodied_ug.get(key, 0) + ug
        return ug

    def _add_embodied(self, component: str, gpu: str, parts: attribution.Parts, now: float) -> None:
        for workload, ug in parts.items():
            key = (component, gpu, workload)
            acc = self._energy.get(key)
            if acc is None:
                born = now if self._previous_time is None else self._previous_time
                acc = self._energy[key] = _Accumulator(born)
            acc.embodied_ug += ug
            if workload is not None:
                self._last_seen[workload] = now

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
        energy = tuple(
            EnergySeries(
                component,
                gpu,
                workload,
                acc.energy_uj,
                acc.grams,
                acc.born,
                acc.resumed,
                acc.embodied_ug,
            )
            for (component, gpu, workload), acc in sorted(
                self._energy.items(), key=lambda item: repr(item[0])
            )
        )
        intensities: tuple[IntensityValue, ...] = ()
        fallback: tuple[tuple[str, bool], ...] = ()
        carbon_errors: tuple[tuple[str, int], ...] = ()
        signals: forecast.ForecastSignals | None = None
        if self.parts.carbon is not None:
            status = self.parts.carbon.status()
            intensities = tuple(
                IntensityValue(s.zone, s.provider, s.signal, s.grams_per_kwh, s.timestamp, s.year)
                for s in status.signals  # type: ignore[attr-defined]
            )
            zone = status.accounting.zone  # type: ignore[attr-defined]
            fallback = ((zone, bool(status.fallback_active)),)  # type: ignore[attr-defined]
            carbon_errors = tuple(sorted(_carbon_errors(status).items()))
            upcoming = getattr(status, "forecast", None)
            signals = forecast.signals(upcoming, now) if upcoming is not None else None
        return Snapshot(
            time=now,
            devices=devices,
            energy=energy,
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
        )

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


def _ticks(usec: int) -> int:
    return usec * TICKS_PER_S // 1_000_000


def _carbon_errors(status: object) -> dict[str, int]:
    per_provider = getattr(status, "errors_by_provider", None)
    if isinstance(per_provider, Mapping):
        return {str(k): int(v) for k, v in per_provider.items()}
    provider = getattr(status, "provider", None) or "static"
    return {str(provider): int(getattr(status, "errors_total", 0))}


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
