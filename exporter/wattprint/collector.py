"""The only module that speaks prometheus_client: metric families from a Snapshot.

collect() never touches hardware; it serializes whatever the sampler published last.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import __version__, registry
from .clock import ClockReading
from .model import UJ_PER_J, EnergySeries, Workload
from .sampler import Snapshot
from .scrape import SCRAPER

WORKLOAD_LABELS = ["component", "gpu", "scheduler", "namespace", "workload", "pod"]
# Prometheus 2.x drops samples older than about an hour before its newest ("out of
# bounds") and logs a warning each time. A series first scraped that long after its
# birth (a Prometheus added later) gets no stamped 0; its value starts it instead.
MAX_ZERO_AGE_S = 50 * 60
# Scrapers remembered, the least recent forgotten first: an HA pair, and some room.
MAX_SCRAPERS = 16

# Every reason the sampler counts, served at 0 from the start (increase() needs the
# series to exist before its first rise).
STATE_ERROR_REASONS = ("corrupt", "foreign", "gap_unknown", "unreadable", "write")

SeriesKey = tuple[str, str, Workload | None]


@dataclass
class _Served:
    keys: set[SeriesKey] = field(default_factory=set)
    time: float = 0.0


class SnapshotCollector(Collector):
    """Serializes the latest Snapshot.

    Each workload and unattributed series is served at 0 the first time a scraper sees
    it and with its value from then on. PromQL's increase() and rate() ignore the value
    a counter is born with, so a job's first seconds of energy would otherwise be lost
    to every rule and dashboard (6.6 % of the replayed H200 job at a 1 s scrape). The
    snapshot itself, and so the exporter's accounting, is unaffected. Only scrapers
    take that 0: a person's curl must not take it from Prometheus.

    With timestamps, each energy and power sample carries the time its devices were
    read, as cAdvisor does, whenever the clock is trusted (clock.py). Without, Prometheus
    stamps it with the scrape time, up to one sample interval after the value was true,
    so each end of a window is up to P x interval off (up to 3.0 % on 1-minute windows
    of the replayed H200 trace at 1 s). A new series' 0 is then stamped with the time it
    really was 0. Info series carry no timestamp, so staleness still ends them.

    Stamped, every scraper (each replica of an HA pair) gets each new series' 0; a
    second one would otherwise see the series only with its value and lose its first
    interval. A 0 sent again to a scraper that already has the series (one forgotten
    and back) is an old sample Prometheus drops. Unstamped, that 0 would read as a
    counter reset and count the job twice, so a series' 0 goes to the first scraper
    that sees it and to no other.
    """

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        timestamps: bool = False,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._latest = latest
        self._timestamps = timestamps
        self._wall = wall
        self._scrapers: OrderedDict[str, _Served] = OrderedDict()
        # Series some scraper has been served, with its 0 or its value: an unstamped 0
        # is for none of them, whichever scraper asks and whatever was forgotten.
        self._shown: set[SeriesKey] = set()
        self._lock = threading.Lock()

    def _newborn(self, snapshot: Snapshot, stamped: bool) -> set[SeriesKey]:
        scraper = SCRAPER.get()
        if scraper is None:
            return set()
        keys = {(s.component, s.gpu, s.workload) for s in snapshot.energy}
        if not self._timestamps:
            scraper = ""  # one 0 per series in all: a second would read as a reset
        with self._lock:
            served = self._scrapers.pop(scraper, None) or _Served()
            self._scrapers[scraper] = served  # now the most recent
            while len(self._scrapers) > MAX_SCRAPERS:
                self._scrapers.popitem(last=False)
            shown, self._shown = self._shown, (self._shown & keys) | keys
            if snapshot.time < served.time:
                # A scrape that took an older snapshot than one already served: its
                # series were all served (or have expired since); serve none at 0.
                return set()
            served.time = snapshot.time
            born = keys - served.keys
            if not stamped:
                born -= shown
            # Expired series leave the sets, so one that comes back starts at 0 again.
            served.keys = keys
        return born

    def describe(self) -> Iterator[Metric]:
        # Registering must not read anything; the families' shape is static.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "wattprint_build_info", "Wattprint build information.", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info
        snapshot = self._latest()
        if snapshot is None:
            return
        stamp: float | None = None
        if self._timestamps:
            stamp = snapshot.time if snapshot.clock is None else snapshot.clock.stamp
        yield from _devices(snapshot, stamp)
        born = self._newborn(snapshot, stamp is not None)
        yield from _workloads(snapshot, born, stamp)
        yield from _embodied(snapshot, born, stamp)
        yield from _carbon(snapshot)
        yield from _forecast(snapshot)
        yield from _self(snapshot)
        yield from _restarts(snapshot)
        yield from _clock(snapshot.clock, self._wall(), stamp is not None)


def _devices(snapshot: Snapshot, stamp: float | None) -> Iterator[Metric]:
    gpu_power = GaugeMetricFamily(
        "wattprint_gpu_power_watts",
        "GPU power draw as reported by the device (NVML: 1 s average on Ampere and newer).",
        labels=["gpu", "uuid", "model"],
    )
    gpu_energy = CounterMetricFamily(
        "wattprint_gpu_energy_joules_total",
        "GPU energy since the exporter started, from the device's energy counter.",
        labels=["gpu", "uuid", "model"],
    )
    families = {
        "cpu": (
            GaugeMetricFamily(
                "wattprint_cpu_power_watts",
                "CPU package power over the last sample interval.",
                labels=["package"],
            ),
            CounterMetricFamily(
                "wattprint_cpu_energy_joules_total",
                "CPU package energy since the exporter started.",
                labels=["package"],
            ),
        ),
        "memory": (
            GaugeMetricFamily(
                "wattprint_memory_power_watts",
                "Memory power over the last sample interval.",
                labels=["package"],
            ),
            CounterMetricFamily(
                "wattprint_memory_energy_joules_total",
                "Memory energy since the exporter started.",
                labels=["package"],
            ),
        ),
    }
    measurement = GaugeMetricFamily(
        "wattprint_measurement_info",
        "How each device's energy is obtained: a hardware counter, integrated power, "
        "or a model (estimated).",
        labels=["component", "device", "method", "estimated"],
    )
    for device in snapshot.devices:
        joules = device.energy_uj / UJ_PER_J
        estimated = "true" if registry.is_estimated(device.method) else "false"
        measurement.add_metric([device.component, device.device, device.method, estimated], 1)
        if device.component == "gpu":
            labels = [device.device, device.uuid, device.model]
            if device.power_w is not None:
                gpu_power.add_metric(labels, device.power_w, timestamp=stamp)
            gpu_energy.add_metric(labels, joules, timestamp=stamp)
        else:
            power, energy = families[device.component]
            if device.power_w is not None:
                power.add_metric([device.device], device.power_w, timestamp=stamp)
            energy.add_metric([device.device], joules, timestamp=stamp)
    yield gpu_power
    yield gpu_energy
    for power, energy in families.values():
        yield power
        yield energy
    yield measurement


def _workloads(snapshot: Snapshot, born: set[SeriesKey], stamp: float | None) -> Iterator[Metric]:
    energy = CounterMetricFamily(
        "wattprint_workload_energy_joules_total",
        "Energy attributed to a workload since the exporter started (gpu: the GPU index "
        "for component=gpu).",
        labels=WORKLOAD_LABELS,
    )
    emissions = CounterMetricFamily(
        "wattprint_workload_emissions_grams_total",
        "Emissions attributed to a workload: energy x grid intensity in force when it "
        "was used x PUE.",
        labels=WORKLOAD_LABELS,
    )
    idle_energy = CounterMetricFamily(
        "wattprint_unattributed_energy_joules_total",
        "Device energy not attributed to any workload (idle, system, unknown processes).",
        labels=["component", "gpu"],
    )
    idle_emissions = CounterMetricFamily(
        "wattprint_unattributed_emissions_grams_total",
        "Emissions of the unattributed energy.",
        labels=["component", "gpu"],
    )
    for series in snapshot.energy:
        zero, at = _first_zero(series, born, snapshot.time, stamp)
        joules = 0.0 if zero else series.energy_uj / UJ_PER_J
        _add_series(energy, idle_energy, series, joules, at)
        _add_series(emissions, idle_emissions, series, 0.0 if zero else series.grams, at)
    holders = GaugeMetricFamily(
        "wattprint_workload_gpu_info",
        "1 for each GPU a workload holds now.",
        labels=["scheduler", "namespace", "workload", "pod", "gpu", "uuid"],
    )
    for w, gpu, uuid in snapshot.gpu_holders:
        holders.add_metric([w.scheduler, w.namespace, w.workload, w.pod, gpu, uuid], 1)
    yield from (energy, emissions, idle_energy, idle_emissions, holders)


def _first_zero(
    series: EnergySeries, born: set[SeriesKey], now: float, stamp: float | None
) -> tuple[bool, float | None]:
    """Whether the series is served its first 0 now, and the time its sample is stamped
    with: the 0 as long before this sample as the series' birth really was (monotonic
    time), right across any re-base of the stamps after a clock step."""
    zero = (series.component, series.gpu, series.workload) in born and not series.resumed
    age = now - series.born
    if stamp is not None and age > MAX_ZERO_AGE_S:
        zero = False
    return zero, (stamp - age if stamp is not None and zero else stamp)


def _add_series(
    named: CounterMetricFamily,
    idle: CounterMetricFamily,
    series: EnergySeries,
    value: float,
    at: float | None,
) -> None:
    """A workload's series, or (no workload) the unattributed one of its component."""
    w = series.workload
    if w is None:
        idle.add_metric([series.component, series.gpu], value, timestamp=at)
    else:
        labels = [series.component, series.gpu, w.scheduler, w.namespace, w.workload, w.pod]
        named.add_metric(labels, value, timestamp=at)


