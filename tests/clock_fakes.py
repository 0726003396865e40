"""The node's clocks, faked at the hardware boundary: the wall clock, the monotonic
clock, and what the kernel says of its clock (adjtimex).

In the test's process:

    clocks = NodeClocks()             # disciplined by a time daemon, in 2026
    clocks.install(sampler)           # the sampler reads these clocks
    clocks.advance(1.0)               # a second passes
    clocks.step(3600, kernel=SET_BY_HAND)   # `date -s`: an hour ahead, unsynchronized

For an exporter process (`python tests/clock_fakes.py CONTROL -- --flag=value ...`),
time.time() is shifted and the kernel's answer chosen by the JSON file CONTROL, read
every 10 ms: {"shift": 7200, "kernel": "disciplined" | "unsynchronized" | "unreadable"}.
The test steps the clock by rewriting it (ClockControl).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wattprint.core.model import KernelClock
from wattprint.sampler.clock import StampClock

if TYPE_CHECKING:  # not at run time: the launcher must patch time.time first
    from wattprint.sampler.loop import Sampler

# chrony or timesyncd keeping the clock: the error is bounded well under 16 s.
DISCIPLINED = KernelClock(synchronized=True, maxerror_s=0.05)
# No time daemon since boot, or the clock just set by hand (the kernel's ntp_clear()).
SET_BY_HAND = UNSYNCHRONIZED = KernelClock(synchronized=False, maxerror_s=16.0)
KERNEL = {"disciplined": DISCIPLINED, "unsynchronized": UNSYNCHRONIZED}


class NodeClocks:
    """A wall clock that steps and a monotonic clock that does not."""

    def __init__(
        self,
        start: float = 1_795_990_000.0,
        kernel: KernelClock | None = DISCIPLINED,
        mono: float = 5_000.0,
    ) -> None:
        self.mono = mono
        self.offset = start - self.mono  # wall = monotonic + offset
        self.kernel_clock = kernel  # None: adjtimex refused

    def wall(self) -> float:
        return self.mono + self.offset

    def monotonic(self) -> float:
        return self.mono

    def kernel(self) -> KernelClock:
        if self.kernel_clock is None:
            raise OSError(1, "adjtimex: Operation not permitted")
        return self.kernel_clock

    def advance(self, seconds: float) -> None:
        self.mono += seconds

    def step(self, seconds: float, kernel: KernelClock | None = None) -> None:
        self.offset += seconds
        if kernel is not None:
            self.kernel_clock = kernel

    def install(self, sampler: Sampler) -> None:
        sampler.parts.clock = self.wall
        sampler.parts.monotonic = self.monotonic  # read times, and how long a restart took
        sampler.parts.stamp_clock = StampClock(self.monotonic, self.kernel)


@dataclass
class ClockControl:
    """The file a launched exporter's fake clocks obey."""

    path: Path

    def set(self, shift: float = 0.0, kernel: str = "disciplined") -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"shift": shift, "kernel": kernel}))
        tmp.replace(self.path)  # never a half-written file

    def command(self, *flags: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), str(self.path), "--", *flags]


def kept_clock_exporter(tmp: Path) -> list[str]:
    """The command that starts `wattprint` (flags follow) on a node whose clock a time
    daemon keeps, whether or not the machine running the test has one."""
    control = ClockControl(tmp / "clock.json")
    control.set(kernel="disciplined")
    return control.command()


def _launch(control: Path, flags: list[str]) -> None:
    state = json.loads(control.read_text())
    real_time = time.time

    def poll() -> None:
        while True:
            time.sleep(0.01)
            try:
                state.update(json.loads(control.read_text()))
            except (OSError, ValueError):
                continue

    def kernel() -> KernelClock:
        if state["kernel"] == "unreadable":
            raise OSError(1, "adjtimex: Operation not permitted")
        return KERNEL[state["kernel"]]

    # Before wattprint's modules bind time.time as a default argument.
    time.time = lambda: real_time() + float(state["shift"])
    import wattprint.sampler.clock

    wattprint.sampler.clock.read_kernel_clock = kernel
    threading.Thread(target=poll, daemon=True).start()
    from wattprint.cli.main import main

    sys.argv = ["wattprint", *flags]
    sys.exit(main())


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit("usage: clock_fakes.py CONTROL -- [wattprint flags]")
    os.environ.pop("PYTHONSTARTUP", None)
    _launch(Path(sys.argv[1]), sys.argv[3:])
