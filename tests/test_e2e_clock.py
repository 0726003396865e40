"""End to end: a real Prometheus 2.42 scrapes the exporter (replaying the recorded H200
trace) every second while the node's clock misbehaves, as measured in issue 12:

- two hours ahead (no time daemon): every stamped sample was dropped as too far in the
  future, `up` 1, no alert;
- an hour ahead for 13 s, then back: stamps froze an hour ahead, Prometheus was blind
  for the rest of the run;
- an hour back: stamps advanced 1 ms a sample, 15 s of energy stored inside 15 ms.

The exporter runs under clock_fakes: its time.time() shifted and its kernel's clock
status chosen by the test, nothing else changed. Each run checks that Prometheus stored
what the exporter counted, to 1 %.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from clock_fakes import ClockControl
from conftest import TRACE, require_tool
from e2e_stack import (
    GPU_JOB,
    Prometheus,
    exporter_process,
    own,
    prometheus_scraping,
    replay_flags,
    wait_for_the_end,
)
from prom_harness import free_port
from test_rules import REPO

pytestmark = pytest.mark.slow

HOUR = 3600.0
TRACE_S = 70.0
DEVICE = "wattprint_gpu_energy_joules_total"
JOB = "wattprint_workload_energy_joules_total"
ALERTS = REPO / "rules" / "alerts.rules.yml"
H200_LIMIT_W = 700.0


SKEW = "wattprint_clock_time_seconds - timestamp(wattprint_clock_time_seconds)"


@dataclass
class Run:
    prometheus: Prometheus
    counters: dict[str, float]  # the exporter's own, at the end

    def assert_recorded_what_was_counted(self) -> None:
        """Prometheus's increase() over the run is what the exporter counted, to 1 %."""
        for name, selector in ((DEVICE, "{}"), (JOB, GPU_JOB)):
            counted = own(self.counters, name, selector)
            assert counted > 1000  # joules
            recorded = self.prometheus.increase(f"{name}{selector}")
            assert recorded == pytest.approx(counted, rel=0.01), name

    def stored_device_samples(self) -> list[tuple[float, float]]:
        return self.prometheus.stored(DEVICE)

    def alert(self, name: str) -> dict[str, str]:
        (alert,) = self.prometheus.query(f'ALERTS{{alertname="{name}"}}')
        labels: dict[str, str] = alert["metric"]
        return labels


@contextmanager
def clock_run(
    tmp: Path,
    speed: float,
    start: tuple[float, str],
    steps: Sequence[tuple[float, float, str]] = (),
) -> Iterator[Run]:
    """The replay under a faked node clock: `start` = (shift, kernel) from the first
    read on, then each step (seconds after the exporter answers, shift, kernel)."""
    binary = require_tool("prometheus")
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    target = f"127.0.0.1:{free_port()}"
    control = ClockControl(tmp / "clock.json")
    control.set(*start)
    command = control.command(*replay_flags(target, TRACE, speed))
    with (
        prometheus_scraping(binary, tmp / "prometheus", [target], [ALERTS]) as prometheus,
        exporter_process(command, target, tmp / "exporter.log") as url,
    ):
        began = time.monotonic()
        for at, shift, kernel in steps:
            time.sleep(max(began + at - time.monotonic(), 0))
            control.set(shift, kernel)
        left = TRACE_S / speed - (time.monotonic() - began)
        yield Run(prometheus, wait_for_the_end(url, max(left, 0)))


def test_two_hours_ahead_without_a_time_daemon_loses_nothing_and_alerts(
    tmp_path: Path,
) -> None:
    with clock_run(tmp_path, 4.0, start=(2 * HOUR, "unsynchronized")) as run:
        refused = run.prometheus.refused()
        assert refused["prometheus_target_scrapes_sample_out_of_bounds_total"] == 0
        assert len(run.stored_device_samples()) >= 15
        run.assert_recorded_what_was_counted()
        assert run.prometheus.value("wattprint_sample_timestamps_active") == 0
        assert run.prometheus.value(SKEW) == pytest.approx(2 * HOUR, abs=5)
        alert = run.alert("WattprintClockSkew")
        assert alert["alertstate"] in {"pending", "firing"}
        assert alert["severity"] == "warning"


def test_an_hour_ahead_for_13_s_then_back_loses_no_scrape(tmp_path: Path) -> None:
    """Even when the kernel vouches for the clock all along (the worst case), the
    excursion never reaches a stamp: Prometheus stores every scrape, none refused."""
    steps = [(5.0, HOUR, "disciplined"), (18.0, 0.0, "disciplined")]
    with clock_run(tmp_path, 2.0, start=(0.0, "disciplined"), steps=steps) as run:
        times = [t for t, _ in run.stored_device_samples()]
        assert max(b - a for a, b in itertools.pairwise(times)) < 2.5  # 1 s scrapes
        assert time.time() - times[-1] < 2.5
        assert set(run.prometheus.refused().values()) == {0}
        run.assert_recorded_what_was_counted()
        assert run.prometheus.value("wattprint_clock_steps_total") == 2
        assert run.prometheus.value("wattprint_clock_offset_seconds") == pytest.approx(0, abs=0.2)


def test_an_hour_back_puts_no_energy_into_milliseconds(tmp_path: Path) -> None:
    """No two stored samples closer than the replay allows: the power between them is
    at most what the GPU can draw (the H200's 700 W limit, replayed 4 x as fast)."""
    speed = 4.0
    steps = [(6.0, -HOUR, "disciplined")]
    with clock_run(tmp_path, speed, start=(0.0, "disciplined"), steps=steps) as run:
        stored = run.stored_device_samples()
        powers = [(e1 - e0) / (t1 - t0) for (t0, e0), (t1, e1) in itertools.pairwise(stored)]
        assert max(powers) < 2 * speed * H200_LIMIT_W
        assert set(run.prometheus.refused().values()) == {0}
        run.assert_recorded_what_was_counted()
        assert run.prometheus.value(SKEW) == pytest.approx(-HOUR, abs=5)
        assert run.alert("WattprintClockSkew")["alertstate"] in {"pending", "firing"}
