"""A stand-in for the `amdsmi` module (AMD SMI's Python binding) at the library boundary.

Names are the real package's, taken from ROCm/amdsmi (py-interface/amdsmi_interface.py,
py-interface/amdsmi_exception.py and include/amd_smi/amdsmi.h, the ROCm 6.2-6.3 tree):
the functions Wattprint calls with the dict keys they return, AmdSmiException and
AmdSmiLibraryException(err_code) with the status codes of amdsmi_status_t, and
AmdSmiInitFlags. Its hardware is simulated here: boards draw a set power, their
accumulator counts in `resolution_uj` steps (wrapping at 2**counter_bits), processes
accumulate GFX busy time. Tests move time with step(); a driver reload with reload().
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

# amdsmi_status_t (amd_smi/amdsmi.h)
STATUS_NOT_SUPPORTED = 2
STATUS_NOT_FOUND = 31
STATUS_NOT_INIT = 32
STATUS_DRIVER_NOT_LOADED = 34
# The accumulator's unit on MI200/MI300 (the float the library returns).
RESOLUTION_UJ = 15.259000778198242


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code

    def __str__(self) -> str:
        return f"An error occured with code: {self.err_code}"

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(9)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(8)


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1
    INIT_NON_AMD_CPUS = 1 << 2
    INIT_NON_AMD_GPUS = 1 << 3
    INIT_AMD_APUS = (1 << 0) | (1 << 1)


@dataclass
class FakeProcess:
    pid: int
    busy: float  # share of each second its GFX engine is busy
    vram_bytes: int = 8 << 30
    gfx_ns: int = 0


@dataclass
class Board:
    """One physical package: a GPU, its partitions (one PCI device) or its dies."""

    bus: int
    serial: str
    power_w: float = 500.0
    model: str = "AMD Instinct MI300X"
    partitions: int = 1  # logical GPUs in its PCI device (CPX: 8)
    dies: int = 1  # PCI devices sharing it (MI250X: 2); only die 0 reports energy
    counter_bits: int = 64
    resolution_uj: float = RESOLUTION_UJ
    counts: int = 7 * 3_000_000_000  # a 64-bit accumulator well past 2**32 counts
    has_counter: bool = True
    cap_w: float = 750.0
    compute_units: int = 304
    busy_reported: bool = True  # False: the process list's gfx time stays 0
    vram_mb: int = 196_608
    procs: dict[int, list[FakeProcess]] = field(default_factory=dict)  # by logical
    drawn_counts: int = 0  # every count the hardware added, across wraps and reloads

    @property
    def logicals(self) -> int:
        return max(self.partitions, self.dies)


@dataclass(frozen=True)
class Handle:
    board: int
    logical: int
    generation: int


@dataclass
class FakeAmdSmi:
    boards: list[Board]
    generation: int = 0
    initialised: bool = False
    init_error: int | None = None
    faults: dict[int, int] = field(default_factory=dict)  # AMD SMI index -> err_code
    process_faults: dict[int, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    now_ns: int = 0

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiRetryException = AmdSmiRetryException
    AmdSmiTimeoutException = AmdSmiTimeoutException
    AmdSmiInitFlags = AmdSmiInitFlags

    # -- the simulated hardware ---------------------------------------------------------

    def step(self, seconds: float = 1.0) -> None:
        self.now_ns += int(seconds * 1e9)
        for board in self.boards:
            added = round(board.power_w * seconds * 1e6 / board.resolution_uj)
            board.drawn_counts += added
            board.counts = (board.counts + added) % (1 << board.counter_bits)
            for procs in board.procs.values():
                for proc in procs:
                    proc.gfx_ns += int(proc.busy * seconds * 1e9)

    def reload(self) -> None:
        """The amdgpu driver reloaded: handles go stale, accumulators restart at 0."""
        self.generation += 1
        self.initialised = False
        for board in self.boards:
            board.counts = 0

    def index_of(self, handle: Handle) -> int:
        return sum(b.logicals for b in self.boards[: handle.board]) + handle.logical

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _board(self, handle: Handle) -> Board:
        if not self.initialised or handle.generation != self.generation:
            raise AmdSmiLibraryException(STATUS_NOT_INIT)
        fault = self.faults.get(self.index_of(handle))
        if fault is not None:
            raise AmdSmiLibraryException(fault)
        return self.boards[handle.board]

    # -- the amdsmi API surface Wattprint uses -----------------------------------------

    def amdsmi_init(self, flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        self._count("amdsmi_init")
        if self.init_error is not None:
            raise AmdSmiLibraryException(self.init_error)
        self.initialised = True

    def amdsmi_shut_down(self) -> None:
        self._count("amdsmi_shut_down")
        self.initialised = False

    def amdsmi_get_processor_handles(self) -> list[Handle]:
        if not self.initialised:
            raise AmdSmiLibraryException(STATUS_NOT_INIT)
        return [
            Handle(b, i, self.generation)
            for b, board in enumerate(self.boards)
            for i in range(board.logicals)
        ]

    def amdsmi_get_gpu_device_uuid(self, handle: Handle) -> str:
        board = self._board(handle)
        return f"{handle.logical:02x}ff74a1-0000-1000-80{board.bus:02x}-{board.serial[-12:]:0>12}"

    def amdsmi_get_gpu_device_bdf(self, handle: Handle) -> str:
        board = self._board(handle)
        if board.dies > 1:  # each die is its own PCI device
            return f"0000:{board.bus + handle.logical:02x}:00.0"
        return f"0000:{board.bus:02x}:00.{handle.logical}"  # partition id as the function

    def amdsmi_get_gpu_asic_info(self, handle: Handle) -> dict[str, Any]:
        board = self._board(handle)
        return {
            "market_name": board.model,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": f"0x{sum(map(ord, board.serial)):016X}",
            "oam_id": board.bus // 16,
            "num_compute_units": board.compute_units // board.logicals,
            "target_graphics_version": "gfx942",
        }

    def amdsmi_get_gpu_board_info(self, handle: Handle) -> dict[str, Any]:
        board = self._board(handle)
        return {
            "model_number": "102-G30211-00",
            "product_serial": board.serial,
            "fru_id": "N/A",
            "product_name": board.model,
            "manufacturer_name": "AMD",
        }

    def amdsmi_get_energy_count(self, handle: Handle) -> dict[str, Any]:
        self._count("amdsmi_get_energy_count")
        board = self._board(handle)
        if not board.has_counter:
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)
        # Partitions each report the package's counter; a second die reports 0.
        counts = 0 if board.dies > 1 and handle.logical > 0 else board.counts
        return {
            "power": counts,  # the old key, "deprecating in 6.4"
            "energy_accumulator": counts,
            "counter_resolution": board.resolution_uj,
            "timestamp": self.now_ns,
        }

    def amdsmi_get_power_info(self, handle: Handle) -> dict[str, Any]:
        board = self._board(handle)
        silent = board.dies > 1 and handle.logical > 0
        return {
            "current_socket_power": 0 if silent else round(board.power_w),
            "average_socket_power": "N/A",  # MI300X reports none
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": round(board.cap_w),
        }

    def amdsmi_get_power_cap_info(self, handle: Handle) -> dict[str, Any]:
        board = self._board(handle)
        cap_uw = int(board.cap_w * 1e6)
        return {
            "power_cap": cap_uw,
            "default_power_cap": cap_uw,
            "dpm_cap": 2100,
            "min_power_cap": 0,
            "max_power_cap": cap_uw,
        }

    def amdsmi_get_gpu_vram_usage(self, handle: Handle) -> dict[str, Any]:
        board = self._board(handle)
        total = board.vram_mb // max(board.partitions, 1)
        used = sum(p.vram_bytes for p in board.procs.get(handle.logical, ())) >> 20
        return {"vram_total": total, "vram_used": used}

    def amdsmi_get_gpu_process_list(self, handle: Handle) -> list[dict[str, Any]]:
        self._count("amdsmi_get_gpu_process_list")
        board = self._board(handle)
        fault = self.process_faults.get(self.index_of(handle))
        if fault is not None:
            raise AmdSmiLibraryException(fault)
        return [
            {
                "name": f"python{p.pid}",
                "pid": p.pid,
                "mem": p.vram_bytes,
                "engine_usage": {"gfx": p.gfx_ns if board.busy_reported else 0, "enc": 0},
                "memory_usage": {"gtt_mem": 0, "cpu_mem": 1 << 20, "vram_mem": p.vram_bytes},
            }
            for p in board.procs.get(handle.logical, ())
        ]


def eight_gpu_node() -> FakeAmdSmi:
    """An 8-board node: five MI300X, an MI100-like board whose 32-bit accumulator is about
    to wrap, an MI300X in CPX (8 partitions) and an MI250X (two dies)."""
    boards = [
        Board(bus=0x0C + 0x10 * i, serial=f"692251001{i:03d}", power_w=400 + 40 * i)
        for i in range(5)
    ]
    boards.append(
        Board(
            bus=0x5C,
            serial="692251001005",
            model="AMD Instinct MI100",
            power_w=290.0,
            cap_w=300.0,
            counter_bits=32,
            counts=(1 << 32) - 40_000_000,  # about 2 s of 290 W before the wrap
            compute_units=120,
            vram_mb=32_768,
        )
    )
    boards.append(Board(bus=0x6C, serial="692251001006", power_w=700.0, partitions=8))
    boards.append(
        Board(
            bus=0x7C,
            serial="692251001007",
            model="AMD Instinct MI250X",
            power_w=480.0,
            cap_w=560.0,
            dies=2,
            compute_units=220,
            vram_mb=131_072,
        )
    )
    return FakeAmdSmi(boards)
