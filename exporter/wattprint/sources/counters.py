"""Turning raw hardware counters into cumulative counters that never go down."""

from __future__ import annotations

# A reading may add at most what the device could draw at this multiple of its power
# ceiling over the elapsed time: slack for timing jitter between the read and our clock.
CEILING_MARGIN = 2.0
# Ceilings where the device states no power limit: above any GPU board, CPU package or
# its DRAM shipped so far, so only readings no such device could produce are rejected.
DEFAULT_MAX_POWER_W = {"gpu": 1500.0, "cpu": 1000.0, "memory": 500.0}
# Even a reading 0 s after the last one may add this much (clock granularity).
CEILING_FLOOR_S = 1.0


class MonotonicCounter:
    """Accumulates the increases of a raw counter that may wrap, reset or glitch.

    The cumulative starts at 0 at the first update: the exporter reports energy since
    it started, like any Prometheus counter. A raw value below the previous one is a
    wrap when the hardware declares a range (RAPL max_energy_range_uj) and the
    increase it implies is plausible. Otherwise it may be a reset (driver reload, GPU
    reset: the counter restarts from 0) or a glitch (a transient dip, a 0 read): the
    reading adds nothing and is held as a candidate. The next reading decides: back at
    or above the old level, it was a glitch and counting continues from the old level;
    at or above the candidate and plausible since it, the counter did restart, and its
    new value (all energy since the restart) is added.

    With a power ceiling, an increase more than the device could have drawn in the
    elapsed time (ceiling x elapsed x CEILING_MARGIN) is held the same way: a glitch
    if the next reading is plausible from the old level, else the counter jumped and
    counting goes on from the new level without adding the jump.

    `errors` counts readings found to be glitches (one sample after they were read);
    `last_error` says why; `resets` counts confirmed restarts.
    """

    __slots__ = (
        "_candidate",
        "_candidate_time",
        "_candidate_why",
        "_last",
        "_last_time",
        "errors",
        "last_error",
        "max_power_w",
        "resets",
        "total",
        "wrap_at",
    )

    def __init__(self, wrap_at: int | None = None, max_power_w: float | None = None) -> None:
        self.wrap_at = wrap_at
        self.max_power_w = max_power_w
        self._last: int | None = None
        self._last_time: float | None = None
        self._candidate: int | None = None
        self._candidate_time: float | None = None
        self._candidate_why = ""
        self.total = 0
        self.resets = 0
        self.errors = 0
        self.last_error = ""

    @property
    def raw(self) -> int | None:
        """The last raw value taken at face value: where the hardware counter stands."""
        return self._last

    def plausible(self, delta_uj: int, elapsed_s: float | None) -> bool:
        """Could the device have used delta_uj in elapsed_s? (Always, without a ceiling.)"""
        if self.max_power_w is None or elapsed_s is None:
            return True
        seconds = max(elapsed_s, CEILING_FLOOR_S)
        return delta_uj <= self.max_power_w * seconds * CEILING_MARGIN * 1e6

    def update(self, raw: int, now: float | None = None) -> int:
        """Feed one raw reading taken at `now` (seconds, any clock); return the increase."""
        last = self._last
        if last is None:
            self._take(raw, now)
            return 0
        elapsed = None if now is None or self._last_time is None else now - self._last_time
        candidate, self._candidate = self._candidate, None
        if raw >= last:
            delta = raw - last
            if self.plausible(delta, elapsed):
                self._settle_glitch(candidate)
                return self._add(delta, raw, now)
            if candidate is not None and raw >= candidate:
                return self._confirm(candidate, raw, now)
            self._settle_glitch(candidate)
            return self._hold(raw, now, f"counter jumped by {delta} uJ in {elapsed or 0:.3g} s")
        if self.wrap_at and self.plausible(raw + self.wrap_at - last, elapsed):
            self._settle_glitch(candidate)
            return self._add(raw + self.wrap_at - last, raw, now)
        if candidate is not None and raw >= candidate:
            return self._confirm(candidate, raw, now)
        self._settle_glitch(candidate)
        return self._hold(raw, now, f"counter went back from {last} to {raw} uJ")

    def _take(self, raw: int, now: float | None) -> None:
        self._last, self._last_time = raw, now

    def _add(self, delta: int, raw: int, now: float | None) -> int:
        self._take(raw, now)
        self.total += delta
        return delta

    def _hold(self, raw: int, now: float | None, why: str) -> int:
        # Not an error yet: a driver reload looks the same until the next reading.
        self._candidate, self._candidate_time, self._candidate_why = raw, now, why
        return 0

    def _settle_glitch(self, candidate: int | None) -> None:
        """The held reading was not followed up: it was a glitch."""
        if candidate is not None:
            self._error(f"{self._candidate_why}: reading ignored")

    def _error(self, message: str) -> None:
        self.errors += 1
        self.last_error = message

    def _confirm(self, candidate: int, raw: int, now: float | None) -> int:
        """A second reading went on from the held one: the counter really moved there."""
        assert self._last is not None
        since_last: float | None = None
        since: float | None = None
        if now is not None and self._last_time is not None:
            since_last = now - self._last_time
        if now is not None and self._candidate_time is not None:
            since = now - self._candidate_time
        if candidate < self._last and self.plausible(raw, since_last):
            # Restarted from 0 (driver reload): everything it counted since is new.
            self.resets += 1
            return self._add(raw, raw, now)
        if self.plausible(raw - candidate, since):
            # Jumped and went on from there: the jump itself is no energy we can vouch
            # for; the rise since the jump is.
            self._error(f"{self._candidate_why}; counting on from the new level")
            return self._add(raw - candidate, raw, now)
        self._error(f"{self._candidate_why}: reading ignored")
        return self._hold(raw, now, "counter keeps moving implausibly")


