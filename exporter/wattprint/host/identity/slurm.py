"""Slurm jobs: the job id from the job's cgroup, else from the task's environment."""

from __future__ import annotations

from collections.abc import Iterable

from wattprint.core.model import Workload
from wattprint.host.identity.cgroup import slurm_job
from wattprint.host.identity.env import first_value

SCHEDULER = "slurm"
# SLURM_JOBID is the older spelling; slurmstepd still sets both.
ENV_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")


def from_cgroup(paths: Iterable[str]) -> Workload | None:
    job = slurm_job(paths)
    return Workload(scheduler=SCHEDULER, workload=job) if job else None


def from_environ(environ: bytes) -> Workload | None:
    job = first_value(environ, ENV_VARS)
    return Workload(scheduler=SCHEDULER, workload=job) if job else None
