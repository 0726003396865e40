"""A stand-in for the pynvml module at the hardware boundary.

It answers the NVML calls Wattprint makes with values replayed from a recorded GPU
trace (tests/fixtures/h200/phased-load.jsonl) and raises pynvml's real exception
classes, so the code under test cannot tell it from a driver. Tests move time by
calling advance(); faults are injected per GPU through `faults`.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

TRACE = Path(__file__).resolve().parent / "fixtures" / "h200" / "phased-load.jsonl"


def load_trace_samples(path: Path = TRACE) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[1:] if line.strip()]


@dataclass
class FakeGpu:
    index: int
    uuid: str
    name: str
    samples: list[dict[str, Any]]  # per-GPU trace entries, in time order
    energy_offset_mj: int = 0  # added to the trace counter: driver reloads reset it
    has_counter: bool = True
    has_power: bool = True


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    position: int = 0
    energy_latency_s: float = 0.0  # the H200 measured ~3 ms per energy read
    util_latency_s: float = 0.0  # ~2.2 ms per process-utilization read
    init_error: type[pynvml.NVMLError] | None = None
    faults: dict[int, type[pynvml.NVMLError]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    # The real exception classes, as the code under test catches them.
    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_Unknown = pynvml.NVMLError_Unknown
    NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded

    @classmethod
    def from_trace(cls, copies: int = 1, path: Path = TRACE, **kwargs: Any) -> FakeNvml:
        samples = load_trace_samples(path)
        gpus = []
        for i in range(copies):
            # Each GPU gets its own copy, so a test can give GPUs different processes.
            entries = [copy.deepcopy(s["gpus"][0]) for s in samples]
            uuid = entries[0]["uuid"] if copies == 1 else f"{entries[0]['uuid'][:-4]}{i:04d}"
            gpus.append(FakeGpu(i, uuid, entries[0]["name"], entries))
        return cls(gpus=gpus, **kwargs)

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def advance(self, steps: int = 1) -> None:
        self.position = min(self.position + steps, len(self.gpus[0].samples) - 1)

    def _entry(self, handle: int) -> dict[str, Any]:
        fault = self.faults.get(handle)
        if fault is not None:
            raise fault()
        gpu = self.gpus[handle]
        return gpu.samples[min(self.position, len(gpu.samples) - 1)]

    def trace_energy_mj(self, handle: int, position: int | None = None) -> int:
        gpu = self.gpus[handle]
        pos = self.position if position is None else position
        return int(gpu.samples[pos]["energy_mj"])

    # --- the pynvml API surface Wattprint uses -------------------------------------
    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.gpus[handle].uuid

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.gpus[handle].name

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._count("nvmlDeviceGetPowerUsage")
        entry = self._entry(handle)  # an injected fault comes first
        if not self.gpus[handle].has_power:
            raise pynvml.NVMLError_NotSupported()
        return int(entry["power_mw"])

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self._count("nvmlDeviceGetTotalEnergyConsumption")
        gpu = self.gpus[handle]
        if not gpu.has_counter:
            raise pynvml.NVMLError_NotSupported()
        if self.energy_latency_s:
            time.sleep(self.energy_latency_s)
        return int(self._entry(handle)["energy_mj"]) + gpu.energy_offset_mj

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        entry = self._entry(handle)
        return [
            SimpleNamespace(
                pid=p["pid"],
                usedGpuMemory=p.get("used_memory_bytes"),
                gpuInstanceId=p.get("gpu_instance_id", 0xFFFFFFFF),
                computeInstanceId=0xFFFFFFFF,
            )
            for p in entry.get("processes") or ()
        ]

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen: int) -> list[Any]:
        self._count("nvmlDeviceGetProcessUtilization")
        if self.util_latency_s:
            time.sleep(self.util_latency_s)
        entry = self._entry(handle)
        samples = [
            SimpleNamespace(
                pid=p["pid"],
                timeStamp=self.position + 1,
                smUtil=p["sm_util"],
                memUtil=0,
                encUtil=0,
                decUtil=0,
            )
            for p in entry.get("processes") or ()
            if p.get("sm_util") is not None
        ]
        if not samples:
            raise pynvml.NVMLError_NotFound()
        return samples

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 0