def _embodied(snapshot: Snapshot, born: set[SeriesKey], stamp: float | None) -> Iterator[Metric]:
    """Embodied (Scope 3) emissions beside the operational ones, born and stamped like
    them: they accrue on the same series keys (embodied.py, sampler._accrue_embodied)."""
    if not snapshot.embodied:
        return
    workload = CounterMetricFamily(
        "wattprint_workload_embodied_grams_total",
        "Embodied (Scope 3, cradle to gate) emissions of the hardware a workload held, "
        "amortized over its service life (component=cpu: the rest of the server, by CPU "
        "share).",
        labels=WORKLOAD_LABELS,
    )
    idle = CounterMetricFamily(
        "wattprint_unattributed_embodied_grams_total",
        "Embodied emissions of hardware no workload held (a free GPU, idle CPU share).",
        labels=["component", "gpu"],
    )
    for series in snapshot.energy:
        zero, at = _first_zero(series, born, snapshot.time, stamp)
        if series.embodied_ug or zero:
            _add_series(workload, idle, series, 0.0 if zero else series.embodied_ug / 1e6, at)
    device = CounterMetricFamily(
        "wattprint_device_embodied_grams_total",
        "Embodied emissions accrued by each device with a known figure (the sum of its "
        "workload and unattributed shares).",
        labels=["component", "device", "model"],
    )
    figure = GaugeMetricFamily(
        "wattprint_embodied_figure_kgco2e",
        "The embodied emissions figure each device accrues by, and its source.",
        labels=["component", "device", "model", "source"],
    )
    unknown = GaugeMetricFamily(
        "wattprint_embodied_unknown",
        "1 for each device with no embodied figure: it accrues nothing (give one by flag).",
        labels=["component", "device", "model"],
    )
    for d in snapshot.embodied:
        if d.figure is None:
            unknown.add_metric([d.component, d.device, d.model], 1)
            continue
        figure.add_metric([d.component, d.device, d.model, d.figure.source], d.figure.kgco2e)
        device.add_metric([d.component, d.device, d.model], d.embodied_ug / 1e6, timestamp=stamp)
    yield from (workload, idle, device, figure, unknown)


