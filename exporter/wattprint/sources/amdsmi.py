"""AMD Instinct GPUs through AMD SMI (`amdsmi`, AMD's Python binding shipped with ROCm).

Energy is the hardware accumulator (amdsmi_get_energy_count: counts x resolution, in
µJ), kept monotonic across wraps and driver reloads by MonotonicCounter; power is
integrated (and marked estimated) only where a device has no counter. Partitions and
dual-die boards share one package's energy: sources/amdsmi_devices.py groups them.
Runs only on the sampler thread; one GPU failing never stops the others. Not yet run on
AMD hardware: docs/power-models.md says which figures to check there first.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from wattprint.core.model import DeviceReading, GpuProcess, SourceResult
from wattprint.sources.amdsmi_devices import (
    BusyKey,
    Logical,
    ProcessSample,
    busy_reported,
    group,
    processes,
    slices,
)
from wattprint.sources.counters import DEFAULT_MAX_POWER_W, MonotonicCounter, PowerIntegrator
from wattprint.sources.gpufaults import NO_PROCESSES, PROCESSES_AGAIN, Fault, read_each
from wattprint.sources.registry import METHOD_AMDSMI_COUNTER, METHOD_AMDSMI_INTEGRATED

log = logging.getLogger(__name__)

_REINIT_EVERY_S = 30.0
_NOT_SUPPORTED = 2  # AMDSMI_STATUS_NOT_SUPPORTED (amd_smi/amdsmi.h)
# MI200 and MI300 keep a 64-bit accumulator; older boards (MI100) a 32-bit one, which
# wraps within minutes at full power. Until a reading passes 2**32 counts, a drop
# that a wrap explains is taken for one.
_NARROW_COUNTS = 2**32
# What a malformed answer raises here: a key missing, "N/A" where a number belongs.
_BAD_VALUE = (KeyError, TypeError, ValueError, AttributeError)
_AMD_VENDOR = "0x1002"  # ATI/AMD graphics (AMD's CPUs and chipsets are 0x1022)
# VGA, 3D, display controller (MI100, MI200), processing accelerator (MI300).
_GPU_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")


def amd_gpus_on_pci(sysfs_root: str | Path = "/sys") -> int:
    """AMD GPUs the PCI bus shows, whether or not a driver or AMD SMI can reach them."""
    try:
        devices = list(Path(sysfs_root, "bus", "pci", "devices").iterdir())
    except OSError:
        return 0
    count = 0
    for device in devices:
        try:
            if (device / "vendor").read_text(encoding="ascii").strip() != _AMD_VENDOR:
                continue
            pci_class = (device / "class").read_text(encoding="ascii").strip()
        except (OSError, ValueError):
            continue
        count += pci_class.startswith(_GPU_CLASSES)
    return count


class Unmeasured:
    """AMD GPUs on the PCI bus without the library to read them: no devices, and an
    error each read, so wattprint_collector_success{collector="amdsmi"} 0 says so."""

    name = "amdsmi"

    def __init__(self, why: str) -> None:
        self.why = why

    def read(self) -> SourceResult:
        return SourceResult(errors=[self.why])

    def explain(self) -> list[str]:
        return [f"gpu: none ({self.why})"]

    def close(self) -> None:
        pass


def _load_amdsmi() -> ModuleType:
    # Importing amdsmi loads libamd_smi.so: a missing ROCm fails here, as OSError too.
    return importlib.import_module("amdsmi")


def _number(value: Any) -> float | None:
    """A value AMD SMI reports, or None for its "N/A"."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str:
    text = value.decode() if isinstance(value, bytes) else str(value)
    return "" if text.strip() in ("", "N/A") else text.strip()