class PowerIntegrator:
    """Energy from power readings where no counter exists (pre-Volta GPUs, models).

    Trapezoids over the caller's own clock (update), or one average power per interval
    (add); micro-joules kept as an integer with the
    fraction carried forward, so the cumulative is exact and monotonic.
    """

    __slots__ = ("_fraction", "_last_power", "_last_time", "total")

    def __init__(self) -> None:
        self._last_time: float | None = None
        self._last_power = 0.0
        self._fraction = 0.0
        self.total = 0

    def restart(self) -> None:
        """The next power reading starts a new trapezoid: nothing across the gap."""
        self._last_time = None

    def update(self, now: float, power_w: float) -> int:
        """A power reading at `now`: the trapezoid since the previous one."""
        power_w = max(power_w, 0.0)
        last_time, last_power = self._last_time, self._last_power
        self._last_time, self._last_power = now, power_w
        if last_time is None or now <= last_time:
            return 0
        return self.add((last_power + power_w) / 2, now - last_time)

    def add(self, power_w: float, seconds: float) -> int:
        """An average power over an interval (the power models' utilisation x TDP)."""
        exact = max(power_w, 0.0) * max(seconds, 0.0) * 1e6 + self._fraction
        delta = int(exact)
        self._fraction = exact - delta
        self.total += delta
        return delta


class StampedPower:
    """Power readings stamped by the device's own clock (a BMC's), integrated between
    stamps: a reading whose stamp has not moved is the one counted already, not new
    power. An interval is the device's, unless it and the caller's clock disagree by
    more than `slack_s` (the device's clock was set): then the caller's. No reading for
    `max_bridge_s` restarts the integration: the gap is not bridged."""

    def __init__(self, slack_s: float, max_bridge_s: float) -> None:
        self._integrator = PowerIntegrator()
        self._slack = slack_s
        self._max_bridge = max_bridge_s
        self._axis = 0.0  # the integrator's time: the sum of the readings' intervals
        self.stamp: float | None = None  # the stamp counted last
        self.counted_at = 0.0  # the caller's clock when it was counted

    @property
    def total(self) -> int:
        return self._integrator.total

    def update(self, power_w: float, stamp: float, now: float) -> str:
        """ "held" (the stamp counted already), "counted", or "restarted" (the first
        reading, or one after a gap: a baseline)."""
        if self.stamp is not None and stamp == self.stamp:
            return "held"
        outcome = "counted"
        if self.stamp is None or now - self.counted_at > self._max_bridge:
            self._integrator.restart()
            outcome = "restarted"
        else:
            interval = stamp - self.stamp
            ours = now - self.counted_at
            self._axis += interval if abs(interval - ours) <= self._slack else ours
        self._integrator.update(self._axis, power_w)
        self.stamp, self.counted_at = stamp, now
        return outcome
