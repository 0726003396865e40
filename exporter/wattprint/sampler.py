"""The background sampler: reads every source once per interval, attributes the energy,
accumulates counters and publishes an immutable Snapshot for the collector.

All hardware access and all arithmetic happen here, on one thread; a scrape only
serializes the latest Snapshot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from . import attribution
from .clock import ClockReading, StampClock
from .model import DeviceReading, GpuProcess, Source, SourceResult, Workload
from .procs import ProcTable

log = logging.getLogger(__name__)

UJ_PER_KWH = 3.6e12


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
    pue: float = 1.0
    sample_interval: float = 1.0
    clock: ClockReading | None = None  # the sample's stamp and clock status (clock.py)


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
    clock: Callable[[], float] = time.time
    stamp_clock: StampClock = field(default_factory=StampClock)
    log_once: dict[str, str] = field(default_factory=dict)


class Sampler:
    def __init__(self, parts: SamplerParts) -> None:
        self.parts = parts
        self._devices: dict[tuple[str, str], DeviceReading] = {}
        self._device_raw: dict[tuple[str, str], int] = {}
        self._device_total: dict[tuple[str, str], int] = {}
        self._previous_time: float | None = None
        self._energy: dict[tuple[str, str, Workload | None], _Accumulator] = {}
        self._last_seen: dict[Workload, float] = {}
        self._collectors: dict[str, _CollectorState] = {}
        self._prev_ticks: dict[tuple[int, int], int] = {}
        self._prev_cpu_total: int | None = None
        self._latest: Snapshot | None = None
        self._last_success_monotonic: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

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
            snapshot = self._sample()
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
            for reading in result.devices:
                deltas[reading.key] = self._account_device(reading)
        # Taken after the reads, before /proc: every energy total is true as of this
        # moment, the samples' timestamp for devices and workloads alike when the clock
        # is trusted. `now` is monotonic: no clock step moves it (clock.py).
        now = parts.stamp_clock.read(parts.clock).time

        table = self._read_procs(statuses)
        resolve_pid = self._pid_resolver(table)

        def resolve(process: GpuProcess) -> Workload | None:
            return process.identity if process.identity is not None else resolve_pid(process.pid)

        factor = self._grams_per_uj()
        holders: set[tuple[Workload, str, str]] = set()
        for key, delta in deltas.items():
            reading = self._devices[key]
            if reading.component != "gpu":
                continue
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
        if table is not None:
            self._prev_cpu_total = table.cpu_ticks_total

        self._expire(now)
        if parts.extra_status is not None:
            statuses.extend(parts.extra_status())
        snapshot = self._snapshot(now, statuses, holders, deltas.keys())
        self._previous_time = now
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

        def resolve_pid(pid: int) -> Workload | None:
            info = procs.get(pid)
            if resolver is None or info is None:
                return None
            try:
                return resolver.resolve(pid, info.start_ticks, table)
            except Exception as err:  # identity is best effort; energy stays conserved
                self._log_once("identity", f"identity resolution failed: {err}")
                return None

        return resolve_pid

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
        ticks: dict[tuple[int, int], int] = {}
        for pid, info in table.procs.items():
            key = (pid, info.start_ticks)
            ticks[key] = info.cpu_ticks
            workload = resolve_pid(pid)
            if workload is None:
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
            EnergySeries(component, gpu, workload, acc.energy_uj, acc.grams, acc.born)
            for (component, gpu, workload), acc in sorted(
                self._energy.items(), key=lambda item: repr(item[0])
            )
        )
        intensities: tuple[IntensityValue, ...] = ()
        fallback: tuple[tuple[str, bool], ...] = ()
        carbon_errors: tuple[tuple[str, int], ...] = ()
        if self.parts.carbon is not None:
            status = self.parts.carbon.status()
            intensities = tuple(
                IntensityValue(s.zone, s.provider, s.signal, s.grams_per_kwh, s.timestamp, s.year)
                for s in status.signals  # type: ignore[attr-defined]
            )
            zone = status.accounting.zone  # type: ignore[attr-defined]
            fallback = ((zone, bool(status.fallback_active)),)  # type: ignore[attr-defined]
            carbon_errors = tuple(sorted(_carbon_errors(status).items()))
        return Snapshot(
            time=now,
            devices=devices,
            energy=energy,
            gpu_holders=tuple(sorted(holders, key=repr)),
            collectors=tuple(statuses),
            intensities=intensities,
            carbon_fallback=fallback,
            carbon_errors=carbon_errors,
            pue=self.parts.pue,
            sample_interval=self.parts.interval,
            clock=self.parts.stamp_clock.last,
        )


def _carbon_errors(status: object) -> dict[str, int]:
    per_provider = getattr(status, "errors_by_provider", None)
    if isinstance(per_provider, Mapping):
        return {str(k): int(v) for k, v in per_provider.items()}
    provider = getattr(status, "provider", None) or "static"
    return {str(provider): int(getattr(status, "errors_total", 0))}


def _with_energy(reading: DeviceReading, total: int, fresh: bool) -> DeviceReading:
    from dataclasses import replace

    power = reading.power_w if fresh else None
    return replace(reading, energy_uj=total, segments=(), power_w=power)
