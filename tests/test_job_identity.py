"""jobs/identity.py: the ranks of one launch share one job id, two launches never do,
whatever the launcher; launchers' placeholders are not names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from wattprint.jobs.identity import JobIdentity, Process, job_identity, readable_name

HOST, BOOT = "node-a", "boot-1"


def ident(
    environ: Mapping[str, str],
    pid: int = 1000,
    parent: int = 900,
    parent_ticks: int = 5,
    script: str = "/home/u/train.py",
    host: str = HOST,
    **kwargs: Any,
) -> JobIdentity:
    return job_identity(
        environ,
        script=script,
        process=Process(pid, 50 + pid),
        parent=Process(parent, parent_ticks),
        host=host,
        boot_id=BOOT,
        **kwargs,
    )


TORCHRUN = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "none"}


def test_torchrun_and_accelerate_placeholder_none_is_not_a_name() -> None:
    # accelerate launch / torchrun without --rdzv-id: TORCHELASTIC_RUN_ID=none.
    ranks = [ident(dict(TORCHRUN, RANK=str(r), LOCAL_RANK=str(r)), pid=1000 + r) for r in range(8)]
    assert len({r.id for r in ranks}) == 1
    job = ranks[0]
    assert "none" not in job.id and job.name == "train" and len(job.launch) == 8
    assert job.launcher == "launching process"
    # Another launch (another agent process, or the same pid started again later).
    assert ident(TORCHRUN, parent=901).id != job.id
    assert ident(TORCHRUN, parent_ticks=6).id != job.id
    # The same pids on another node are another launch.
    assert ident(TORCHRUN, host="node-b").id != job.id


@pytest.mark.parametrize("placeholder", ["none", "None", "", "NULL", "0", "default"])
def test_placeholders_are_never_names(placeholder: str) -> None:
    env = dict(TORCHRUN, TORCHELASTIC_RUN_ID=placeholder, WATTPRINT_WORKLOAD=placeholder)
    job = ident(env)
    assert job.launcher == "launching process" and job.name == "train"


def test_a_real_rdzv_id_is_shared_across_nodes() -> None:
    env = dict(TORCHRUN, TORCHELASTIC_RUN_ID="exp-42")
    a, b = ident(env, host="node-a", parent=1), ident(env, host="node-b", parent=2)
    assert a.id == b.id and a.launcher == "torchrun --rdzv-id"
    assert ident(dict(env, TORCHELASTIC_RUN_ID="exp-43")).id != a.id


def test_slurm_steps_are_launches_and_its_nodes_one_job() -> None:
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}
    a = ident(env, host="node-a", parent=1)
    assert a.id == ident(dict(env, SLURM_PROCID="9"), host="node-b", parent=7).id
    assert a.launcher == "slurm"
    assert ident(dict(env, SLURM_STEP_ID="1")).id != a.id  # the next srun of the allocation
    assert ident(dict(env, SLURM_JOB_ID="4243")).id != a.id


def test_mpirun_by_pmix_namespace_or_its_daemon() -> None:
    pmix = {"OMPI_COMM_WORLD_RANK": "1", "PMIX_NAMESPACE": "prterun-node-a-1234@1"}
    assert ident(pmix, parent=1).id == ident(dict(pmix, OMPI_COMM_WORLD_RANK="2"), parent=2).id
    assert ident(pmix).id != ident(dict(pmix, PMIX_NAMESPACE="prterun-node-a-1300@1")).id
    # MPICH's hydra: PMI_RANK only; its proxy launched the node's ranks.
    hydra = {"PMI_RANK": "0", "PMI_SIZE": "4"}
    assert ident(hydra, pid=1).id == ident(dict(hydra, PMI_RANK="1"), pid=2).id
    assert ident(hydra).id != ident(hydra, parent=901).id


def test_multiprocessing_spawned_ranks_share_their_parents_launch() -> None:
    # torch.multiprocessing.spawn: no RANK in the environment, one parent.
    assert ident({}, pid=1, spawned=True).id == ident({}, pid=2, spawned=True).id
    assert ident({}, spawned=True).id != ident({}, parent=901, spawned=True).id


def test_a_plain_process_is_its_own_launch() -> None:
    # Two runs of `python train.py` from one shell: the same parent, two jobs.
    assert ident({}, pid=1000).id != ident({}, pid=1001).id
    assert ident({}).launcher == "process"


def test_named_jobs_and_project_names() -> None:
    # WATTPRINT_WORKLOAD (what `wattprint run` exports) or workload=: the id as given.
    assert ident(dict(TORCHRUN, WATTPRINT_WORKLOAD="train")).id == "train"
    # As given, not sanitized: the sampler names the process by the same name
    # (`wattprint run --workload "my job"` exports it), so the tracker's series match.
    assert ident(TORCHRUN, workload="my job").id == "my job"
    assert ident(dict(TORCHRUN, WATTPRINT_WORKLOAD="a b/c")).id == "a b/c"
    # A codecarbon project_name is a name, with the launch id: projects run many times.
    job = ident(TORCHRUN, project="llm-finetune")
    assert job.name == "llm-finetune" and job.id.startswith("llm-finetune-")
    assert ident(TORCHRUN, project="llm-finetune", parent=901).id != job.id


def test_a_given_launch_id_comes_first() -> None:
    # `wattprint run` gives its command $WATTPRINT_LAUNCH_ID (and its name, if it has one).
    under_run = dict(TORCHRUN, WATTPRINT_WORKLOAD="train", WATTPRINT_LAUNCH_ID="slurm-7.0")
    job = ident(under_run)
    assert (job.id, job.launch, job.named) == ("train", "slurm-7.0", True)
    given = dict(TORCHRUN, WATTPRINT_LAUNCH_ID="abc")
    job = ident(given, project="p")
    assert job.launcher == "$WATTPRINT_LAUNCH_ID" and job.id.startswith("p-")
    assert ident(given, parent=1, project="p").id == job.id  # whatever process started it
    assert ident(dict(given, WATTPRINT_LAUNCH_ID="abd"), project="p").id != job.id
    assert ident(dict(given, WATTPRINT_LAUNCH_ID="none")).launcher == "launching process"


def test_readable_names() -> None:
    assert readable_name("/x/train.py", None) == "train"
    assert readable_name("-c", None) == "python"
    assert readable_name("", None) == "python"
    assert readable_name("/x/train.py", "none") == "train"
    assert readable_name("/x/train.py", "a/b c") == "a_b_c"
