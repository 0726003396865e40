"""What the NVML and AMD SMI sources share about a GPU that fails: each of its faults
(its read, its process list) is logged once per kind of error and once more when it
is over, and every GPU of a read failing at once is told apart from one failing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from wattprint.core.model import DeviceReading, SourceResult

# A GPU's process list, unreadable and readable again: (vendor, label, uuid[, error]).
NO_PROCESSES = (
    "%sGPU %s (%s): process list unavailable (%s); its energy stays unattributed meanwhile"
)
PROCESSES_AGAIN = "%sGPU %s (%s): process list readable again"


@dataclass
class Fault:
    """One fault of one GPU: the kind of error last logged ("" while there is none)."""

    kind: str = ""

    def failed(self, log: logging.Logger, err: BaseException, message: str, *args: object) -> None:
        """Log `message` if `err` is a new kind of error for this fault."""
        kind = type(err).__name__
        if self.kind != kind:
            log.warning(message, *args)
            self.kind = kind

    def over(self, log: logging.Logger, message: str, *args: object) -> None:
        """Log `message` if the fault was on."""
        if self.kind:
            log.info(message, *args)
            self.kind = ""


class FaultyGpu(Protocol):
    read_fault: Fault

    @property
    def label(self) -> str: ...  # the index its series are exported under
    @property
    def uuid(self) -> str: ...


G = TypeVar("G", bound=FaultyGpu)


def read_each(
    gpus: Sequence[G],
    read: Callable[[G, list[str]], DeviceReading],
    failures: tuple[type[Exception], ...],
    lost: Callable[[Exception], bool],
    log: logging.Logger,
    vendor: str = "",
) -> tuple[SourceResult, bool]:
    """Every GPU read, one failing never stopping the others; and whether all of them
    failed as `lost` says a GPU gone fails (a driver reload: the caller opens its
    library again). `vendor` comes before "GPU" in the log."""
    result = SourceResult()
    gone = 0
    for gpu in gpus:
        where = f"{vendor}GPU {gpu.label} ({gpu.uuid})"
        try:
            result.devices.append(read(gpu, result.errors))
            gpu.read_fault.over(log, "%s: readable again", where)
        except failures as err:
            gpu.read_fault.failed(log, err, "%s: read failed: %s", where, err)
            result.errors.append(f"GPU {gpu.label}: {err}")
            gone += lost(err)
    return result, bool(gpus) and gone == len(gpus)
