"""Output: the table, CSV, JSON and codecarbon-compatible CSV renderers."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wattprint.core.safeio import printable
from wattprint.report.common import CODECARBON_COLUMNS, COMPONENTS, JOULES_PER_KWH, iso
from wattprint.report.jobreport import Component, GpuUse, JobReport
from wattprint.report.queries import Window


# -- output ----------------------------------------------------------------------------
def _kwh(joules: float) -> float:
    return joules / JOULES_PER_KWH


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _num(value: float | None, digits: int = 4) -> str:
    """`digits` significant digits without an exponent: 0.005988, 344.1, 21557."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s"


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    # Names are others' (a workload's label, a file's name): no escape codes to the terminal.
    rows = [[printable(c, 256) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def _sorted_gpus(job: JobReport) -> list[GpuUse]:
    def order(gpu: GpuUse) -> tuple[str, int, str]:
        return (gpu.instance, int(gpu.gpu) if gpu.gpu.isdigit() else 1 << 30, gpu.gpu)

    return sorted(job.gpus.values(), key=order)


@dataclass(frozen=True)
class Unit:
    """A unit the table prints a quantity in: its name, and how many base units (J, g) it is."""

    name: str
    size: float

    def of(self, base: float) -> float:
        return base / self.size


@dataclass(frozen=True)
class Units:
    energy: Unit
    mass: Unit

    @classmethod
    def suited(cls, jobs: Sequence[JobReport]) -> Units:
        """The units the table's largest energy and emissions read best in: a job of a few
        seconds in J and g, not 0.00000001350 kWh."""
        joules = max((job.energy_j for job in jobs), default=0.0)
        grams = max((job.footprint_g for job in jobs), default=0.0)
        energy = next((u for u in ENERGY_UNITS if joules >= u.size), ENERGY_UNITS[-1])
        mass = next((u for u in MASS_UNITS if grams >= u.size), MASS_UNITS[-1])
        return cls(energy, mass)


ENERGY_UNITS = (Unit("kWh", JOULES_PER_KWH), Unit("Wh", 3600.0), Unit("J", 1.0))
MASS_UNITS = (Unit("kg", 1000.0), Unit("g", 1.0))
KWH_KG = Units(ENERGY_UNITS[0], MASS_UNITS[0])  # the Prometheus report's, whatever the size


def render_table(jobs: Sequence[JobReport], window: Window, url: str, units: Units = KWH_KG) -> str:
    e, m = units.energy, units.mass
    if window.whole_life:
        start = window.data_from if window.data_from is not None else window.since
        span = f"each job's whole life (the server's data reaches back to {iso(start)}"
        span += ")" if window.retention_reported else "; it does not report its retention)"
    else:
        span = f"{iso(window.since)} to {iso(window.until)}"
    out = [f"{window.server} {url}: {span}", ""]
    rows = []
    for job in jobs:
        c = job.components
        rows.append(
            [
                job.workload,
                job.namespace or "-",
                job.scheduler,
                iso(job.start),
                _duration(job.duration),
                _num(e.of(job.energy_j)),
                _num(e.of(c["gpu"].energy_j)),
                _num(e.of(c["cpu"].energy_j)),
                _num(e.of(c["memory"].energy_j)),
                _num(m.of(job.emissions_g)),
                _num(job.intensity),
                _num(job.pue, 3),
                _percent(_share(job.estimated_j, job.energy_j)),
                _percent(job.budget_used),
            ]
        )
    header = [
        "WORKLOAD",
        "NAMESPACE",
        "SCHEDULER",
        "START",
        "DURATION",
        f"ENERGY {e.name}",
        f"GPU {e.name}",
        f"CPU {e.name}",
        f"MEMORY {e.name}",
        f"CO2e {m.name}",
        "g/kWh",
        "PUE",
        "ESTIMATED",
        "BUDGET USED",
    ]
    out.append(_aligned(header, rows, set(range(4, 14))))
    gpu_rows = [
        [
            job.workload,
            gpu.instance,
            gpu.gpu,
            gpu.model or "-",
            _num(e.of(gpu.energy_j)),
            _num(m.of(gpu.emissions_g)),
            _percent(_share(gpu.estimated_j, gpu.energy_j)),
        ]
        for job in jobs
        for gpu in _sorted_gpus(job)
    ]
    if gpu_rows:
        out += ["", "Energy per GPU"]
        header = [
            "WORKLOAD",
            "INSTANCE",
            "GPU",
            "MODEL",
            f"ENERGY {e.name}",
            f"CO2e {m.name}",
            "ESTIMATED",
        ]
        out.append(_aligned(header, gpu_rows, {4, 5, 6}))
    part_rows = [
        [
            job.workload,
            name,
            _num(e.of(part.energy_j)),
            _num(e.of(part.energy_j - part.estimated_j)),
            _num(e.of(part.estimated_j)),
            ",".join(sorted(part.methods)) or "unknown",
        ]
        for job in jobs
        for name, part in job.components.items()
        if part.energy_j > 0
    ]
    if part_rows:  # a heading over no rows says nothing the notes do not say better
        out += ["", "Measured and estimated"]
        header = ["WORKLOAD", "COMPONENT", f"ENERGY {e.name}", f"MEASURED {e.name}"]
        header += [f"ESTIMATED {e.name}", "METHOD"]
        out.append(_aligned(header, part_rows, {2, 3, 4}))
    out += ["", WALL_SECTION, _wall_rows(jobs, units)]
    if any(job.embodied_g > 0 for job in jobs):
        out += ["", "Operational and embodied"]
        header = ["WORKLOAD", *(f"{s} CO2e {m.name}" for s in ("OPERATIONAL", "EMBODIED", "TOTAL"))]
        scope_rows = [
            [
                job.workload,
                _num(m.of(job.emissions_g)),
                _num(m.of(job.embodied_g)),
                _num(m.of(job.footprint_g)),
            ]
            for job in jobs
        ]
        out.append(_aligned(header, scope_rows, {1, 2, 3}))
    notes = [
        f"  {printable(job.workload)}: {printable(n, 2000)}" for job in jobs for n in _notes(job)
    ]
    budgets = [
        f"  {printable(job.workload)}: {_num(job.emissions_g)} g of a 30-day budget of "
        f"{_num(job.budget_grams)} g"
        for job in jobs
        if job.budget_grams is not None
    ]
    if budgets:
        out += ["", "Budgets", *budgets]
    if notes:
        out += ["", "Notes", *notes]
    return "\n".join(out) + "\n"


WALL_SECTION = "Chips (ENERGY and CO2e above: GPU + CPU + memory) and at the wall (+ platform)"


def _wall_rows(jobs: Sequence[JobReport], units: Units) -> str:
    """Each job's chips and its figure at the wall, which is "n/a" (a note says why)
    where a node it ran on read no input."""
    e, m = units.energy, units.mass
    rows = []
    for job in jobs:
        wall_j, wall_g = job.wall_energy_j, job.wall_emissions_g
        rows.append(
            [
                job.workload,
                _num(e.of(job.energy_j)),
                "n/a" if wall_j is None else _num(e.of(job.platform.energy_j)),
                "n/a" if wall_j is None else _num(e.of(wall_j)),
                _num(m.of(job.emissions_g)),
                "n/a" if wall_g is None else _num(m.of(wall_g)),
            ]
        )
    header = ["WORKLOAD", f"CHIPS {e.name}", f"PLATFORM {e.name}", f"WALL {e.name}"]
    header += [f"CHIPS CO2e {m.name}", f"WALL CO2e {m.name}"]
    return _aligned(header, rows, {1, 2, 3, 4, 5})


def _notes(job: JobReport) -> list[str]:
    why = job.wall_unavailable
    return [*job.notes, f"no figure at the wall: {why}"] if why else job.notes


def _wall_dict(job: JobReport) -> dict[str, Any]:
    wall_j, wall_g = job.wall_energy_j, job.wall_emissions_g
    return {
        "energy_kwh": None if wall_j is None else _kwh(wall_j),
        "emissions_kg": None if wall_g is None else wall_g / 1000,
        "platform_energy_kwh": None if wall_j is None else _kwh(job.platform.energy_j),
        "platform_emissions_kg": None if wall_g is None else job.platform.emissions_g / 1000,
        "unavailable": job.wall_unavailable or None,
    }


def job_dict(job: JobReport) -> dict[str, Any]:
    c = job.components

    def per(value: Any) -> dict[str, Any]:
        return {name: value(part) for name, part in c.items()}

    return {
        "scheduler": job.scheduler,
        "namespace": job.namespace,
        "workload": job.workload,
        "start": iso(job.start, ms=True),
        "end": iso(job.end, ms=True),
        "duration_seconds": round(job.duration, 3),
        "energy_kwh": {**per(lambda p: _kwh(p.energy_j)), "total": _kwh(job.energy_j)},
        "emissions_kg": {**per(lambda p: p.emissions_g / 1000), "total": job.emissions_g / 1000},
        # energy_kwh and emissions_kg are the chips (gpu + cpu + memory); "wall" adds
        # the platform, the rest of the server, where every node read its input.
        "figures": "chips",
        "wall": _wall_dict(job),
        "embodied_kg": job.embodied_g / 1000,
        "footprint_kg": job.footprint_g / 1000,
        "estimated_kwh": {**per(lambda p: _kwh(p.estimated_j)), "total": _kwh(job.estimated_j)},
        "estimated_share": {
            **per(lambda p: _share(p.estimated_j, p.energy_j)),
            "total": _share(job.estimated_j, job.energy_j),
        },
        "methods": per(lambda p: sorted(p.methods)),
        "intensity_g_per_kwh": job.intensity,
        "pue": job.pue,
        "zones": sorted(job.zones),
        "gpus": [
            {
                "instance": gpu.instance,
                "gpu": gpu.gpu,
                "model": gpu.model,
                "energy_kwh": _kwh(gpu.energy_j),
                "emissions_kg": gpu.emissions_g / 1000,
                "estimated_share": _share(gpu.estimated_j, gpu.energy_j),
            }
            for gpu in _sorted_gpus(job)
        ],
        "budget": None
        if job.budget_grams is None
        else {"grams_30d": job.budget_grams, "used": job.budget_used},
        "notes": list(job.notes),
    }


def render_json(jobs: Sequence[JobReport], window: Window, url: str) -> str:
    document = {
        "prometheus": url,
        "engine": window.server,
        "since": iso(window.since, ms=True),
        "until": iso(window.until, ms=True),
        "whole_life": window.whole_life,
        "jobs": [job_dict(job) for job in jobs],
    }
    return json.dumps(document, indent=2) + "\n"


CSV_COLUMNS = (
    "scheduler",
    "namespace",
    "workload",
    "start",
    "end",
    "duration_seconds",
    "energy_kwh",
    "gpu_energy_kwh",
    "cpu_energy_kwh",
    "memory_energy_kwh",
    "emissions_kg",
    "gpu_emissions_kg",
    "cpu_emissions_kg",
    "memory_emissions_kg",
    "intensity_g_per_kwh",
    "pue",
    "estimated_share",
    "gpu_estimated_share",
    "cpu_estimated_share",
    "memory_estimated_share",
    "gpu_count",
    "gpu_energy_kwh_by_device",
    "zones",
    "budget_grams_30d",
    "budget_used",
    "embodied_kg",
    "footprint_kg",
    # energy_kwh and emissions_kg are the chips; these add the platform (empty, with
    # wall_unavailable saying why, where a node read no input).
    "wall_energy_kwh",
    "wall_emissions_kg",
    "platform_energy_kwh",
    "platform_emissions_kg",
    "wall_unavailable",
)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def render_csv(jobs: Sequence[JobReport], window: Window, url: str) -> str:
    del window, url  # one row per job says it all; the range is in start/end
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for job in jobs:
        d = job_dict(job)
        row = {
            "scheduler": job.scheduler,
            "namespace": job.namespace,
            "workload": job.workload,
            "start": d["start"],
            "end": d["end"],
            "duration_seconds": d["duration_seconds"],
            "energy_kwh": d["energy_kwh"]["total"],
            "emissions_kg": d["emissions_kg"]["total"],
            "intensity_g_per_kwh": job.intensity,
            "pue": job.pue,
            "estimated_share": d["estimated_share"]["total"],
            "gpu_count": len(job.gpus),
            "gpu_energy_kwh_by_device": " ".join(
                f"{gpu['instance']}/{gpu['gpu']}={gpu['energy_kwh']!r}" for gpu in d["gpus"]
            ),
            "zones": " ".join(d["zones"]),
            "budget_grams_30d": job.budget_grams,
            "budget_used": job.budget_used,
            "embodied_kg": d["embodied_kg"],
            "footprint_kg": d["footprint_kg"],
            **{f"wall_{k}": d["wall"][k] for k in ("energy_kwh", "emissions_kg", "unavailable")},
            "platform_energy_kwh": d["wall"]["platform_energy_kwh"],
            "platform_emissions_kg": d["wall"]["platform_emissions_kg"],
        }
        for name in COMPONENTS:
            row[f"{name}_energy_kwh"] = d["energy_kwh"][name]
            row[f"{name}_emissions_kg"] = d["emissions_kg"][name]
            row[f"{name}_estimated_share"] = d["estimated_share"][name]
        writer.writerow([_cell(row[column]) for column in CSV_COLUMNS])
    return buffer.getvalue()


def _zone_fields(zones: set[str]) -> dict[str, str]:
    """codecarbon's location columns, where the job ran in one known zone."""
    if len(zones) != 1:
        return {}
    zone = next(iter(zones))
    try:
        from wattprint.carbon.embedded import dataset

        entry = dataset().lookup(zone)
    except Exception:
        # An Electricity Maps or WattTime zone the embedded data does not know: say
        # the zone, not a guess.
        return {"region": zone}
    if entry.key.startswith("gcp:"):
        return {"cloud_provider": "gcp", "cloud_region": entry.key[4:], "region": entry.name}
    if entry.key.startswith("OWID_"):
        return {"region": zone}
    return {"country_name": entry.name, "country_iso_code": entry.key}


def render_codecarbon(jobs: Sequence[JobReport], window: Window, url: str) -> str:
    del window, url
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CODECARBON_COLUMNS)
    for job in jobs:
        c = job.components
        duration = job.duration
        models: dict[str, int] = defaultdict(int)
        for gpu in job.gpus.values():
            models[gpu.model or "unknown GPU"] += 1

        def power(part: Component, duration: float = duration) -> float | None:
            return part.energy_j / duration if duration > 0 else None

        row: dict[str, Any] = {
            "timestamp": dt.datetime.fromtimestamp(job.end, tz=dt.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%S"
            ),
            "project_name": job.namespace,
            "run_id": job.workload,
            "duration": duration,
            "emissions": job.emissions_g / 1000,
            "emissions_rate": job.emissions_g / 1000 / duration if duration > 0 else None,
            "cpu_power": power(c["cpu"]),
            "gpu_power": power(c["gpu"]),
            "ram_power": power(c["memory"]),
            "cpu_energy": _kwh(c["cpu"].energy_j),
            "gpu_energy": _kwh(c["gpu"].energy_j),
            "ram_energy": _kwh(c["memory"].energy_j),
            "energy_consumed": _kwh(job.energy_j),
            "gpu_count": len(job.gpus) if job.gpus else None,
            "gpu_model": ", ".join(f"{n} x {m}" for m, n in sorted(models.items())) or None,
            "pue": job.pue,
            # What codecarbon writes without a water figure: WUE 0, so 0 water.
            "water_consumed": 0.0,
            "wue": 0.0,
            **_zone_fields(job.zones),
        }
        row["on_cloud"] = "Y" if row.get("cloud_provider") else "N"
        writer.writerow([_cell(row.get(column)) for column in CODECARBON_COLUMNS])
    return buffer.getvalue()


RENDERERS = {
    "table": render_table,
    "csv": render_csv,
    "json": render_json,
    "codecarbon-csv": render_codecarbon,
}
