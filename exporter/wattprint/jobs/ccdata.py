"""What an EmissionsTracker hands its user and its output handlers, as codecarbon 3.x
shapes it: EmissionsData and TaskEmissionsData (its fields, in its order), OutputMethod,
the row's emissions from the tracker's own carbon arguments, its hardware and
utilization columns, and the task file codecarbon writes beside the CSV."""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wattprint._version import __version__
from wattprint.jobs.trackfiles import codecarbon_row
from wattprint.report.common import CODECARBON_COLUMNS
from wattprint.report.jobs import JobReport

log = logging.getLogger("wattprint.tracker")

J_PER_KWH = 3.6e6
_NUMBERS = {
    "duration", "emissions", "emissions_rate", "cpu_power", "gpu_power", "ram_power",
    "cpu_energy", "gpu_energy", "ram_energy", "energy_consumed", "water_consumed",
    "cpu_count", "gpu_count", "longitude", "latitude", "ram_total_size",
    "cpu_utilization_percent", "gpu_utilization_percent", "ram_utilization_percent",
    "ram_used_gb", "pue", "wue",
}  # fmt: skip
_SCALED_BY_PUE: tuple[str, ...] = ("cpu_power", "gpu_power", "ram_power", "cpu_energy")
_SCALED_BY_PUE += ("gpu_energy", "ram_energy", "energy_consumed")
# What codecarbon's compute_delta_emission takes the difference of.
_DELTAS: tuple[str, ...] = ("duration", "emissions", "cpu_energy", "gpu_energy", "ram_energy")
_DELTAS += ("energy_consumed", "water_consumed")

EmissionsData: Any = dataclasses.make_dataclass(
    "EmissionsData", [(column, Any) for column in CODECARBON_COLUMNS]
)
TASK_COLUMNS = ("task_name", *(c for c in CODECARBON_COLUMNS if c not in ("experiment_id",)))
TASK_COLUMNS = tuple(c for c in TASK_COLUMNS if c not in ("pue", "wue"))
TaskEmissionsData: Any = dataclasses.make_dataclass(
    "TaskEmissionsData", [(column, Any) for column in TASK_COLUMNS]
)


class OutputMethod(str, enum.Enum):
    """codecarbon's output methods, equal to its own by value ("csv", ...)."""

    CSV = "csv"
    API = "api"
    LOGGER = "logger"
    PROMETHEUS = "prometheus"
    LOGFIRE = "logfire"
    BOAMPS = "boamps"


@dataclasses.dataclass(frozen=True)
class OwnCarbon:
    """A tracker's own carbon arguments: its energy (from the node's sampler) turned into
    its emissions whatever zone and PUE the sampler accounts with."""

    zone: str | None = None  # country_iso_code, gcp:<region>; None: the sampler's intensity
    grams_per_kwh: float | None = None  # the zone's, or force_carbon_intensity_g_co2e_kwh
    pue: float = 1.0  # codecarbon's default
    country: str | None = None  # country_iso_code as given (its columns)
    region: str | None = None
    cloud_provider: str | None = None
    cloud_region: str | None = None

    def grams(self, job: JobReport) -> float:
        """The job's emissions (g) at this tracker's intensity and PUE."""
        if self.grams_per_kwh is not None:
            return job.energy_j / J_PER_KWH * self.grams_per_kwh * self.pue
        # The sampler's grams carry its own PUE: the energy's intensity is what remains.
        return job.emissions_g / (job.pue or 1.0) * self.pue


def own_carbon(options: Mapping[str, Any], pue: float) -> OwnCarbon:
    """OwnCarbon from codecarbon's location arguments; an unknown one is one line (as
    codecarbon's error) and the sampler's intensity counts."""
    from wattprint.carbon.base import UnknownZoneError
    from wattprint.carbon.embedded import dataset

    forced = options.get("force_carbon_intensity_g_co2e_kwh")
    provider, cloud_region = options.get("cloud_provider"), options.get("cloud_region")
    country = options.get("country_iso_code") or options.get("country_2letter_iso_code")
    zone = None
    if provider and cloud_region and str(provider).lower() == "gcp":
        zone = f"gcp:{cloud_region}"
    elif country:
        zone = str(country)
    intensity = None
    if zone is not None:
        try:
            intensity = dataset().lookup(zone).grams_per_kwh
        except UnknownZoneError as err:
            log.error("%s: emissions at the node's sampler's intensity", err)
            zone = None
    region = options.get("region")
    return OwnCarbon(
        zone=zone,
        grams_per_kwh=forced if forced is not None else intensity,
        pue=pue,
        country=str(country).upper() if country and zone else None,
        region=str(region).lower() if region else None,
        cloud_provider=str(provider) if provider else None,
        cloud_region=str(cloud_region) if cloud_region else None,
    )


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(1 << 20)
    except OSError:
        return ""


def machine() -> dict[str, Any]:
    """This machine's columns, as codecarbon fills them."""
    model = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "os": platform.platform(),
        "python_version": platform.python_version(),
        "codecarbon_version": f"wattprint-{__version__}",
        "cpu_count": os.cpu_count() or 0,  # codecarbon's: logical CPUs
        "cpu_model": model or platform.processor() or None,
        "ram_total_size": round(_meminfo().get("MemTotal", 0) / 1024**2, 3),
    }


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in KiB."""
    fields: dict[str, int] = {}
    for line in _read("/proc/meminfo").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0])
    return fields


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) ticks of all CPUs, from /proc/stat."""
    for line in _read("/proc/stat").splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:] if v.isdigit()]
            idle = sum(values[3:5])  # idle, iowait
            total = sum(values[:8])  # not guest: already in user
            return total - idle, total
    return 0, 0


