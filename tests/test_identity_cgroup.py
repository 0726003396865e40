from __future__ import annotations

from pathlib import Path

import pytest

from wattprint.host.identity.cgroup import PodRef, cgroup_paths, kubernetes_pod, slurm_job

CGROUP = Path(__file__).parent / "fixtures" / "cgroup"


def paths(name: str) -> list[str]:
    return cgroup_paths((CGROUP / name).read_text())


# (cgroup version, driver, runtime) -> pod UID as the API server writes it, container id
PODS = {
    "v1-cgroupfs-docker.txt": (
        "a0838b12-4968-4c0e-9983-ce0de4725152",
        "d834ff854fdf83c4462a4a0c4f9e381c521b49e06e71634eea7196903edba630",
    ),
    "v1-cgroupfs-containerd.txt": (
        "7e93e1f5-0aa6-4394-a7f8-d4afc6864c09",
        "6d7c2db41f1344750527b3c54673fa78f36788f8e9fda73df42082e265192e21",
    ),
    "v1-cgroupfs-crio.txt": (
        "290a3e52-b6a5-4e05-a9b6-e41f7c9d5229",
        "a285f15813730b484493a2979c34f8c6eb93c6b3c2258982ac3ac44d5e5e1c23",
    ),
    "v1-systemd-docker.txt": (
        "95aa5df8-9560-4887-aa6b-a243f953420f",
        "ae3ff22a220682fa44ae0a89eb9fd09a4df609edbe3d3f9c3ae400eabbb0e8c8",
    ),
    "v1-systemd-containerd.txt": (
        "f2dbbd23-163a-4021-b4f8-73bcd16b4485",
        "2715ac44aa0c7cc450a32bb9a16a532bf3ca04beb46680fafb433aa0e275b968",
    ),
    "v1-systemd-crio.txt": (
        "7309dba1-ae00-414f-a43f-d41c85d7cbf9",
        "a9075afd96f5537292cb403795ca931475741269d6d230eec56a9d6866e584e0",
    ),
    "v2-cgroupfs-docker.txt": (
        "61d0c7fd-ad4a-4cac-8ee7-15a4530df8b9",
        "d5dd873c81b9d43fe4ea5d7e4e01acab60d6d4fae4d621140ecd434f2869a598",
    ),
    "v2-cgroupfs-containerd.txt": (
        "4cd1a753-6722-4d9b-abda-28f030fe97ed",
        "a16e9a12d5e7f292f5d852e6cc23749a6f9c7ff8ac819c3dc69c132df23651c2",
    ),
    "v2-cgroupfs-crio.txt": (
        "bf3375d6-d87b-455d-a0c6-945e99b4586d",
        "d61621184aacfe497f0e6753653c8c67d397480603fbef6cb79b7e63aede0487",
    ),
    "v2-systemd-docker.txt": (
        "4908cb16-d5f4-4d23-8100-64a6f20ece0e",
        "f3af38b37120c3e90305c54d15e34005215a195a5a0a75d9b285772544b3d8e9",
    ),
    "v2-systemd-containerd.txt": (
        "d2a7a51b-8257-4172-8276-eaa2845be93e",
        "dcb39b256e94daa4efa7ee071ee51a60d817ad812a78844cac18e419a2286ff0",
    ),
    "v2-systemd-crio.txt": (
        "eb2bc7cc-6405-4ff5-bd2f-59e27635c743",
        "218d4f5466d899232bd11ddeffea90b4314be39c229dcb6faca21594c8349f25",
    ),
    # Seen from inside the exporter's own cgroup namespace: relative to its cgroup.
    "v2-cgroupns-relative.txt": (
        "f1aefedb-558a-4668-8b51-faf75c49a10c",
        "6d9268671cee4adab465bfdf6594c1fdefa549ba9b37b7d1097a3ca1fd7bb5b8",
    ),
    # kind: the node is itself a Docker container; the outer docker-<id>.scope is not it.
    "v2-kind-nested.txt": (
        "9e492af7-8c6d-4a44-bea4-e05a4e231a4d",
        "4c01b5058822127ba2e155d646ff55fd786deafdd8bf8aaa5590b999c2304cb3",
    ),
    # Static pods run under the kubelet's hash of the manifest, not a UUID.
    "v2-systemd-static-pod.txt": (
        "0956783103ba8372a592a2476683bdab",
        "cdc574024b7ffe86d3eb537c10c8bdc2e80ba9401758fd27c478c895d4d30829",
    ),
    # CRI-O's conmon runs in the pod's slice but in no container.
    "v2-systemd-crio-conmon.txt": ("46476cb6-00d8-4a3d-be21-f1cb85c709bf", ""),
}

NOT_PODS = [
    "v1-slurm.txt",
    "v2-slurm.txt",
    "v2-slurm-multi-slurmd.txt",
    "v2-user-session.txt",
    "v1-docker-standalone.txt",
    "v2-podman.txt",
]


@pytest.mark.parametrize(("name", "expected"), sorted(PODS.items()))
def test_pod_and_container_from_cgroup(name: str, expected: tuple[str, str]) -> None:
    assert kubernetes_pod(paths(name)) == PodRef(pod_uid=expected[0], container_id=expected[1])
    assert slurm_job(paths(name)) is None


@pytest.mark.parametrize("name", NOT_PODS)
def test_other_cgroups_are_no_pod(name: str) -> None:
    assert kubernetes_pod(paths(name)) is None


def test_every_fixture_is_checked() -> None:
    assert {p.name for p in CGROUP.glob("*.txt")} == set(PODS) | set(NOT_PODS)


@pytest.mark.parametrize(
    ("name", "job"),
    [
        ("v1-slurm.txt", "4242"),
        ("v2-slurm.txt", "4243"),
        ("v2-slurm-multi-slurmd.txt", "4244"),
        ("v2-user-session.txt", None),
        ("v1-docker-standalone.txt", None),
    ],
)
def test_slurm_job_from_cgroup(name: str, job: str | None) -> None:
    assert slurm_job(paths(name)) == job


def test_pod_in_its_own_cgroup_has_no_container() -> None:
    ref = kubernetes_pod(
        ["/kubepods.slice/kubepods-besteffort.slice/"
         "kubepods-besteffort-pod4cd1a753_6722_4d9b_abda_28f030fe97ed.slice"]
    )  # fmt: skip
    assert ref == PodRef("4cd1a753-6722-4d9b-abda-28f030fe97ed", "")


def test_job_named_directory_outside_slurm_is_no_job() -> None:
    assert slurm_job(["/user.slice/user-1000.slice/job_12"]) is None


def test_malformed_lines_are_ignored() -> None:
    assert cgroup_paths("garbage\n\n0::\n3:cpu:/a\n") == ["/a"]
