"""Clock faults on a node: a wall clock hours ahead, a step forward and back, a step
back, the clock set by hand, and a kernel that will not say how its clock is kept.

The exporter is built as `wattprint` builds it (faultrig), its clocks faked at the
hardware boundary (clock_fakes.NodeClocks): each step below is one second of monotonic
time and one sample, then a scrape checked for conservation. What Prometheus 2.42 does
with the resulting stamps is in wattprint/clock.py and tests/test_e2e_clock.py.
"""

from __future__ import annotations

import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from clock_fakes import DISCIPLINED, SET_BY_HAND, UNSYNCHRONIZED, NodeClocks
from wattprint.core.model import UNSYNCHRONIZED_MAXERROR_S
from wattprint.sampler.clock import STEP_HOLD_S, read_kernel_clock

from .faultrig import CPU_CHILD_PID, CPU_JOB_PID, Node, Rig, RigFactory, warnings_about

HOUR = 3600.0
ENERGY = "wattprint_gpu_energy_joules_total"
JOB = "wattprint_workload_energy_joules_total"


def clocked(rig: Rig, clocks: NodeClocks) -> Rig:
    clocks.install(rig.exporter.sampler)
    return rig


def tick(rig: Rig, clocks: NodeClocks, count: int = 1) -> None:
    """`count` seconds of node time, one sample and one scrape each."""
    for _ in range(count):
        clocks.advance(1.0)
        rig.step()


def stamps(rig: Rig, name: str) -> set[float | None]:
    """The timestamps of `name`'s samples, as a person's curl sees them."""
    text = requests.get(f"{rig.url}/metrics", timeout=5).text
    return {
        s.timestamp if s.timestamp is None else float(s.timestamp)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    }


def stamp(rig: Rig) -> float | None:
    (only,) = stamps(rig, ENERGY)  # one stamp for every device: the sample's
    return only


def gauge(rig: Rig, name: str) -> float | None:
    values = [v for (n, _), v in rig.series.items() if n == name]
    return values[0] if values else None