@dataclass
class _Gpu:
    """One exported GPU: the logical GPUs that share its energy, members[0] reads it."""

    members: list[Logical]
    has_counter: bool
    resolution_uj: float
    counter: MonotonicCounter = field(default_factory=MonotonicCounter)
    integrator: PowerIntegrator = field(default_factory=PowerIntegrator)
    busy: dict[BusyKey, int] | None = None  # GFX ns at the last read; None before one
    read_at: float | None = None
    read_fault: Fault = field(default_factory=Fault)
    processes_fault: Fault = field(default_factory=Fault)
    glitches_logged: bool = False

    @property
    def label(self) -> str:
        return str(min(m.index for m in self.members))

    @property
    def uuid(self) -> str:
        return self.members[0].uuid

    @property
    def key(self) -> tuple[str, str]:
        """Who it is across a driver reload: a UUID may be empty, or shared by partitions."""
        return self.uuid, self.members[0].bdf

    @property
    def method(self) -> str:
        return METHOD_AMDSMI_COUNTER if self.has_counter else METHOD_AMDSMI_INTEGRATED


class AmdSmiSource:
    """AMD GPUs' energy accumulators, power and processes, read through AMD SMI."""

    name = "amdsmi"

    def __init__(
        self,
        amdsmi: ModuleType | Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        required: bool = False,
        pci_gpus: int = 0,
    ) -> None:
        self._smi = amdsmi if amdsmi is not None else _load_amdsmi()
        self.pci_gpus = pci_gpus  # AMD GPUs the PCI bus shows: none of them may go unread
        # Under --gpu.source=auto a machine without AMD GPUs is normal: no warning.
        self._failure_level = logging.WARNING if required or pci_gpus else logging.INFO
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

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    # -- opening ----------------------------------------------------------------------

    def _init(self) -> None:
        smi = self._smi
        self._next_init = self._clock() + _REINIT_EVERY_S
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            handles = list(smi.amdsmi_get_processor_handles())
        except smi.AmdSmiException as err:
            message = f"AMD SMI init failed: {err}"
            if message != self._init_error:
                log.log(self._failure_level, "%s; AMD GPUs will not be measured", message)
                self._failure_level = logging.WARNING  # once GPUs were expected
            self._init_error = message
            return
        logicals = []
        resolution: dict[int, float] = {}
        for index, handle in enumerate(handles):
            try:
                logical, resolution[index] = self._open(index, handle)
            except (smi.AmdSmiException, *_BAD_VALUE) as err:
                log.warning("AMD GPU %d: cannot be opened: %s", index, err)
                continue
            logicals.append(logical)
        known = {gpu.key: gpu for gpu in self._gpus}
        gpus = []
        for members in group(logicals):
            reader = members[0]
            previous = known.pop((reader.uuid, reader.bdf), None)
            if previous is not None:
                # After a driver reload keep the accumulated state: the counter sees
                # the accumulator's restart from 0 as a reset, so nothing goes down.
                previous.members = members
                gpus.append(previous)
                continue
            gpu = _Gpu(members, reader.counter, resolution.get(reader.index, 0.0))
            if gpu.has_counter:
                gpu.counter.wrap_at = int(_NARROW_COUNTS * gpu.resolution_uj)
            else:
                log.info(
                    "AMD GPU %s (%s): no energy counter; integrating power", gpu.label, reader.model
                )
            gpu.counter.max_power_w = self._power_cap(reader.handle)
            gpus.append(gpu)
        self._gpus = gpus
        self._initialised = True
        if self._init_error:
            log.info("AMD SMI initialised after earlier failure: %d GPU(s)", len(gpus))
        self._init_error = ""

    def _open(self, index: int, handle: Any) -> tuple[Logical, float]:
        smi = self._smi
        asic = smi.amdsmi_get_gpu_asic_info(handle)
        board = self._optional(smi.amdsmi_get_gpu_board_info, handle) or {}
        model = _text(asic.get("market_name")) or _text(board.get("product_name")) or "AMD GPU"
        counts, resolution = 0, 0.0
        energy = self._optional(smi.amdsmi_get_energy_count, handle)
        if energy is not None:
            counts, resolution = _counts(energy), float(energy["counter_resolution"])
        logical = Logical(
            index=index,
            handle=handle,
            uuid=_text(smi.amdsmi_get_gpu_device_uuid(handle)),
            bdf=_text(smi.amdsmi_get_gpu_device_bdf(handle)),
            serial=_text(board.get("product_serial")),
            model=model,
            compute_units=int(_number(asic.get("num_compute_units")) or 0),
            counter=counts > 0 and resolution > 0,
            power=bool(self._power(handle)),
        )
        return logical, resolution

    def _optional(self, call: Callable[[Any], Any], handle: Any) -> Any:
        """call(handle), or None where the device does not support it."""
        try:
            return call(handle)
        except self._smi.AmdSmiLibraryException as err:
            if getattr(err, "err_code", None) == _NOT_SUPPORTED:
                return None
            raise

    def _power_cap(self, handle: Any) -> float:
        try:
            cap_uw = _number(
                (self._optional(self._smi.amdsmi_get_power_cap_info, handle) or {}).get("power_cap")
            )
        except (self._smi.AmdSmiException, *_BAD_VALUE):
            cap_uw = None
        return cap_uw / 1e6 if cap_uw else DEFAULT_MAX_POWER_W["gpu"]

    def _power(self, handle: Any) -> float | None:
        """Socket power in W: the current reading (MI300), else the average (MI200)."""
        info = self._optional(self._smi.amdsmi_get_power_info, handle) or {}
        for key in ("current_socket_power", "average_socket_power"):
            watts = _number(info.get(key))
            if watts:
                return watts
        return None

    # -- reading ----------------------------------------------------------------------

    def read(self) -> SourceResult:
        smi = self._smi
        if not self._initialised:
            if self._clock() >= self._next_init:
                self._init()
            if not self._initialised:
                return SourceResult(errors=[self._why_none()])
        if not self._gpus and self.pci_gpus:
            # Opened, but it sees none of them (no access to /dev/kfd, a driver still
            # loading): an error each read, and AMD SMI opened again every 30 s.
            if self._clock() >= self._next_init:
                self._try_shutdown()
                self._initialised = False
                self._init()
            if not self._gpus:
                return SourceResult(errors=[self._why_none()])
        result, all_lost = read_each(
            self._gpus,
            self._read_gpu,
            (smi.AmdSmiException, *_BAD_VALUE),
            lambda e: isinstance(e, smi.AmdSmiLibraryException),
            log,
            "AMD ",
        )
        if all_lost and self._clock() >= self._next_init:
            # Every GPU failing at once looks like a driver reload: open AMD SMI again.
            self._try_shutdown()
            self._initialised = False
            self._init()
        return result

    def _read_gpu(self, gpu: _Gpu, errors: list[str]) -> DeviceReading:
        reader = gpu.members[0]
        now = self._clock()
        power_w = self._power(reader.handle)
        if gpu.has_counter:
            energy = self._smi.amdsmi_get_energy_count(reader.handle)
            counts = _counts(energy)
            if counts >= _NARROW_COUNTS:
                gpu.counter.wrap_at = None  # a 64-bit accumulator: a drop is a reset
            errors_before = gpu.counter.errors
            gpu.counter.update(int(counts * float(energy["counter_resolution"])), now)
            if gpu.counter.errors != errors_before:
                message = f"GPU {gpu.label}: energy {gpu.counter.last_error}"
                errors.append(message)
                if not gpu.glitches_logged:
                    log.warning("AMD %s (logged once per GPU; counted in errors)", message)
                    gpu.glitches_logged = True
        elif power_w is not None:
            gpu.integrator.update(now, power_w)
        else:
            errors.append(f"GPU {gpu.label}: no energy counter and no power reading")
        elapsed = None if gpu.read_at is None else now - gpu.read_at
        gpu.read_at = now
        held = self._processes(gpu, elapsed, errors)
        return DeviceReading(
            component="gpu",
            device=gpu.label,
            energy_uj=gpu.counter.total if gpu.has_counter else gpu.integrator.total,
            power_w=power_w,
            method=gpu.method,
            uuid=gpu.uuid,
            model=reader.model,
            processes=held,
            mig_slices=slices(gpu.members),
            raw_uj=gpu.counter.raw if gpu.has_counter else None,
            raw_wrap_uj=gpu.counter.wrap_at if gpu.has_counter else None,
            max_power_w=gpu.counter.max_power_w,
        )

    def _processes(
        self, gpu: _Gpu, elapsed: float | None, errors: list[str]
    ) -> tuple[GpuProcess, ...]:
        """Who holds each member, weighted by GFX busy time (VRAM where there is none).

        The process list failing must not lose the energy reading: the energy then goes
        to unattributed for this interval and the error is counted, logged once.
        """
        smi = self._smi
        shared = len(gpu.members) > 1
        samples: list[ProcessSample] = []
        vram_total: dict[int | None, int] = {}
        try:
            for position, member in enumerate(gpu.members):
                key = position if shared else None
                for proc in smi.amdsmi_get_gpu_process_list(member.handle):
                    samples.append(_sample(proc, key))
            if samples and not busy_reported(samples):  # only the fallback needs it
                for position, member in enumerate(gpu.members):
                    vram_total[position if shared else None] = self._vram_total(member.handle)
        except (smi.AmdSmiException, *_BAD_VALUE) as err:
            gpu.processes_fault.failed(log, err, NO_PROCESSES, "AMD ", gpu.label, gpu.uuid, err)
            errors.append(f"GPU {gpu.label}: process list: {err}")
            gpu.busy = None
            return ()
        gpu.processes_fault.over(log, PROCESSES_AGAIN, "AMD ", gpu.label, gpu.uuid)
        held, gpu.busy = processes(samples, gpu.busy, elapsed, vram_total)
        return held

    def _vram_total(self, handle: Any) -> int:
        try:
            usage = self._optional(self._smi.amdsmi_get_gpu_vram_usage, handle) or {}
        except self._smi.AmdSmiException:
            return 0
        return int((_number(usage.get("vram_total")) or 0) * 1024 * 1024)  # MB

    # -- the rest ---------------------------------------------------------------------

    def _why_none(self) -> str:
        why = self._init_error or "AMD SMI found no AMD GPU"
        if self.pci_gpus:
            why += f"; {self.pci_gpus} AMD GPU(s) on the PCI bus are not measured"
        return why

    def explain(self) -> list[str]:
        if not self._initialised or not self._gpus:
            return [f"gpu: none ({self._why_none()})"]
        lines = []
        for gpu in self._gpus:
            reader = gpu.members[0]
            line = (
                f"gpu {gpu.label} ({reader.model}, {gpu.uuid}, PCI {reader.bdf}"
                + (f", serial {reader.serial}" if reader.serial else "")
                + f"): {gpu.method}"
            )
            if not gpu.has_counter:
                line += " (no energy counter: power integrated)"
            if len(gpu.members) > 1:
                others = ", ".join(str(m.index) for m in gpu.members[1:])
                line += f"; AMD SMI GPUs {others} share its energy (partitions or dies)"
            lines.append(line)
        return lines

    def _try_shutdown(self) -> None:
        with contextlib.suppress(self._smi.AmdSmiException):
            self._smi.amdsmi_shut_down()

    def close(self) -> None:
        if self._initialised:
            self._try_shutdown()
            self._initialised = False


def _counts(energy: dict[str, Any]) -> int:
    # "energy_accumulator" since ROCm 6.2; before, the same value under "power".
    value = energy.get("energy_accumulator", energy.get("power"))
    number = _number(value)
    if number is None:
        raise ValueError(f"energy accumulator {value!r} is not a number")
    return int(number)


def _sample(proc: Any, member: int | None) -> ProcessSample:
    """One entry of amdsmi_get_gpu_process_list (a dict since ROCm 6.1)."""
    engine = proc.get("engine_usage") or {}
    memory = proc.get("memory_usage") or {}
    gfx = _number(engine.get("gfx"))
    vram = _number(memory.get("vram_mem"))
    if vram is None:
        vram = _number(proc.get("mem"))
    return ProcessSample(
        pid=int(proc["pid"]),
        member=member,
        gfx_ns=None if gfx is None else int(gfx),
        vram_bytes=None if vram is None else int(vram),
    )
