"""The node's input power from the BMC's DCMI "Get Power Reading", in band (/dev/ipmiN).

ipmitool sends the raw request (netfn 0x2C, cmd 0x02, group extension 0xDC, mode 0x01:
system power statistics) and prints the response's bytes in hex, the same in every
locale and ipmitool version; the bytes are decoded here (DCMI 1.5, table 6-16). ipmitool
rather than freeipmi's ipmi-dcmi: it is in every distribution's base repository, and its
`raw` output is bytes, not text to parse. Like Redfish, a BMC answers in seconds or not
at all, so it is asked on a thread of its own, each call killed at its deadline, and a
sample only takes the latest answer.

The reading carries the BMC's own timestamp. A reading whose timestamp has not moved is
the one already counted, not new power: the sample is held (the platform's share waits
for the next reading, attribution/platform.py). A new reading adds the trapezoid since
the previous one over the BMC's own interval between them (estimated). A BMC that says
its measurement is not active, fails, or gives no new reading for STALE_AFTER_S is said
in collector_success and held out of the platform split: nothing is invented.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wattprint.core.background import Poller
from wattprint.core.model import DeviceReading, SourceResult
from wattprint.sources.counters import StampedPower
from wattprint.sources.pm_counters import NODE_MAX_POWER_W
from wattprint.sources.redfish import MAX_BRIDGE_S, STALE_AFTER_S
from wattprint.sources.registry import METHOD_IPMI_INTEGRATED

REQUEST_DEADLINE_S = 8.0  # one ipmitool call, whole: a BMC may take 5 s
POLL_INTERVAL_S = 1.0  # between the end of one call and the start of the next
# Get Power Reading, mode 0x01 (system power statistics), no rolling average.
POWER_READING = ("raw", "0x2c", "0x02", "0xdc", "0x01", "0x00", "0x00")
# Group extension, current, minimum, maximum, average (W), timestamp (s), period (ms), state.
_LAYOUT = struct.Struct("<BHHHHIIB")
_ACTIVE = 0x40  # state byte, bit 6: power measurement active
_CLOCK_SLACK_S = 2.0


class IpmiError(ValueError):
    """A reading that cannot be used; one line."""


@dataclass(frozen=True)
class PowerReading:
    """One DCMI power reading as the BMC answered it."""

    current_w: int
    minimum_w: int
    maximum_w: int
    average_w: int
    timestamp: int  # the BMC's clock, seconds
    period_ms: int  # the statistics' reporting period
    active: bool  # the BMC is measuring power


def parse_power_reading(text: str) -> PowerReading:
    """The reading from `ipmitool raw`'s hex bytes (completion code already stripped)."""
    tokens = text.split()
    if not tokens or not all(re.fullmatch(r"[0-9a-fA-F]{2}", t) for t in tokens):
        raise IpmiError(f"not hex bytes: {text.strip()[:80]!r}")
    data = bytes(int(t, 16) for t in tokens)
    if len(data) < _LAYOUT.size:
        raise IpmiError(f"{len(data)} bytes, not the {_LAYOUT.size} of a power reading")
    ext, current, low, high, average, stamp, period, state = _LAYOUT.unpack_from(data)
    if ext != 0xDC:
        raise IpmiError(f"group extension {ext:#04x}, not DCMI's 0xdc")
    return PowerReading(current, low, high, average, stamp, period, bool(state & _ACTIVE))


def device_number(device: str) -> str:
    """ipmitool's -d for /dev/ipmiN (or /dev/ipmi/N, /dev/ipmidev/N)."""
    found = re.fullmatch(r"/dev/ipmi(?:dev/|/)?(\d+)", device)
    if found is None:
        raise IpmiError(f"bad value for --platform.ipmi-device: {device!r} is not /dev/ipmiN")
    return found.group(1)


def power_reading_argv(ipmitool: str, device: str) -> tuple[str, ...]:
    return (ipmitool, "-I", "open", "-d", device_number(device), *POWER_READING)


