"""Turning raw hardware counters into cumulative counters that never go down."""

from __future__ import annotations


class MonotonicCounter:
    """Accumulates the increases of a raw counter that may wrap or reset.

    The cumulative starts at 0 at the first update: the exporter reports energy since
    it started, like any Prometheus counter. A raw value below the previous one is a
    wrap when the hardware declares a range (RAPL max_energy_range_uj), otherwise a
    reset (driver reload, GPU reset) after which the raw counter counts from 0 again,
    so the new raw value itself is what was added.
    """

    __slots__ = ("_last", "resets", "total", "wrap_at")

    def __init__(self, wrap_at: int | None = None) -> None:
        self.wrap_at = wrap_at
        self._last: int | None = None
        self.total = 0
        self.resets = 0

    def update(self, raw: int) -> int:
        """Feed one raw reading; return the increase it adds (never negative)."""
        last, self._last = self._last, raw
        if last is None:
            return 0
        if raw >= last:
            delta = raw - last
        elif self.wrap_at:
            delta = raw + self.wrap_at - last
        else:
            self.resets += 1
            delta = max(raw, 0)
        self.total += delta
        return delta


class PowerIntegrator:
    """Energy from power readings where no counter exists (pre-Volta GPUs, models).

    Trapezoids over the caller's own clock; micro-joules kept as an integer with the
    fraction carried forward, so the cumulative is exact and monotonic.
    """

    __slots__ = ("_fraction", "_last_power", "_last_time", "total")

    def __init__(self) -> None:
        self._last_time: float | None = None
        self._last_power = 0.0
        self._fraction = 0.0
        self.total = 0

    def update(self, now: float, power_w: float) -> int:
        power_w = max(power_w, 0.0)
        last_time, last_power = self._last_time, self._last_power
        self._last_time, self._last_power = now, power_w
        if last_time is None or now <= last_time:
            return 0
        exact = (last_power + power_w) / 2 * (now - last_time) * 1e6 + self._fraction
        delta = int(exact)
        self._fraction = exact - delta
        self.total += delta
        return delta
