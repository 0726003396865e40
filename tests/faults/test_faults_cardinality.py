"""One tenant starts thousands of processes, each naming its own workload: the node's
series stay within --workload.max-series, and every joule is still accounted for (the
rig checks conservation, exactly in the snapshot and in the exported text, at every
step)."""

from __future__ import annotations

import random
import string

import pytest

from clock_fakes import NodeClocks

from .faultrig import CPU_CHILD_PID, CPU_JOB_PID, Node, Rig, RigFactory, value, warnings_about

FLOOD = 3000
FIRST_PID = 10_000


def random_names(count: int, seed: int = 12) -> list[str]:
    rng = random.Random(seed)
    alphabet = string.ascii_lowercase + string.digits
    return ["".join(rng.choices(alphabet, k=16)) for _ in range(count)]


def workloads(rig: Rig) -> set[str]:
    return {
        dict(labels)["workload"]
        for name, labels in rig.series
        if name == "wattprint_workload_energy_joules_total"
    }


def flood(node: Node, names: list[str], first_pid: int = FIRST_PID) -> list[int]:
    pids = list(range(first_pid, first_pid + len(names)))
    for pid, name in zip(pids, names):
        node.add_process(pid, start=5000, rss_pages=100, environ={"WATTPRINT_WORKLOAD": name})
    return pids


def test_random_workload_names_stay_within_the_cap_and_energy_is_conserved(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    rig = rig_factory()  # the default --workload.max-series
    rig.steps(2)
    before = workloads(rig)
    assert before == {"job-a", "phased-load"}

    flood(node, random_names(FLOOD))
    series = rig.steps(3)

    names = workloads(rig)
    assert len(names) == 500 + 1 and "other" in names
    assert before < names  # workloads that had series keep them
    assert value(series, "wattprint_workloads") == 500
    assert value(series, "wattprint_workloads_max") == 500
    assert value(series, "wattprint_workload_overflow_total") == FLOOD - (500 - len(before))
    # "other" is paid for what its processes used, like any workload.
    for component in ("cpu", "memory"):
        assert rig.energy("workload", component=component, workload="other") > 0
    # The whole exposition within the deploy files' arithmetic for a node of 2 GPUs:
    # (max-series + 1) x (3 x GPUs + 4) + 1000.
    assert len(series) <= 501 * (3 * 2 + 4) + 1000
    assert len(warnings_about(caplog, "--workload.max-series")) == 1


def test_room_freed_by_expiry_goes_to_new_workloads_not_to_those_in_other(
    node: Node, rig_factory: RigFactory
) -> None:
    rig = rig_factory(**{"workload.max-series": "5", "workload.retention": "1m"})
    clock = NodeClocks()
    clock.install(rig.exporter.sampler)
    rig.steps(2)
    early = flood(node, [f"early-{i}" for i in range(3)])
    rig.step()
    late = flood(node, [f"late-{i}" for i in range(4)], first_pid=FIRST_PID + 100)
    rig.step()
    assert workloads(rig) == {"job-a", "phased-load", "early-0", "early-1", "early-2", "other"}

    # job-a and two early workloads end; their series go after the retention. The late
    # ones still run: they stay in "other", which holds their whole energy.
    for pid in (CPU_CHILD_PID, CPU_JOB_PID, *early[:2]):
        node.remove_process(pid)
    clock.advance(61)
    rig.step()
    assert workloads(rig) == {"phased-load", "early-2", "other"}
    assert value(rig.series, "wattprint_workloads") == 2
    # A workload that starts now gets one of the freed slots.
    flood(node, ["fresh"], first_pid=FIRST_PID + 200)
    rig.step()
    assert workloads(rig) == {"phased-load", "early-2", "fresh", "other"}
    assert value(rig.series, "wattprint_workload_overflow_total") == len(late)

    # Once the late workloads have been gone for a retention, a name coming back is
    # new again, and there is room.
    for pid in late:
        node.remove_process(pid)
    clock.advance(61)
    rig.step()
    assert workloads(rig) == {"phased-load", "early-2", "fresh"}
    flood(node, ["late-0"], first_pid=FIRST_PID + 300)
    rig.step()
    assert "late-0" in workloads(rig)


def test_a_long_workload_name_is_cut_with_a_hash(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    rig = rig_factory()
    prefix = "w" * 10_000
    flood(node, [prefix + "-a", prefix + "-b"])
    rig.steps(2)
    long = {name for name in workloads(rig) if name.startswith("www")}
    assert len(long) == 2
    for name in long:
        assert len(name) == 128
        assert name.startswith("w" * 119 + "~")
    assert len(warnings_about(caplog, "characters long")) == 1