def utilization(since: tuple[int, int]) -> dict[str, float]:
    """The machine's CPU use since `since` (cpu_ticks()) and its memory now, as
    codecarbon's columns; the GPUs': 0, codecarbon's value without a GPU (with one,
    emissions_data() leaves it empty: the sampler's figures do not have it)."""
    busy, total = cpu_ticks()
    spent = total - since[1]
    memory = _meminfo()
    whole, available = memory.get("MemTotal", 0), memory.get("MemAvailable", 0)
    return {
        "cpu_utilization_percent": round(100 * (busy - since[0]) / spent, 2) if spent > 0 else 0.0,
        "gpu_utilization_percent": 0.0,
        "ram_utilization_percent": round(100 * (whole - available) / whole, 2) if whole else 0.0,
        "ram_used_gb": round((whole - available) / 1024**2, 3),
    }


def emissions_data(
    job: JobReport, carbon: OwnCarbon, fields: Mapping[str, Any], system: Mapping[str, Any]
) -> Any:
    """The job as codecarbon's EmissionsData: its energy, at the tracker's own carbon."""
    row: dict[str, Any] = {}
    for column, text in codecarbon_row(job, {}).items():
        row[column] = _typed(column, text)
    pue = carbon.pue
    for column in _SCALED_BY_PUE:
        if row.get(column) is not None:
            row[column] *= pue  # codecarbon's columns are the facility's: IT energy x PUE
    kg = carbon.grams(job) / 1000
    duration = job.duration
    row.update(system)
    row.update(
        emissions=kg,
        emissions_rate=kg / duration if duration > 0 else 0.0,
        pue=pue,
        gpu_count=int(row.get("gpu_count") or 0),
        gpu_model=row.get("gpu_model") or "",
        water_consumed=0.0,
        wue=0.0,
    )
    for column in ("cpu_power", "gpu_power", "ram_power"):
        row[column] = row.get(column) or 0.0
    if carbon.zone is not None or carbon.country:
        from wattprint.report.render import _zone_fields

        for column in ("country_name", "country_iso_code", "region", "cloud_provider"):
            row[column] = None
        row["cloud_region"] = None
        row.update(_zone_fields({carbon.zone}) if carbon.zone else {})
    if carbon.region:
        row["region"] = carbon.region
    if carbon.cloud_provider:
        row["cloud_provider"], row["cloud_region"] = carbon.cloud_provider, carbon.cloud_region
    row["on_cloud"] = "Y" if row.get("cloud_provider") else "N"
    row.update(fields)
    if row["gpu_count"]:  # the sampler exports no GPU utilization: unknown, not 0
        row["gpu_utilization_percent"] = None
    return EmissionsData(**{column: row.get(column) for column in CODECARBON_COLUMNS})


def _typed(column: str, text: str) -> Any:
    if text == "":
        return None
    if column in _NUMBERS:
        try:
            return float(text)
        except ValueError:
            return None
    return text


def delta(total: Any, previous: Any | None) -> Any:
    """codecarbon's compute_delta_emission: total minus previous, its rate over the span."""
    if previous is None:
        return dataclasses.replace(total)
    values = {n: (getattr(total, n) or 0.0) - (getattr(previous, n) or 0.0) for n in _DELTAS}
    values["emissions_rate"] = (
        values["emissions"] / values["duration"] if values["duration"] > 0 else 0.0
    )
    return dataclasses.replace(total, **values)


def task_data(name: str, data: Any) -> Any:
    """A task's EmissionsData as codecarbon's TaskEmissionsData (its task file's row)."""
    values = dataclasses.asdict(data)
    return TaskEmissionsData(task_name=name, **{c: values.get(c) for c in TASK_COLUMNS[1:]})


def csv_row(data: Any) -> dict[str, str]:
    """A row of the CSV: numbers as Python writes them, unknown as empty."""
    return {k: "" if v is None else str(v) for k, v in dataclasses.asdict(data).items()}


def write_task_file(directory: str, experiment: str, tasks: list[Any]) -> str:
    """emissions_<experiment>_<run_id>.csv, every finished task's row, as codecarbon's
    FileOutput.task_out writes it (replaced each time; all-empty columns left out)."""
    import csv
    import io

    from wattprint.core.safeio import write_atomic

    rows = [dataclasses.asdict(task) for task in tasks]
    columns = [c for c in TASK_COLUMNS if any(r.get(c) is not None for r in rows)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow(["" if r.get(c) is None else r[c] for c in columns])
    path = Path(directory) / f"emissions_{experiment}_{rows[0]['run_id']}.csv"
    write_atomic(str(path), buffer.getvalue().encode())
    return str(path)


def physical_cpus() -> int:
    """Physical cores of this machine (distinct package and core ids in /proc/cpuinfo)."""
    cores, package = set(), ""
    for line in _read("/proc/cpuinfo").splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "physical id":
            package = value.strip()
        elif name.strip() == "core id":
            cores.add((package, value.strip()))
    return len(cores) or os.cpu_count() or 0
