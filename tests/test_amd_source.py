"""The AMD SMI source against a fake `amdsmi` module (tests/fake_amdsmi.py), driven by an
8-board trace: a 32-bit accumulator that wraps, a driver reload, partitions, a dual-die
board, a process that leaves. The sampler's split is tested in test_amd_node.py."""

from __future__ import annotations

import itertools
import logging

import pytest

from fake_amdsmi import (
    RESOLUTION_UJ,
    STATUS_DRIVER_NOT_LOADED,
    STATUS_NOT_SUPPORTED,
    Board,
    FakeAmdSmi,
    FakeProcess,
    eight_gpu_node,
)
from wattprint.sources.amdsmi import AmdSmiSource
from wattprint.sources.amdsmi_devices import ProcessSample, processes
from wattprint.sources.registry import METHOD_AMDSMI_COUNTER, METHOD_AMDSMI_INTEGRATED


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(fake: FakeAmdSmi, source: AmdSmiSource, clock: Clock, seconds: int) -> list:
    results = []
    for _ in range(seconds):
        fake.step()
        clock.now += 1.0
        results.append(source.read())
    return results


def drawn_uj(board: Board, since_counts: int) -> float:
    return (board.drawn_counts - since_counts) * RESOLUTION_UJ


def test_eight_board_trace_counts_what_each_package_drew_once() -> None:
    fake, clock = eight_gpu_node(), Clock()
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    first = source.read()
    assert not first.errors
    # 16 logical GPUs, 8 packages: partitions and the second die are not devices of
    # their own, so nothing is counted twice (or not at all).
    assert [d.device for d in first.devices] == ["0", "1", "2", "3", "4", "5", "6", "14"]
    base = [b.drawn_counts for b in fake.boards]
    history = [first, *run(fake, source, clock, 40)]
    fake.reload()  # every handle stale, every accumulator back at 0
    history += run(fake, source, clock, 40)
    assert source.available
    last = history[-1]
    assert not last.errors
    for board, device, b0 in zip(fake.boards, last.devices, base, strict=True):
        # Exact up to the rounding of counts x resolution to whole µJ, once per segment.
        assert abs(device.energy_uj - drawn_uj(board, b0)) <= 4, device.device
        assert device.method == METHOD_AMDSMI_COUNTER
    # The MI100's 32-bit accumulator wrapped before the reload: taken for a wrap.
    raws = [r.devices[5].raw_uj for r in history[:41]]
    assert any(b < a for a, b in itertools.pairwise(raws))
    assert last.devices[5].raw_wrap_uj == int((1 << 32) * RESOLUTION_UJ)
    # Monotonic at every read, through the wrap and the reload.
    for before, after in itertools.pairwise(history):
        for d0, d1 in zip(before.devices, after.devices):
            assert d1.energy_uj >= d0.energy_uj
    # The reload was one read of errors, named per GPU, not a crash.
    failed = [r for r in history if r.errors]
    assert failed and all(e.startswith("GPU ") for r in failed for e in r.errors)
    assert fake.calls["amdsmi_init"] == 2


def test_reload_seen_as_reset_by_64_bit_counter_even_on_a_young_board() -> None:
    # A board whose 64-bit accumulator has not yet passed 2**32 counts: a drop to 0
    # after a reload could read as a 32-bit wrap; it is too big to be one, so it is a reset.
    fake = FakeAmdSmi([Board(bus=0x0C, serial="s0", power_w=700.0, counts=10, drawn_counts=10)])
    clock = Clock()
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    source.read()
    run(fake, source, clock, 31)
    fake.reload()
    run(fake, source, clock, 5)
    [device] = source.read().devices
    assert device.raw_wrap_uj is not None  # still below 2**32 counts: wraps are possible
    assert abs(device.energy_uj - drawn_uj(fake.boards[0], 10)) <= 4


def test_partitions_share_the_package_counter_read_once() -> None:
    fake = FakeAmdSmi([Board(bus=0x6C, serial="cpx", power_w=700.0, partitions=8)])
    fake.boards[0].procs = {0: [FakeProcess(11, 0.5)], 3: [FakeProcess(12, 0.25)]}
    clock = Clock()
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    source.read()
    reading = run(fake, source, clock, 10)[-1].devices[0]
    assert abs(reading.energy_uj - 10 * 700e6) < 10 * RESOLUTION_UJ  # not 8 x
    assert reading.mig_slices == tuple((i, 38) for i in range(8))
    weights = {(p.gpu_instance_id, p.pid): p.sm_util for p in reading.processes}
    assert weights == {(0, 11): 50, (3, 12): 25}  # GFX busy % of the interval
    assert "AMD SMI GPUs 1, 2, 3, 4, 5, 6, 7 share its energy" in source.explain()[0]


def test_second_die_joins_its_board_and_its_processes_share_the_board_energy() -> None:
    board = Board(bus=0x7C, serial="mi250x", power_w=480.0, dies=2, compute_units=220)
    board.procs = {0: [FakeProcess(21, 0.9)], 1: [FakeProcess(22, 0.9)]}
    fake, clock = FakeAmdSmi([board]), Clock()
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    source.read()
    [reading] = run(fake, source, clock, 3)[-1].devices
    assert reading.device == "0" and reading.mig_slices == ((0, 110), (1, 110))
    assert {p.pid: p.gpu_instance_id for p in reading.processes} == {21: 0, 22: 1}


