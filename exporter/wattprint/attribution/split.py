"""Splitting each device's energy among the workloads that used it. Pure: no I/O.

Every function takes an integer number of micro-joules and returns integer parts whose
sum is exactly that number; the key None stands for "unattributed" (idle time, the
system, processes with no known workload). That is what makes the exported workload
and unattributed counters add up to the device counters exactly.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from wattprint.core.model import GpuProcess, Workload

K = TypeVar("K", bound=Hashable)
Parts = dict[Workload | None, int]


def split(total: int, weights: Mapping[K, float]) -> dict[K, int]:
    """Split total into integer parts proportional to weights (largest remainder).

    Returns {} when there is nothing to weigh by; otherwise the parts sum to total.
    """
    positive = {key: float(w) for key, w in weights.items() if w > 0}
    return _split(total, list(positive), list(positive.values()))


def _split(total: int, keys: list[K], weights: list[float]) -> dict[K, int]:
    """split() of positive float weights, given as two lists in the keys' order."""
    weight_sum = sum(weights)
    if not keys or weight_sum <= 0:
        return {}
    # Lists and comprehensions, not a loop over dicts: a sample splits among a hundred
    # jobs, twice.
    exact = [total * w / weight_sum for w in weights]
    floor = math.floor  # int(x // 1), at a third of the cost
    whole = [floor(x) for x in exact]
    parts = dict(zip(keys, whole, strict=True))
    short = total - sum(whole)
    if short <= 0:
        return parts
    # Hand out what rounding down left over, biggest fractions first; ties by key
    # order (repr) so the result does not depend on dict order. Only the fractions tied
    # at the cut are ordered by key.
    if short >= len(keys):
        given = keys
    else:
        fractions = [x - w for x, w in zip(exact, whole, strict=True)]
        cut = sorted(fractions, reverse=True)[short - 1]
        given = [key for key, f in zip(keys, fractions, strict=True) if f > cut]
        tied = sorted((k for k, f in zip(keys, fractions, strict=True) if f == cut), key=repr)
        given += tied[: short - len(given)]
    for key in given:
        parts[key] += 1
    return parts


def merge(into: Parts, parts: Mapping[Workload | None, int]) -> Parts:
    for key, value in parts.items():
        if value:
            into[key] = into.get(key, 0) + value
    return into


Resolve = Callable[[GpuProcess], Workload | None]


def _by_utilization(delta_uj: int, processes: Sequence[GpuProcess], resolve: Resolve) -> Parts:
    """The default GPU policy (README, "How energy is split among jobs") among the
    processes that share one GPU (or MIG instance)."""
    if not processes:
        return {None: delta_uj}
    sampled = {i: p.sm_util for i, p in enumerate(processes) if p.sm_util is not None}
    weights: dict[int, float] = {i: float(u) for i, u in sampled.items() if u > 0}
    if not weights:
        # No utilization sample (or all zero): the holders share the GPU equally;
        # the holder pays for idle draw too.
        weights = {i: 1.0 for i in range(len(processes))}
    parts: Parts = {}
    for i, energy in split(delta_uj, weights).items():
        merge(parts, {resolve(processes[i]): energy})
    return parts


def _mig_activity(processes: Iterable[GpuProcess]) -> float | None:
    utils = [p.sm_util for p in processes if p.sm_util is not None]
    return sum(utils) / len(utils) if utils else None


def attribute_gpu(
    delta_uj: int,
    processes: Sequence[GpuProcess],
    resolve: Resolve,
    mig_slices: Mapping[int, int] | None = None,
) -> Parts:
    """One GPU's energy over one interval, by the processes that held it.

    MIG: NVML measures only the whole GPU. The slices of instances that nobody used go
    to unattributed; the rest is shared among occupied instances by slice count,
    weighted by their mean SM utilization when every occupied instance has a sample,
    then within an instance by the usual policy.
    """
    if delta_uj <= 0:
        return {}
    on_mig = [p for p in processes if p.gpu_instance_id is not None]
    if not mig_slices or not on_mig:
        return _by_utilization(delta_uj, processes, resolve)
    groups: dict[int, list[GpuProcess]] = defaultdict(list)
    for p in on_mig:
        groups[p.gpu_instance_id].append(p)  # type: ignore[index]
    total_slices = sum(mig_slices.values()) or 1
    occupied = {gi: mig_slices.get(gi, 1) for gi in groups}
    idle_slices = max(total_slices - sum(occupied.values()), 0)
    shares = split(delta_uj, {"occupied": total_slices - idle_slices, "idle": idle_slices})
    parts: Parts = {None: shares.get("idle", 0)}
    activity = {gi: _mig_activity(ps) for gi, ps in groups.items()}
    weights: dict[int, float] = dict(occupied)
    known = {gi: a for gi, a in activity.items() if a is not None}
    if len(known) == len(groups) and sum(known.values()) > 0:
        weights = {gi: occupied[gi] * known[gi] for gi in groups}
    for gi, energy in split(shares.get("occupied", 0), weights).items():
        merge(parts, _by_utilization(energy, groups[gi], resolve))
    return {key: value for key, value in parts.items() if value}


def attribute_by_share(delta_uj: int, usage: Mapping[Workload, int], capacity: int) -> Parts:
    """Energy by each workload's share of a node-wide resource; the rest unattributed.

    CPU: usage = CPU ticks each workload used in the interval, capacity = all CPU
    ticks of the node in the interval (idle included), so idle and system time stay
    unattributed. Memory: usage = resident bytes, capacity = installed memory.
    """
    if delta_uj <= 0:
        return {}
    pairs = [(w, u) for w, u in usage.items() if u > 0]
    keys: list[Workload | None] = [w for w, _ in pairs]
    used = [u for _, u in pairs]
    used_sum = sum(used)
    capacity = max(capacity, used_sum)
    if capacity <= 0:
        return {None: delta_uj}
    # The floats split() would make of {**used, None: the rest}, in that order: the same
    # sums and quotients, so the same parts.
    weights = [float(u) for u in used]
    if capacity > used_sum:
        keys.append(None)
        weights.append(float(capacity - used_sum))
    parts = _split(delta_uj, keys, weights)
    return parts or {None: delta_uj}
