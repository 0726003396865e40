"""What a process's cgroup path says about who runs it.

/proc/PID/cgroup has one line per hierarchy, "ID:CONTROLLERS:PATH": many lines on
cgroup v1 ("4:memory:/kubepods/..."), one "0::/..." line on v2, both on hybrid hosts.
Paths are matched by their components, not anchored at the root, because a reader in
its own cgroup namespace sees other processes' paths relative to its own cgroup
("0::/../../kubepods.slice/...") and nested setups (kind, k3d) add a prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# A pod UID as the kubelet writes it in cgroup names: a UUID, dashes turned into
# underscores by the systemd driver; static pods use a 32-hex config hash instead.
_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# cgroupfs: "pod<uid>"; systemd: "kubepods-<qos>-pod<uid>.slice" or "kubepods-pod<uid>.slice"
# (kind prefixes "kubelet-").
_POD_COMPONENT = re.compile(rf"^(?:.*-)?pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?$")
# containerd "cri-containerd-<id>.scope", CRI-O "crio-<id>.scope" (systemd) or "crio-<id>"
# (cgroupfs), Docker/cri-dockerd "docker-<id>.scope", and the bare "<id>" of cgroupfs.
_CONTAINER_COMPONENT = re.compile(
    r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)
_SLURM_JOB_COMPONENT = re.compile(r"^job_([0-9]+)$")


@dataclass(frozen=True)
class PodRef:
    """The pod, and the container in it, that a process's cgroup path names."""

    pod_uid: str  # as the API server writes it (dashes), or the static pod's hash
    container_id: str  # "" where the process sits in the pod's cgroup but no container's


def cgroup_paths(content: str) -> list[str]:
    """The path of every hierarchy listed in /proc/PID/cgroup content."""
    paths = []
    for line in content.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2]:
            paths.append(parts[2])
    return paths


def kubernetes_pod(paths: Iterable[str]) -> PodRef | None:
    """The pod (and container) of the first path that lies under a kubepods cgroup."""
    for path in paths:
        if "kubepods" not in path:
            continue
        components = path.split("/")
        # The last pod component wins: a nested node (kind) has only one anyway, and
        # the container is the component right under it.
        for i in range(len(components) - 1, -1, -1):
            m = _POD_COMPONENT.match(components[i])
            if m is None:
                continue
            uid = m.group(1).replace("_", "-")
            container = ""
            if i + 1 < len(components):
                c = _CONTAINER_COMPONENT.match(components[i + 1])
                if c is not None:
                    container = c.group(1)
            return PodRef(pod_uid=uid, container_id=container)
    return None


def slurm_job(paths: Iterable[str]) -> str | None:
    """The Slurm job id of a process in a job's cgroup.

    v1: /slurm/uid_U/job_J/step_S/... ; v2: .../slurmstepd.scope/job_J/step_S/...
    (a node with several slurmd daemons names them slurm_<node> and <node>_slurmstepd).
    """
    for path in paths:
        if "slurm" not in path:
            continue
        for component in path.split("/"):
            m = _SLURM_JOB_COMPONENT.match(component)
            if m is not None:
                return m.group(1)
    return None


@dataclass(frozen=True, slots=True)
class JobCgroup:
    """The cgroup that holds every process of one job: a pod's, or a Slurm job's.

    Paths are as /proc/PID/cgroup names them (possibly relative to the reader's cgroup
    namespace), cut after the job's component, so every container or step of the job
    maps to the same JobCgroup.
    """

    scheduler: str  # "kubernetes" (ident: the pod UID) or "slurm" (ident: the job id)
    ident: str
    cpu_path: str  # the job's cgroup in the hierarchy that counts CPU time
    memory_path: str  # and in the one that counts memory: the same path on v2
    v1: bool


def _job_prefix(path: str, kubernetes: bool) -> tuple[str, str, str] | None:
    """(scheduler, ident, path cut after the job's component), or None."""
    components = path.split("/")
    if kubernetes and "kubepods" in path:
        for i in range(len(components) - 1, -1, -1):
            m = _POD_COMPONENT.match(components[i])
            if m is not None:
                uid = m.group(1).replace("_", "-")
                return "kubernetes", uid, "/".join(components[: i + 1])
    if "slurm" in path:
        for i, component in enumerate(components):
            m = _SLURM_JOB_COMPONENT.match(component)
            if m is not None:
                return "slurm", m.group(1), "/".join(components[: i + 1])
    return None


def job_cgroup(content: str, kubernetes: bool = True) -> JobCgroup | None:
    """The job cgroup that /proc/PID/cgroup content puts the process in, or None.

    cgroup v1 (cpuacct and memory hierarchies listed): both must lie in the same job's
    cgroup, or the job's CPU and memory cannot both be read there (Slurm's task/cgroup
    plugin alone leaves cpuacct at slurmd's service). v2: the unified "0::" path.
    kubernetes=False: pods are not recognized (the resolver does not claim them either).
    """
    cpu_v1 = memory_v1 = unified = None
    for line in content.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2]:
            continue
        controllers = parts[1].split(",")
        if parts[0] == "0" and parts[1] == "":
            unified = parts[2]
        elif "cpuacct" in controllers:
            cpu_v1 = parts[2]
        elif "memory" in controllers:
            memory_v1 = parts[2]
    if cpu_v1 is not None or memory_v1 is not None:
        if cpu_v1 is None or memory_v1 is None:
            return None
        cpu = _job_prefix(cpu_v1, kubernetes)
        memory = _job_prefix(memory_v1, kubernetes)
        if cpu is None or memory is None or cpu[:2] != memory[:2]:
            return None
        return JobCgroup(cpu[0], cpu[1], cpu[2], memory[2], v1=True)
    if unified is None:
        return None
    job = _job_prefix(unified, kubernetes)
    if job is None:
        return None
    return JobCgroup(job[0], job[1], job[2], job[2], v1=False)
