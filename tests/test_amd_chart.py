"""The chart on AMD GPU nodes: placed by AMD's node labels, the devices through the AMD
Container Toolkit's runtime without privilege, or from the host with it (opt-in)."""

from __future__ import annotations

import helm_python
import kubernetes_validate
import pytest

from test_helm import _chart, args, env, exporter, objects, pod_spec, render


def node_terms(pod: dict) -> list[list[dict]]:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [t["matchExpressions"] for t in terms["nodeSelectorTerms"]]


def test_defaults_also_land_on_amd_gpu_nodes() -> None:
    terms = node_terms(pod_spec(objects("defaults")))
    # Each label alone places the exporter (terms are ORed).
    assert [
        {"key": "feature.node.kubernetes.io/amd-gpu", "operator": "In", "values": ["true"]}
    ] in terms
    assert [{"key": "amd.com/gpu.device-id", "operator": "Exists"}] in terms
    assert [
        {"key": "feature.node.kubernetes.io/pci-1002.present", "operator": "In", "values": ["true"]}
    ] in terms
    # Nothing is requested: amd.com/gpu would take a GPU from the jobs.
    assert "amd.com/gpu" not in str(exporter(objects("defaults")).get("resources"))


def test_amd_container_toolkit_gives_the_devices_without_privilege() -> None:
    docs = objects("amd")
    pod = pod_spec(docs)
    assert pod["runtimeClassName"] == "amd"
    assert env(docs)["AMD_VISIBLE_DEVICES"]["value"] == "all"
    assert "NVIDIA_VISIBLE_DEVICES" not in env(docs)
    assert pod["securityContext"]["supplementalGroups"] == [44, 110]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert exporter(docs)["securityContext"]["privileged"] is False
    assert not any(v.get("hostPath", {}).get("path", "").startswith("/dev") for v in pod["volumes"])
    assert args(docs)["--gpu.source"] == "amdsmi"


def test_host_devices_mount_kfd_and_dri_and_say_privileged() -> None:
    values = {"amd": {"hostDevices": True, "groups": [44, 110]}}
    values["security"] = {"supplementalGroups": [44, 2000]}
    docs, _ = render(values)
    pod, container = pod_spec(docs), exporter(docs)
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert host["amd-kfd"] == {"path": "/dev/kfd", "type": "CharDevice"}
    assert host["amd-dri"] == {"path": "/dev/dri", "type": "Directory"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert (mounts["amd-kfd"], mounts["amd-dri"]) == ("/dev/kfd", "/dev/dri")
    # Only a privileged container's device list opens host devices; still no capability
    # added and a read-only root file system.
    ctx = container["securityContext"]
    assert ctx["privileged"] is True and ctx["capabilities"]["drop"] == ["ALL"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["supplementalGroups"] == [44, 2000, 110]
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    kubernetes_validate.validate(daemonset, kubernetes_validate.latest_version(), strict=True)


def test_schema_refuses_group_names() -> None:
    with pytest.raises(helm_python.HelmValuesError, match="groups"):
        _chart().validate_schema({"amd": {"groups": ["render"]}})
