"""The chart's platform source: Redfish credentials from a Secret mounted as files, the
BMC's CA, and the opt-in in-band IPMI device (privileged, as root)."""

from __future__ import annotations

import base64
import json

import helm_python
import kubernetes_validate
import pytest

from test_helm import CHART, _chart, args, env, exporter, kinds, objects, one, pod_spec, render
from wattprint.cli import main as cli
from wattprint.sources import registry


def secret_volumes(docs: list) -> dict[str, str]:
    return {
        v["name"]: v["secret"]["secretName"] for v in pod_spec(docs)["volumes"] if "secret" in v
    }


def mounts(docs: list) -> dict[str, dict]:
    return {m["name"]: m for m in exporter(docs)["volumeMounts"]}


def test_defaults_read_the_platform_by_auto_with_no_bmc_mount() -> None:
    # The schema's enum is the registry's (test_registry.py): every source is offered.
    assert all(s.in_chart for s in registry.sources("platform"))
    assert args(objects("defaults"))["--platform.source"] == "auto"
    assert not any(n.startswith("redfish") or n == "ipmi" for n in mounts(objects("defaults")))


def test_redfish_credentials_from_an_existing_secret_are_files() -> None:
    docs = objects("redfish")
    assert "Secret" not in kinds(docs)
    assert secret_volumes(docs)["redfish-credentials"] == "bmc-readonly"
    assert secret_volumes(docs)["redfish-ca"] == "bmc-ca"
    assert mounts(docs)["redfish-credentials"]["readOnly"] is True
    variables = env(docs)
    assert variables["WATTPRINT_REDFISH_USERNAME_FILE"]["value"] == "/etc/wattprint/redfish/user"
    assert variables["WATTPRINT_REDFISH_PASSWORD_FILE"]["value"] == "/etc/wattprint/redfish/pass"
    assert "WATTPRINT_REDFISH_PASSWORD" not in variables
    flags = args(docs)
    assert flags["--platform.source"] == "redfish"
    assert flags["--platform.redfish-ca-file"] == "/etc/wattprint/redfish-ca/ca.crt"
    # Kubernetes expands $(NODE_NAME) from the container's env: each node its own BMC.
    assert flags["--platform.redfish-url"] == "https://$(NODE_NAME)-bmc.example.com"
    assert "NODE_NAME" in env(docs)
    argv = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in exporter(docs)["args"]]
    config = cli.load(cli.make_parser().parse_args(argv), environ={"NODE_NAME": "gpu-node-1"})
    assert config.platform_redfish_url == "https://gpu-node-1-bmc.example.com"


def test_redfish_credentials_in_a_secret_the_chart_creates_never_in_the_pod_spec() -> None:
    password = "bmc-pass-0123456789"
    values = {
        "exporter": {
            "platform": {
                "source": "redfish",
                "redfish": {
                    "url": "https://169.254.95.118",
                    "insecure": True,
                    "credentials": {"username": "wattprint", "password": password},
                },
            }
        }
    }
    docs, _ = render(values)
    secret = one(docs, "Secret")
    assert secret_volumes(docs)["redfish-credentials"] == secret["metadata"]["name"]
    assert base64.b64decode(secret["data"]["redfish-password"]).decode() == password
    assert base64.b64decode(secret["data"]["redfish-username"]).decode() == "wattprint"
    daemonset = one(docs, "DaemonSet")
    assert password not in json.dumps(daemonset)
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/redfish-credentials" in annotations  # a new password rolls the pods
    assert args(docs)["--platform.redfish-insecure"] == "true"
    assert exporter(docs)["securityContext"]["privileged"] is False
    for doc in docs:
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    report = helm_python.lint(
        CHART, values, strict=True, namespace="monitoring", kube_version="v1.30.0"
    )
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_in_band_ipmi_mounts_the_device_privileged_as_root_without_capabilities() -> None:
    values = {"exporter": {"platform": {"source": "ipmi", "ipmi": {"hostDevice": True}}}}
    docs, _ = render(values)
    pod, container = pod_spec(docs), exporter(docs)
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert host["ipmi"] == {"path": "/dev/ipmi0", "type": "CharDevice"}
    assert mounts(docs)["ipmi"]["mountPath"] == "/dev/ipmi0"
    assert args(docs)["--platform.ipmi-device"] == "/dev/ipmi0"
    # /dev/ipmi0 is root's (0600), and only a privileged container opens host devices.
    ctx = container["securityContext"]
    assert ctx["privileged"] is True and ctx["capabilities"]["drop"] == ["ALL"]
    assert "add" not in ctx["capabilities"] and ctx["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] == 0
    kubernetes_validate.validate(
        one(docs, "DaemonSet"), kubernetes_validate.latest_version(), strict=True
    )
    config = cli.load(cli.make_parser().parse_args(container["args"]), environ={})
    assert (config.platform_source, config.platform_ipmi_device) == ("ipmi", "/dev/ipmi0")


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"source": "ipmitool"}, "source"),
        ({"ipmi": {"device": "/dev/sda"}}, "device"),
        ({"redfish": {"url": "https://admin:secret@bmc.example"}}, "url"),
        ({"redfish": {"credentials": {"keys": {"password": ""}}}}, "password"),
    ],
)
def test_schema_refuses_what_the_exporter_would(values: dict, where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=where):
        _chart().validate_schema({"exporter": {"platform": values}})
