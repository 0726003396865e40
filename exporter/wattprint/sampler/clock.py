"""The time stamped on samples, and how far the node's clock is trusted with it.

What Prometheus 2.x does with a sample the exporter stamps (measured with 2.42):
- more than 10 minutes ahead of Prometheus's own clock: dropped as out of bounds, with a
  warning at every scrape, while `up` stays 1;
- older than the series' newest sample: dropped as out of order; about an hour older
  than the newest sample of any series: dropped as out of bounds.
A sample served without a timestamp is filed under the scrape's time, by Prometheus's
clock, and is always kept. So a stamp is worth more than no stamp only while this node's
clock agrees with Prometheus's, and it does harm once the two disagree by minutes.

The exporter cannot see Prometheus's clock (the alert WattprintClockSkew compares the
two, from `wattprint_clock_time_seconds`). Locally it has two witnesses:
- The kernel. A time daemon that disciplines the clock (chrony, ntpd,
  systemd-timesyncd) keeps telling the kernel how far off it may be: adjtimex's maximum
  error. Without such news the kernel lets that bound grow by 0.5 ms a second up to
  16 s, where it calls the clock unsynchronized, and setting the clock by hand (`date
  -s`) puts it there at once. (chrony without `rtcsync` keeps the STA_UNSYNC flag set
  on Linux, but still reports the bound, so the bound is what counts here.)
- The monotonic clock, which NTP slews exactly as it slews the wall clock but which no
  step moves. Comparing the two at every read shows every step of the wall clock.

The rules (StampClock.read):
1. Samples are stamped only while the kernel's maximum error is under 16 s. Otherwise
   (no time daemon, the clock just set by hand, adjtimex unreadable) they are served
   without a timestamp: slightly less exact windows, but nothing dropped.
2. Stamps follow the monotonic clock from an anchor on the wall clock. When the wall
   clock moves against it by more than STEP_TOLERANCE_S, it was stepped (counted,
   logged): samples go without timestamps until it has held still for STEP_HOLD_S,
   then the stamps follow it. They never freeze, and a clock stepped an hour ahead for
   13 s and back never reaches a stamp (a stamp an hour ahead is dropped, and a job
   whose first samples are dropped loses its first interval).
3. A stamp is never at or before one already served. After a backward step, samples
   are served without timestamps until the wall clock passes the last stamp, never
   squeezed 1 ms apart (a step back by an hour put 15 s of energy into 15 ms: a 690 kW
   spike).
4. The sampler's own time (workload retention, a series' birth) is the monotonic clock
   since start, as Unix time at start: no step moves a deadline or expires a job.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable

from wattprint.core.model import ClockReading, KernelClock

log = logging.getLogger(__name__)
# Wall minus monotonic moves only when the wall clock is set (or a leap second is
# inserted); reading the two clocks one after the other costs microseconds.
STEP_TOLERANCE_S = 0.1
# A step is followed only once the wall clock has held still this long: long enough
# for a time daemon to take back a wrong step (chrony and timesyncd first poll every
# 64 s), so that a clock stepped away and back never reaches a stamp.
STEP_HOLD_S = 600.0
# Reads of the wall clock between two monotonic reads, until those are close.
READ_TRIES = 3
# Prometheus keeps milliseconds: two stamps closer than that are one sample.
MIN_STAMP_GAP_S = 0.001

_STA_UNSYNC = 0x0040


class _Timex(ctypes.Structure):
    """struct timex of <sys/timex.h> where a long holds a time_t (x86_64, aarch64)."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time_sec", ctypes.c_long),
        ("time_usec", ctypes.c_long),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("reserved", ctypes.c_int * 11),
    ]


def read_kernel_clock() -> KernelClock:
    """adjtimex(2) in read-only mode; OSError if the kernel or a seccomp filter refuses
    (systemd's ProtectClock=yes does, even for reading) or there is no such call."""
    try:
        adjtimex = ctypes.CDLL(None, use_errno=True).adjtimex
    except (AttributeError, OSError) as err:
        raise OSError(f"no adjtimex: {err}") from None
    timex = _Timex()  # modes 0: read only, needs no capability
    if adjtimex(ctypes.byref(timex)) == -1:
        errno = ctypes.get_errno()
        raise OSError(errno, f"adjtimex: {os.strerror(errno)}")
    return KernelClock(
        synchronized=not timex.status & _STA_UNSYNC,
        maxerror_s=timex.maxerror / 1e6,  # microseconds, whatever STA_NANO says
    )


