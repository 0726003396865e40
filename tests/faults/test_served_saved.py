"""What the exporter serves is what it has saved (issue 39): while the state file cannot
be written, the counters served hold still at the last save, so that a restart after a
kill (resuming from that save) serves no counter lower than one served before it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from random import Random

import pytest

from .faultrig import (
    CPU_CHILD_PID,
    CPU_JOB_PID,
    GPU_PID,
    STEP_S,
    Node,
    Rig,
    RigFactory,
    ScrapeLedger,
    Series,
    parse,
    value,
)
from .test_faults_nvml import gpu_energy
from .test_restart import BOOT, set_boot
from .test_state_durability import EMBODIED, leave_free, small_disk_fixture  # noqa: F401

JOB = {"component": "gpu", "gpu": "0", "workload": "phased-load"}
JOBS = 40  # env-tagged jobs beside the fixture's: a state of a few pages
# Counters of this process alone, not resumed: a restart starts them again (from the
# saved count for the state errors, which a full disk kept from being saved).
PROCESS_COUNTERS = ("wattprint_state_errors_total", "wattprint_collector_errors_total")
HELD = (
    "wattprint_workload_energy_joules_total",
    "wattprint_workload_emissions_grams_total",
    "wattprint_unattributed_energy_joules_total",
    "wattprint_gpu_energy_joules_total",
    "wattprint_cpu_energy_joules_total",
    "wattprint_workload_embodied_grams_total",
)


def _tagged_node(node: Node) -> None:
    set_boot(node, BOOT)
    for n in range(JOBS):
        node.add_process(900 + n, environ={"WATTPRINT_WORKLOAD": f"job-{n}"}, rss_pages=1000)


def _counters(series: Series) -> Series:
    return {k: v for k, v in series.items() if k[0] in HELD}


class NodeMonotonic:
    """The node's monotonic clock, one second a step as its counters rise (the steps
    run faster than that): a restart's gap is then what the devices could draw."""

    def __init__(self) -> None:
        self.steps = 0

    def __call__(self) -> float:
        return time.monotonic() + self.steps * STEP_S


def _rig(rig_factory: RigFactory, state: Path, clock: NodeMonotonic) -> Rig:
    rig = rig_factory(**{"state.file": str(state), **EMBODIED})
    rig.exporter.sampler.parts.monotonic = clock
    return rig


def _steps(rig: Rig, clock: NodeMonotonic, count: int) -> None:
    for _ in range(count):
        clock.steps += 1
        rig.step()


def test_a_kill_while_the_disk_is_full_serves_no_counter_lower_after_the_restart(
    node: Node, rig_factory: RigFactory, small_disk: Path
) -> None:
    _tagged_node(node)
    state = small_disk / "state.json"
    clock = NodeMonotonic()
    first = _rig(rig_factory, state, clock)
    _steps(first, clock, 3)
    saved = _counters(first.series)
    filler = leave_free(small_disk, 0)
    # The disk full for 20 samples (every scrape checked by the ledger); the GPU job and
    # the CPU job end half-way through: a restart books what they used meanwhile to
    # nobody, as it cannot tell.
    _steps(first, clock, 10)
    for pid in (GPU_PID, CPU_CHILD_PID, CPU_JOB_PID):
        node.remove_process(pid)
    _steps(first, clock, 10)
    # Held still at the last save, though the job used energy meanwhile.
    assert _counters(first.series) == saved
    health = first.session.get(f"{first.url}/healthz", timeout=5)
    assert (health.status_code, health.text) == (
        200,
        "ok; the state file cannot be written: counters held at the last save\n",
    )
    assert first.snapshot is not None
    assert sum(s.energy_uj for s in first.snapshot.energy) / 1e6 > sum(
        v for (n, _), v in saved.items() if n == "wattprint_workload_energy_joules_total"
    )

    first.kill()
    filler.unlink()
    second = _rig(rig_factory, state, clock)
    # One scraper across the restart: no counter it saw goes down, and from the first
    # scrape the workload and unattributed parts add up to every device.
    ledger = first.ledger
    ledger.previous = {k: v for k, v in ledger.previous.items() if k[0] not in PROCESS_COUNTERS}
    second.ledger = ledger
    _steps(second, clock, 3)
    assert second.energy("workload", **JOB) == value(
        saved, "wattprint_workload_energy_joules_total", **JOB
    )
    # Each failed save counted and served with its sample.
    assert value(first.series, "wattprint_state_errors_total", reason="write") == 20


