"""A reading: what a Wattprint sampler's counters stand at, from our own sampler's
snapshot or a running exporter's /metrics, and how two readings of one exporter compare."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from prometheus_client.parser import text_string_to_metric_families

from wattprint.core.model import Snapshot
from wattprint.core.units import UJ_PER_J

# (component, gpu, scheduler, namespace, workload, pod)
SeriesKey = tuple[str, str, str, str, str, str]


@dataclass
class Reading:
    """The node's counters at one moment (`time`: when the devices were read)."""

    time: float
    series: dict[SeriesKey, tuple[float, float]] = field(default_factory=dict)  # J, g
    devices: dict[tuple[str, str], float] = field(default_factory=dict)  # J
    methods: dict[tuple[str, str], str] = field(default_factory=dict)
    gpu_models: dict[str, str] = field(default_factory=dict)
    pue: float = 1.0
    zones: set[str] = field(default_factory=set)
    interval: float = 1.0  # the sampler's
    workloads: int = 0  # with series of their own, and the most the cap lets have them
    workloads_max: int = 0
    # The exporter's process start time (process_start_time_seconds): a restart has a
    # new one. NaN where not known (our own sampler, an exporter not on Linux).
    started: float = math.nan
    # Its starts that resumed from the state file (wattprint_restarts_total): one more
    # in a later reading is a restart whose counters went on from its last save.
    resumed: float = math.nan


def reading_from_snapshot(snapshot: Snapshot) -> Reading:
    reading = Reading(time=snapshot.time, pue=snapshot.pue, interval=snapshot.sample_interval)
    for s in snapshot.energy:
        if s.workload is None:
            continue
        w = s.workload
        key = (s.component, s.gpu, w.scheduler, w.namespace, w.workload, w.pod)
        reading.series[key] = (s.energy_uj / UJ_PER_J, s.grams)
    for d in snapshot.devices:
        reading.devices[d.key] = d.energy_uj / UJ_PER_J
        reading.methods[d.key] = d.method
        if d.component == "gpu":
            reading.gpu_models[d.device] = d.model
    reading.zones = {zone for zone, _ in snapshot.carbon_fallback}
    reading.workloads = snapshot.workload_cap.workloads
    reading.workloads_max = snapshot.workload_cap.max_workloads
    return reading


# The families a reading is made of; only their lines are parsed (a flush() parses the
# node's /metrics, most of which is the exporter's own health).
_READ = (
    "wattprint_workload_energy_joules",
    "wattprint_workload_emissions_grams_total",
    "wattprint_gpu_energy_joules_total",
    "wattprint_cpu_energy_joules_total",
    "wattprint_memory_energy_joules_total",
    "wattprint_measurement_info",
    "wattprint_pue_ratio",
    "wattprint_carbon_fallback_active",
    "wattprint_sampler_last_success_timestamp_seconds",
    "wattprint_sampler_interval_seconds",
    "wattprint_workloads",  # and _max: whether the workload cap was full
    "process_start_time_seconds",
    "wattprint_restarts_total",
    "wattprint_node_energy_joules",  # where a platform source reads the node's input
    "wattprint_platform_energy_joules",
)


def _needed(text: str) -> str:
    def name(line: str) -> str:
        if line.startswith("#"):
            parts = line.split(" ", 3)
            return parts[2] if len(parts) > 2 else ""
        return line.split("{", 1)[0].split(" ", 1)[0]

    lines = [line for line in text.splitlines() if name(line).startswith(_READ)]
    return "\n".join(lines) + "\n"


def reading_from_text(text: str) -> Reading:
    """Parse an exporter's /metrics; the reading's time is its last sample's."""
    reading = Reading(time=math.nan)
    grams: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(_needed(text)):
        for sample in family.samples:
            labels = sample.labels
            name = sample.name
            if name == "wattprint_workload_energy_joules_total" or (
                name == "wattprint_workload_energy_joules" and family.type == "counter"
            ):
                key = _key(labels)
                reading.series[key] = (sample.value, reading.series.get(key, (0.0, 0.0))[1])
            elif name in ("wattprint_workload_emissions_grams_total",):
                grams[_key(labels)] = sample.value
            elif name == "wattprint_gpu_energy_joules_total":
                reading.devices[("gpu", labels.get("gpu", ""))] = sample.value
                reading.gpu_models[labels.get("gpu", "")] = labels.get("model", "")
            elif name in (
                "wattprint_cpu_energy_joules_total",
                "wattprint_memory_energy_joules_total",
            ):
                component = name.split("_")[1]
                reading.devices[(component, labels.get("package", ""))] = sample.value
            elif name == "wattprint_measurement_info":
                reading.methods[(labels.get("component", ""), labels.get("device", ""))] = (
                    labels.get("method", "")
                )
            elif name == "wattprint_pue_ratio":
                reading.pue = sample.value
            elif name == "wattprint_carbon_fallback_active":
                reading.zones.add(labels.get("zone", ""))
            elif name == "wattprint_sampler_last_success_timestamp_seconds":
                reading.time = sample.value
            elif name == "wattprint_sampler_interval_seconds":
                reading.interval = sample.value
            elif name == "wattprint_workloads":
                reading.workloads = int(sample.value)
            elif name == "wattprint_workloads_max":
                reading.workloads_max = int(sample.value)
            elif name == "process_start_time_seconds":
                reading.started = sample.value
            elif name == "wattprint_restarts_total" and labels.get("outcome") == "resumed":
                reading.resumed = sample.value
            elif name in (
                "wattprint_node_energy_joules_total",
                "wattprint_platform_energy_joules_total",
            ):
                reading.devices[(name.split("_")[1], "node")] = sample.value
    for key, value in grams.items():
        reading.series[key] = (reading.series.get(key, (0.0, 0.0))[0], value)
    return reading


def _key(labels: dict[str, str]) -> SeriesKey:
    return (
        labels.get("component", ""),
        labels.get("gpu", ""),
        labels.get("scheduler", ""),
        labels.get("namespace", ""),
        labels.get("workload", ""),
        labels.get("pod", ""),
    )


def same_exporter(a: Reading, b: Reading) -> bool:
    """Whether one exporter process served both readings (its start time known)."""
    return math.isfinite(a.started) and a.started == b.started


def resumed_between(earlier: Reading, later: Reading) -> bool:
    """Whether the exporter restarted between the readings and went on from its state
    file: its counters then resume at its last save, which may be below a fresh sample
    (/metrics?fresh, served unsaved) read before the restart. No counter from 0."""
    return not same_exporter(earlier, later) and later.resumed > earlier.resumed


def behind(earlier: Reading, later: Reading) -> bool:
    """Whether `later` shows a counter below `earlier`'s while one exporter process served
    both: it served `later` held at its last save (its state file cannot be written;
    sampler/loop.py), not the counters since; no restart, which would be a new process."""
    if not same_exporter(earlier, later):
        return False
    before = earlier.series
    return any(value[0] < before[key][0] for key, value in later.series.items() if key in before)


def only_gpus(reading: Reading, gpus: set[str]) -> Reading:
    """The reading without the GPUs not in `gpus` (a tracker's gpu_ids)."""
    series = {k: v for k, v in reading.series.items() if k[0] != "gpu" or k[1] in gpus}
    devices = {k: v for k, v in reading.devices.items() if k[0] != "gpu" or k[1] in gpus}
    return replace(reading, series=series, devices=devices)
