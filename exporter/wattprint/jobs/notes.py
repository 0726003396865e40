"""What `wattprint run`'s report (and a tracker's) says about how its numbers came
about: settings the node's sampler overrides, the world-average carbon intensity, a job
too short to see."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping

from wattprint.config.options import OPTIONS, Config
from wattprint.jobs.meter import Reading

# What a running exporter's /metrics shows of its settings, to compare with run's own.
_SHOWN = {"carbon.zone", "pue", "sample.interval"}
# Flags run uses itself whoever samples: finding the sampler, its own log.
_RUNS_OWN = {"state.file", "log.level"}


def given_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """flag -> how the user set it ("--pue=1.5", "WATTPRINT_PUE=1.5"): on the command
    line or in the environment, not by default."""
    given: dict[str, str] = {}
    for option in OPTIONS:
        value = getattr(args, f"opt:{option.flag}", None)
        if value is not None:
            given[option.flag] = f"--{option.flag}={value}"
        elif option.env in environ:
            given[option.flag] = f"{option.env}={environ[option.env]}"
    return given


def _same_zone(mine: str, theirs: set[str]) -> bool:
    """Whether the zone given names the zone the sampler uses (DE and DEU are one)."""
    if len(theirs) != 1:
        return False
    (other,) = theirs
    try:
        from wattprint.carbon.embedded import dataset

        data = dataset()
        if data.canonical(mine) == data.canonical(other):
            return True
        countries = all(len(z.strip()) in (2, 3) and z.strip().isalpha() for z in (mine, other))
        return countries and data.lookup(mine).key == data.lookup(other).key
    except Exception:  # a live provider's zone the embedded data does not know
        return mine.strip().upper() == other.strip().upper()


def overridden(
    config: Config, given: Mapping[str, str], reading: Reading, source: str
) -> list[str]:
    """One note per setting given to run that the node's sampler does not apply."""
    theirs = {
        "carbon.zone": ", ".join(sorted(reading.zones)) or "no zone",
        "pue": f"{reading.pue:g}",
        "sample.interval": f"{reading.interval:g}s",
    }
    differs = {
        "carbon.zone": bool(config.carbon_zone)
        and not _same_zone(config.carbon_zone, reading.zones),
        "pue": not math.isclose(config.pue, reading.pue),
        "sample.interval": not math.isclose(config.sample_interval, reading.interval),
    }
    notes = []
    for flag, how in given.items():
        if flag in _RUNS_OWN:
            continue
        if flag in _SHOWN:
            if differs[flag]:
                notes.append(
                    f"{how} not applied: the node's sampler ({source}) uses {theirs[flag]}"
                )
        elif how.startswith("--"):  # one in the environment may be meant for anything
            notes.append(f"{how} not applied: the node's sampler ({source}) keeps its own settings")
    return notes


def tracker_overridden(config: Config, flags: Mapping[str, str], reading: Reading) -> list[str]:
    """How the node's sampler accounts otherwise than a tracker's flags asked."""
    differ = []
    zones, zone = reading.zones, config.carbon_zone
    if "carbon.zone" in flags and zones and zone.upper() not in {z.upper() for z in zones}:
        differ.append(f"carbon zone {'/'.join(sorted(zones))}, not {zone}")
    if "pue" in flags and abs(reading.pue - config.pue) > 1e-9:
        differ.append(f"PUE {reading.pue:g}, not {config.pue:g}")
    wanted = config.sample_interval
    if "sample.interval" in flags and abs(reading.interval - wanted) > 1e-6:
        differ.append(f"a sample every {reading.interval:g} s, not {wanted:g} s")
    return differ


def cap_note(end: Reading, registered: bool, counted: bool) -> str | None:
    """What the job's report says when the node's --workload.max-series was full
    (`counted`: the job's series rose)."""
    if not end.workloads_max or end.workloads < end.workloads_max:
        return None
    where = f"the node's --workload.max-series ({end.workloads_max}) was full"
    if registered and counted:
        return f"{where}: this run registered with the sampler, so it was counted all the same"
    if registered:  # its user's share over the cap was taken (attribution/cardinality.py)
        return (
            f"{where}, and so was this user's share over it for registered runs: this "
            'run\'s energy is in workload="other" (stop other runs, or raise the cap)'
        )
    return (
        f'{where}: a workload new to it is counted as workload="other", and this '
        "run's energy may be there (use the node's own sampler, or raise the cap)"
    )


def world_average(reading: Reading, source: str) -> str | None:
    """The note for a node's sampler that accounts with the world average."""
    if reading.zones != {"WORLD"}:
        return None
    return (
        f"the node's sampler ({source}) accounts with the world average (zone WORLD): "
        "it was started without --carbon.zone"
    )


def unseen(seen: bool, ran_s: float, interval: float) -> str | None:
    """The note for a command the samples missed (all of it, or all but a sample)."""
    if ran_s >= interval:
        if seen:
            return None
        return f"the sampler saw no process of the command in {ran_s:.2f} s: nothing is counted"
    what = (
        "only the samples that saw it count what it used"
        if seen
        else "the sampler never saw its processes, so nothing is counted"
    )
    return f"the command ran {ran_s:.2f} s, shorter than one sample ({interval:g} s): {what}"


def namesake(start: Reading, workload: str) -> str | None:
    """The note for a workload name the sampler already had series of before the command
    started: another job of that name on the node, whose energy is counted in too."""
    if not any(key[4] == workload for key in start.series):
        return None
    return (
        f"the node's sampler counted energy for workload {workload!r} before the command "
        "started: another job of that name ran or runs on this node, and what it used "
        "meanwhile is counted here too (give this run its own --workload)"
    )