def ask(
    argv: Sequence[str],
    deadline_s: float = REQUEST_DEADLINE_S,
    started: Callable[[subprocess.Popen[bytes] | None], None] | None = None,
) -> PowerReading:
    """One power reading, or OSError or IpmiError (ValueError) saying why not."""
    return parse_power_reading(run_bounded(argv, deadline_s, started))


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_bounded(
    argv: Sequence[str],
    deadline_s: float,
    started: Callable[[subprocess.Popen[bytes] | None], None] | None = None,
) -> str:
    """argv's stdout; killed with its children at the deadline. OSError or IpmiError.
    `started` is told the process while it runs (and None once it is over), for a
    caller that must be able to kill it sooner."""
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: a hung child is killed with it
        env={**os.environ, "LC_ALL": "C"},
    ) as proc:
        if started is not None:
            started(proc)
        try:
            out, err = proc.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.communicate()
            raise IpmiError(f"no answer in {deadline_s:g} s") from None
        finally:
            if started is not None:
                started(None)
    if proc.returncode < 0:
        raise IpmiError(f"ipmitool killed by signal {-proc.returncode}")
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"]
        raise IpmiError(lines[-1][:200])
    return out.decode(errors="replace")


@dataclass(frozen=True)
class Answer:
    reading: PowerReading
    at: float  # the source's clock when it came


class IpmiSource(Poller[Answer]):
    """The node's input (component "node") from DCMI power readings, polled on a thread."""

    name = "ipmi"
    thread_name = "wattprint-ipmi"

    def __init__(
        self,
        ipmitool: str,
        device: str = "/dev/ipmi0",
        clock: Callable[[], float] = time.monotonic,
        deadline_s: float = REQUEST_DEADLINE_S,
        poll_s: float = POLL_INTERVAL_S,
    ) -> None:
        self.device = device
        self.argv = power_reading_argv(ipmitool, device)
        self._clock = clock
        self._deadline = deadline_s
        super().__init__(poll_s)
        self._child: subprocess.Popen[bytes] | None = None  # the call under way
        # The BMC's and this node's clocks may disagree on an interval by the polling and
        # the BMC's latency; beyond that the BMC's clock was set.
        self._power = StampedPower(_CLOCK_SLACK_S + poll_s + deadline_s, MAX_BRIDGE_S)
        self.start()

    # -- the poller's thread -----------------------------------------------------------

    def poll_once(self) -> Answer:
        return Answer(ask(self.argv, self._deadline, self._running), self._clock())

    def _running(self, proc: subprocess.Popen[bytes] | None) -> None:
        with self._lock:
            self._child = proc
        if proc is not None and self._stop.is_set():
            kill_group(proc)  # closed while it started

    def _interrupt(self) -> None:
        """Closing: the call under way is killed, not left behind the exporter."""
        with self._lock:
            child = self._child
        if child is not None:
            kill_group(child)

    # -- the sampler's thread ----------------------------------------------------------

    def read(self) -> SourceResult:
        result = SourceResult()
        now = self._clock()
        answer, failure = self.latest()
        if failure:
            stands = " (a reading of before stands)" if answer is not None else ""
            result.errors.append(f"ipmi {self.device}: {failure}{stands}")
        if answer is None:
            return result
        reading = answer.reading
        if not reading.active:
            result.errors.append(f"ipmi {self.device}: the BMC's power measurement is not active")
            return result
        watts = float(min(reading.current_w, NODE_MAX_POWER_W))
        counted, gap = self._power.stamp is not None, now - self._power.counted_at
        outcome = self._power.update(watts, reading.timestamp, now)
        if outcome == "held":
            if gap > STALE_AFTER_S:
                result.errors.append(
                    f"ipmi {self.device}: stale: the BMC's reading has kept its timestamp "
                    f"for {gap:.0f} s"
                )
            elif not result.errors:
                result.held.append(("node", "node"))
            return result  # the reading already counted: held, not new power
        if outcome == "restarted" and counted:
            result.errors.append(f"ipmi {self.device}: no new reading for {gap:.0f} s: not bridged")
            result.rebased.append(("node", "node"))
        result.devices.append(
            DeviceReading(
                component="node",
                device="node",
                energy_uj=self._power.total,
                power_w=watts,
                method=METHOD_IPMI_INTEGRATED,
                max_power_w=NODE_MAX_POWER_W,
            )
        )
        return result

    def explain(self) -> list[str]:
        """Doctor's line, once the first call is over: the BMC's reading, or why not."""
        self._polled.wait(self._deadline + 1)
        answer, failure = self.latest()
        line = f"node: ipmi (DCMI power reading through {self.device})"
        if failure or answer is None:
            return [f"{line}; last call failed: {failure}"]
        r = answer.reading
        state = "active" if r.active else "NOT active (held out)"
        return [
            f"{line}: {r.current_w} W now, {r.average_w} W average over {r.period_ms} ms, "
            f"measurement {state}, integrated ({METHOD_IPMI_INTEGRATED}, estimated)"
        ]

    def close(self) -> None:
        self.stop(timeout_s=0.1)
