"""AMD SMI's logical GPUs grouped into the devices whose energy they share, and the
weights that split a device's energy among its processes. Pure: sources/amdsmi.py reads
the values.

AMD SMI lists one processor per logical GPU. Two layouts share one package's energy:
- partitions (MI300X CPX/DPX/QPX, NPS): the logical GPUs of one PCI device differ at
  most in the PCI function (AMD SMI puts the partition id there or in bits the bus id
  string leaves out); each may report the package's counter again, so it is read once;
- dual-die boards (MI250/MI250X): each die is its own PCI device; the first reports the
  whole board's power and energy, the second reports none. A logical GPU that reports
  neither joins the one of the same board serial that does.
Either way the group is one exported GPU, labelled by its lowest AMD SMI index, and its
members are shared like MIG instances: an idle member's share stays unattributed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wattprint.core.model import GpuProcess

BusyKey = tuple[int | None, int]  # (member, pid)


@dataclass
class Logical:
    """One AMD SMI processor (a GPU, a partition or a die) as it was opened."""

    index: int  # its position in amdsmi_get_processor_handles()
    handle: Any
    uuid: str
    bdf: str  # PCI bus id, domain:bus:device.function
    serial: str  # board serial, "" where the board gives none
    model: str  # product name
    compute_units: int  # 0 when unknown
    counter: bool  # an energy counter that moves: it can speak for the package
    power: bool  # a non-zero power reading


@dataclass(frozen=True)
class ProcessSample:
    """One process on one member, as the process list gave it."""

    pid: int
    member: int | None  # the member's position in its group; None when alone
    gfx_ns: int | None  # GFX engine busy time since the process started
    vram_bytes: int | None


def parent_bus_id(bdf: str) -> str:
    """domain:bus:device: what the partitions of one GPU have in common."""
    return bdf.rsplit(".", 1)[0]


def group(logicals: Iterable[Logical]) -> list[list[Logical]]:
    """The logical GPUs by the device that measures their energy, each group's reader
    first (one with a counter, else one with power), groups by lowest index."""
    groups: dict[str, list[Logical]] = {}
    for logical in sorted(logicals, key=lambda lg: lg.index):
        key = parent_bus_id(logical.bdf) or f"#{logical.index}"
        groups.setdefault(key, []).append(logical)

    def speaks(members: Sequence[Logical]) -> bool:
        return any(m.counter or m.power for m in members)

    speaker: dict[str, str] = {}
    for key, members in groups.items():
        if members[0].serial and speaks(members):
            speaker.setdefault(members[0].serial, key)
    for key in list(groups):
        members = groups[key]
        target = speaker.get(members[0].serial) if members[0].serial else None
        if target is not None and target != key and not speaks(members):
            groups[target].extend(groups.pop(key))
    ordered = []
    for members in groups.values():
        members.sort(key=lambda lg: lg.index)
        reader = next(
            (m for m in members if m.counter), next((m for m in members if m.power), members[0])
        )
        ordered.append([reader, *(m for m in members if m is not reader)])
    return sorted(ordered, key=lambda ms: min(m.index for m in ms))


def slices(members: Sequence[Logical]) -> tuple[tuple[int, int], ...]:
    """Each member's size in compute units, as MIG slices (none for a lone GPU)."""
    if len(members) < 2:
        return ()
    return tuple((i, m.compute_units or 1) for i, m in enumerate(members))


def busy_reported(samples: Sequence[ProcessSample]) -> bool:
    """Every process has a busy time, and some has one: all 0 is a kernel that does not
    report it (DRM fdinfo without engine time)."""
    return all(s.gfx_ns is not None for s in samples) and any(s.gfx_ns for s in samples)


def processes(
    samples: Sequence[ProcessSample],
    previous: Mapping[BusyKey, int] | None,
    elapsed_s: float | None,
    vram_total: Mapping[int | None, int],
) -> tuple[tuple[GpuProcess, ...], dict[BusyKey, int]]:
    """The processes with their weight (GpuProcess.sm_util), and the busy times to keep.

    The weight is each process's GFX busy time since the last read, in percent of the
    interval: measured over the whole interval, not a sampled utilisation. Where some
    process has no busy time (or none has any), every process's VRAM in percent of its
    member's memory stands in; where that is missing too, the split is equal.
    A process not seen at the last read started since: all its busy time is new.
    previous None: the first read, with no interval to weigh.
    """
    busy = {(s.member, s.pid): s.gfx_ns for s in samples if s.gfx_ns is not None}
    weights: dict[BusyKey, int] = {}
    if previous is not None and elapsed_s and busy_reported(samples):
        for key, ns in busy.items():
            before = previous.get(key, 0)
            used = ns - before if ns >= before else ns  # a reused PID: a new process
            weights[key] = round(used / (elapsed_s * 1e9) * 100)
    elif all(s.vram_bytes is not None for s in samples):
        held = sum(s.vram_bytes or 0 for s in samples) or 1
        for s in samples:
            total = vram_total.get(s.member) or held
            weights[(s.member, s.pid)] = round((s.vram_bytes or 0) / total * 100)
    out = tuple(
        GpuProcess(
            pid=s.pid,
            used_memory_bytes=s.vram_bytes,
            sm_util=weights.get((s.member, s.pid)),
            gpu_instance_id=s.member,
        )
        for s in samples
    )
    return out, {key: ns for key, ns in busy.items() if ns is not None}
