"""The background sampler: reads every source once per interval, attributes the energy,
accumulates counters and publishes an immutable Snapshot for the collector.

All hardware access and all arithmetic happen here, on one thread; a scrape only
serializes the latest Snapshot. Each sample is one pipeline: read the devices, go on
from a restart, read /proc, attribute each device's energy, accrue embodied emissions,
expire, snapshot. The parts that keep state between samples are composed, each owning
its fields and its share of the state file: DeviceLedger (devices.py), SeriesBook
(series.py), UsageTracker (usage.py), EmbodiedAccrual (embodied.py), Restarts
(restarts.py).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from wattprint.attribution import split
from wattprint.attribution.cardinality import WorkloadCap
from wattprint.attribution.embodied import EmbodiedSettings
from wattprint.carbon import forecast
from wattprint.core.model import (
    DEFAULT_MAX_WORKLOADS,
    CarbonStatus,
    CollectorStatus,
    ForecastSignals,
    GpuProcess,
    Intensity,
    Snapshot,
    Source,
    SourceResult,
    Workload,
)
from wattprint.durability.statefile import StateFile
from wattprint.host.procfs import ProcTable
from wattprint.sampler.clock import StampClock
from wattprint.sampler.devices import DeviceKey, DeviceLedger
from wattprint.sampler.embodied import EmbodiedAccrual
from wattprint.sampler.gpus import ExpectedGpus, attribute_gap, attribute_gpu
from wattprint.sampler.once import LogOnce
from wattprint.sampler.platform import PlatformAccrual
from wattprint.sampler.restarts import Restarts
from wattprint.sampler.series import SeriesBook
from wattprint.sampler.usage import Resolver, UsageTracker

log = logging.getLogger(__name__)

UJ_PER_KWH = 3.6e12
# How long a sample asked for waits for others asked at the same moment to join it.
FRESH_GATHER_S = 0.005
# Samples taken on request (/metrics?fresh): this many at once (a node's jobs flushing
# together), then at most FRESH_PER_INTERVAL per sampling interval (but one a second
# at least: on a node sampled every 20 s, a job's fifth flush() in a row must not wait
# out the tracker's deadline), and never more than half a core (each begins one sample's
# duration after the last ends), however often a client asks; the periodic samples go
# on besides.
FRESH_BURST = 3
FRESH_PER_INTERVAL = 4
FRESH_MAX_SPACING_S = 1.0


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
    embodied: EmbodiedSettings | None = None  # None: no embodied accrual
    # Checked before each save: None while this process holds the node lock, else why
    # not (durability/nodelock.py NodeLock.check); None: no lock to hold.
    owns_state: Callable[[], str | None] | None = None
    gpu_expected: int = 0  # --gpu.expect: GPUs this node should measure (0: no expectation)


class Sampler:
    """Samples every source on one thread and hands out the latest Snapshot."""

    def __init__(self, parts: SamplerParts) -> None:
        self.parts = parts
        self._once = LogOnce(parts.log_once)
        self.devices = DeviceLedger()
        self.book = SeriesBook()
        cap = WorkloadCap(parts.max_workloads, parts.retention)
        self.usage = UsageTracker(parts.resolver, cap, self.book, self._once)
        self.embodied = EmbodiedAccrual(parts.embodied, self.devices, self.book)
        self.platform = PlatformAccrual(self.devices, self.book, self._once)
        self.gpus = ExpectedGpus(parts.gpu_expected, self._once)
        self.restarts = Restarts(
            parts.state,
            parts.boot_id,
            parts.sources,
            (self.devices, self.book, self.usage, self.embodied),
            self._once,
        )
        self._collectors: dict[str, _CollectorState] = {}
        self._holders: tuple[tuple[Workload, str, str], ...] = ()  # at the last sample
        self._read_monotonic = 0.0  # when the last sample's devices had been read
        self._state_loaded = False
        self._latest: Snapshot | None = None  # what is served
        self._kept: Snapshot | None = None  # the last one a restart resumes from
        self.live: Snapshot | None = None  # the last one taken, saved or not
        self.lost = ""  # why another process now owns the state file: never save again
        self.held = ""  # why the counters served are held still ("" while they are not)
        self._last_success_monotonic: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._began = 0.0  # monotonic: when the latest sample began, and how long it took
        self._took = 0.0
        self._fresh_due = 0.0  # monotonic: the rate cap's clock (sample_fresh)
        self._held: set[DeviceKey] = set()  # the last sample's standing readings
        self._rebased: set[DeviceKey] = set()  # and those starting over after a gap

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

    def note(self) -> str:
        """What /healthz adds to its "ok": why the counters are held, GPUs missing."""
        return "; ".join(filter(None, (self.held, self.gpus.note())))

    def start(self) -> None:
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="wattprint-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            if self.book.previous_time is not None and self._owns_state():
                self.restarts.save(self._read_monotonic, self._holders, sync=True)

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
            return self._sample_locked()

    def sample_fresh(self, timeout: float = 5.0) -> bool:
        """Wait for a sample begun after this call (a tracker's flush() or stop()): one
        for all who ask meanwhile, served to them as `live`. FRESH_BURST are taken at
        once, then FRESH_PER_INTERVAL per interval at most (a periodic sample begun
        meanwhile serves too). Such a sample saves no state: the state file keeps the
        periodic cadence, and scrapers are served the last saved. False if none came."""
        asked = time.monotonic()
        deadline = asked + timeout
        time.sleep(FRESH_GATHER_S)  # the ranks released by one barrier: one sample
        while True:
            if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
            try:
                if self._stop.is_set():
                    return False  # stopping: its last save is made, no sample after it
                if self._began > asked:  # taken for another caller meanwhile
                    return True
                wait = self._fresh_wait(time.monotonic())
                if wait <= 0:
                    self._sample_locked(fresh=True)
                    return True
            except Exception:  # as in the loop: the sampler outlives a bad sample
                log.exception("sample failed")
                return False
            finally:
                self._lock.release()
            # The spacing is waited out without the lock: the periodic samples and the
            # other callers go on meanwhile, and one of theirs may serve this call.
            if time.monotonic() + wait > deadline:
                return False
            time.sleep(wait)

    def _fresh_wait(self, now: float) -> float:
        """How long until a sample on request may begin (<= 0: now), and if now, count
        it: a generic cell rate algorithm, FRESH_BURST deep, one sample per `spacing`."""
        spacing = min(self.parts.interval / FRESH_PER_INTERVAL, FRESH_MAX_SPACING_S)
        spacing = max(spacing, 2 * self._took)
        due = max(self._fresh_due, now)
        wait = due - (FRESH_BURST - 1) * spacing - now
        if wait <= 0:
            self._fresh_due = due + spacing
        return wait

    def _sample_locked(self, fresh: bool = False) -> Snapshot:
        began = time.monotonic()
        if not self._state_loaded:
            self._state_loaded = True
            self.restarts.load()
        snapshot = self._sample()
        self.live = snapshot
        # A sample on request is not saved where saving writes a file (the next periodic
        # one saves it all, within an interval): it is served as `live` to the job
        # meter that asked, and to no scraper.
        if not (fresh and self.restarts.writes):
            # Saved before it is served: whatever a scraper has seen, a restart
            # continues from at least that, so no counter ever goes back.
            if self._owns_state():
                kept = self.restarts.save(self._read_monotonic, self._holders)
            else:  # a sampler keeping no state (a job's) has nothing to hold back
                kept = self.restarts.state is None
            self._latest = self._servable(snapshot, kept)
        self._last_success_monotonic = time.monotonic()
        self._began, self._took = began, self._last_success_monotonic - began
        return snapshot

    def _owns_state(self) -> bool:
        """False once another process took the node lock: it resumed from this one's
        last save, and a save now would write under it."""
        check = self.parts.owns_state
        if not self.lost and check is not None:
            why = check()
            if why:
                self.lost = why
                log.error("%s; this one stops, its state left to it", why)
        return not self.lost

    def _servable(self, snapshot: Snapshot, kept: bool) -> Snapshot | None:
        """What may be served after `snapshot`'s save: itself once a restart would resume
        from it; else the last one kept, its counters held still (the energy measured
        meanwhile stays in the sampler, served at the next save that succeeds, or booked
        as the restart gap after a kill), with this sample's errors and status."""
        if kept:
            self._kept = snapshot
            self.held = ""
            return snapshot
        base = self._kept
        self.held = self.lost or "the state file cannot be written: counters held at the last save"
        if base is None:
            if self.restarts.resumed:
                # Nothing saved yet, and a restart would resume from the file this one
                # resumed from, below what this sample counts: no counters to serve.
                self.held = "the state file cannot be written: no counters served until it is"
                self._once.warn("state-held", self.held)
                return None
            self.held = ""
            base = snapshot  # a restart would start from 0 too: a reset, not a decrease
        return dataclasses.replace(
            base,
            gpu_holders=snapshot.gpu_holders,
            collectors=snapshot.collectors,
            intensities=snapshot.intensities,
            carbon_fallback=snapshot.carbon_fallback,
            carbon_errors=snapshot.carbon_errors,
            workload_cap=snapshot.workload_cap,
            gpus=snapshot.gpus,
            state_errors=tuple(sorted(self.restarts.state_errors.items())),
            forecast=snapshot.forecast,
        )

    # -- one sample -------------------------------------------------------------

    def _sample(self) -> Snapshot:
        parts = self.parts
        statuses: list[CollectorStatus] = []
        deltas = self._read_devices(statuses)
        self.platform.close(deltas, self._read_monotonic, self._rebased)
        gap_gpus = self.restarts.resume(deltas, self._read_monotonic)
        # Taken after the reads, before /proc: every energy total is true as of this
        # moment, the samples' timestamp for devices and workloads alike when the clock
        # is trusted. `now` is monotonic: no clock step moves it (clock.py).
        now = parts.stamp_clock.read(parts.clock).time
        self.restarts.rebase(now, self._read_monotonic)

        table = self._read_procs(statuses)
        resolve_pid = self.usage.pid_resolver(table)
        admit = self.usage.admit

        def resolve(process: GpuProcess) -> Workload | None:
            if process.identity is not None:
                return admit(process.identity)
            return resolve_pid(process.pid)

        grams_per_uj = self._grams_per_uj()
        held_before = {gpu: self.restarts.held_before.get(gpu, set()) for gpu in gap_gpus}
        holders = self._attribute_gpus(deltas, held_before, resolve, grams_per_uj, now)
        cpu_usage, rss = self.usage.usage(table, resolve_pid, now)
        node_ticks = self.usage.node_ticks(table)
        self._attribute_shares(deltas, cpu_usage, rss, node_ticks, table, grams_per_uj, now)
        self.platform.attribute(deltas, grams_per_uj, now)
        self.embodied.accrue(now, resolve, held_before, cpu_usage, node_ticks)
        self.usage.end_sample(table)

        self.book.expire(now, parts.retention)
        self.gpus.count(deltas.keys())
        statuses.extend(self.platform.status())
        if parts.extra_status is not None:
            statuses.extend(parts.extra_status())
        read = deltas.keys() | self.platform.standing(self._held)
        snapshot = self._snapshot(now, statuses, holders, read)
        self.book.previous_time = now
        self._holders = snapshot.gpu_holders
        return snapshot

    def _read_devices(self, statuses: list[CollectorStatus]) -> dict[DeviceKey, int]:
        """Read every source; each device's increase since the last sample."""
        deltas: dict[DeviceKey, int] = {}
        self._held, self._rebased = set(), set()
        for source in self.parts.sources:
            result, status = self._read_source(source)
            statuses.append(status)
            self._held.update(result.held)
            self._rebased.update(result.rebased)
            read_at = self.parts.monotonic()
            for reading in result.devices:
                deltas[reading.key] = self.devices.account(reading, read_at)
        self._read_monotonic = self.parts.monotonic()
        return deltas

    def _read_source(self, source: Source) -> tuple[SourceResult, CollectorStatus]:
        start = time.perf_counter()
        try:
            result = source.read()
        except Exception as err:  # a source bug must not stop the others
            result = SourceResult(errors=[f"{type(err).__name__}: {err}"])
            self._once.warn(source.name, f"source {source.name} failed: {err}")
        return result, self._status(source.name, result.errors, time.perf_counter() - start)

    def _status(self, name: str, errors: Sequence[str], duration: float) -> CollectorStatus:
        state = self._collectors.setdefault(name, _CollectorState())
        state.errors_total += len(errors)
        return CollectorStatus(name, not errors, duration, state.errors_total)

    def _read_procs(self, statuses: list[CollectorStatus]) -> ProcTable | None:
        if self.parts.read_procs is None:
            return None
        start = time.perf_counter()
        try:
            table = self.parts.read_procs()
            errors: list[str] = []
        except Exception as err:  # /proc unreadable: energy goes unattributed
            self._once.warn("procfs", f"cannot read processes: {err}")
            table, errors = None, [str(err)]
        statuses.append(self._status("procfs", errors, time.perf_counter() - start))
        return table

    def _attribute_gpus(
        self,
        deltas: dict[DeviceKey, int],
        held_before: dict[str, set[Workload]],
        resolve: split.Resolve,
        grams_per_uj: float,
        now: float,
    ) -> set[tuple[Workload, str, str]]:
        """Split each GPU's energy among its processes' workloads; return who held which."""
        holders: set[tuple[Workload, str, str]] = set()
        last_seen = self.book.last_seen
        for key, delta in deltas.items():
            reading = self.devices.readings[key]
            if reading.component != "gpu":
                continue
            if reading.device in held_before:
                gpu_parts = attribute_gap(reading, delta, resolve, held_before[reading.device])
            else:
                gpu_parts = attribute_gpu(reading, delta, resolve)
            self.book.add("gpu", reading.device, gpu_parts, grams_per_uj, now)
            for process in reading.processes:
                workload = resolve(process)
                if workload is not None:
                    holders.add((workload, reading.device, reading.uuid))
                    last_seen[workload] = now
        return holders

    def _attribute_shares(
        self,
        deltas: dict[DeviceKey, int],
        cpu_usage: dict[Workload, int],
        rss: dict[Workload, int],
        node_ticks: int,
        table: ProcTable | None,
        grams_per_uj: float,
        now: float,
    ) -> None:
        """Split the CPU's energy by CPU time and memory's by resident memory."""
        cpu_delta = sum(d for (c, _), d in deltas.items() if c == "cpu")
        mem_delta = sum(d for (c, _), d in deltas.items() if c == "memory")
        if cpu_delta:
            cpu_parts = split.attribute_by_share(cpu_delta, cpu_usage, node_ticks)
            self.book.add("cpu", "", cpu_parts, grams_per_uj, now)
        if mem_delta:
            capacity = table.mem_total_bytes if table is not None else 0
            mem_parts = split.attribute_by_share(mem_delta, rss, capacity)
            self.book.add("memory", "", mem_parts, grams_per_uj, now)

    def _grams_per_uj(self) -> float:
        carbon = self.parts.carbon
        if carbon is None:
            return 0.0
        intensity = carbon.accounting()
        return float(intensity.grams_per_kwh) * self.parts.pue / UJ_PER_KWH

    def _snapshot(
        self,
        now: float,
        statuses: list[CollectorStatus],
        holders: set[tuple[Workload, str, str]],
        read: Collection[DeviceKey],
    ) -> Snapshot:
        series, keys = self.book.snapshot()
        intensities: tuple[Intensity, ...] = ()
        fallback: tuple[tuple[str, bool], ...] = ()
        carbon_errors: tuple[tuple[str, int], ...] = ()
        signals: ForecastSignals | None = None
        if self.parts.carbon is not None:
            status = self.parts.carbon.status()
            intensities = tuple(status.signals)
            fallback = ((status.accounting.zone, status.fallback_active),)
            carbon_errors = ((status.provider, status.errors_total),)
            upcoming = status.forecast
            signals = forecast.signals(upcoming, now) if upcoming is not None else None
        restarts = self.restarts
        return Snapshot(
            time=now,
            devices=self.devices.snapshot(read),
            energy=series,
            gpu_holders=tuple(sorted(holders, key=repr)),
            collectors=tuple(statuses),
            intensities=intensities,
            carbon_fallback=fallback,
            carbon_errors=carbon_errors,
            workload_cap=self.usage.cap.status(self.book.last_seen),
            gpus=(self.gpus.expected, self.gpus.measured),
            pue=self.parts.pue,
            sample_interval=self.parts.interval,
            restart_gap=tuple((c, e, uj) for (c, e), uj in sorted(restarts.gap_uj.items())),
            restarts=tuple(sorted(restarts.restarts.items())),
            state_errors=tuple(sorted(restarts.state_errors.items())),
            embodied=self.embodied.snapshot(),
            forecast=signals,
            clock=self.parts.stamp_clock.last,
            series_keys=keys,
        )
