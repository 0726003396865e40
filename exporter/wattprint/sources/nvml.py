"""NVIDIA GPUs through NVML: energy counter, power gauge, compute processes.

Reading the energy counter and the per-process utilization takes milliseconds per GPU
(docs/performance.md), so this runs only on the sampler thread, never at scrape time.
One GPU failing (lost, Unknown) never stops the others.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from wattprint.core.model import DeviceReading, GpuProcess, SourceResult
from wattprint.sources.counters import DEFAULT_MAX_POWER_W, MonotonicCounter, PowerIntegrator
from wattprint.sources.gpufaults import NO_PROCESSES, PROCESSES_AGAIN, Fault, read_each
from wattprint.sources.registry import METHOD_NVML_COUNTER, METHOD_NVML_INTEGRATED

log = logging.getLogger(__name__)

# NVML's "no such value" for used memory under some drivers and in containers.
_NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
_REINIT_EVERY_S = 30.0


def _load_pynvml() -> ModuleType:
    import pynvml

    return pynvml


# PCI vendor NVIDIA; classes 0x0300 (VGA) and 0x0302 (3D controller): GPUs, not
# NVSwitches or audio functions.
_NVIDIA_VENDOR = "0x10de"
_GPU_CLASSES = ("0x0300", "0x0302")


def nvidia_gpus_on_pci(sysfs_root: str | Path = "/sys") -> int:
    """NVIDIA GPUs the PCI bus shows, whether or not a driver or NVML can reach them."""
    count = 0
    try:
        devices = list(Path(sysfs_root, "bus", "pci", "devices").iterdir())
    except OSError:
        return 0
    for device in devices:
        try:
            vendor = (device / "vendor").read_text(encoding="ascii").strip()
            if vendor != _NVIDIA_VENDOR:
                continue
            pci_class = (device / "class").read_text(encoding="ascii").strip()
        except (OSError, ValueError):
            continue
        count += pci_class.startswith(_GPU_CLASSES)
    return count


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    model: str
    has_counter: bool
    counter: MonotonicCounter = field(default_factory=MonotonicCounter)
    integrator: PowerIntegrator = field(default_factory=PowerIntegrator)
    last_util_timestamp: int = 0
    read_fault: Fault = field(default_factory=Fault)
    processes_fault: Fault = field(default_factory=Fault)
    glitches_logged: bool = False  # counter readings rejected: logged once per GPU

    @property
    def label(self) -> str:
        return str(self.index)

    @property
    def method(self) -> str:
        return METHOD_NVML_COUNTER if self.has_counter else METHOD_NVML_INTEGRATED

    @property
    def energy_uj(self) -> int:
        return self.counter.total if self.has_counter else self.integrator.total


class NvmlSource:
    """NVIDIA GPUs' energy counters, power and compute processes, read through NVML."""

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
        required: bool = False,
        pci_gpus: int = 0,
    ) -> None:
        self._nvml = nvml if nvml is not None else _load_pynvml()
        # NVIDIA GPUs on the PCI bus: NVML failing then means GPUs go unmeasured.
        self.pci_gpus = pci_gpus
        # With --gpu.source=auto a machine without NVML is normal, not worth a warning,
        # unless the PCI bus shows GPUs.
        required = required or pci_gpus > 0
        self._failure_level = logging.WARNING if required else logging.INFO
        self._clock = clock
        self._gpus: list[_Gpu] = []
        self._init_error = ""
        self._next_init = 0.0
        self._initialised = False
        self._init()

    @property
    def available(self) -> bool:
        return self._initialised

    @property
    def init_error(self) -> str:
        return self._init_error

    def _init(self) -> None:
        nv = self._nvml
        self._next_init = self._clock() + _REINIT_EVERY_S
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as err:
            message = f"NVML init failed: {err}"
            if message != self._init_error:
                log.log(self._failure_level, "%s; GPUs will not be measured", message)
                self._failure_level = logging.WARNING  # once GPUs were expected
            self._init_error = message
            return
        known = {gpu.uuid: gpu for gpu in self._gpus}
        gpus = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                model = _text(nv.nvmlDeviceGetName(handle))
            except nv.NVMLError as err:
                log.warning("GPU %d: cannot be opened: %s", index, err)
                continue
            previous = known.get(uuid)
            if previous is not None:
                # After a driver reload keep the accumulated state: the counter
                # object sees the raw drop as a reset, so the total never goes down.
                previous.handle, previous.index = handle, index
                gpus.append(previous)
                continue
            has_counter = True
            try:
                nv.nvmlDeviceGetTotalEnergyConsumption(handle)
            except nv.NVMLError_NotSupported:
                has_counter = False
                log.info("GPU %d (%s): no energy counter; integrating power", index, model)
            except nv.NVMLError:
                pass  # a transient failure; reads will tell
            gpu = _Gpu(index, handle, uuid, model, has_counter)
            gpu.counter.max_power_w = self._power_limit(handle)
            gpus.append(gpu)
        self._gpus = gpus
        self._initialised = True
        if self._init_error:
            log.info("NVML initialised after earlier failure: %d GPU(s)", len(gpus))
        self._init_error = ""

    def _power_limit(self, handle: Any) -> float:
        nv = self._nvml
        try:
            limit_mw = nv.nvmlDeviceGetEnforcedPowerLimit(handle)
        except (nv.NVMLError, AttributeError):
            return DEFAULT_MAX_POWER_W["gpu"]
        return limit_mw / 1000.0 if limit_mw and limit_mw > 0 else DEFAULT_MAX_POWER_W["gpu"]

    def read(self) -> SourceResult:
        nv = self._nvml
        if not self._initialised:
            if self._clock() >= self._next_init:
                self._init()
            if not self._initialised:
                return SourceResult(errors=[self._init_error])
        gone = (nv.NVMLError_Uninitialized, nv.NVMLError_GpuIsLost)
        result, all_lost = read_each(
            self._gpus, self._read_gpu, (nv.NVMLError,), lambda e: isinstance(e, gone), log
        )
        if all_lost and self._clock() >= self._next_init:
            # Every GPU gone at once looks like a driver reload: open NVML again.
            self._try_shutdown()
            self._initialised = False
            self._init()
        return result

    def _read_gpu(self, gpu: _Gpu, errors: list[str]) -> DeviceReading:
        nv = self._nvml
        power_w: float | None = None
        try:
            power_w = nv.nvmlDeviceGetPowerUsage(gpu.handle) / 1000.0
        except nv.NVMLError_NotSupported:
            # Some boards (and vGPU profiles) have the energy counter but no power
            # reading: the counter is all the energy needs; there is just no gauge.
            if not gpu.has_counter:
                raise
        if gpu.has_counter:
            errors_before = gpu.counter.errors
            raw_mj = int(nv.nvmlDeviceGetTotalEnergyConsumption(gpu.handle))
            gpu.counter.update(raw_mj * 1000, self._clock())
            if gpu.counter.errors != errors_before:
                message = f"GPU {gpu.index}: energy {gpu.counter.last_error}"
                errors.append(message)
                if not gpu.glitches_logged:
                    log.warning("%s (logged once per GPU; counted in errors)", message)
                    gpu.glitches_logged = True
        elif power_w is not None:
            gpu.integrator.update(self._clock(), power_w)
        processes, mig_slices = self._processes(gpu, errors)
        return DeviceReading(
            component="gpu",
            device=str(gpu.index),
            energy_uj=gpu.energy_uj,
            power_w=power_w,
            method=gpu.method,
            uuid=gpu.uuid,
            model=gpu.model,
            processes=processes,
            mig_slices=mig_slices,
            raw_uj=gpu.counter.raw if gpu.has_counter else None,
            max_power_w=gpu.counter.max_power_w,
        )

    def _processes(
        self, gpu: _Gpu, errors: list[str]
    ) -> tuple[tuple[GpuProcess, ...], tuple[tuple[int, int], ...]]:
        """Who holds the GPU, with SM utilization where NVML sampled it.

        Process discovery failing must not lose the energy reading: the energy then
        goes to unattributed for this interval, the error is counted, and the log says
        so once per GPU and kind of error.
        """
        nv = self._nvml
        try:
            running = nv.nvmlDeviceGetComputeRunningProcesses(gpu.handle)
        except nv.NVMLError as err:
            gpu.processes_fault.failed(log, err, NO_PROCESSES, "", gpu.index, gpu.uuid, err)
            errors.append(f"GPU {gpu.index}: process list: {err}")
            return (), ()
        gpu.processes_fault.over(log, PROCESSES_AGAIN, "", gpu.index, gpu.uuid)
        if not running:
            return (), ()
        util: dict[int, int] = {}
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.last_util_timestamp)
        except nv.NVMLError_NotFound:
            samples = []  # no process ran in the window: no sample, not an error
        except nv.NVMLError as err:
            log.debug("GPU %d: process utilization unavailable: %s", gpu.index, err)
            samples = []
        for sample in samples:
            gpu.last_util_timestamp = max(gpu.last_util_timestamp, int(sample.timeStamp))
            util[int(sample.pid)] = max(util.get(int(sample.pid), 0), int(sample.smUtil))
        processes = []
        for proc in running:
            memory = getattr(proc, "usedGpuMemory", None)
            if memory is None or memory >= _NVML_VALUE_NOT_AVAILABLE:
                memory = None
            instance = getattr(proc, "gpuInstanceId", None)
            if instance is not None and instance >= 0xFFFFFFFF:
                instance = None
            processes.append(
                GpuProcess(
                    pid=int(proc.pid),
                    used_memory_bytes=memory,
                    sm_util=util.get(int(proc.pid)),
                    gpu_instance_id=instance,
                )
            )
        mig = self._mig_slices(gpu) if any(p.gpu_instance_id is not None for p in processes) else ()
        return tuple(processes), mig

    def _mig_slices(self, gpu: _Gpu) -> tuple[tuple[int, int], ...]:
        nv = self._nvml
        slices: dict[int, int] = {}
        try:
            for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)):
                try:
                    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, i)
                except nv.NVMLError_NotFound:
                    continue
                instance = int(nv.nvmlDeviceGetGpuInstanceId(mig))
                slices[instance] = int(nv.nvmlDeviceGetAttributes(mig).gpuInstanceSliceCount)
        except nv.NVMLError as err:
            log.debug("GPU %d: MIG layout unavailable: %s", gpu.index, err)
        return tuple(sorted(slices.items()))

    def explain(self) -> list[str]:
        if not self._initialised:
            why = self._init_error or "NVML not available"
            if self.pci_gpus:
                why += f"; {self.pci_gpus} NVIDIA GPU(s) on the PCI bus are not measured"
            return [f"gpu: none ({why})"]
        if not self._gpus:
            return ["gpu: none (NVML found no GPU)"]
        return [
            f"gpu {gpu.index} ({gpu.model}, {gpu.uuid}): {gpu.method}"
            + ("" if gpu.has_counter else " (energy counter not supported: power integrated)")
            for gpu in self._gpus
        ]

    def _try_shutdown(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def close(self) -> None:
        if self._initialised:
            self._try_shutdown()
            self._initialised = False
