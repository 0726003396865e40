"""The job file format (wattprint-job/v1): one job's report as a document, read back and merged.

Beside "job" and "raw", a file may say: "host" (the node), "launch" (the launch id: files
that name different ones are never added), "tracker" and "final" (a rank's tracker, and
whether it stopped), "command" and "exit_status" (`wattprint run`'s), "codecarbon_file"
(the codecarbon CSV an EmissionsTracker also writes its rows to).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from wattprint.core.safeio import BadDocument, number, printable
from wattprint.report.jobreport import Component, GpuUse, JobReport
from wattprint.report.render import job_dict

JOB_FORMAT = "wattprint-job/v1"


# -- files -------------------------------------------------------------------------------


def _part(part: Component) -> dict[str, Any]:
    return {
        "energy_j": part.energy_j,
        "emissions_g": part.emissions_g,
        "estimated_j": part.estimated_j,
        "pue_energy_j": part.pue_energy_j,
        "methods": sorted(part.methods),
    }


def _raw(job: JobReport) -> dict[str, Any]:
    """The report's own numbers in joules and grams: what a merge adds up, exactly."""
    return {
        "start": job.start,
        "end": job.end,
        "components": {name: _part(part) for name, part in job.components.items()},
        "gpus": [
            {
                "instance": gpu.instance,
                "gpu": gpu.gpu,
                "model": gpu.model,
                "energy_j": gpu.energy_j,
                "emissions_g": gpu.emissions_g,
                "estimated_j": gpu.estimated_j,
            }
            for gpu in job.gpus.values()
        ],
        "instances": sorted(list(i) for i in job.instances),
        "zones": sorted(job.zones),
        "platform": _part(job.platform),
        "platform_nodes": sorted(list(i) for i in job.platform_nodes),
    }


def job_document(
    job: JobReport, source: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "format": JOB_FORMAT,
        "source": source,
        **(extra or {}),
        "job": job_dict(job),
        "raw": _raw(job),
    }


# A file is one node's part of a job: over 1e18 J (30 GW for a year) or 1e18 g is not a
# measurement, and bounded parts keep any sum of them finite.
MAX_JOULES = 1e18
# Unix seconds: before 1970 or after 2286 is not a job's time.
MAX_TIME_S = 1e10


def _text(value: Any, limit: int = 256) -> str:
    """A name from a file: shown without escape codes (it is printed in the report)."""
    return printable(str(value), limit)


def _amount(part: dict[str, Any], key: str, where: str) -> float:
    return number(part[key], f"{where}.{key}", minimum=0.0, maximum=MAX_JOULES)


def _component(part: dict[str, Any], where: str) -> Component:
    energy, grams, estimated, pue_energy = (
        _amount(part, k, where) for k in ("energy_j", "emissions_g", "estimated_j", "pue_energy_j")
    )
    return Component(energy, grams, estimated, pue_energy, {_text(m) for m in part["methods"]})


def job_from_document(document: dict[str, Any]) -> JobReport:
    """The JobReport a job file holds; ValueError (one line, naming the field) if it is not
    one or if a figure in it is not a measurement (NaN, infinite, negative, absurd)."""
    if not isinstance(document, dict) or document.get("format") != JOB_FORMAT:
        raise ValueError(f"not a {JOB_FORMAT} document")
    try:
        summary, raw = document["job"], document["raw"]
        start = number(raw["start"], "raw.start", minimum=0.0, maximum=MAX_TIME_S)
        end = number(raw["end"], "raw.end", minimum=start, maximum=MAX_TIME_S)
        job = JobReport(
            _text(summary["scheduler"]),
            _text(summary["namespace"]),
            _text(summary["workload"]),
            start=start,
            end=end,
        )
        for name, part in raw["components"].items():
            if name in job.components:
                job.components[name] = _component(part, f"raw.components.{name}")
        # A file from before the platform (or a tracker's) has none: no wall figure.
        if "platform" in raw:
            job.platform = _component(raw["platform"], "raw.platform")
            job.platform_nodes = {(_text(a), _text(b)) for a, b in raw["platform_nodes"]}
        for gpu in raw["gpus"]:
            energy, grams, estimated = (
                _amount(gpu, k, "raw.gpus[]") for k in ("energy_j", "emissions_g", "estimated_j")
            )
            instance, index, model = (_text(gpu[k]) for k in ("instance", "gpu", "model"))
            use = GpuUse(instance, index, model, energy, grams, estimated)
            job.gpus[(use.instance, use.gpu)] = use
        job.instances = {(_text(a), _text(b)) for a, b in raw["instances"]}
        job.zones = {_text(z) for z in raw["zones"]}
        job.notes = [_text(n, 1000) for n in summary.get("notes", [])]
    except BadDocument as err:
        raise ValueError(str(err)) from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(
            f"malformed {JOB_FORMAT} document ({type(err).__name__}: {_text(err, 80)})"
        ) from None
    return job


def merge(jobs: Iterable[JobReport], workload: str | None = None) -> JobReport:
    """One job from its parts (nodes, or ranks): energy and emissions add up; it ran
    from the first part's start to the last part's end."""
    parts = list(jobs)
    if not parts:
        raise ValueError("nothing to merge")
    first = parts[0]
    total = JobReport(first.scheduler, first.namespace, workload or first.workload)
    total.start = min(p.start for p in parts)
    total.end = max(p.end for p in parts)
    for part in parts:
        for into, comp in (
            *((total.components[name], comp) for name, comp in part.components.items()),
            (total.platform, part.platform),
        ):
            into.energy_j += comp.energy_j
            into.emissions_g += comp.emissions_g
            into.estimated_j += comp.estimated_j
            into.pue_energy_j += comp.pue_energy_j
            into.methods |= comp.methods
        for key, gpu in part.gpus.items():
            into_gpu = total.gpus.setdefault(key, GpuUse(gpu.instance, gpu.gpu, gpu.model))
            into_gpu.energy_j += gpu.energy_j
            into_gpu.emissions_g += gpu.emissions_g
            into_gpu.estimated_j += gpu.estimated_j
        total.instances |= part.instances
        total.platform_nodes |= part.platform_nodes
        total.zones |= part.zones
    seen: set[str] = set()  # a set: thousands of files may each have notes
    for note in (n for part in parts for n in part.notes):
        if note not in seen:
            seen.add(note)
            total.notes.append(note)
    return total
