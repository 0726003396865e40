"""A run's name and the node's workload cap (issue 43): a name over the 128 characters a
label may be is never cut silently, and a run is never lost to a full
--workload.max-series: it asked to be measured, so it is counted, and its report says
the cap was full; a name run again and again is counted every time."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from .jobnode import JobNode, job_node

__all__ = ["job_node"]

BUSY = (sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass")


def job_of(job_node: JobNode, prefix: str) -> dict:  # type: ignore[type-arg]
    [path] = job_node.out.glob(f"wattprint-{prefix}*.json")
    path.rename(path.with_suffix(".seen"))  # the next run of the name writes anew
    return json.loads(path.with_suffix(".seen").read_text())  # type: ignore[no-any-return]


def test_a_workload_name_of_200_characters_is_hashed_and_said_never_lost(
    job_node: JobNode,
) -> None:
    name = "nightly-" + "x" * 192
    result = job_node.run(f"--workload={name}", command=BUSY)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    document = job_of(job_node, "nightly-")
    job = document["job"]
    assert document["raw"]["components"]["cpu"]["energy_j"] > 0
    assert len(job["workload"]) == 128 and job["workload"].startswith("nightly-xxx")
    assert any(note.startswith("--workload is 200 characters") for note in job["notes"])
    assert not any("saw no process" in note for note in job["notes"]), job["notes"]


def test_a_run_on_a_node_whose_workload_cap_is_full_is_counted_and_says_so(
    job_node: JobNode,
) -> None:
    busy = "import time\nwhile True:\n    sum(range(10000)); time.sleep(0.01)\n"
    other = subprocess.Popen(
        [sys.executable, "-c", busy], env=dict(job_node.env, WATTPRINT_WORKLOAD="someone-else")
    )
    try:
        time.sleep(0.5)
        for _ in range(2):  # a nightly: the same name, again
            result = job_node.run(
                "--workload.max-series=1", "--workload=nightly", command=BUSY, timeout=90
            )
            assert result.returncode == 0, result.stderr
            job = job_of(job_node, "nightly-")
            energy = job["raw"]["components"]["cpu"]["energy_j"]
            assert energy > 0, (job["job"]["notes"], result.stderr)
            [full] = [n for n in job["job"]["notes"] if "--workload.max-series (1) was full" in n]
            assert full.endswith(
                "this run registered with the sampler, so it was counted all the same"
            )
            assert not any("saw no process" in note for note in job["job"]["notes"])
    finally:
        other.kill()
        other.wait()


def test_the_cap_admits_a_registered_workload_over_it_and_out_of_other() -> None:
    from wattprint.attribution.cardinality import OVERFLOW, WorkloadCap
    from wattprint.core.model import Workload

    cap = WorkloadCap(max_workloads=1, retention=600.0)
    first, nightly = Workload("env", "first"), Workload("env", "nightly")
    cap.begin([], None)
    assert cap.admit(first) == first
    assert cap.admit(nightly) is OVERFLOW  # not registered: "other", as before
    cap.begin([first], 1.0)
    assert cap.admit(nightly, lambda w: {1000} if w == nightly else set()) == nightly
    assert cap.registered_over_total == 1  # out of "other", over the cap
    cap.begin([first, nightly], 2.0)
    flood = [Workload("env", f"flood-{i}") for i in range(5)]
    # Registered or not, never more than twice the cap.
    assert [cap.admit(w, lambda _: {1001}) for w in flood] == [OVERFLOW] * 5


def test_one_user_registering_names_never_takes_the_room_of_anothers_jobs() -> None:
    # Any local user can register names with the node's sampler: over a full cap, each
    # user lifts at most a 16th of it, so a flood of one user's registered names leaves
    # room for the registered job of another.
    from wattprint.attribution.cardinality import OVERFLOW, WorkloadCap
    from wattprint.core.model import Workload

    attacker, victim = 64102, 64101
    cap = WorkloadCap(max_workloads=32, retention=600.0)
    cap.begin([], None)
    for i in range(32):
        cap.admit(Workload("env", f"job-{i}"))
    flood = [Workload("env", f"flood-{i}") for i in range(40)]
    lifted = [w for w in flood if cap.admit(w, lambda _: {attacker}) != OVERFLOW]
    assert len(lifted) == 2  # 32 / 16
    nightly = Workload("env", "nightly")
    # The victim's name registered by the attacker too: charged to whoever has room.
    assert cap.admit(nightly, lambda _: {attacker, victim}) == nightly
    # The share holds across samples, while the lifted names keep their series.
    cap.begin([*(Workload("env", f"job-{i}") for i in range(32)), *lifted, nightly], 1.0)
    assert cap.admit(flood[-1], lambda _: {attacker}) is OVERFLOW
    assert cap.admit(Workload("env", "second"), lambda _: {victim}) != OVERFLOW
    # Without a registration, a full cap is full.
    assert cap.admit(Workload("env", "plain")) is OVERFLOW


def test_a_trackers_long_name_is_hashed_as_runs_are_and_said() -> None:
    # A project_name or workload= over what a name may be: its start and a hash of the
    # whole (two that begin alike stay two jobs), the rows say so; a workload= is the
    # label the sampler gives the process, so a tracker reading by name finds its series.
    from wattprint.attribution.cardinality import bound_label
    from wattprint.jobs.identity import Process, job_identity

    def identity(**names: str):  # type: ignore[no-untyped-def]
        return job_identity(
            {},
            script="train.py",
            process=Process(10, 1),
            parent=Process(1, 1),
            host="h",
            boot_id="b",
            **names,
        )

    one, two = identity(project="p" * 150 + "1"), identity(project="p" * 150 + "2")
    assert one.name != two.name and len(one.name) == 80 and one.name.startswith("ppp")
    assert one.note.startswith("the job's name is 151 characters, over the 80 it may be")
    assert identity(project="short").note == ""
    named = identity(workload="nightly-" + "x" * 192)
    assert named.id == bound_label("nightly-" + "x" * 192) and len(named.id) == 128
    assert "200 characters, over the 128" in named.note


def test_a_registered_run_past_its_users_share_is_told_where_its_energy_went() -> None:
    from wattprint.jobs.notes import cap_note
    from wattprint.jobs.reading import Reading

    full = Reading(time=0.0, workloads=4, workloads_max=4)
    counted = cap_note(full, registered=True, counted=True)
    assert counted is not None and counted.endswith("so it was counted all the same")
    missed = cap_note(full, registered=True, counted=False)
    assert missed is not None and 'energy is in workload="other"' in missed
    assert cap_note(Reading(time=0.0, workloads=3, workloads_max=4), True, False) is None