def _carbon(snapshot: Snapshot) -> Iterator[Metric]:
    pue = GaugeMetricFamily(
        "wattprint_pue_ratio", "Power usage effectiveness applied to emissions."
    )
    pue.add_metric([], snapshot.pue)
    yield pue
    if not snapshot.intensities:
        return
    labels = ["zone", "provider", "signal"]
    value = GaugeMetricFamily(
        "wattprint_grid_carbon_intensity_grams_per_kwh",
        "Grid carbon intensity, grams CO2e per kWh.",
        labels=labels,
    )
    stamp = GaugeMetricFamily(
        "wattprint_grid_carbon_intensity_timestamp_seconds",
        "Unix time the carbon intensity value refers to.",
        labels=labels,
    )
    dataset = GaugeMetricFamily(
        "wattprint_grid_carbon_intensity_dataset_info",
        "1 for each embedded yearly intensity in use: which year of the dataset it is.",
        labels=["zone", "provider", "year"],
    )
    for i in snapshot.intensities:
        value.add_metric([i.zone, i.provider, i.signal], i.grams_per_kwh)
        stamp.add_metric([i.zone, i.provider, i.signal], i.timestamp)
        if i.year is not None:
            dataset.add_metric([i.zone, i.provider, str(i.year)], 1)
    fallback = GaugeMetricFamily(
        "wattprint_carbon_fallback_active",
        "1 while emissions use the embedded default because the live provider failed.",
        labels=["zone"],
    )
    for zone, active in snapshot.carbon_fallback:
        fallback.add_metric([zone], 1 if active else 0)
    errors = CounterMetricFamily(
        "wattprint_carbon_errors_total",
        "Failed carbon intensity fetches or invalid answers.",
        labels=["provider"],
    )
    for provider, count in snapshot.carbon_errors:
        errors.add_metric([provider], count)
    yield from (value, stamp, dataset, fallback, errors)


