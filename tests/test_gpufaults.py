"""sources/gpufaults.py, the fault handling NVML and AMD SMI share: a GPU's fault is
logged once per kind of error and once when it is over; one GPU failing never stops
the others; all of them lost at once is said, for the caller to reopen its library."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from wattprint.core.model import DeviceReading
from wattprint.sources.gpufaults import Fault, read_each

log = logging.getLogger("test_gpufaults")


class Lost(Exception):
    pass


class Busy(Exception):
    pass


@dataclass
class Gpu:
    label: str
    uuid: str
    fails: Exception | None = None
    read_fault: Fault = field(default_factory=Fault)


def lost(err: Exception) -> bool:
    return isinstance(err, Lost)


def read(gpu: Gpu, errors: list[str]) -> DeviceReading:
    if gpu.fails is not None:
        raise gpu.fails
    return DeviceReading("gpu", gpu.label, 1, 100.0, "nvml-energy")


def test_one_gpu_failing_is_said_once_and_never_stops_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpus = [Gpu("0", "GPU-a", Busy("busy")), Gpu("1", "GPU-b")]
    with caplog.at_level(logging.INFO, logger="test_gpufaults"):
        for _ in range(3):
            result, all_lost = read_each(gpus, read, (Lost, Busy), lost, log, "AMD ")
            assert [d.device for d in result.devices] == ["1"] and not all_lost
            assert result.errors == ["GPU 0: busy"]
        gpus[0].fails = Lost("gone")  # another kind of error: said again
        read_each(gpus, read, (Lost, Busy), lost, log, "AMD ")
        gpus[0].fails = None
        read_each(gpus, read, (Lost, Busy), lost, log, "AMD ")
        read_each(gpus, read, (Lost, Busy), lost, log, "AMD ")
    assert [r.getMessage() for r in caplog.records] == [
        "AMD GPU 0 (GPU-a): read failed: busy",
        "AMD GPU 0 (GPU-a): read failed: gone",
        "AMD GPU 0 (GPU-a): readable again",
    ]


def test_every_gpu_lost_at_once_is_told_apart() -> None:
    gpus = [Gpu("0", "GPU-a", Lost("gone")), Gpu("1", "GPU-b", Lost("gone"))]
    assert read_each(gpus, read, (Lost, Busy), lost, log)[1]
    gpus[1].fails = Busy("busy")  # one merely busy: not a driver reload
    assert not read_each(gpus, read, (Lost, Busy), lost, log)[1]
    assert not read_each([], read, (Lost,), lambda _: True, log)[1]
