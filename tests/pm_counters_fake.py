"""A node's HPE Cray pm_counters tree (tests/fixtures/sys/cray-ex) whose energy counter a
thread advances at a fixed power, for end-to-end tests that run the exporter with
`--platform.source=pm_counters --path.sysfs=<root>`: the node's input, and so a platform
component, beside whatever the other sources read."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "sys" / "cray-ex"
PERIOD_S = 0.1  # pm_counters' own refresh (10 Hz)


class PmCountersNode:
    """A sysfs root whose node draws `watts`; its cgroups are the machine's (fs ->
    /sys/fs), so that the exporter finds processes' jobs as without it."""

    def __init__(self, root: Path, watts: float) -> None:
        self.root, self.watts = root, watts
        self.counters = root / "cray" / "pm_counters"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pm_counters", daemon=True)

    def flags(self) -> list[str]:
        return ["--platform.source=pm_counters", f"--path.sysfs={self.root}"]

    def start(self) -> PmCountersNode:
        shutil.copytree(FIXTURE, self.root)
        (self.root / "fs").symlink_to("/sys/fs")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _write(self, name: str, text: str) -> None:
        # Whole or not at all, as the controller's files read.
        tmp = self.counters / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.counters / name)

    def _run(self) -> None:
        joules, freshness, last = 0.0, 0, time.monotonic()
        while not self._stop.wait(PERIOD_S):
            now = time.monotonic()
            joules += self.watts * (now - last)
            last, freshness = now, freshness + 1
            # As HPE's controller writes them: the value, its unit, when it was taken.
            stamp = f"{time.time_ns() // 1000} us"
            self._write("energy", f"{int(joules)} J {stamp}\n")
            self._write("power", f"{int(self.watts)} W {stamp}\n")
            self._write("freshness", f"{freshness}\n")
