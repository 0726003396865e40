"""MonotonicCounter: raw hardware counters that wrap, reset or glitch never lose or
invent energy."""

from __future__ import annotations

from wattprint.sources.counters import MonotonicCounter

GJ = 10**15  # a raw NVML counter after weeks of uptime, in micro-joules
W700_1S = 700_000_000  # 700 W for 1 s, in micro-joules


def feed(counter: MonotonicCounter, readings: list[int], start: float = 0.0) -> list[int]:
    return [counter.update(raw, start + i) for i, raw in enumerate(readings)]


def test_a_dip_adds_nothing_and_counting_goes_on_from_the_old_level() -> None:
    c = MonotonicCounter(max_power_w=700)
    feed(c, [GJ, GJ + W700_1S, GJ + W700_1S - 1_000_000, GJ + 3 * W700_1S])
    assert c.total == 3 * W700_1S
    assert c.errors == 1 and "went back" in c.last_error
    assert c.resets == 0


def test_a_zero_reading_is_a_glitch_when_the_counter_comes_back() -> None:
    c = MonotonicCounter(max_power_w=700)
    feed(c, [GJ, GJ + W700_1S, 0, GJ + 2 * W700_1S])
    assert c.total == 2 * W700_1S and c.errors == 1 and c.resets == 0


def test_a_reset_is_confirmed_by_the_next_reading_and_counts_from_zero() -> None:
    c = MonotonicCounter(max_power_w=700)
    feed(c, [GJ, GJ + W700_1S, 300_000_000, 300_000_000 + W700_1S])
    # Before the reset, and all the restarted counter counted since.
    assert c.total == W700_1S + 300_000_000 + W700_1S
    assert c.resets == 1 and c.errors == 0


def test_a_jump_beyond_the_power_limit_is_not_energy() -> None:
    c = MonotonicCounter(max_power_w=700)
    # A glitch up: the next reading goes on from the old level.
    feed(c, [GJ, GJ + W700_1S, GJ + 10**12, GJ + 2 * W700_1S])
    assert c.total == 2 * W700_1S and c.errors == 1
    # A real step (the counter moved and stayed): counting goes on from there, the
    # step itself is not added.
    c = MonotonicCounter(max_power_w=700)
    feed(c, [GJ, GJ + 10**12, GJ + 10**12 + W700_1S])
    assert c.total == W700_1S and c.errors == 1 and "counting on" in c.last_error


def test_a_wrap_is_counted_once_and_a_dip_near_the_range_is_not_a_wrap() -> None:
    wrap = 262_143_328_850
    c = MonotonicCounter(wrap_at=wrap, max_power_w=350)
    feed(c, [wrap - 100_000_000, 200_000_000])
    assert c.total == 300_000_000 and c.errors == 0
    # A 1 J dip would be a wrap of 262 kJ in 1 s: no 350 W package draws that.
    c = MonotonicCounter(wrap_at=wrap, max_power_w=350)
    feed(c, [5 * 10**9, 5 * 10**9 - 1_000_000, 5 * 10**9 + 300_000_000])
    assert c.total == 300_000_000 and c.errors == 1


def test_without_a_ceiling_or_clock_only_the_order_of_readings_decides() -> None:
    c = MonotonicCounter()
    for raw in (10, 20, 5, 15):  # 5 is held; 15 goes on from it: a reset
        c.update(raw)
    assert c.total == 10 + 15 and c.resets == 1