def _forecast(snapshot: Snapshot) -> Iterator[Metric]:
    f = snapshot.forecast
    if f is None:
        return
    where = [f.zone, f.provider]
    fetched = GaugeMetricFamily(
        "wattprint_grid_carbon_forecast_fetched_timestamp_seconds",
        "Unix time the intensity forecast in use was fetched.",
        labels=["zone", "provider"],
    )
    fetched.add_metric(where, f.fetched_at)
    value = GaugeMetricFamily(
        "wattprint_grid_carbon_intensity_forecast_grams_per_kwh",
        "Forecast grid carbon intensity for the period that starts within horizon of now.",
        labels=["zone", "provider", "horizon"],
    )
    for hours, grams in f.horizons:
        value.add_metric([*where, f"{hours}h"], grams)
    labels = ["zone", "provider", "within", "duration"]
    offset = GaugeMetricFamily(
        "wattprint_grid_carbon_greenest_start_offset_seconds",
        "Seconds from now to the start, within the next `within`, of the run of "
        "`duration` with the lowest forecast mean intensity (0: now).",
        labels=labels,
    )
    mean = GaugeMetricFamily(
        "wattprint_grid_carbon_greenest_grams_per_kwh",
        "Forecast mean intensity over the run of `duration` from the greenest start.",
        labels=labels,
    )
    for g in f.greenest:
        key = [*where, f"{g.within_h}h", f"{g.duration_h}h"]
        offset.add_metric(key, g.offset_s)
        mean.add_metric(key, g.grams_per_kwh)
    yield from (fetched, value, offset, mean)


def _self(snapshot: Snapshot) -> Iterator[Metric]:
    cap = snapshot.workload_cap
    workloads = GaugeMetricFamily(
        "wattprint_workloads", "Workloads with series of their own on this node now."
    )
    workloads.add_metric([], cap.workloads)
    limit = GaugeMetricFamily(
        "wattprint_workloads_max",
        "Most workloads with series of their own (--workload.max-series).",
    )
    limit.add_metric([], cap.max_workloads)
    overflow = CounterMetricFamily(
        "wattprint_workload_overflow",
        'Workloads counted as workload="other" because --workload.max-series was reached.',
    )
    overflow.add_metric([], cap.overflowed_total)
    yield from (workloads, limit, overflow)
    success = GaugeMetricFamily(
        "wattprint_collector_success",
        "1 if the source's last read succeeded completely.",
        labels=["collector"],
    )
    duration = GaugeMetricFamily(
        "wattprint_collector_duration_seconds",
        "Time the source's last read took.",
        labels=["collector"],
    )
    errors = CounterMetricFamily(
        "wattprint_collector_errors_total", "Errors reading the source.", labels=["collector"]
    )
    for status in snapshot.collectors:
        success.add_metric([status.name], 1 if status.success else 0)
        duration.add_metric([status.name], status.duration_s)
        errors.add_metric([status.name], status.errors_total)
    last = GaugeMetricFamily(
        "wattprint_sampler_last_success_timestamp_seconds",
        "Unix time the last sample completed.",
    )
    last.add_metric([], snapshot.time if snapshot.clock is None else snapshot.clock.wall)
    interval = GaugeMetricFamily(
        "wattprint_sampler_interval_seconds", "Configured sample interval."
    )
    interval.add_metric([], snapshot.sample_interval)
    yield from (success, duration, errors, last, interval)


