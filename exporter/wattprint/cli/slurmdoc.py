"""The document `wattprint slurm-epilog` keeps in a job's AdminComment: each node's part
(its energy by component, emissions, intensity, PUE, and its figure at the wall) and
the job's totals over the parts; and the paragraph a job's output ends with.

"energy_j" and "emissions_g" are the chips (GPUs, CPU packages, memory: every node
measures them). "wall_energy_j" and "wall_emissions_g" add the job's share of the
platform, the rest of the server, where the node read its input (a platform source);
null where it did not, and in the totals unless every part has one: never the chips'
figure in its place."""

from __future__ import annotations

import json
import math
from typing import Any

from wattprint.core.safeio import BadDocument, loads_json, number
from wattprint.jobs.meter import Reading, job_report
from wattprint.report.jobreport import JobReport

# The document's mark: an AdminComment that has it is ours to update, any other is not.
MARK = "wattprint"
NODE_INPUT = "node"  # the component a platform source reads (wattprint_measurement_info)
WALL = ("wall_energy_j", "wall_emissions_g")


def node_report(reading: Reading, job: str, node: str) -> JobReport | None:
    """The job's counters on this node (only its Slurm series), its platform share
    among them, or None without any."""
    slurm = Reading(time=reading.time, pue=reading.pue, interval=reading.interval)
    slurm.series = {k: v for k, v in reading.series.items() if k[2] == "slurm" and k[4] == job}
    if not slurm.series:
        return None
    slurm.methods, slurm.gpu_models, slurm.zones = (
        reading.methods,
        reading.gpu_models,
        reading.zones,
    )
    report = job_report(Reading(time=math.nan), slurm, job, host=node)  # platform too
    if any(component == NODE_INPUT for component, _ in reading.methods):
        report.platform_nodes = set(report.instances)
    return report


def _round(value: float) -> float:
    return float(f"{value:.7g}")


def _rounded(value: float | None) -> float | None:
    return None if value is None else _round(value)


def node_part(report: JobReport) -> dict[str, Any]:
    """This node's share of the job: energy by component, emissions, intensity, which
    components were measured and which estimated, and the figure at the wall."""
    used = {name: c for name, c in report.components.items() if c.energy_j > 0}
    intensity = report.intensity
    return {
        "energy_j": {name: _round(c.energy_j) for name, c in used.items()},
        "emissions_g": _round(report.emissions_g),
        "wall_energy_j": _rounded(report.wall_energy_j),
        "wall_emissions_g": _rounded(report.wall_emissions_g),
        "intensity_g_per_kwh": _round(intensity) if intensity is not None else None,
        "pue": _round(report.pue) if report.pue is not None else None,
        "measured": sorted(n for n, c in used.items() if c.estimated_j < c.energy_j),
        "estimated": sorted(n for n, c in used.items() if c.estimated_j > 0),
    }


def document(nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The job's totals over the nodes that wrote their part, and the parts."""
    energy: dict[str, float] = {}
    for part in nodes.values():
        for name, joules in part["energy_j"].items():
            energy[name] = energy.get(name, 0.0) + joules
    grams = sum(part["emissions_g"] for part in nodes.values())
    joules = sum(energy.values())
    # The facility's energy (the devices' times each node's PUE): the intensity is the
    # grid's, as in each part, so that emissions = energy x PUE x intensity holds in both.
    facility = sum(sum(p["energy_j"].values()) * (p.get("pue") or 1.0) for p in nodes.values())
    # A part from a node without a platform source (or from an older epilog) has none.
    wall = {
        key: _round(sum(p[key] for p in nodes.values()))
        if nodes and all(p.get(key) is not None for p in nodes.values())
        else None
        for key in WALL
    }
    return {
        MARK: 1,
        "energy_j": {name: _round(j) for name, j in energy.items()},
        "emissions_g": _round(grams),
        **wall,
        "intensity_g_per_kwh": _round(grams / (facility / 3.6e6)) if facility > 0 else None,
        "pue": _round(facility / joules) if joules > 0 else None,
        "nodes": nodes,
    }


def wall_text(part: dict[str, Any], digits: int) -> str:
    """The part's figure at the wall, or why there is none, for a line of text."""
    joules, grams = part.get("wall_energy_j"), part.get("wall_emissions_g")
    if joules is None or grams is None:
        return "at the wall: none (no platform source read the node's input)"
    figures = f"{joules:.{digits}g} J, {grams:.{digits}g} g CO2e"
    return f"at the wall (with the rest of the server) {figures}"


def paragraph(job: str, node: str, part: dict[str, Any]) -> str:
    """What the user reads at the end of the job's output."""
    energy = part["energy_j"]
    parts = ", ".join(f"{name} {joules:.4g} J" for name, joules in energy.items())
    estimated = part["estimated"]
    how = f"estimated from models: {', '.join(estimated)}" if estimated else "all measured"
    intensity = part["intensity_g_per_kwh"]
    grid = f" at {intensity:.4g} g CO2e/kWh" if intensity is not None else ""
    return (
        f"\nWattprint: job {job} used {sum(energy.values()):.4g} J on {node}'s chips ({parts}; "
        f"{how}), {part['emissions_g']:.4g} g CO2e{grid}; {wall_text(part, 4)}. Other nodes' "
        f"parts, if any, are in: sacct -X -n -P -o AdminComment -j {job}\n"
    )


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def raw_parts(comment: str) -> dict[str, Any] | None:
    """The node parts of a document we wrote (quotes as sacctmgr stores them), unchecked;
    None if the comment is not one."""
    text = comment.replace("`", '"')
    try:
        value = loads_json(text, "its AdminComment")
    except BadDocument as err:
        if any(s in str(err) for s in ("not valid JSON", "nested")):
            return None
        # JSON with a NaN, an infinity or a huge number in it (Python's json writes the
        # first two): read, so that our parts that hold figures are kept, the others not.
        value = json.loads(text)
    if isinstance(value, dict) and value.get(MARK) == 1 and isinstance(value.get("nodes"), dict):
        return {str(name): part for name, part in value["nodes"].items()}
    return None


def ours(comment: str) -> dict[str, dict[str, Any]] | None:
    """The node parts of a document we wrote whose figures are figures (a part with a
    NaN, an infinity or a negative figure is left out, never added), or None if the
    comment is not our document."""
    nodes = raw_parts(comment)
    return None if nodes is None else {n: p for n, p in nodes.items() if _figures(p)}


def _figures(part: Any) -> bool:
    """Whether a node's part holds figures that add up: finite, not negative."""
    try:
        energy = part["energy_j"]
        for value in (*energy.values(), part["emissions_g"]):
            number(value, "a part's figure", minimum=0.0)
        for key in ("intensity_g_per_kwh", "pue", *WALL):
            if part.get(key) is not None:
                number(part[key], key, minimum=0.0)
    except (BadDocument, KeyError, TypeError, AttributeError, OverflowError):
        return False
    return isinstance(energy, dict)