class StampClock:
    """Reads the clocks once per sample and decides the stamp (module docstring)."""

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        kernel: Callable[[], KernelClock] | None = None,
    ) -> None:
        self._monotonic = monotonic
        # Looked up when built, not when imported: a test's fake kernel (a launched
        # exporter's, tests/clock_fakes.py) replaces the module's function first.
        self._kernel = kernel if kernel is not None else read_kernel_clock
        self._start: tuple[float, float] | None = None  # (wall, monotonic)
        self._anchor: tuple[float, float] = (0.0, 0.0)  # where the stamps re-based last
        self._last_stamp: float | None = None
        self._steps = 0
        self._stepped_at: float | None = None  # monotonic time of the last step
        self._unstamped_by: str | None = None  # the reason, while unstamped
        self.last: ClockReading | None = None

    def read(self, wall_clock: Callable[[], float]) -> ClockReading:
        wall, mono, spread = self._read_both(wall_clock)
        kernel = self._read_kernel()
        if self._start is None:
            self._start = self._anchor = (wall, mono)
        line = self._anchor[0] + (mono - self._anchor[1])
        if abs(wall - line) > STEP_TOLERANCE_S + spread:
            self._steps += 1
            self._stepped_at = mono
            log.warning(
                "the wall clock was stepped by %+.3f s (against the monotonic clock): "
                "samples go without timestamps until it has held still for %s",
                wall - line,
                _minutes(STEP_HOLD_S),
            )
            self._anchor = (wall, mono)
            line = wall
        stamp: float | None = None
        # Why not, and what to log when that reason starts ("": already said, or nothing
        # worth saying: two reads at one instant of a test's clock).
        why: tuple[str, str] | None = None
        if kernel is None:
            why = ("unreadable", "the kernel's clock status cannot be read (adjtimex)")
        elif not kernel.disciplined:
            why = (
                "unsynchronized",
                "the kernel does not report the clock synchronized "
                f"(adjtimex maximum error {kernel.maxerror_s:g} s)",
            )
        elif self._stepped_at is not None and mono - self._stepped_at < STEP_HOLD_S:
            why = ("stepped", "")
        elif self._last_stamp is not None and line < self._last_stamp + MIN_STAMP_GAP_S:
            behind = self._last_stamp - line
            message = (
                f"the wall clock is {behind:.3f} s behind the last timestamp served, "
                "until it passes it"
            )
            why = ("behind", message if behind > STEP_TOLERANCE_S else "")
        else:
            stamp = self._last_stamp = line
        self._note(why)
        start_wall, start_mono = self._start
        self.last = ClockReading(
            time=start_wall + (mono - start_mono),
            wall=wall,
            stamp=stamp,
            steps_total=self._steps,
            kernel=kernel,
        )
        return self.last

    def _read_both(self, wall_clock: Callable[[], float]) -> tuple[float, float, float]:
        """The wall clock, the monotonic clock at the same moment, and how far apart the
        two reads may be. A thread preempted between two reads on a busy node would
        otherwise see a step that never was: the wall clock is read between two reads
        of the monotonic one, again if they are far apart."""
        for _ in range(READ_TRIES):
            before = self._monotonic()
            wall = wall_clock()
            after = self._monotonic()
            if after - before <= STEP_TOLERANCE_S / 10:
                break
        return wall, (before + after) / 2, (after - before) / 2

    def _read_kernel(self) -> KernelClock | None:
        try:
            return self._kernel()
        except OSError:
            return None  # _note says so, once

    def _note(self, why: tuple[str, str] | None) -> None:
        """One log line when stamping stops (and why), one when it resumes."""
        cause, message = why if why is not None else (None, "")
        if message and cause != self._unstamped_by:
            log.warning("serving samples without timestamps: %s", message)
        elif cause is None and self._unstamped_by is not None:
            log.warning("the clock is trusted again: samples carry timestamps")
        self._unstamped_by = cause


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"
