"""Restarts over the state file, and energy counter glitches (issue: a number you can
trust in production). Every test here failed on the exporter before the state file and
the glitch-aware counter: a restart started every counter at 0 and lost the gap, and a
raw reading below the last one was a reset that added the whole raw value."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from .faultrig import CPU_CHILD_PID, CPU_JOB_PID, Node, Rig, RigFactory, value, warnings_about
from .test_faults_nvml import gpu_energy, trace_joules

BOOT = "8a0d6c3e-0d3c-4d7e-9a3f-6a5c3b2f1e0d"


def set_boot(node: Node, boot_id: str) -> None:
    path = node.procfs / "sys" / "kernel" / "random" / "boot_id"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot_id + "\n")


def job_gpu(rig: Rig) -> float:
    return rig.energy("workload", component="gpu", gpu="0", workload="phased-load")


def restarts(rig: Rig, outcome: str) -> float:
    return value(rig.series, "wattprint_restarts_total", outcome=outcome)


def gap(rig: Rig, component: str, estimated: str = "false") -> float:
    return value(
        rig.series,
        "wattprint_restart_gap_energy_joules_total",
        component=component,
        estimated=estimated,
    )


@pytest.fixture(name="state_file")
def state_file_fixture(node: Node, tmp_path: Path) -> str:
    set_boot(node, BOOT)
    return str(tmp_path / "state" / "state.json")


def run_then_kill(rig_factory: RigFactory, state_file: str, steps: int = 5) -> Rig:
    rig = rig_factory(**{"state.file": state_file})
    rig.steps(steps)
    rig.kill()
    return rig


def first_read(node: Node) -> int:
    """The trace position of a new rig's first read (its first step advances)."""
    return node.nvml.position + 1


def test_a_killed_exporter_resumes_and_books_the_gap_to_the_job(
    node: Node, rig_factory: RigFactory, state_file: str
) -> None:
    start = first_read(node)
    first = run_then_kill(rig_factory, state_file)
    killed_at = node.nvml.position
    before = {gpu: gpu_energy(first, gpu) for gpu in ("0", "1")}
    job_before = job_gpu(first)
    cpu_before = first.energy("cpu", package="0")

    node.advance()  # the exporter is down for two steps of node time
    node.advance()
    second = rig_factory(**{"state.file": state_file})
    second.step()

    assert restarts(second, "resumed") == 1
    for gpu in ("0", "1"):
        # The device counter goes on: everything since the first start, gap included.
        assert gpu_energy(second, gpu) == pytest.approx(
            trace_joules(node, int(gpu), start, node.nvml.position)
        )
        assert gpu_energy(second, gpu) > before[gpu]
    drawn_in_gap = trace_joules(node, 0, killed_at, node.nvml.position)
    assert drawn_in_gap > 0
    # The job held GPU 0 before and after the gap: it pays for it, like any interval.
    assert job_gpu(second) - job_before == pytest.approx(drawn_in_gap)
    assert gap(second, "gpu") == pytest.approx(2 * drawn_in_gap)  # both GPUs
    # RAPL counters span the gap too (180 W package 0 for 3 steps: 2 down, 1 up).
    assert second.energy("cpu", package="0") - cpu_before == pytest.approx(3 * 180)
    assert gap(second, "cpu") == pytest.approx((180 + 150) * 3)


def test_the_state_is_written_before_each_sample_is_served(
    node: Node, rig_factory: RigFactory, state_file: str
) -> None:
    rig = rig_factory(**{"state.file": state_file})
    rig.steps(3)
    saved = json.loads(Path(state_file).read_text())
    totals = {d["device"]: d["total_uj"] for d in saved["devices"] if d["component"] == "gpu"}
    # Whatever a scraper saw, a restart continues from at least that.
    assert totals["0"] / 1e6 == pytest.approx(gpu_energy(rig, "0"))


