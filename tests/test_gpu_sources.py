"""GPU sources: the replayed trace and NVML (through a fake at the pynvml boundary)."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import pynvml
import pytest

from fake_nvml import FakeNvml, load_trace_samples
from wattprint.core.model import SourceResult
from wattprint.sources import nvml
from wattprint.sources.nvml import NvmlSource
from wattprint.sources.registry import (
    METHOD_NVML_COUNTER,
    METHOD_NVML_INTEGRATED,
    SourceContext,
)
from wattprint.sources.replay import ReplaySource, TraceError
from wattprint.sources.select import choose


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def trace_delta_uj(samples: list[dict], first: int, last: int) -> int:
    return (samples[last]["gpus"][0]["energy_mj"] - samples[first]["gpus"][0]["energy_mj"]) * 1000


def test_replay_counter_rises_by_exactly_the_trace_delta(trace_path: Path) -> None:
    samples = load_trace_samples(trace_path)
    clock = Clock()
    source = ReplaySource(str(trace_path), speed=3.0, clock=clock)
    readings = []
    # Irregular read times: every trace sample between two reads must still be applied.
    for step in (0.05, 0.37, 1.0, 2.5, 0.01, 7.0, 40.0, 100.0):
        clock.now += step
        readings.append(source.read().devices[0].energy_uj)
    assert readings == sorted(readings)
    assert readings[-1] == trace_delta_uj(samples, 0, len(samples) - 1)
    assert source.finished
    # After the last sample all values hold.
    clock.now += 50
    assert source.read().devices[0].energy_uj == readings[-1]


def test_replay_maps_trace_time_at_speed(trace_path: Path) -> None:
    samples = load_trace_samples(trace_path)
    clock = Clock()
    source = ReplaySource(str(trace_path), speed=2.0, clock=clock)
    clock.now += 100.0  # the trace starts at the first read, not when the file is loaded
    assert source.read().devices[0].energy_uj == 0
    clock.now += 5.0  # 10 s of trace
    reading = source.read().devices[0]
    t_end = samples[0]["t"] + 10.0
    applied = max(i for i, s in enumerate(samples) if s["t"] <= t_end)
    assert reading.energy_uj == trace_delta_uj(samples, 0, applied)
    assert reading.power_w == samples[applied]["gpus"][0]["power_mw"] / 1000
    assert sum(energy for energy, _ in reading.segments) == reading.energy_uj


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty"),
        ('{"format": "other"}\n', "header"),
        ('{"format": "wattprint-gpu-trace/v1"}\n{"t": 1, "gpus": [{"index": 0}]}\n', "line 2"),
        ('{"format": "wattprint-gpu-trace/v1"}\nnot json\n', "line 2"),
    ],
)
def test_replay_rejects_bad_traces_with_one_line(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match=message) as err:
        ReplaySource(str(path))
    assert "\n" not in str(err.value)


def read_all(source: NvmlSource, fake: FakeNvml, steps: int) -> list[int]:
    values = []
    for _ in range(steps):
        fake.advance()
        values.append(source.read().devices[0].energy_uj)
    return values


def test_nvml_counter_matches_the_recorded_counter() -> None:
    fake = FakeNvml.from_trace()
    clock = Clock()
    source = NvmlSource(nvml=fake, clock=clock)
    first = source.read().devices[0]
    assert first.energy_uj == 0 and first.method == METHOD_NVML_COUNTER
    values = read_all(source, fake, len(fake.gpus[0].samples) - 1)
    assert values[-1] == trace_delta_uj(load_trace_samples(), 0, fake.position)


def test_nvml_counter_stays_monotonic_through_a_driver_reset() -> None:
    fake = FakeNvml.from_trace()
    source = NvmlSource(nvml=fake, clock=Clock())
    source.read()
    before = read_all(source, fake, 50)
    # Driver reload: the raw counter restarts near zero.
    fake.gpus[0].energy_offset_mj = -fake.gpus[0].samples[fake.position]["energy_mj"]
    after = read_all(source, fake, 50)
    values = before + after
    assert all(b >= a for a, b in itertools.pairwise(values))
    # The counter restarted from 0 at sample 50, so every joule drawn after it counts.
    assert after[-1] - before[-1] == trace_delta_uj(load_trace_samples(), 50, 100)


def test_one_lost_gpu_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml.from_trace(copies=3)
    source = NvmlSource(nvml=fake, clock=Clock())
    source.read()
    fake.faults[1] = pynvml.NVMLError_GpuIsLost
    caplog.set_level(logging.WARNING)
    for _ in range(5):
        fake.advance()
        result = source.read()
        assert [d.device for d in result.devices] == ["0", "2"]
        assert len(result.errors) == 1 and "GPU 1" in result.errors[0]
    # One log line for the failure, not one per sample.
    assert sum("GPU 1" in r.getMessage() for r in caplog.records) == 1
    del fake.faults[1]
    fake.advance()
    result = source.read()
    assert [d.device for d in result.devices] == ["0", "1", "2"]
    assert not result.errors


def test_unsupported_counter_integrates_power_on_the_samplers_clock() -> None:
    fake = FakeNvml.from_trace()
    fake.gpus[0].has_counter = False
    clock = Clock()
    source = NvmlSource(nvml=fake, clock=clock)
    source.read()
    samples = load_trace_samples()
    expected = 0.0
    for i in range(1, 40):
        fake.advance()
        clock.now += 0.5
        p0 = samples[i - 1]["gpus"][0]["power_mw"] / 1000
        p1 = samples[i]["gpus"][0]["power_mw"] / 1000
        expected += (p0 + p1) / 2 * 0.5
        reading = source.read().devices[0]
    assert reading.method == METHOD_NVML_INTEGRATED
    assert reading.energy_uj == pytest.approx(expected * 1e6, abs=1)
    assert "power integrated" in source.explain()[0]


def test_nvml_init_failure_is_no_data_and_retried() -> None:
    fake = FakeNvml.from_trace(init_error=pynvml.NVMLError_DriverNotLoaded)
    clock = Clock()
    source = NvmlSource(nvml=fake, clock=clock)
    assert not source.available
    result = source.read()
    assert result.devices == [] and "NVML init failed" in result.errors[0]
    fake.init_error = None
    clock.now += 31  # the retry is rate-limited
    assert len(source.read().devices) == 1


def test_nvml_processes_and_utilization_are_reported(trace_path: Path) -> None:
    fake = FakeNvml.from_trace()
    source = NvmlSource(nvml=fake, clock=Clock())
    samples = load_trace_samples(trace_path)
    busy = next(i for i, s in enumerate(samples) if s["gpus"][0]["processes"])
    fake.position = busy
    reading = source.read().devices[0]
    recorded = samples[busy]["gpus"][0]["processes"][0]
    assert [p.pid for p in reading.processes] == [recorded["pid"]]
    assert reading.processes[0].sm_util == recorded["sm_util"]
    assert reading.processes[0].gpu_instance_id is None
    assert json.dumps(recorded)  # the fixture carries an identity the replay uses


def test_a_gpu_without_a_power_reading_is_measured_by_its_counter() -> None:
    fake = FakeNvml.from_trace(copies=2)
    fake.gpus[0].has_power = False
    source = NvmlSource(nvml=fake, clock=Clock())
    source.read()
    result = SourceResult()
    for _ in range(30):
        fake.advance()
        result = source.read()
    assert result.errors == []
    blind, other = result.devices
    assert blind.power_w is None and other.power_w is not None
    assert blind.method == METHOD_NVML_COUNTER
    assert blind.energy_uj == other.energy_uj == trace_delta_uj(load_trace_samples(), 0, 30)


def test_a_gpu_with_neither_counter_nor_power_is_an_error_each_read() -> None:
    fake = FakeNvml.from_trace()
    fake.gpus[0].has_power = False
    fake.gpus[0].has_counter = False
    source = NvmlSource(nvml=fake, clock=Clock())
    result = source.read()
    assert result.devices == [] and len(result.errors) == 1


def pci_device(sysfs: Path, address: str, vendor: str, pci_class: str) -> None:
    device = sysfs / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(pci_class + "\n")


@pytest.mark.parametrize(
    ("devices", "kept"),
    [
        # An H100 (3D controller) beside an NVSwitch (bridge) and a NIC.
        ([("0x10de", "0x030200"), ("0x10de", "0x068000"), ("0x15b3", "0x020000")], True),
        # No NVIDIA GPU: a node without GPUs, where no NVML is normal.
        ([("0x10de", "0x068000"), ("0x8086", "0x030000")], False),
    ],
)
def test_auto_keeps_a_failing_nvml_where_the_pci_bus_shows_gpus(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    devices: list[tuple[str, str]],
    kept: bool,
) -> None:
    """A GPU node whose container cannot reach NVML: under --gpu.source=auto the source
    stays, so wattprint_collector_success{collector="nvml"} reads 0 and an alert fires,
    instead of the node quietly measuring no GPU."""
    for i, (vendor, pci_class) in enumerate(devices):
        pci_device(tmp_path, f"0000:{i:02x}:00.0", vendor, pci_class)
    fake = FakeNvml.from_trace(init_error=pynvml.NVMLError_LibraryNotFound)
    monkeypatch.setattr(nvml, "_load_pynvml", lambda: fake)
    caplog.set_level(logging.INFO, logger="wattprint.sources.nvml")

    source, why = choose("auto", SourceContext("gpu", False, sysfs_root=tmp_path))

    record = next(r for r in caplog.records if "NVML init failed" in r.getMessage())
    if not kept:
        assert source is None and why.startswith("gpu: none (NVML init failed")
        assert record.levelno == logging.INFO
        return
    assert source is not None and source.name == "nvml"
    assert record.levelno == logging.WARNING
    result = source.read()
    assert result.devices == [] and result.errors[0].startswith("NVML init failed")
    assert source.explain() == [
        "gpu: none (NVML init failed: NVML Shared Library Not Found; "
        "1 NVIDIA GPU(s) on the PCI bus are not measured)"
    ]
