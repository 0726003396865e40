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
