"""Families that describe the exporter's inputs and health rather than energy: carbon
intensity and its forecast, the workload cap, the sources, restarts and the clock."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from wattprint.core.units import UJ_PER_J
from wattprint.durability.statefile import STATE_ERROR_REASONS
from wattprint.export.exposition import Family, counter, gauge, single

if TYPE_CHECKING:  # served before the sampler is built (see collector.py)
    from wattprint.core.model import ClockReading, Snapshot


def status_families(snapshot: Snapshot, wall: float, stamped: bool) -> Iterator[Family]:
    yield from _carbon(snapshot)
    yield from _forecast(snapshot)
    yield from _self(snapshot)
    yield from _restarts(snapshot)
    yield from _clock(snapshot.clock, wall, stamped)
    yield from _process()


def _carbon(snapshot: Snapshot) -> Iterator[Family]:
    pue = single(
        "gauge",
        "wattprint_pue_ratio",
        "Power usage effectiveness applied to emissions.",
        snapshot.pue,
    )
    yield pue
    if not snapshot.intensities:
        return
    labels = ["zone", "provider", "signal"]
    value = gauge(
        "wattprint_grid_carbon_intensity_grams_per_kwh",
        "Grid carbon intensity, grams CO2e per kWh.",
        labels,
    )
    stamp = gauge(
        "wattprint_grid_carbon_intensity_timestamp_seconds",
        "Unix time the carbon intensity value refers to.",
        labels,
    )
    dataset = gauge(
        "wattprint_grid_carbon_intensity_dataset_info",
        "1 for each embedded yearly intensity in use: which year of the dataset it is.",
        ["zone", "provider", "year"],
    )
    for i in snapshot.intensities:
        value.add([i.zone, i.provider, i.signal], i.grams_per_kwh)
        stamp.add([i.zone, i.provider, i.signal], i.timestamp)
        if i.year is not None:
            dataset.add([i.zone, i.provider, str(i.year)], 1)
    fallback = gauge(
        "wattprint_carbon_fallback_active",
        "1 while emissions use the embedded default because the live provider failed.",
        ["zone"],
    )
    for zone, active in snapshot.carbon_fallback:
        fallback.add([zone], 1 if active else 0)
    errors = counter(
        "wattprint_carbon_errors_total",
        "Failed carbon intensity fetches or invalid answers.",
        ["provider"],
    )
    for provider, count in snapshot.carbon_errors:
        errors.add([provider], count)
    yield from (value, stamp, dataset, fallback, errors)


def _forecast(snapshot: Snapshot) -> Iterator[Family]:
    f = snapshot.forecast
    if f is None:
        return
    where = [f.zone, f.provider]
    fetched = gauge(
        "wattprint_grid_carbon_forecast_fetched_timestamp_seconds",
        "Unix time the intensity forecast in use was fetched.",
        ["zone", "provider"],
    )
    fetched.add(where, f.fetched_at)
    value = gauge(
        "wattprint_grid_carbon_intensity_forecast_grams_per_kwh",
        "Forecast grid carbon intensity for the period that starts within horizon of now.",
        ["zone", "provider", "horizon"],
    )
    for hours, grams in f.horizons:
        value.add([*where, f"{hours}h"], grams)
    labels = ["zone", "provider", "within", "duration"]
    offset = gauge(
        "wattprint_grid_carbon_greenest_start_offset_seconds",
        "Seconds from now to the start, within the next `within`, of the run of "
        "`duration` with the lowest forecast mean intensity (0: now).",
        labels,
    )
    mean = gauge(
        "wattprint_grid_carbon_greenest_grams_per_kwh",
        "Forecast mean intensity over the run of `duration` from the greenest start.",
        labels,
    )
    for g in f.greenest:
        key = [*where, f"{g.within_h}h", f"{g.duration_h}h"]
        offset.add(key, g.offset_s)
        mean.add(key, g.grams_per_kwh)
    yield from (fetched, value, offset, mean)


def _self(snapshot: Snapshot) -> Iterator[Family]:
    cap = snapshot.workload_cap
    sampled = snapshot.time if snapshot.clock is None else snapshot.clock.wall
    yield from _singles(
        (
            "gauge",
            "wattprint_workloads",
            "Workloads with series of their own on this node now.",
            cap.workloads,
        ),
        (
            "gauge",
            "wattprint_workloads_max",
            "Most workloads with series of their own (--workload.max-series).",
            cap.max_workloads,
        ),
        (
            "counter",
            "wattprint_workload_overflow",
            'Workloads counted as workload="other" because --workload.max-series was reached.',
            cap.overflowed_total,
        ),
        (
            "gauge",
            "wattprint_gpu_expected",
            "GPUs this node should have (--gpu.expect; 0: no expectation).",
            snapshot.gpus[0],
        ),
        (
            "gauge",
            "wattprint_gpu_measured",
            "GPUs whose energy this node read in the last sample.",
            snapshot.gpus[1],
        ),
        (
            "counter",
            "wattprint_workload_registered_over_cap",
            "Registered workloads (a tracker's, wattprint run's) given series of their own "
            "though --workload.max-series was reached (up to twice it).",
            cap.registered_over_total,
        ),
    )
    success = gauge(
        "wattprint_collector_success",
        "1 if the source's last read succeeded completely.",
        ["collector"],
    )
    duration = gauge(
        "wattprint_collector_duration_seconds", "Time the source's last read took.", ["collector"]
    )
    errors = counter(
        "wattprint_collector_errors_total", "Errors reading the source.", ["collector"]
    )
    for status in snapshot.collectors:
        success.add([status.name], 1 if status.success else 0)
        duration.add([status.name], status.duration_s)
        errors.add([status.name], status.errors_total)
    yield from (success, duration, errors)
    yield from _singles(
        (
            "gauge",
            "wattprint_sampler_last_success_timestamp_seconds",
            "Unix time the last sample completed.",
            sampled,
        ),
        (
            "gauge",
            "wattprint_sampler_interval_seconds",
            "Configured sample interval.",
            snapshot.sample_interval,
        ),
    )


def _singles(*rows: tuple[str, str, str, float]) -> Iterator[Family]:
    """Families of one unlabelled sample each: (type, name, help, value)."""
    return (single(*row) for row in rows)


def _restarts(snapshot: Snapshot) -> Iterator[Family]:
    gap = counter(
        "wattprint_restart_gap_energy_joules_total",
        "Energy the devices used while the exporter was down, booked when it resumed "
        "from its state file (estimated: no hardware counter spans the gap).",
        ["component", "estimated"],
    )
    # Every measured component from the start, at 0 until a gap: increase() needs the
    # series to exist before its first rise.
    booked = {(c, e): uj for c, e, uj in snapshot.restart_gap}
    for component in sorted({d.component for d in snapshot.devices} | {c for c, _ in booked}):
        for estimated in (False, True):
            energy_uj = booked.get((component, estimated), 0)
            gap.add([component, str(estimated).lower()], energy_uj / UJ_PER_J)
    restarts = counter(
        "wattprint_restarts_total",
        "Starts after an earlier run: resumed from the state file, or fresh (counters "
        "from 0) because it was missing, unusable or unsafe to resume from.",
        ["outcome"],
    )
    counted = dict(snapshot.restarts)
    for outcome in ("fresh", "resumed"):
        restarts.add([outcome], counted.get(outcome, 0))
    errors = counter(
        "wattprint_state_errors_total",
        "State file problems and unknown restart gaps, by reason (docs/metrics.md lists each).",
        ["reason"],
    )
    counted_errors = dict(snapshot.state_errors)
    # Every reason served at 0 from the start: increase() needs the series before its rise.
    for reason in sorted(set(STATE_ERROR_REASONS) | set(counted_errors)):
        errors.add([reason], counted_errors.get(reason, 0))
    yield from (gap, restarts, errors)


def _clock(reading: ClockReading | None, wall: float, stamped: bool) -> Iterator[Family]:
    yield from _singles(
        (
            "gauge",
            "wattprint_clock_time_seconds",
            "The exporter's wall clock when scraped: minus the scrape's timestamp, how far it "
            "is from Prometheus's clock.",
            wall,
        ),
        (
            "gauge",
            "wattprint_sample_timestamps_active",
            "1 while energy and power samples carry the time the devices were read, 0 while "
            "they go without (--sample.timestamps=false, or a clock not trusted).",
            1 if stamped else 0,
        ),
    )
    if reading is None:
        return
    yield from _singles(
        (
            "gauge",
            "wattprint_clock_offset_seconds",
            "How far the wall clock has been stepped since the exporter started: the wall "
            "clock minus its reading at start plus the monotonic time since.",
            reading.offset_s,
        ),
        (
            "counter",
            "wattprint_clock_steps",
            "Steps of the wall clock against the monotonic clock seen since the exporter started.",
            reading.steps_total,
        ),
    )
    if reading.kernel is None:
        return  # adjtimex unreadable: nothing known, and nothing claimed
    yield from _singles(
        (
            "gauge",
            "wattprint_clock_synchronized",
            "1 while the kernel bounds the clock's error under 16 s (a time daemon disciplines "
            "it, as adjtimex reports), 0 otherwise.",
            1 if reading.kernel.disciplined else 0,
        ),
        (
            "gauge",
            "wattprint_clock_maxerror_seconds",
            "How far off the clock may be, as the kernel says (adjtimex maximum error).",
            reading.kernel.maxerror_s,
        ),
    )


def _process() -> Iterator[Family]:
    """The process_* metrics every Prometheus client library serves (Linux), so the
    exporter's own CPU, memory and file descriptors show on the usual dashboards."""
    times = os.times()
    rows: list[tuple[str, str, str, float]] = [
        (
            "counter",
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            times.user + times.system,
        )
    ]
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            virtual, resident = (
                int(x) * os.sysconf("SC_PAGE_SIZE") for x in statm.read().split()[:2]
            )
        open_fds = len(os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        return  # not Linux: no process_* at all rather than a part of them
    rows += [
        ("gauge", "process_virtual_memory_bytes", "Virtual memory size in bytes.", virtual),
        ("gauge", "process_resident_memory_bytes", "Resident memory size in bytes.", resident),
        ("gauge", "process_open_fds", "Number of open file descriptors.", open_fds),
    ]
    if (limit := _max_fds()) is not None:
        rows.append(("gauge", "process_max_fds", "Maximum number of open file descriptors.", limit))
    if (started := _start_time()) is not None:
        rows.append(
            (
                "gauge",
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                started,
            )
        )
    yield from _singles(*rows)


def _max_fds() -> float | None:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else float(soft)


@functools.cache
def _start_time() -> float | None:
    """The kernel's start time of this process: boot time plus its start in clock ticks."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            # Fields after the parenthesised command name, which may hold spaces.
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as kernel:
            boot = next(int(line.split()[1]) for line in kernel if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
