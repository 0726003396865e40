"""The sampler's GPUs: each one's energy split among the workloads that held it, and
whether the node measures as many GPUs as it should (--gpu.expect)."""

from __future__ import annotations

from collections.abc import Collection

from wattprint.attribution import split
from wattprint.core.model import DeviceReading, Workload
from wattprint.sampler.devices import DeviceKey
from wattprint.sampler.once import LogOnce


def attribute_gpu(reading: DeviceReading, delta: int, resolve: split.Resolve) -> split.Parts:
    """A GPU's energy by the policy: each replay segment to its own processes, the rest
    to the processes of this read."""
    mig = dict(reading.mig_slices)
    gpu_parts: split.Parts = {}
    remaining = delta
    for energy, processes in reading.segments:
        energy = min(energy, remaining)
        split.merge(gpu_parts, split.attribute_gpu(energy, processes, resolve, mig))
        remaining -= energy
    split.merge(gpu_parts, split.attribute_gpu(remaining, reading.processes, resolve, mig))
    return gpu_parts


def attribute_gap(
    reading: DeviceReading,
    energy: int,
    resolve: split.Resolve,
    held_before: set[Workload],
) -> split.Parts:
    """A GPU's gap energy goes, by the usual policy, to the workloads that held it both
    before and after the gap: nothing says who used it in between otherwise."""
    processes = tuple(p for p in reading.processes if resolve(p) in held_before)
    return split.attribute_gpu(energy, processes, resolve, dict(reading.mig_slices))


class ExpectedGpus:
    """A node that should have `expected` GPUs and measures fewer says so, in its
    metrics, its log (once) and /healthz's note: a GPU the driver lost, or a container
    that cannot reach it, otherwise only makes the node's energy smaller."""

    def __init__(self, expected: int, once: LogOnce) -> None:
        self.expected = expected  # 0: no expectation
        self.measured = 0  # GPUs read in the last sample
        self._once = once

    def count(self, read: Collection[DeviceKey]) -> None:
        self.measured = sum(1 for component, _ in read if component == "gpu")
        if self.note():
            self._once.warn("gpu-expect", self.note())
        else:
            self._once.clear("gpu-expect")

    def note(self) -> str:
        """Why the node measures fewer GPUs than expected ("" while it does not)."""
        if self.measured >= self.expected:
            return ""
        return f"{self.measured} of {self.expected} expected GPUs measured (--gpu.expect)"