def _restarts(snapshot: Snapshot) -> Iterator[Metric]:
    gap = CounterMetricFamily(
        "wattprint_restart_gap_energy_joules_total",
        "Energy the devices used while the exporter was down, booked when it resumed "
        "from its state file (estimated: no hardware counter spans the gap).",
        labels=["component", "estimated"],
    )
    # Every measured component from the start, at 0 until a gap: increase() needs the
    # series to exist before its first rise.
    booked = {(c, e): uj for c, e, uj in snapshot.restart_gap}
    for component in sorted({d.component for d in snapshot.devices} | {c for c, _ in booked}):
        for estimated in (False, True):
            energy_uj = booked.get((component, estimated), 0)
            gap.add_metric([component, str(estimated).lower()], energy_uj / UJ_PER_J)
    restarts = CounterMetricFamily(
        "wattprint_restarts_total",
        "Starts after an earlier run: resumed from the state file, or fresh (counters "
        "from 0) because it was missing, unusable or unsafe to resume from.",
        labels=["outcome"],
    )
    counted = dict(snapshot.restarts)
    for outcome in ("fresh", "resumed"):
        restarts.add_metric([outcome], counted.get(outcome, 0))
    errors = CounterMetricFamily(
        "wattprint_state_errors_total",
        "State file problems: unreadable, corrupt, foreign (never overwritten), write.",
        labels=["reason"],
    )
    counted_errors = dict(snapshot.state_errors)
    for reason in sorted(set(STATE_ERROR_REASONS) | set(counted_errors)):
        errors.add_metric([reason], counted_errors.get(reason, 0))
    yield from (gap, restarts, errors)


def _clock(reading: ClockReading | None, wall: float, stamped: bool) -> Iterator[Metric]:
    now = GaugeMetricFamily(
        "wattprint_clock_time_seconds",
        "The exporter's wall clock when scraped: minus the scrape's timestamp, how far it "
        "is from Prometheus's clock.",
    )
    now.add_metric([], wall)
    active = GaugeMetricFamily(
        "wattprint_sample_timestamps_active",
        "1 while energy and power samples carry the time the devices were read, 0 while "
        "they go without (--sample.timestamps=false, or a clock not trusted).",
    )
    active.add_metric([], 1 if stamped else 0)
    yield from (now, active)
    if reading is None:
        return
    offset = GaugeMetricFamily(
        "wattprint_clock_offset_seconds",
        "How far the wall clock has been stepped since the exporter started: the wall "
        "clock minus its reading at start plus the monotonic time since.",
    )
    offset.add_metric([], reading.offset_s)
    steps = CounterMetricFamily(
        "wattprint_clock_steps",
        "Steps of the wall clock against the monotonic clock seen since the exporter started.",
    )
    steps.add_metric([], reading.steps_total)
    yield from (offset, steps)
    if reading.kernel is None:
        return  # adjtimex unreadable: nothing known, and nothing claimed
    synchronized = GaugeMetricFamily(
        "wattprint_clock_synchronized",
        "1 while the kernel bounds the clock's error under 16 s (a time daemon disciplines "
        "it, as adjtimex reports), 0 otherwise.",
    )
    synchronized.add_metric([], 1 if reading.kernel.disciplined else 0)
    maxerror = GaugeMetricFamily(
        "wattprint_clock_maxerror_seconds",
        "How far off the clock may be, as the kernel says (adjtimex maximum error).",
    )
    maxerror.add_metric([], reading.kernel.maxerror_s)
    yield from (synchronized, maxerror)