def test_another_boot_starts_fresh_and_says_why(
    node: Node, rig_factory: RigFactory, state_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_then_kill(rig_factory, state_file)
    set_boot(node, "a-different-boot")
    node.advance()
    caplog.set_level(logging.WARNING)
    second = rig_factory(**{"state.file": state_file})
    second.step()
    assert gpu_energy(second, "0") == 0  # raw counters restarted with the machine
    assert restarts(second, "fresh") == 1 and restarts(second, "resumed") == 0
    assert len(warnings_about(caplog, "another boot")) == 1


def test_a_counter_behind_the_saved_one_is_not_resumed(
    node: Node, rig_factory: RigFactory, state_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_then_kill(rig_factory, state_file)
    node.advance()
    # The driver was reloaded while the exporter was down: its counter restarted.
    node.nvml.gpus[1].energy_offset_mj = -node.nvml.trace_energy_mj(1)
    caplog.set_level(logging.WARNING)
    second = rig_factory(**{"state.file": state_file})
    second.steps(2)
    said = warnings_about(caplog, "not resuming")
    assert len(said) == 1 and "gpu 1" in said[0] and "behind" in said[0]
    assert restarts(second, "fresh") == 1
    assert gpu_energy(second, "0") == pytest.approx(trace_joules(node, 0, 151 + 6, 151 + 7))


def test_a_gpu_swapped_while_down_is_not_resumed(
    node: Node, rig_factory: RigFactory, state_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_then_kill(rig_factory, state_file)
    node.nvml.gpus[0].uuid = "GPU-00000000-1111-2222-3333-444444444444"
    caplog.set_level(logging.WARNING)
    second = rig_factory(**{"state.file": state_file})
    second.step()
    assert "GPU-00000000" in " ".join(warnings_about(caplog, "not resuming"))
    assert restarts(second, "fresh") == 1


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "corrupt"),
        (b'{"format": "wattprint-state/v1", "boot_id": "%s", "devices": 3}', "corrupt"),
        (b"root:x:0:0:root:/root:/bin/bash\n", "corrupt"),
        (b'{"format": "something-else/v9"}', "foreign"),
    ],
)
def test_a_bad_state_file_never_stops_the_exporter(
    node: Node,
    rig_factory: RigFactory,
    state_file: str,
    caplog: pytest.LogCaptureFixture,
    content: bytes,
    reason: str,
) -> None:
    Path(state_file).parent.mkdir(parents=True)
    Path(state_file).write_bytes(content.replace(b"%s", BOOT.encode()))
    caplog.set_level(logging.WARNING)
    rig = rig_factory(**{"state.file": state_file})
    rig.steps(3)
    assert value(rig.series, "wattprint_state_errors_total", reason=reason) == 1
    assert restarts(rig, "fresh") == 1
    assert len(warnings_about(caplog, state_file)) == 1
    after = Path(state_file).read_bytes()
    if reason == "foreign":
        assert after == content  # someone else's file is never overwritten
    else:
        assert json.loads(after)["format"] == "wattprint-state/v1"