def test_two_boards_are_never_merged_by_a_shared_serial_when_both_report() -> None:
    # A serial two boards report alike (a vendor's placeholder) joins nothing that speaks.
    boards = [Board(bus=0x0C, serial="same", power_w=300.0), Board(bus=0x1C, serial="same")]
    source = AmdSmiSource(amdsmi=FakeAmdSmi(boards), clock=Clock())
    assert [d.device for d in source.read().devices] == ["0", "1"]


def test_a_process_that_leaves_stops_being_weighed_and_a_new_one_counts_from_its_start() -> None:
    board = Board(bus=0x0C, serial="s", power_w=500.0)
    leaver, stayer = FakeProcess(31, 0.4), FakeProcess(32, 0.2)
    board.procs = {0: [leaver, stayer]}
    fake, clock = FakeAmdSmi([board]), Clock()
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    source.read()
    [reading] = run(fake, source, clock, 2)[-1].devices
    assert {p.pid: p.sm_util for p in reading.processes} == {31: 40, 32: 20}
    board.procs[0] = [stayer, FakeProcess(33, 0.6, gfx_ns=0)]
    [reading] = run(fake, source, clock, 1)[-1].devices
    assert {p.pid: p.sm_util for p in reading.processes} == {32: 20, 33: 60}


def test_vram_weighs_processes_where_the_kernel_reports_no_busy_time() -> None:
    board = Board(bus=0x0C, serial="s", busy_reported=False, vram_mb=196_608)
    board.procs = {0: [FakeProcess(41, 0.9, vram_bytes=96 << 30), FakeProcess(42, 0.1, 48 << 30)]}
    fake, clock = FakeAmdSmi([board]), Clock()
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    source.read()
    [reading] = run(fake, source, clock, 2)[-1].devices
    assert {p.pid: p.sm_util for p in reading.processes} == {41: 50, 42: 25}


def test_busy_weights_are_the_interval_delta_and_a_reused_pid_starts_over() -> None:
    samples = [ProcessSample(1, None, 9_000_000_000, None), ProcessSample(2, None, 100, None)]
    held, busy = processes(samples, {(None, 1): 8_000_000_000, (None, 2): 5_000}, 2.0, {})
    assert {p.pid: p.sm_util for p in held} == {1: 50, 2: 0}
    assert busy == {(None, 1): 9_000_000_000, (None, 2): 100}


def test_no_counter_integrates_power_and_says_it_is_estimated() -> None:
    fake = FakeAmdSmi([Board(bus=0x0C, serial="s", power_w=250.0, has_counter=False)])
    clock = Clock()
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    source.read()
    [reading] = run(fake, source, clock, 4)[-1].devices
    assert reading.method == METHOD_AMDSMI_INTEGRATED
    assert reading.energy_uj == 4 * 250_000_000
    assert "power integrated" in source.explain()[0]


def test_one_gpu_failing_keeps_the_others_and_its_process_list_failing_keeps_its_energy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = eight_gpu_node()
    clock = Clock()
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    source.read()
    fake.faults[2] = 12  # AMDSMI_STATUS_IO
    fake.process_faults[0] = STATUS_NOT_SUPPORTED
    with caplog.at_level(logging.WARNING):
        results = run(fake, source, clock, 3)
    devices = [d.device for d in results[-1].devices]
    assert "2" not in devices and len(devices) == 7
    assert results[-1].devices[0].energy_uj > 0 and results[-1].devices[0].processes == ()
    assert any("process list" in e for e in results[-1].errors)
    # Logged once per GPU and kind, not every second.
    assert sum("GPU 2" in r.message for r in caplog.records) == 1
    del fake.faults[2]
    assert "2" in [d.device for d in run(fake, source, clock, 1)[-1].devices]


def test_driver_not_loaded_is_one_line_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    fake = eight_gpu_node()
    fake.init_error = STATUS_DRIVER_NOT_LOADED
    clock = Clock()
    with caplog.at_level(logging.INFO):
        source = AmdSmiSource(amdsmi=fake, clock=clock)
    assert not source.available
    assert source.init_error.startswith("AMD SMI init failed")
    assert "\n" not in source.init_error
    assert source.explain() == [f"gpu: none ({source.init_error})"]
    fake.init_error = None
    clock.now += 31
    assert len(source.read().devices) == 8


def test_malformed_answers_are_errors_not_crashes() -> None:
    fake = FakeAmdSmi([Board(bus=0x0C, serial="s")])
    clock = Clock()
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    source.read()
    fake.amdsmi_get_energy_count = lambda handle: {"energy_accumulator": "N/A"}  # type: ignore[method-assign]
    fake.step()
    clock.now += 1
    result = source.read()
    assert result.devices == [] and "not a number" in result.errors[0]


def test_gpus_without_a_uuid_keep_their_own_counters_across_a_reload() -> None:
    boards = [Board(bus=0x0C, serial="s0", power_w=300.0), Board(bus=0x1C, serial="s1")]
    fake, clock = FakeAmdSmi(boards), Clock()
    fake.amdsmi_get_gpu_device_uuid = lambda handle: "N/A"  # type: ignore[method-assign]
    source = AmdSmiSource(amdsmi=fake, clock=clock)
    source.read()
    base = [b.drawn_counts for b in boards]
    run(fake, source, clock, 31)
    fake.reload()
    last = run(fake, source, clock, 4)[-1]
    for board, device, b0 in zip(boards, last.devices, base, strict=True):
        assert abs(device.energy_uj - drawn_uj(board, b0)) <= 4, device.device
