"""Plays a recorded GPU trace (docs/metrics.md, "GPU trace format") as if it were NVML.

Trace time maps to wall time at --replay.speed. Every trace sample that falls between
two reads is applied in order, so the replayed counter rises by exactly the trace's
counter delta, and each sample's process state is kept as a segment so the energy is
split by who held the GPU when it was drawn. After the last sample all values hold.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wattprint.core.model import DeviceReading, GpuProcess, SourceResult, Workload
from wattprint.sources.counters import DEFAULT_MAX_POWER_W, MonotonicCounter
from wattprint.sources.registry import METHOD_REPLAY

TRACE_FORMAT = "wattprint-gpu-trace/v1"

log = logging.getLogger(__name__)


class TraceError(ValueError):
    """The trace file cannot be played; str() is one line naming the problem."""


@dataclass(frozen=True)
class TraceGpu:
    """One GPU in one sample of a recorded trace."""

    index: int
    uuid: str
    model: str
    power_mw: int
    energy_mj: int
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True)
class TraceSample:
    """One sample of a recorded trace: when, and every GPU's state."""

    t: float
    gpus: tuple[TraceGpu, ...]


def _identity(raw: Any) -> Workload | None:
    if not raw:
        return None
    return Workload(
        scheduler=str(raw.get("scheduler", "env")),
        workload=str(raw["workload"]),
        namespace=str(raw.get("namespace") or ""),
        pod=str(raw.get("pod") or ""),
    )


def _process(raw: dict[str, Any]) -> GpuProcess:
    util = raw.get("sm_util")
    memory = raw.get("used_memory_bytes")
    instance = raw.get("gpu_instance_id")
    return GpuProcess(
        pid=int(raw["pid"]),
        used_memory_bytes=None if memory is None else int(memory),
        sm_util=None if util is None else int(util),
        gpu_instance_id=None if instance is None else int(instance),
        identity=_identity(raw.get("identity")),
    )


def load_trace(path: str) -> tuple[dict[str, Any], list[TraceSample]]:
    """Parse and check a trace; raise TraceError naming the file and line."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.readlines()
    except OSError as err:
        raise TraceError(f"cannot read trace {path}: {err.strerror}") from None
    if not lines:
        raise TraceError(f"trace {path} is empty")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError:
        raise TraceError(f"trace {path} line 1: not JSON") from None
    if not isinstance(header, dict) or header.get("format") != TRACE_FORMAT:
        raise TraceError(f"trace {path} line 1: header must say format {TRACE_FORMAT!r}")
    samples: list[TraceSample] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            gpus = tuple(
                TraceGpu(
                    index=int(g["index"]),
                    uuid=str(g.get("uuid", "")),
                    model=str(g.get("name", "")),
                    power_mw=int(g["power_mw"]),
                    energy_mj=int(g["energy_mj"]),
                    processes=tuple(_process(p) for p in g.get("processes") or ()),
                )
                for g in raw["gpus"]
            )
            sample = TraceSample(t=float(raw["t"]), gpus=gpus)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise TraceError(f"trace {path} line {number}: bad sample ({err})") from None
        if samples and sample.t < samples[-1].t:
            raise TraceError(f"trace {path} line {number}: time goes backwards")
        samples.append(sample)
    if not samples:
        raise TraceError(f"trace {path} has a header but no samples")
    return header, samples


def _gpu_counter() -> MonotonicCounter:
    return MonotonicCounter(max_power_w=DEFAULT_MAX_POWER_W["gpu"])


@dataclass
class _ReplayGpu:
    last: TraceGpu
    counter: MonotonicCounter = field(default_factory=_gpu_counter)
    segments: list[tuple[int, tuple[GpuProcess, ...]]] = field(default_factory=list)
    glitches_logged: bool = False


class ReplaySource:
    """A recorded GPU trace played back in place of NVML (--gpu.source=replay)."""

    name = "replay"

    def __init__(
        self,
        path: str,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.header, self._samples = load_trace(path)
        self._speed = speed
        self._clock = clock
        # Trace time starts at the first read, which the sampler takes as its baseline:
        # samples applied before it would be in nobody's delta.
        self._start: float | None = None
        self._next = 0
        self._gpus: dict[int, _ReplayGpu] = {}
        # Restarted over a state file: trace time goes on from the first run's start,
        # and the samples played while the exporter was down are skipped, as the
        # hardware would have gone on without it.
        self._skip_to_now = False
        # The first sample is the baseline: counters start at 0 there, as a real
        # exporter's do when it starts next to a GPU that has been running for a while.
        self._apply(self._samples[0])
        self._next = 1

    @property
    def trace_start(self) -> float:
        return self._samples[0].t

    @property
    def trace_end(self) -> float:
        return self._samples[-1].t

    @property
    def finished(self) -> bool:
        return self._next >= len(self._samples)

    def _apply(self, sample: TraceSample, errors: list[str] | None = None) -> None:
        for g in sample.gpus:
            state = self._gpus.get(g.index)
            if state is None:
                state = self._gpus[g.index] = _ReplayGpu(last=g)
            errors_before = state.counter.errors
            added = state.counter.update(g.energy_mj * 1000, sample.t)
            if state.counter.errors != errors_before and errors is not None:
                message = f"GPU {g.index}: energy {state.counter.last_error}"
                errors.append(message)
                if not state.glitches_logged:
                    log.warning("%s (logged once per GPU; counted in errors)", message)
                    state.glitches_logged = True
            # The state in a sample applies to the interval that ends at it.
            if added:
                state.segments.append((added, g.processes))
            state.last = g

    def save_state(self) -> dict[str, object]:
        return {"path": self.path, "start": self._start}

    def restore_state(self, data: dict[str, object]) -> None:
        start = data.get("start")
        if data.get("path") == self.path and isinstance(start, (int, float)):
            self._start = float(start)
            self._skip_to_now = True

    def read(self) -> SourceResult:
        now = self._clock()
        if self._start is None:
            self._start = now
        trace_now = self.trace_start + (now - self._start) * self._speed
        errors: list[str] = []
        if self._skip_to_now:
            self._skip_to_now = False
            while self._next < len(self._samples) and self._samples[self._next].t <= trace_now:
                self._next += 1
            # The sample in force now is this run's baseline, as a first NVML read is.
            self._gpus = {}
            self._apply(self._samples[self._next - 1])
        while self._next < len(self._samples) and self._samples[self._next].t <= trace_now:
            self._apply(self._samples[self._next], errors)
            self._next += 1
        devices = []
        for index in sorted(self._gpus):
            state = self._gpus[index]
            devices.append(
                DeviceReading(
                    component="gpu",
                    device=str(index),
                    energy_uj=state.counter.total,
                    power_w=state.last.power_mw / 1000.0,
                    method=METHOD_REPLAY,
                    uuid=state.last.uuid,
                    model=state.last.model,
                    processes=state.last.processes,
                    segments=tuple(state.segments),
                    raw_uj=state.counter.raw,
                    max_power_w=state.counter.max_power_w,
                )
            )
            state.segments = []
        return SourceResult(devices=devices, errors=errors)

    def explain(self) -> list[str]:
        span = self.trace_end - self.trace_start
        return [
            f"gpu: replay of {self.path} ({len(self._samples)} samples, {span:.1f} s of trace "
            f"at {self._speed:g}x, {len(self._gpus)} GPU(s))"
        ]

    def close(self) -> None:
        pass