def test_an_unwritable_state_file_is_counted_and_sampling_goes_on(
    node: Node, rig_factory: RigFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    caplog.set_level(logging.WARNING)
    rig = rig_factory(**{"state.file": str(blocker / "state.json")})
    rig.steps(4)
    # Each sample's own failed write is served with it.
    assert value(rig.series, "wattprint_state_errors_total", reason="write") == 4
    assert len(warnings_about(caplog, "cannot write state file")) == 1
    assert gpu_energy(rig, "0") > 0


def glitch(node: Node, gpu: int, raw_mj: int) -> None:
    """Make GPU `gpu` read `raw_mj` at the current trace position."""
    node.nvml.gpus[gpu].energy_offset_mj = raw_mj - node.nvml.trace_energy_mj(gpu)


@pytest.mark.parametrize("bad", ["dip-1J", "zero"])
def test_a_glitching_counter_adds_nothing(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    rig = rig_factory()
    start = first_read(node)
    rig.steps(3)
    last_read = node.nvml.trace_energy_mj(0)
    node.advance()
    glitch(node, 0, last_read - 1000 if bad == "dip-1J" else 0)
    caplog.set_level(logging.WARNING)
    rig.step(advance=False)
    node.nvml.gpus[0].energy_offset_mj = 0
    rig.steps(3)
    truth = trace_joules(node, 0, start, node.nvml.position)
    assert gpu_energy(rig, "0") == pytest.approx(truth, rel=0.005)
    assert gpu_energy(rig, "0") == pytest.approx(gpu_energy(rig, "1"))  # its healthy twin
    assert job_gpu(rig) <= gpu_energy(rig, "0")
    assert rig.errors("nvml") == 1
    assert len(warnings_about(caplog, "GPU 0: energy counter went back")) == 1


def test_a_driver_reload_counts_what_follows_and_nothing_twice(
    node: Node, rig_factory: RigFactory
) -> None:
    rig = rig_factory()
    start = first_read(node)
    rig.steps(3)
    before = node.nvml.position
    node.advance()
    reload_at = node.nvml.position
    node.nvml.gpus[0].energy_offset_mj = -node.nvml.trace_energy_mj(0)  # reads 0 now
    rig.step(advance=False)
    rig.steps(3)
    truth = trace_joules(node, 0, start, before) + trace_joules(
        node, 0, reload_at, node.nvml.position
    )
    assert gpu_energy(rig, "0") == pytest.approx(truth, rel=0.005)
    assert rig.errors("nvml") == 0  # a reload is no error


def test_a_restart_while_the_wall_clock_stands_stepped_keeps_every_series(
    node: Node, rig_factory: RigFactory, state_file: str
) -> None:
    """Sampler time is the wall clock at start plus monotonic time: a process started
    while the wall clock is an hour off runs an hour off. The saved times are carried
    into it by the monotonic clock, which spans the restart, so no series ages by an
    hour at once (before: every workload expired in the sample that booked its gap,
    and that energy left the exported parts)."""
    from clock_fakes import NodeClocks

    clocks = NodeClocks()
    first = rig_factory(**{"state.file": state_file})
    clocks.install(first.exporter.sampler)
    for _ in range(4):
        clocks.advance(1)
        first.step()
    # job-a ends just before the kill: its series stay for the retention (10 min).
    node.remove_process(CPU_CHILD_PID)
    node.remove_process(CPU_JOB_PID)
    clocks.advance(1)
    first.step()
    job_before = job_gpu(first)
    killed_at = node.nvml.position
    first.kill()

    node.advance()
    clocks.advance(5)
    clocks.step(3600)  # `date -s` an hour ahead while the exporter is down
    second = rig_factory(**{"state.file": state_file})
    clocks.install(second.exporter.sampler)
    clocks.advance(1)
    second.step()  # the rig checks conservation in the exported text, expiries included
    assert restarts(second, "resumed") == 1
    assert job_gpu(second) - job_before == pytest.approx(
        trace_joules(node, 0, killed_at, node.nvml.position)
    )
    assert value(second.series, "wattprint_workload_energy_joules_total", workload="job-a") > 0


def test_the_state_text_is_the_document_it_stands_for_save_after_save() -> None:
    # The sampler writes the state's rows from text it keeps between saves: what it
    # writes must read back as the document itself, after series come, go, move on and
    # are reborn, and with numbers JSON can only spell as json.dumps does.
    from wattprint.core.model import Workload
    from wattprint.durability.document import DocumentText, Restored, SavedDevice, document, restore

    job, pod = Workload("slurm", "4243"), Workload("kubernetes", 'a"b\\c', "ns", "p\n1")
    device = SavedDevice("gpu", "0", "GPU-1", 10, 20, None, 300.5, 12.25, "measured", "H200")
    writer = DocumentText()

    def both(energy: dict, last_seen: dict) -> None:
        state = Restored(energy, last_seen, {}, {(7, 8): 9}, 1000, 5.5, {}, {}, {})
        args = ([device], ((job, "0", "GPU-1"),), "boot", 3.25, {"replay": {"at": 1}})
        text = writer.encode(state, *args)
        # Numbers compared as written (0.0 is not -0.0, NaN is NaN).
        exact = {"parse_float": str, "parse_constant": str}
        assert json.loads(text, **exact) == json.loads(json.dumps(document(state, *args)), **exact)
        if all(g == g and abs(g) != float("inf") for _, g, _ in energy.values()):
            assert restore(json.loads(text)).energy == energy

    both({("gpu", "0", job): (1, 0.5, 1.0), ("cpu", "", None): (2, 0.25, 1.0)}, {job: 4.0})
    both(
        {
            ("gpu", "0", job): (3, 1.5, 1.0),
            ("memory", "", pod): (4, 0.1 + 0.2, 2.5),
            ("cpu", "", None): (5, 1e-7, 0.5),  # reborn: another birth
        },
        {job: 5.0, pod: 5.0},
    )
    both({("memory", "", pod): (6, float("nan"), 2.5)}, {pod: float("inf")})
    # A series whose numbers stand still is written from its last row; one whose grams
    # alone move, or turn from 0.0 to -0.0, is not.
    both({("memory", "", pod): (6, float("nan"), 2.5)}, {pod: 6.0})
    both({("memory", "", pod): (7, 0.5, 2.5), ("cpu", "", job): (8, 0.0, 3.0)}, {pod: 6.0})
    both({("memory", "", pod): (7, 0.5, 2.5), ("cpu", "", job): (8, 0.0, 3.0)}, {pod: 7.0})
    both({("memory", "", pod): (7, 0.75, 2.5), ("cpu", "", job): (8, -0.0, 3.0)}, {pod: 7.0})
    both({("memory", "", pod): (7, 0.75, 2.5), ("cpu", "", job): (8, 0.0, 3.0)}, {pod: 7.0})


def test_the_state_text_keeps_the_job_cgroups_as_they_stand_save_after_save() -> None:
    # The job cgroups' CPU times are written from the text of the last save while none
    # moved (a node of still jobs): the file must still say what each one is now.
    from wattprint.durability.document import DocumentText, Restored, document, restore

    writer = DocumentText()
    args = ([], (), "boot", 3.25, {})
    for cgroups in (
        {},
        {"/a/cpu.stat": 5, 'b"\\/cpu.stat': 7},
        {"/a/cpu.stat": 5, 'b"\\/cpu.stat': 7},  # still
        {"/a/cpu.stat": 6, 'b"\\/cpu.stat': 7},  # one moved
        {'b"\\/cpu.stat': 7},  # one ended
        {},
    ):
        state = Restored({}, {}, {}, {}, 1000, 5.5, {}, {}, {}, cgroups=cgroups)
        text = writer.encode(state, *args)
        assert json.loads(text) == json.loads(json.dumps(document(state, *args)))
        assert restore(json.loads(text)).cgroups == cgroups
