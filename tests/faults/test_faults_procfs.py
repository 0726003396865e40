"""/proc faults: a process exits between the listing and the read, a PID is reused by a
new process, an environment cannot be read, and /proc itself cannot be read.

Processes ending mid-read and unreadable environments are normal on a busy node: they
must cost nothing (no error counted, nothing logged above debug) and keep conservation.
"""

from __future__ import annotations

import logging
import shutil

import pytest

from wattprint.host import procfs as procs

from .faultrig import CPU_CHILD_PID, CPU_JOB_PID, Node, Rig, RigFactory


def cpu_share(rig: Rig, workload: str) -> float:
    return rig.energy("workload", component="cpu", workload=workload)


def test_process_exits_between_listing_and_reading(
    node: Node,
    rig_factory: RigFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig: Rig = rig_factory()
    rig.steps(2)
    caplog.set_level(logging.INFO)
    real = procs.read_small
    exited: list[int] = []

    def read(path: str) -> bytes:
        # The process listed a moment ago exits just before its stat is read.
        if path.endswith(f"/{CPU_JOB_PID}/stat") and not exited:
            shutil.rmtree(node.procfs / str(CPU_JOB_PID))
            node.busy.pop(CPU_JOB_PID)
            exited.append(CPU_JOB_PID)
        return real(path)

    monkeypatch.setattr(procs, "read_small", read)
    before = cpu_share(rig, "job-a")
    rig.steps(3)
    assert exited
    assert rig.errors("procfs") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # Its child, already known as job-a's, runs on and keeps billing job-a.
    assert cpu_share(rig, "job-a") > before


def test_pid_reused_by_a_new_process(node: Node, rig_factory: RigFactory) -> None:
    rig: Rig = rig_factory()
    rig.steps(3)
    job_a = cpu_share(rig, "job-a")
    # job-a's process and its child end; a process of job-b gets the same PID later.
    node.remove_process(CPU_CHILD_PID)
    node.remove_process(CPU_JOB_PID)
    node.add_process(CPU_JOB_PID, start=90_000, environ={"WATTPRINT_WORKLOAD": "job-b"})
    rig.steps(3)
    assert cpu_share(rig, "job-a") == job_a  # the old identity is not inherited
    assert cpu_share(rig, "job-b") > 0
    assert rig.errors("procfs") == 0


def test_unreadable_environ_is_unattributed_not_an_error(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    environ = node.procfs / str(CPU_JOB_PID) / "environ"
    environ.unlink()
    # EISDIR: as unreadable as another user's environ without ptrace access (chmod
    # cannot make it so for root).
    environ.mkdir()
    caplog.set_level(logging.INFO)
    rig: Rig = rig_factory()
    rig.steps(3)
    assert rig.errors("procfs") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # Neither the process nor the child that would inherit from it can be claimed ...
    assert cpu_share(rig, "job-a") == 0
    assert rig.energy("unattributed", component="cpu") > 0
    # ... while everything else is attributed as usual.
    assert cpu_share(rig, "phased-load") > 0


def test_proc_unreadable_is_counted_said_once_and_unattributed(
    node: Node, rig_factory: RigFactory, caplog: pytest.LogCaptureFixture
) -> None:

    rig: Rig = rig_factory()
    rig.steps(3)  # every series past its first scrape, where it is served at 0
    caplog.set_level(logging.INFO)
    shared = {key: cpu_share(rig, key) for key in ("job-a", "phased-load")}
    unattributed = rig.energy("unattributed", component="cpu")
    for _ in range(3):
        node.advance()
        (node.procfs / "stat").unlink()  # e.g. --path.procfs on a mount that went stale
        rig.step(advance=False)
    assert rig.errors("procfs") == 3
    assert rig.success("procfs") == 0
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "cannot read processes" in said[0].getMessage()
    # Without a process table nobody can be billed: all of it is unattributed.
    assert {key: cpu_share(rig, key) for key in shared} == shared
    assert rig.energy("unattributed", component="cpu") > unattributed

    rig.steps(3)  # the node's /proc/stat is back
    assert rig.success("procfs") == 1
    assert cpu_share(rig, "job-a") > shared["job-a"]
