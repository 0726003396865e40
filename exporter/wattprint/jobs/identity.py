"""Which job a tracker's process belongs to: one id for the ranks of one launch, never
the same for two launches, whatever started them.

The id is a readable name (the entry script, or the project's name) and a launch id:
the launcher's own id where it has a real one (Slurm's job and step, torchrun's
--rdzv-id, PMIx's namespace), else the process that launched the ranks (its pid and
start time, on this boot of this host); $WATTPRINT_LAUNCH_ID, where `wattprint run` or
the user gave one, before all. A name the user gave (`workload=`, $WATTPRINT_WORKLOAD,
which `wattprint run` exports to its command) is the id as is, or, over the 128
characters a label may be, its start and a hash of the whole, as `wattprint run` does.
job_identity() is pure: identify() passes it what the kernel says of this process.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wattprint.attribution.cardinality import MAX_LABEL_LENGTH, bound_label
from wattprint.host.procfs import read_proc

# What launchers put in their id variables when nobody named the run: not names.
PLACEHOLDERS = frozenset({"", "none", "null", "default", "0", "undefined", "unknown"})
# Set in each rank by a launcher that starts several (torchrun, accelerate, mpirun, srun).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
# A project's or script's characters in the id: with "-" and the launch id, far below a
# label's MAX_LABEL_LENGTH.
MAX_NAME = 80


@dataclass(frozen=True)
class Process:
    """A process as the kernel tells it apart: pid and start time (clock ticks since boot)."""

    pid: int
    start_ticks: int


@dataclass(frozen=True)
class JobIdentity:
    name: str  # readable: the script or project
    launch: str  # the launch id ("" for a job the user named outside `wattprint run`)
    launcher: str  # what the launch id came from, for the log
    named: bool = False  # the user's name is the id, as given
    long: str = ""  # the name as given where it was too long and is hashed in `name`

    @property
    def id(self) -> str:
        return self.name if self.named or not self.launch else f"{self.name}-{self.launch}"

    @property
    def note(self) -> str:
        """What the rows say of a name hashed ("" for none)."""
        if not self.long:
            return ""
        limit = MAX_LABEL_LENGTH if self.named else MAX_NAME
        return (
            f"the job's name is {len(self.long)} characters, over the {limit} it may be: "
            f"counted as {self.name!r} (its start and a hash of the whole)"
        )


def is_placeholder(value: str | None) -> bool:
    return value is None or value.strip().lower() in PLACEHOLDERS


def readable_name(script: str, project: str | None) -> str:
    """The project's name, else the entry script's (`train` for train.py)."""
    if project and not is_placeholder(project):
        return _clean(project)
    base = os.path.basename(script.rstrip("/")) if script and script != "-c" else ""
    stem = base[:-3] if base.endswith(".py") else base
    return _clean(stem or "python")


def job_identity(
    environ: Mapping[str, str],
    *,
    script: str,
    process: Process,
    parent: Process,
    host: str,
    boot_id: str,
    workload: str | None = None,
    project: str | None = None,
    spawned: bool = False,
) -> JobIdentity:
    """The job of a process: `script` is its argv[0], `parent` its parent process;
    `spawned`: started by Python's multiprocessing (torch.multiprocessing.spawn's ranks)."""
    named = workload or environ.get("WATTPRINT_WORKLOAD")
    given = environ.get("WATTPRINT_LAUNCH_ID", "")  # `wattprint run` gives its command one
    if named and not is_placeholder(named):
        # As the sampler labels the process (files sanitize it): as given, or hashed.
        bounded = bound_label(named)
        launch = "" if is_placeholder(given) else given
        return JobIdentity(bounded, launch, "named", True, "" if bounded == named else named)
    name = readable_name(script, project)
    given_name = project if project and not is_placeholder(project) else os.path.basename(script)
    long = given_name if "~" in name else ""  # _clean leaves no "~" but a hash's
    if not is_placeholder(given):
        return JobIdentity(name, _short(f"given:{given}"), "$WATTPRINT_LAUNCH_ID", long=long)
    launcher, key = _launch_key(environ, process, parent, host, boot_id, spawned)
    return JobIdentity(name, _short(key), launcher, long=long)


def identify(
    workload: str | None, project: str | None, environ: Mapping[str, str], host: str
) -> JobIdentity:
    """This process's job from what the kernel says of it."""
    me, parent = read_proc(os.getpid()), read_proc(os.getppid())
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = ""
    return job_identity(
        environ,
        script=sys.argv[0] if sys.argv else "",
        process=Process(os.getpid(), me.start_ticks if me else 0),
        parent=Process(os.getppid(), parent.start_ticks if parent else 0),
        host=host,
        boot_id=boot_id,
        workload=workload,
        project=project,
        spawned=multiprocessing.parent_process() is not None,
    )


def _launch_key(
    environ: Mapping[str, str],
    process: Process,
    parent: Process,
    host: str,
    boot_id: str,
    spawned: bool,
) -> tuple[str, str]:
    slurm_job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not is_placeholder(slurm_job):
        step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID") or "batch"
        # A job id is one per cluster; the step tells two sruns of one allocation apart.
        return "slurm", f"slurm:{environ.get('SLURM_CLUSTER_NAME', '')}:{slurm_job}.{step}"
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if not is_placeholder(run_id):
        return "torchrun --rdzv-id", f"torchelastic:{run_id}"
    namespace = environ.get("PMIX_NAMESPACE")
    if not is_placeholder(namespace):
        return "PMIx namespace", f"pmix:{host}:{namespace}"
    if spawned or any(name in environ for name in RANK_VARIABLES):
        # One launcher process starts the ranks of one launch on a node (torchrun's agent,
        # accelerate, mpirun's daemon): its pid and start time tell launches apart.
        return "launching process", f"parent:{host}:{boot_id}:{parent.pid}:{parent.start_ticks}"
    return "process", f"process:{host}:{boot_id}:{process.pid}:{process.start_ticks}"


def _short(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def _clean(text: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in text.strip()) or "job"
    # Two long names that begin alike stay two jobs.
    return bound_label(cleaned, MAX_NAME)