def test_the_energy_held_while_the_disk_is_full_is_served_at_the_next_save(
    node: Node, rig_factory: RigFactory, small_disk: Path
) -> None:
    _tagged_node(node)
    state = small_disk / "state.json"
    clock = NodeMonotonic()
    rig = _rig(rig_factory, state, clock)
    _steps(rig, clock, 3)
    filler = leave_free(small_disk, 0)
    _steps(rig, clock, 5)
    held = gpu_energy(rig, "0")
    filler.unlink()
    _steps(rig, clock, 1)
    assert rig.snapshot is not None
    # Everything measured meanwhile, nothing lost: the sampler's own totals, served.
    device = next(d for d in rig.snapshot.devices if d.component == "gpu" and d.device == "0")
    assert gpu_energy(rig, "0") == device.energy_uj / 1e6 > held
    assert rig.session.get(f"{rig.url}/healthz", timeout=5).text == "ok\n"
    job = next(
        s
        for s in rig.snapshot.energy
        if s.workload is not None and s.workload.workload == "phased-load" and s.gpu == "0"
    )
    assert rig.energy("workload", **JOB) == job.energy_uj / 1e6
    assert os.path.getsize(state) > 0


def test_a_restart_on_a_full_disk_serves_no_counter_until_it_can_save(
    node: Node, rig_factory: RigFactory, small_disk: Path
) -> None:
    """Resumed, and nothing saved since: a restart would resume from the same file,
    below what this run counts, so it serves none of its counters until it can save."""
    _tagged_node(node)
    state = small_disk / "state.json"
    clock = NodeMonotonic()
    first = _rig(rig_factory, state, clock)
    _steps(first, clock, 3)
    first.kill()
    filler = leave_free(small_disk, 0)
    second = _rig(rig_factory, state, clock)
    ledger = first.ledger
    for _ in range(3):
        clock.steps += 1
        node.advance()
        second.exporter.sampler.sample_once()
        text = second.session.get(f"{second.url}/metrics", timeout=5).text
        assert "wattprint_workload_energy_joules_total{" not in text
    health = second.session.get(f"{second.url}/healthz", timeout=5).text
    assert health == "ok; the state file cannot be written: no counters served until it is\n"
    filler.unlink()
    second.ledger = ledger  # the scraper of the first run: nothing it saw goes down
    _steps(second, clock, 2)
    assert second.energy("workload", **JOB) > value(
        first.series, "wattprint_workload_energy_joules_total", **JOB
    )


def _scrape(rig: Rig, clock: NodeMonotonic, ledger: ScrapeLedger) -> None:
    """One step of node time, one sample and one scrape, checked by `ledger` (a scrape
    without counters, as while a resumed run cannot save, has nothing to check)."""
    clock.steps += 1
    rig.node.advance()
    rig.exporter.sampler.sample_once()
    current = parse(rig.session.get(f"{rig.url}/metrics", timeout=5).text)
    if any(name in HELD for name, _ in current):
        problems = ledger.check(current)
        assert not problems, problems


@pytest.mark.parametrize("seed", range(6))
def test_no_counter_goes_down_whatever_the_order_of_events(
    node: Node, rig_factory: RigFactory, small_disk: Path, seed: int
) -> None:
    """Disk full and freed, kills and restarts (on a full disk too), jobs coming and
    going, in a random order: one scraper across every restart sees no counter go down,
    and the parts add up to the devices at every scrape."""
    random = Random(seed)
    _tagged_node(node)
    state = small_disk / "state.json"
    clock = NodeMonotonic()
    rig = _rig(rig_factory, state, clock)
    ledger = ScrapeLedger()
    filler: Path | None = None
    pid = 2000
    for _ in range(40):
        event = random.choice(("step", "step", "fill", "free", "kill", "start", "end"))
        if event == "fill" and filler is None:
            filler = leave_free(small_disk, 0)
        elif event == "free" and filler is not None:
            filler.unlink()
            filler = None
        elif event == "kill":
            rig.kill()
            ledger.previous = {
                k: v for k, v in ledger.previous.items() if k[0] not in PROCESS_COUNTERS
            }
            rig = _rig(rig_factory, state, clock)
        elif event == "start":
            pid += 1
            node.add_process(pid, environ={"WATTPRINT_WORKLOAD": f"late-{pid}"}, rss_pages=500)
        elif event == "end" and len(node.busy) > 2:
            node.remove_process(random.choice(sorted(node.busy)))
        _scrape(rig, clock, ledger)
    if filler is not None:
        filler.unlink()
    for _ in range(2):
        _scrape(rig, clock, ledger)
