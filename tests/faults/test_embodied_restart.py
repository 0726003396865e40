"""Embodied emissions through the running exporter: exported beside the operational
counters, and continued across a restart from the state file (nothing lost, nothing
counted twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clock_fakes import NodeClocks

from .faultrig import Node, Rig, RigFactory, value
from .test_restart import set_boot

BOOT = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
# The trace's GPUs are H200s, which have no published figure: the flag gives one.
FLAGS = {"embodied.gpu-kgco2e": "NVIDIA H200=164", "embodied.node-kgco2e": "2500"}
GRAMS_PER_S = 164_000 / (4 * 8766 * 3600)


def started(rig_factory: RigFactory, clock: NodeClocks, **flags: str) -> Rig:
    rig = rig_factory(**FLAGS, **flags)
    clock.install(rig.exporter.sampler)  # whole minutes per step, not milliseconds
    return rig


def step(rig: Rig, clock: NodeClocks, seconds: float = 60.0) -> None:
    clock.advance(seconds)
    rig.step()


def job_embodied(rig: Rig) -> float:
    return value(
        rig.series,
        "wattprint_workload_embodied_grams_total",
        component="gpu",
        gpu="0",
        workload="phased-load",
    )


def test_embodied_is_exported_and_adds_up_per_device(node: Node, rig_factory: RigFactory) -> None:
    clock = NodeClocks()
    rig = started(rig_factory, clock)
    for _ in range(4):
        step(rig, clock)
    device = value(rig.series, "wattprint_device_embodied_grams_total", component="gpu", device="0")
    # The first sample is the baseline; the first scrape of a series serves its 0.
    assert device == pytest.approx(3 * 60 * GRAMS_PER_S, abs=1e-6)
    parts = job_embodied(rig) + value(
        rig.series, "wattprint_unattributed_embodied_grams_total", component="gpu", gpu="0"
    )
    assert parts == pytest.approx(device, abs=1e-6)
    figure = value(rig.series, "wattprint_embodied_figure_kgco2e", device="0")
    assert figure == 164.0
    node_total = value(rig.series, "wattprint_device_embodied_grams_total", component="node")
    assert node_total == pytest.approx(3 * 60 * 2500 / 164 * GRAMS_PER_S, abs=1e-6)


def test_an_unknown_gpu_model_counts_nothing_and_says_so(
    node: Node, rig_factory: RigFactory
) -> None:
    clock = NodeClocks()
    rig = rig_factory()
    clock.install(rig.exporter.sampler)
    for _ in range(3):
        step(rig, clock)
    assert value(rig.series, "wattprint_embodied_unknown", model="NVIDIA H200") == 2  # 2 GPUs
    assert value(rig.series, "wattprint_workload_embodied_grams_total", component="gpu") == 0


def test_a_restart_continues_embodied_grams_and_books_the_gap(
    node: Node, rig_factory: RigFactory, tmp_path: Path
) -> None:
    set_boot(node, BOOT)
    state = {"state.file": str(tmp_path / "state.json")}
    clock = NodeClocks()
    first = started(rig_factory, clock, **state)
    for _ in range(5):
        step(first, clock)
    before = job_embodied(first)
    assert before > 0
    first.kill()

    node.advance()  # down for ten minutes
    clock.advance(600)
    second = started(rig_factory, clock, **state)
    step(second, clock)
    step(second, clock)
    # The job held GPU 0 before and after the gap: it pays the GPU's whole life since
    # the first sample, gap included, to the micro-gram.
    elapsed = 4 * 60 + 600 + 2 * 60
    assert job_embodied(second) == pytest.approx(elapsed * GRAMS_PER_S, abs=1e-6)
    device = value(
        second.series, "wattprint_device_embodied_grams_total", component="gpu", device="0"
    )
    assert device == pytest.approx(elapsed * GRAMS_PER_S, abs=1e-6)
