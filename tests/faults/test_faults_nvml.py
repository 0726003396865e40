"""NVML faults through the fake pynvml: init fails, a GPU is lost and comes back,
Unknown and NotSupported errors, and a driver reload that restarts the energy counter."""

from __future__ import annotations

import logging

import pynvml
import pytest

from wattprint.sources import nvml as nvml_source

from .faultrig import Node, Rig, RigFactory, value, warnings_about


def trace_joules(node: Node, gpu: int, first: int, last: int) -> float:
    return (node.nvml.trace_energy_mj(gpu, last) - node.nvml.trace_energy_mj(gpu, first)) / 1e3


def gpu_energy(rig: Rig, gpu: str) -> float:
    return rig.energy("gpu", gpu=gpu)


def powered(rig: Rig) -> set[str]:
    """The GPUs with a power reading in the last scrape."""
    return {dict(labels)["gpu"] for n, labels in rig.series if n == "wattprint_gpu_power_watts"}


def test_init_failure_is_counted_logged_once_and_retried(
    node: Node,
    rig_factory: RigFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(nvml_source, "_REINIT_EVERY_S", 0.0)  # retry at every sample
    node.nvml.init_error = pynvml.NVMLError_DriverNotLoaded
    caplog.set_level(logging.INFO)
    rig: Rig = rig_factory()
    said_at_start = len(warnings_about(caplog, "NVML init failed"))
    assert said_at_start >= 1

    rig.steps(5)
    assert rig.errors("nvml") == 5
    assert rig.success("nvml") == 0
    assert value(rig.series, "wattprint_gpu_energy_joules_total") == 0
    assert rig.energy("cpu") > 0  # the other sources go on
    # Retried at every sample, said once: nothing new while sampling.
    assert len(warnings_about(caplog, "NVML init failed")) == said_at_start

    node.nvml.init_error = None  # the driver is loaded
    rig.step()
    first = node.nvml.position
    rig.steps(3)
    assert rig.success("nvml") == 1
    assert rig.errors("nvml") == 5
    for gpu in ("0", "1"):  # counting from the first read after NVML came up
        assert gpu_energy(rig, gpu) == pytest.approx(
            trace_joules(node, int(gpu), first, node.nvml.position)
        )
    assert any("initialised after earlier failure" in r.getMessage() for r in caplog.records)


def test_gpu_lost_mid_run_and_back(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    rig: Rig = rig_factory()
    rig.step()
    baseline = node.nvml.position
    rig.steps(3)
    caplog.set_level(logging.INFO)

    node.nvml.faults[1] = pynvml.NVMLError_GpuIsLost
    held = gpu_energy(rig, "1")
    for lost in range(1, 6):
        rig.step()
        assert gpu_energy(rig, "1") == held
        assert rig.errors("nvml") == lost
        assert rig.success("nvml") == 0
        # A lost GPU has no power reading, not the last one it gave.
        assert powered(rig) == {"0"}
    assert gpu_energy(rig, "0") == pytest.approx(
        trace_joules(node, 0, baseline, node.nvml.position)
    )
    assert len(warnings_about(caplog, "GPU 1")) == 1

    del node.nvml.faults[1]
    rig.steps(2)
    assert rig.success("nvml") == 1
    assert rig.errors("nvml") == 5
    # The hardware counter ran on while NVML could not read it: nothing lost, nothing
    # invented.
    assert gpu_energy(rig, "1") == pytest.approx(
        trace_joules(node, 1, baseline, node.nvml.position)
    )
    assert any("readable again" in r.getMessage() for r in caplog.records)


def test_unknown_error_on_the_energy_counter_is_transient(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    rig: Rig = rig_factory()
    rig.step()
    baseline = node.nvml.position
    caplog.set_level(logging.INFO)
    node.nvml.call_faults[("energy", 0)] = pynvml.NVMLError_Unknown
    rig.steps(4)
    assert rig.errors("nvml") == 4
    assert gpu_energy(rig, "0") == 0  # held at its baseline
    assert gpu_energy(rig, "1") == pytest.approx(
        trace_joules(node, 1, baseline, node.nvml.position)
    )
    assert len(warnings_about(caplog, "GPU 0")) == 1

    del node.nvml.call_faults[("energy", 0)]
    rig.steps(2)
    assert gpu_energy(rig, "0") == pytest.approx(
        trace_joules(node, 0, baseline, node.nvml.position)
    )
    assert rig.success("nvml") == 1


def test_utilization_not_supported_splits_among_holders(
    node: Node, rig_factory: RigFactory
) -> None:
    # Some drivers and vGPUs refuse per-process utilization: the holder still pays.
    node.nvml.call_faults[("utilization", 0)] = pynvml.NVMLError_NotSupported
    rig: Rig = rig_factory()
    rig.steps(4)
    assert rig.energy("workload", component="gpu", gpu="0", workload="phased-load") == (
        pytest.approx(gpu_energy(rig, "0"))
    )
    assert gpu_energy(rig, "0") > 0


def test_process_list_not_supported_is_counted_and_said_once(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    node.nvml.call_faults[("processes", 0)] = pynvml.NVMLError_NotSupported
    caplog.set_level(logging.INFO)
    rig: Rig = rig_factory()
    rig.steps(4)
    # Without a process list the GPU's energy can only go to unattributed ...
    assert rig.energy("unattributed", component="gpu", gpu="0") == pytest.approx(
        gpu_energy(rig, "0")
    )
    # ... and the operator must be able to see why.
    assert rig.errors("nvml") >= 3
    assert len(warnings_about(caplog, "GPU 0")) == 1


def test_driver_reload_restarts_the_counter(
    node: Node,
    rig_factory: RigFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:

    monkeypatch.setattr(nvml_source, "_REINIT_EVERY_S", 0.0)
    rig: Rig = rig_factory()
    rig.step()
    baseline = node.nvml.position
    rig.steps(3)
    last_good = node.nvml.position
    caplog.set_level(logging.INFO)
    init_calls = node.nvml.calls.get("nvmlInit", 0)

    # The driver goes away: every call fails, for both GPUs ...
    node.nvml.faults = {0: pynvml.NVMLError_Uninitialized, 1: pynvml.NVMLError_Uninitialized}
    rig.steps(2)
    assert rig.errors("nvml") == 4  # one per GPU and sample
    # ... and comes back with its energy counters restarted from zero.
    node.nvml.faults = {}
    node.nvml.advance()
    reload_at = node.nvml.position
    for gpu in node.nvml.gpus:
        gpu.energy_offset_mj = -node.nvml.trace_energy_mj(gpu.index, reload_at)
    rig.steps(4)

    assert node.nvml.calls["nvmlInit"] > init_calls  # NVML was opened again
    assert rig.success("nvml") == 1
    for gpu in (0, 1):
        # What was counted before, plus everything since the counter restarted; the
        # energy drawn while the driver was away is unknowable and not invented.
        expected = trace_joules(node, gpu, baseline, last_good) + trace_joules(
            node, gpu, reload_at, node.nvml.position
        )
        assert gpu_energy(rig, str(gpu)) == pytest.approx(expected)
    assert len(warnings_about(caplog, "GPU 0")) == 1
    assert rig.energy("workload", component="gpu", workload="phased-load") > 0
