"""Metric names, limits and errors the report modules share."""

from __future__ import annotations

import datetime as dt

from wattprint.sources import registry

ENERGY = "wattprint_workload_energy_joules_total"
EMISSIONS = "wattprint_workload_emissions_grams_total"
EMBODIED = "wattprint_workload_embodied_grams_total"
MEASUREMENT = "wattprint_measurement_info"
PUE = "wattprint_pue_ratio"
GPU_COUNTER = "wattprint_gpu_energy_joules_total"
INTENSITY = "wattprint_grid_carbon_intensity_grams_per_kwh"
BUDGET = "namespace_workload:wattprint_emissions_budget_grams:30d"
# The methods the sources declare as estimated (sources/registry.py).
ESTIMATED_METHODS = registry.estimated_methods()
COMPONENTS = ("gpu", "cpu", "memory")  # the chips
PLATFORM = "platform"  # the rest of the server: with them, the job at the wall
JOULES_PER_KWH = 3.6e6

MAX_STEPS = 1000
# VictoriaMetrics replaces the points of a range query within -search.latencyOffset
# (30 s) of now by the point before, at steps under -search.maxStepForPointsAdjustment
# (1m): a running job would lose its last half minute. From a minute up it leaves
# them alone; the totals do not depend on the step.
MIN_STEP_S = 60.0
LOOKBACK_S = 300.0  # Prometheus's default lookback delta
BASELINE_LOOKBACK_S = 86400.0
DEFAULT_RETENTION_S = 15 * 86400.0  # Prometheus's default
# How far back to look for the oldest data on a server that does not report its
# retention (VictoriaMetrics, Thanos, Mimir): a tenth of VictoriaMetrics' maximum.
PROBE_SPAN_S = 10 * 365 * 86400.0
MAX_INSTANCE_FILTER = 200
PROGRESS_AFTER_S = 1.0
FORMATS = ("table", "csv", "json", "codecarbon-csv", "ghg-csv", "ghg-json")

# codecarbon 3.x emissions.csv, in its order (tests/fixtures/h200/codecarbon-4-processes).
CODECARBON_COLUMNS = (
    "timestamp",
    "project_name",
    "run_id",
    "experiment_id",
    "duration",
    "emissions",
    "emissions_rate",
    "cpu_power",
    "gpu_power",
    "ram_power",
    "cpu_energy",
    "gpu_energy",
    "ram_energy",
    "energy_consumed",
    "water_consumed",
    "country_name",
    "country_iso_code",
    "region",
    "cloud_provider",
    "cloud_region",
    "os",
    "python_version",
    "codecarbon_version",
    "cpu_count",
    "cpu_model",
    "gpu_count",
    "gpu_model",
    "longitude",
    "latitude",
    "ram_total_size",
    "tracking_mode",
    "cpu_utilization_percent",
    "gpu_utilization_percent",
    "ram_utilization_percent",
    "ram_used_gb",
    "on_cloud",
    "pue",
    "wue",
)


class ReportError(Exception):
    """Nothing to report (unknown workload, empty range); str() is one line."""


class UsageError(Exception):
    """A bad combination of flags; str() is one line. Exit status 2."""


def iso(t: float, ms: bool = False) -> str:
    moment = dt.datetime.fromtimestamp(t, tz=dt.timezone.utc)
    if ms:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