def test_two_hours_ahead_without_a_time_daemon_serves_plain_samples(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Stamped 2 h ahead, every sample would be dropped by Prometheus (over 10 min
    ahead) while `up` stays 1. Unstamped, Prometheus files them at its own time."""
    clocks = NodeClocks(start=1_795_990_000.0 + 2 * HOUR, kernel=UNSYNCHRONIZED)
    rig = clocked(rig_factory(), clocks)
    tick(rig, clocks, 5)
    assert stamps(rig, ENERGY) == stamps(rig, JOB) == {None}
    assert rig.energy("gpu") > 0
    assert gauge(rig, "wattprint_sample_timestamps_active") == 0
    assert gauge(rig, "wattprint_clock_synchronized") == 0
    assert gauge(rig, "wattprint_clock_maxerror_seconds") == UNSYNCHRONIZED_MAXERROR_S
    assert len(warnings_about(caplog, "without timestamps")) == 1


def test_an_hour_ahead_for_13_s_then_back_never_reaches_a_stamp(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Even when the kernel vouches for each position of the clock (the worst case), a
    step is not followed until the clock has held still: the samples go out unstamped
    (Prometheus files them at its scrape time), neither frozen nor an hour ahead."""
    clocks = NodeClocks()
    rig = clocked(rig_factory(), clocks)
    tick(rig, clocks, 3)
    first = stamp(rig)
    assert first == clocks.wall()
    clocks.step(HOUR)
    for _ in range(13):
        before = rig.energy("gpu")
        tick(rig, clocks)
        assert stamp(rig) is None
        assert rig.energy("gpu") > before
    clocks.step(-HOUR)
    tick(rig, clocks, 5)
    assert stamp(rig) is None
    assert gauge(rig, "wattprint_clock_steps_total") == 2
    assert gauge(rig, "wattprint_clock_offset_seconds") == 0
    assert gauge(rig, "wattprint_sample_timestamps_active") == 0
    clocks.advance(STEP_HOLD_S - 6)
    tick(rig, clocks)
    assert stamp(rig) is None  # held still for 599 s only
    tick(rig, clocks)
    assert stamp(rig) == clocks.wall()  # held still for 600 s
    assert gauge(rig, "wattprint_sample_timestamps_active") == 1
    assert len(warnings_about(caplog, "stepped by +3600.000 s")) == 1
    assert len(warnings_about(caplog, "stepped by -3600.000 s")) == 1
    assert len(warnings_about(caplog, "trusted again")) == 1


def test_a_step_that_holds_is_followed(node: Node, rig_factory: RigFactory) -> None:
    """A clock put right stays right: the stamps re-base on it, one second a sample."""
    clocks = NodeClocks()
    rig = clocked(rig_factory(), clocks)
    tick(rig, clocks, 3)
    clocks.step(HOUR)
    tick(rig, clocks)
    clocks.advance(STEP_HOLD_S)
    served = []
    for _ in range(3):
        tick(rig, clocks)
        served.append(stamp(rig))
        assert served[-1] == clocks.wall()
    assert served == [served[0], served[0] + 1, served[0] + 2]


def test_a_clock_set_by_hand_is_trusted_again_once_the_time_daemon_vouches(
    node: Node, rig_factory: RigFactory
) -> None:
    """`date -s` leaves the kernel's clock unsynchronized (its ntp_clear()): no stamp
    is taken from it; once chrony vouches for the clock and it has held still, the
    stamps follow it."""
    clocks = NodeClocks()
    rig = clocked(rig_factory(), clocks)
    tick(rig, clocks, 3)
    before = stamp(rig)
    assert before is not None
    clocks.step(HOUR, kernel=SET_BY_HAND)
    tick(rig, clocks, 13)
    assert stamp(rig) is None
    clocks.step(-HOUR)
    tick(rig, clocks, 3)
    assert stamp(rig) is None
    clocks.kernel_clock = DISCIPLINED  # chrony has checked the time
    tick(rig, clocks)
    assert stamp(rig) is None  # the last step was 1 s ago
    clocks.advance(STEP_HOLD_S)
    tick(rig, clocks)
    assert stamp(rig) == clocks.wall() == before + 18 + STEP_HOLD_S


def test_an_hour_back_puts_no_energy_into_milliseconds(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Stamps 1 ms apart after a step back put 15 s of energy into 15 ms (690 kW):
    instead the samples go out unstamped until the clock is past the last stamp."""
    clocks = NodeClocks()
    rig = clocked(rig_factory(), clocks)
    tick(rig, clocks, 3)
    last = stamp(rig)
    assert last is not None
    clocks.step(-HOUR)
    for _ in range(15):
        before = rig.energy("gpu")
        tick(rig, clocks)
        assert stamp(rig) is None
        assert rig.energy("gpu") > before  # the energy is still counted, as it comes
    assert gauge(rig, "wattprint_clock_offset_seconds") == -HOUR
    clocks.advance(STEP_HOLD_S)
    tick(rig, clocks)
    assert stamp(rig) is None  # held still, but still behind the last stamp
    assert len(warnings_about(caplog, "behind the last timestamp")) == 1
    clocks.advance(last - clocks.wall())
    tick(rig, clocks)
    resumed = stamp(rig)
    assert resumed == clocks.wall() == last + 1


def test_a_step_moves_no_retention_deadline(node: Node, rig_factory: RigFactory) -> None:
    """A step an hour ahead would otherwise expire every job idle at that moment."""
    clocks = NodeClocks()
    rig = clocked(rig_factory(**{"workload.retention": "1m"}), clocks)
    tick(rig, clocks, 2)
    node.remove_process(CPU_CHILD_PID)
    node.remove_process(CPU_JOB_PID)
    clocks.step(HOUR)
    tick(rig, clocks)
    assert rig.energy("workload", workload="job-a") > 0  # kept: a minute has not passed
    tick(rig, clocks, 61)
    assert rig.energy("workload", workload="job-a") == 0  # expired after a real minute


def test_a_new_series_zero_is_stamped_on_the_timeline_of_its_value(
    node: Node, rig_factory: RigFactory
) -> None:
    """A series born before a step forward gets its 0 stamped as long before its value
    as its birth really was (by the monotonic clock), not an hour before it."""
    clocks = NodeClocks()
    rig = clocked(rig_factory(), clocks)
    tick(rig, clocks, 2)
    node.add_process(700, environ={"WATTPRINT_WORKLOAD": "late-job"}, rss_pages=1000)
    tick(rig, clocks)  # born at the previous read
    clocks.step(HOUR)
    tick(rig, clocks)
    clocks.advance(STEP_HOLD_S)
    rig.exporter.sampler.sample_once()  # the step has held: stamped
    scraper = {"X-Prometheus-Scrape-Timeout-Seconds": "10", "User-Agent": "Prometheus/2"}
    text = requests.get(f"{rig.url}/metrics", headers=scraper, timeout=5).text
    (zero,) = [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == JOB and s.labels["workload"] == "late-job" and s.labels["component"] == "cpu"
    ]
    assert zero.value == 0
    assert zero.timestamp is not None
    assert float(zero.timestamp) == clocks.wall() - 2.0 - STEP_HOLD_S  # its birth's read


def test_a_kernel_that_refuses_adjtimex_gets_plain_samples_and_one_log_line(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """systemd's ProtectClock=yes refuses even reading the clock's status."""
    clocks = NodeClocks(kernel=None)
    rig = clocked(rig_factory(), clocks)
    tick(rig, clocks, 4)
    assert stamps(rig, ENERGY) == {None}
    assert gauge(rig, "wattprint_clock_synchronized") is None  # nothing claimed
    assert gauge(rig, "wattprint_sample_timestamps_active") == 0
    assert warnings_about(caplog, "cannot be read (adjtimex)") == [
        "serving samples without timestamps: the kernel's clock status cannot be read (adjtimex)"
    ]


class Preempted(NodeClocks):
    """A busy node: the sampler's thread loses the CPU for 0.3 s right after it reads
    the wall clock, now and then."""

    def __init__(self) -> None:
        super().__init__()
        self.preempt = False

    def wall(self) -> float:
        wall = super().wall()
        if self.preempt:
            self.preempt = False
            self.advance(0.3)
        return wall


def test_a_busy_node_sees_no_step_that_was_not(node: Node, rig_factory: RigFactory) -> None:
    """A step taken for real would hold the stamps off for 10 minutes."""
    clocks = Preempted()
    rig = clocked(rig_factory(), clocks)
    for i in range(10):
        clocks.preempt = i % 2 == 1
        tick(rig, clocks)
        assert stamp(rig) is not None
    assert gauge(rig, "wattprint_clock_steps_total") == 0


@pytest.mark.skipif(sys.platform != "linux", reason="adjtimex is Linux's")
def test_the_kernel_says_how_its_clock_is_kept() -> None:
    """The real adjtimex, read-only, without any capability: the values are the
    kernel's own (it caps the maximum error at 16 s, where it sets STA_UNSYNC)."""
    kernel = read_kernel_clock()
    assert 0 <= kernel.maxerror_s <= UNSYNCHRONIZED_MAXERROR_S
    if kernel.synchronized:
        assert kernel.disciplined
