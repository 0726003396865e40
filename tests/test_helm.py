"""The Helm chart, rendered offline by the real Helm engine (helm-python-sdk).

Each value set in helm/wattprint/ci/ is a way users install the chart; every one
must lint clean, produce objects a current Kubernetes accepts, and keep the
exporter at least privilege.
"""

from __future__ import annotations

import base64
import functools
import json
import operator
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as monitoring_v1

import wattprint
from wattprint.cli import main as cli

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "wattprint"
RELEASE, NAMESPACE = "wattprint", "monitoring"
# The oldest Kubernetes still widely run and the newest the validator knows.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

Doc = dict[str, Any]


def _value_sets() -> dict[str, Doc]:
    sets: dict[str, Doc] = {"defaults": {}}
    for path in sorted((CHART / "ci").glob("*-values.yaml")):
        # Helm's own YAML reader: it types values (1.5e6, "1") the way `helm -f` does.
        sets[path.name.removesuffix("-values.yaml")] = helm_python.values_from_yaml(
            path.read_text()
        )
    return sets


VALUE_SETS = _value_sets()


@functools.cache
def _chart() -> Any:
    return helm_python.Chart.load(CHART)


def render(values: Doc) -> tuple[list[Doc], str]:
    """The chart's objects and its NOTES.txt for these values."""
    out = _chart().render(values, name=RELEASE, namespace=NAMESPACE)
    docs: list[Doc] = []
    notes = ""
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
        else:
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs, notes


@functools.cache
def _render_set(name: str) -> tuple[list[Doc], str]:
    return render(VALUE_SETS[name])


def objects(name: str) -> list[Doc]:
    return _render_set(name)[0]


def one(docs: list[Doc], kind: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def kinds(docs: list[Doc]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def pod_spec(docs: list[Doc]) -> Doc:
    spec: Doc = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def exporter(docs: list[Doc]) -> Doc:
    containers = pod_spec(docs)["containers"]
    assert [c["name"] for c in containers] == ["exporter"]
    container: Doc = containers[0]
    return container


def args(docs: list[Doc]) -> dict[str, str]:
    flags = (a.split("=", 1) for a in exporter(docs)["args"])
    return {f[0]: f[1] if len(f) > 1 else "" for f in flags}


def env(docs: list[Doc]) -> dict[str, Doc]:
    return {e["name"]: e for e in exporter(docs).get("env", [])}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is required when CI=true (apt-get install prometheus)")
        pytest.skip("promtool not installed")
    return path


# --- lint and schemas -------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_is_clean_in_strict_mode(name: str) -> None:
    report = helm_python.lint(
        CHART, VALUE_SETS[name], strict=True, namespace=NAMESPACE, kube_version="v1.30.0"
    )
    findings = [m for m in report["messages"] if m["severity"] >= 2]
    assert findings == [] and report["errors"] == []


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", VALUE_SETS)
def test_core_objects_pass_kubernetes_strict_schema(name: str, version: str) -> None:
    core = [d for d in objects(name) if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {"DaemonSet", "Service", "ServiceAccount", "ClusterRole"} <= set(kinds(core))
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    "name", ["kube-prometheus-stack", "budgets", "rapl-root", "escape-hatches"]
)
def test_operator_objects_match_the_prometheus_operator_schema(name: str) -> None:
    custom = [d for d in objects(name) if d["apiVersion"] == "monitoring.coreos.com/v1"]
    assert custom
    for doc in custom:
        model = getattr(monitoring_v1, doc["kind"]).model_validate(doc)
        # The models accept unknown keys and drop them; a round trip that loses
        # something means a misspelt field the operator would ignore.
        assert model.model_dump(mode="json", by_alias=True, exclude_unset=True) == doc


def test_default_image_is_the_package_version() -> None:
    assert _chart().metadata["appVersion"] == wattprint.__version__
    assert exporter(objects("defaults"))["image"].endswith(f":{wattprint.__version__}")


def test_defaults_need_no_prometheus_operator() -> None:
    assert kinds(objects("defaults")) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Service",
        "ServiceAccount",
    ]


def test_schema_rejects_a_wrong_type_naming_the_value() -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        _chart().validate_schema({"exporter": {"port": "9950"}})
    assert "/exporter/port" in str(err.value)
    assert "want integer" in str(err.value)


@pytest.mark.parametrize("duration", ["5s1m", "1m1m", "1.5s", "", "5"])
def test_schema_rejects_what_prometheus_would_not_parse(duration: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match="sampleInterval"):
        _chart().validate_schema({"exporter": {"sampleInterval": duration}})


def test_schema_accepts_prometheus_durations() -> None:
    for duration in ("500ms", "1m30s", "0", "1y2w3d4h5m6s7ms"):
        _chart().validate_schema({"exporter": {"sampleInterval": duration}})


def test_schema_rejects_a_misspelt_key() -> None:
    with pytest.raises(helm_python.HelmValuesError, match="hostPid"):
        _chart().validate_schema({"hostPid": False})


# --- least privilege --------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_exporter_is_never_privileged(name: str) -> None:
    docs = objects(name)
    pod, ctx = pod_spec(docs), exporter(docs)["securityContext"]
    assert ctx["privileged"] is False
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert set(ctx["capabilities"].get("add", [])) <= {"DAC_READ_SEARCH", "SYS_PTRACE"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    # The host paths are /sys and /proc, mounted read-only, and the state directory.
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert sorted(host.values()) == ["/proc", "/sys", "/var/lib/wattprint"]
    for mount in exporter(docs)["volumeMounts"]:
        if mount["name"] in host and host[mount["name"]] != "/var/lib/wattprint":
            assert mount["readOnly"] is True


def test_defaults_run_as_an_unprivileged_user_without_capabilities() -> None:
    docs = objects("defaults")
    pod_ctx = pod_spec(docs)["securityContext"]
    assert pod_ctx["runAsNonRoot"] is True
    assert pod_ctx["runAsUser"] != 0
    assert "add" not in exporter(docs)["securityContext"]["capabilities"]


def test_rapl_opt_in_runs_as_root_still_without_capabilities() -> None:
    docs, _ = render({"security": {"runAsRoot": True}})
    pod_ctx = pod_spec(docs)["securityContext"]
    assert pod_ctx["runAsUser"] == 0 and pod_ctx["runAsNonRoot"] is False
    assert "add" not in exporter(docs)["securityContext"]["capabilities"]


def test_reading_other_processes_environment_adds_only_the_two_capabilities() -> None:
    docs = objects("rapl-root")
    assert pod_spec(docs)["securityContext"]["runAsUser"] == 0
    added = exporter(docs)["securityContext"]["capabilities"]["add"]
    assert sorted(added) == ["DAC_READ_SEARCH", "SYS_PTRACE"]


def test_host_pid_can_be_turned_off() -> None:
    assert pod_spec(objects("defaults"))["hostPID"] is True
    docs, _ = render({"hostPID": False})
    assert pod_spec(docs)["hostPID"] is False


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rbac_reads_pods_and_nothing_else(name: str) -> None:
    docs = objects(name)
    assert not {"Role", "RoleBinding"} & set(kinds(docs))
    role = one(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(docs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
    ]
    assert pod_spec(docs)["serviceAccountName"] == account["name"]


# --- the exporter's view of the node ----------------------------------------------


def test_exporter_reads_the_host_sys_and_proc_read_only() -> None:
    docs = objects("defaults")
    mounts = {m["mountPath"]: m for m in exporter(docs)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    flags = args(docs)
    for flag, host in (("--path.sysfs", "/sys"), ("--path.procfs", "/proc")):
        mount = mounts[flags[flag]]
        assert volumes[mount["name"]]["hostPath"]["path"] == host
        assert mount["readOnly"] is True


def test_node_name_comes_from_the_downward_api() -> None:
    node = env(objects("defaults"))["NODE_NAME"]
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_probes_use_healthz_on_the_metrics_port() -> None:
    container = exporter(objects("defaults"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9950}
    assert args(objects("defaults"))["--web.listen-address"] == ":9950"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_values_reach_the_exporter_as_flags() -> None:
    docs, _ = render(
        {
            "exporter": {
                "port": 9100,
                "sampleInterval": "500ms",
                "sampleTimestamps": False,
                "cpu": {"tdpWatts": 350},
            },
            "carbon": {"provider": "uk-grid", "zone": "GB", "pue": 1.25},
        }
    )
    flags = args(docs)
    assert flags["--web.listen-address"] == ":9100"
    assert flags["--sample.interval"] == "500ms"
    assert flags["--sample.timestamps"] == "false"
    assert args(objects("defaults"))["--sample.timestamps"] == "true"
    assert flags["--cpu.tdp-watts"] == "350"
    assert (flags["--carbon.provider"], flags["--carbon.zone"]) == ("uk-grid", "GB")
    assert float(flags["--pue"]) == 1.25


@pytest.mark.parametrize("name", VALUE_SETS)
def test_exporter_accepts_the_rendered_flags_and_environment(name: str) -> None:
    docs = objects(name)
    argv = list(exporter(docs)["args"])
    web_config = [a for a in argv if a.startswith("--web.config.file=")]
    for flag in web_config:
        # Checked by the exporter for existence, which only holds inside the pod.
        argv.remove(flag)
        mounts = [m["mountPath"] for m in exporter(docs)["volumeMounts"]]
        assert any(flag.split("=", 1)[1].startswith(m + "/") for m in mounts)
    environ = {"NODE_NAME": "gpu-node-1"}
    for var in env(docs).values():
        if "value" in var:
            environ[var["name"]] = var["value"]
        elif "secretKeyRef" in var.get("valueFrom", {}):
            environ[var["name"]] = "from-a-secret"

    config = cli.load(cli.make_parser().parse_args(argv), environ=environ)

    assert (config.sysfs_root, config.procfs_root) == ("/host/sys", "/host/proc")
    assert config.kubernetes_node_name == "gpu-node-1"
    assert config.listen_address == f":{exporter(docs)['ports'][0]['containerPort']}"


# --- carbon credentials -----------------------------------------------------------


def _secret_env(docs: list[Doc]) -> dict[str, tuple[str, str]]:
    refs = {}
    for name, var in env(docs).items():
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            refs[name] = (ref["name"], ref["key"])
    return refs


def test_token_from_an_existing_secret() -> None:
    docs = objects("existing-secret")
    assert "Secret" not in kinds(docs)
    assert _secret_env(docs)["WATTPRINT_CARBON_TOKEN"] == ("grid-api", "em-token")
    assert args(docs)["--carbon.provider"] == "electricitymaps"


def test_token_in_a_secret_the_chart_creates_and_never_in_the_pod_spec() -> None:
    token = "em-token-0123456789"
    docs, _ = render({"carbon": {"provider": "electricitymaps", "credentials": {"token": token}}})
    secret = one(docs, "Secret")
    name, key = _secret_env(docs)["WATTPRINT_CARBON_TOKEN"]
    assert name == secret["metadata"]["name"]
    assert base64.b64decode(secret["data"][key]).decode() == token
    assert token not in json.dumps(one(docs, "DaemonSet"))


def test_no_secret_and_no_secret_env_without_credentials() -> None:
    docs = objects("defaults")
    assert "Secret" not in kinds(docs)
    assert _secret_env(docs) == {}


# --- placement --------------------------------------------------------------------


def test_defaults_land_on_gpu_nodes_tolerating_every_noschedule_taint() -> None:
    """A node the exporter is kept off is a node nobody measures: every NoSchedule
    taint (the GPU one, dedicated=..., a cordon) is tolerated, NoExecute is not, and the
    pods outrank the jobs they measure."""
    pod = pod_spec(objects("defaults"))
    assert pod["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "system-node-critical"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]}
    assert "nvidia.com/gpu.present" in keys
    assert "NVIDIA_VISIBLE_DEVICES" in env(objects("defaults"))


def test_placement_overrides_replace_the_defaults() -> None:
    pod = pod_spec(objects("placement"))
    values = VALUE_SETS["placement"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert "affinity" not in pod
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["runtimeClassName"] == "nvidia"


def test_every_node_when_not_limited_to_gpu_nodes() -> None:
    docs, _ = render({"gpuNodesOnly": False})
    assert "affinity" not in pod_spec(docs) and "nodeSelector" not in pod_spec(docs)


# --- Prometheus Operator and Grafana ----------------------------------------------


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_servicemonitor_selects_the_service_and_the_service_the_pods() -> None:
    docs = objects("kube-prometheus-stack")
    daemonset, service, monitor = (one(docs, k) for k in ("DaemonSet", "Service", "ServiceMonitor"))
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert _labels_match(service["spec"]["selector"], pod_labels)
    assert service["spec"]["ports"][0]["targetPort"] == exporter(docs)["ports"][0]["name"]

    assert _labels_match(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert NAMESPACE in monitor["spec"]["namespaceSelector"]["matchNames"]
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    # kube-prometheus-stack's Prometheus only picks up objects labelled with its release.
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert one(docs, "PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # The exporter stamps its energy samples; the Operator must keep those times.
    assert endpoint["honorTimestamps"] is True
    assert args(docs)["--sample.timestamps"] == "true"


# --- escape hatches ---------------------------------------------------------------


def test_a_registry_mirror_keeps_the_image_path() -> None:
    docs = objects("escape-hatches")
    image = f"registry.example.com/mirror/wattprint/wattprint:{wattprint.__version__}"
    assert exporter(docs)["image"] == image
    assert pod_spec(docs)["initContainers"][0]["image"] == image
    # A repository without a registry part keeps all of itself.
    values = {"global": {"imageRegistry": "mirror.local:5000"}, "image": {"repository": "me/wp"}}
    assert (
        exporter(render(values)[0])["image"] == f"mirror.local:5000/me/wp:{wattprint.__version__}"
    )


def test_common_labels_reach_every_object_but_not_the_pod_selector() -> None:
    docs = objects("escape-hatches")
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "ml-platform", doc["kind"]
        assert doc["metadata"]["labels"]["cost-center"] == "4711", doc["kind"]
    assert "team" not in one(docs, "DaemonSet")["spec"]["selector"]["matchLabels"]


def test_extra_volumes_env_and_pod_security_context_join_the_chart_s_own() -> None:
    docs = objects("escape-hatches")
    pod = pod_spec(docs)
    assert {"name": "ca-bundle", "configMap": {"name": "corporate-ca"}} in pod["volumes"]
    assert {"name": "sys", "mountPath": "/host/sys", "readOnly": True} in exporter(docs)[
        "volumeMounts"
    ]
    assert {"name": "ca-bundle", "mountPath": "/etc/ssl/corporate", "readOnly": True} in exporter(
        docs
    )["volumeMounts"]
    assert env(docs)["SSL_CERT_FILE"]["value"] == "/etc/ssl/corporate/ca.crt"
    context = pod["securityContext"]
    assert context["seLinuxOptions"] == {"type": "spc_t"}
    assert context["runAsNonRoot"] is True and context["seccompProfile"]["type"] == "RuntimeDefault"


def test_podmonitor_scrapes_the_pods_as_the_servicemonitor_does() -> None:
    docs = objects("escape-hatches")
    monitor = one(docs, "PodMonitor")
    assert "ServiceMonitor" not in kinds(docs)
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert _labels_match(monitor["spec"]["selector"]["matchLabels"], pod_labels)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == exporter(docs)["ports"][0]["name"]
    service_endpoint = one(objects("kube-prometheus-stack"), "ServiceMonitor")["spec"]["endpoints"][
        0
    ]
    assert endpoint["relabelings"] == service_endpoint["relabelings"]
    assert endpoint["honorLabels"] is True and endpoint["honorTimestamps"] is True
    assert monitor["spec"]["attachMetadata"] == {"node": True}


def test_network_policy_admits_scrapes_of_the_metrics_port_only() -> None:
    docs = objects("escape-hatches")
    policy = one(docs, "NetworkPolicy")["spec"]
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert _labels_match(policy["podSelector"]["matchLabels"], pod_labels)
    assert policy["policyTypes"] == ["Ingress"]  # egress: the API server, the provider
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == VALUE_SETS["escape-hatches"]["networkPolicy"]["from"]
    assert "NetworkPolicy" not in kinds(objects("defaults"))


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"resources": {"requests": {"cpu": {"x": 1}}}}, "/resources/requests/cpu"),
        ({"resources": {"requests": {"cpu": "lots"}}}, "/resources/requests/cpu"),
        ({"resources": {"request": {"cpu": "1"}}}, "/resources"),
        ({"tolerations": [{"operator": "Exists", "effect": "NoScheduled"}]}, "/tolerations/0"),
        ({"tolerations": [{"key": "a", "opertor": "Exists"}]}, "/tolerations/0"),
        ({"affinity": {"nodeAfinity": {}}}, "/affinity"),
        ({"extraVolumes": [{"hostPath": {"path": "/"}}]}, "/extraVolumes/0"),
        ({"extraVolumeMounts": [{"name": "a", "mountPath": "relative"}]}, "/extraVolumeMounts/0"),
        ({"podSecurityContext": {"runAsUser": 0}}, "/podSecurityContext"),
        ({"serviceMonitor": {"kind": "Probe"}}, "/serviceMonitor/kind"),
        ({"commonLabels": {"team": 5}}, "/commonLabels/team"),
    ],
)
def test_schema_is_strict_about_the_escape_hatches(values: Doc, where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        _chart().validate_schema(values)
    assert where in str(err.value)


def test_schema_accepts_kubernetes_quantities() -> None:
    for cpu in ("50m", "1", "1.5", 2, 0.5):
        _chart().validate_schema({"resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}})


def test_servicemonitor_keeps_the_workload_namespace_and_pod_labels() -> None:
    endpoint = one(objects("kube-prometheus-stack"), "ServiceMonitor")["spec"]["endpoints"][0]
    dropped = [r["regex"].split("|") for r in endpoint["relabelings"] if r["action"] == "labeldrop"]
    assert any({"namespace", "pod"} <= set(d) for d in dropped)
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    } in endpoint["relabelings"]


def _rule_groups(docs: list[Doc]) -> list[Doc]:
    groups: list[Doc] = one(docs, "PrometheusRule")["spec"]["groups"]
    return groups


def test_prometheusrule_carries_the_rules_of_rules_dir_unchanged() -> None:
    expected: list[Doc] = []
    for path in sorted((REPO / "rules").glob("*.y*ml")):
        doc = yaml.safe_load(path.read_text())
        if isinstance(doc, dict) and "groups" in doc:
            expected.extend(doc["groups"])
    assert expected, "rules/ holds no rule groups"
    groups = _rule_groups(objects("kube-prometheus-stack"))
    by_name = operator.itemgetter("name")
    assert sorted(groups, key=by_name) == sorted(expected, key=by_name)


@pytest.mark.parametrize("name", ["kube-prometheus-stack", "budgets"])
def test_rule_groups_pass_promtool_check_rules(name: str, tmp_path: Path) -> None:
    tool = promtool()
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups(objects(name))}))
    result = subprocess.run(
        [tool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _alerts(groups: list[Doc]) -> dict[str, Doc]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_alerts_can_be_disabled_raised_and_labelled(tmp_path: Path) -> None:
    """As kube-prometheus-stack allows: one alert off, one severity raised, one `for`
    and label changed, labels and annotations for all; the recording rules untouched."""
    overrides = {
        "WattprintWorkloadEmissionBudgetBurnFast": {"severity": "critical"},
        "WattprintGpusNotMeasured": {"disabled": True},
        "WattprintExporterDown": {"for": "10m", "labels": {"team": "ml-platform"}},
    }
    values = {
        "prometheusRule": {
            "enabled": True,
            "alerts": overrides,
            "additionalAlertLabels": {"route": "energy", "severity": "ignored"},
            "additionalAlertAnnotations": {"dashboard": "https://grafana.example/d/wattprint"},
        }
    }
    plain = _rule_groups(objects("kube-prometheus-stack"))
    groups = _rule_groups(render(values)[0])
    before, after = _alerts(plain), _alerts(groups)

    assert set(before) - set(after) == {"WattprintGpusNotMeasured"}
    for name, rule in after.items():
        expected = before[name]
        severity = overrides.get(name, {}).get("severity", expected["labels"]["severity"])
        team = {"team": "ml-platform"} if name == "WattprintExporterDown" else {}
        assert rule["labels"] == {"severity": severity, "route": "energy", **team}, name
        assert rule["for"] == ("10m" if name == "WattprintExporterDown" else expected["for"])
        assert rule["annotations"] == {
            **expected["annotations"],
            "dashboard": "https://grafana.example/d/wattprint",
        }
        assert rule["expr"] == expected["expr"]
    assert before["WattprintWorkloadEmissionBudgetBurnFast"]["labels"]["severity"] == "warning"
    recorded = [[r for r in g["rules"] if "record" in r] for g in groups]
    assert recorded == [[r for r in g["rules"] if "record" in r] for g in plain]

    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run(
        [promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_inference_rules_install_from_values(tmp_path: Path) -> None:
    """tools/gen_sci_rules.py's groups for rules/inference-units.yaml, given as values,
    reach the PrometheusRule whole: the Inference dashboard's series from the chart."""
    from wattprint.report import sci

    generated = sci.rules(sci.load_units(REPO / "rules" / "inference-units.yaml"))["groups"]
    values = helm_python.values_from_yaml(
        yaml.safe_dump({"prometheusRule": {"enabled": True, "additionalRuleGroups": generated}})
    )
    groups = _rule_groups(render(values)[0])
    assert groups[-len(generated) :] == generated
    assert groups[: -len(generated)] == _rule_groups(objects("kube-prometheus-stack"))
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run(
        [promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    again = {"prometheusRule": {"enabled": True, "additionalRuleGroups": [groups[0]]}}
    with pytest.raises(helm_python.HelmError, match=f"group named {groups[0]['name']} exists"):
        render(again)


def test_grouping_labels_keep_other_external_labels_apart(tmp_path: Path) -> None:
    """rules/tests/multicluster.test.yml with `region` where it has `cluster`: with
    prometheusRule.groupingLabels [region], the chart's rules keep two regions' nodes
    of one name apart just as they keep clusters apart."""
    values = {"prometheusRule": {"enabled": True, "groupingLabels": ["region"]}}
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups(render(values)[0])}))
    spec = yaml.safe_load((REPO / "rules" / "tests" / "multicluster.test.yml").read_text())
    text = re.sub(r"\bcluster(?=[=:])", "region", yaml.safe_dump(spec["tests"]))
    spec["tests"], spec["rule_files"] = yaml.safe_load(text), [str(rules)]
    assert "region: a" in text and 'region="b"' in text
    path = tmp_path / "regions.test.yml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_override_for_an_alert_the_chart_lacks_fails_the_install() -> None:
    values = {"prometheusRule": {"enabled": True, "alerts": {"WattprintExporterDwn": {}}}}
    with pytest.raises(helm_python.HelmError, match="WattprintExporterDwn: no such alert"):
        render(values)


@pytest.mark.parametrize(
    "override",
    [{"disabled": "yes"}, {"for": "5 minutes"}, {"severity": ""}, {"labels": {"a": 1}}, {"x": 1}],
)
def test_schema_rejects_a_malformed_alert_override(override: Doc) -> None:
    with pytest.raises(helm_python.HelmValuesError, match="alerts"):
        alerts = {"WattprintExporterDown": override}
        _chart().validate_schema({"prometheusRule": {"alerts": alerts}})


def _promtool_test(tool: str, tmp_path: Path, groups: list[Doc], test: Doc) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    spec = tmp_path / "test.yml"
    spec.write_text(
        yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [test]})
    )
    result = subprocess.run(
        [tool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _budget_series(budget: Doc, metric: str) -> str:
    """A budget-level series as the rules name it: per namespace, or per workload."""
    labels = {k: budget[k] for k in ("namespace", "workload") if budget.get(k)}
    level = "namespace_workload" if "workload" in labels else "namespace"
    selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{level}:{metric}{{{selector}}}"


def _grams(budget: Doc) -> float:
    if "grams" in budget:
        return float(budget["grams"])
    amount = str(budget["budget"])
    for unit, factor in (("kg", 1e3), ("t", 1e6), ("g", 1.0)):
        if amount.endswith(unit):
            return float(amount.removesuffix(unit)) * factor
    raise AssertionError(f"no unit in {amount!r}")


BUDGETS: list[Doc] = VALUE_SETS["budgets"]["prometheusRule"]["budgets"]


def test_budget_group_has_the_name_gen_budget_rules_gives_it() -> None:
    """One name for one group, whether the chart or tools/gen_budget_rules.py writes it:
    a dashboard or a silence that selects on rule_group must match both."""
    from test_rules import gen

    names = [group["name"] for group in _rule_groups(objects("budgets"))]
    assert gen.GROUP_NAME in names


def test_budget_value_set_covers_every_kind_of_entry() -> None:
    assert any(b.get("namespace") and not b.get("workload") for b in BUDGETS)
    assert any(b.get("namespace") and b.get("workload") for b in BUDGETS)
    assert any(b.get("workload") and not b.get("namespace") for b in BUDGETS)
    assert {"grams", "budget"} <= {k for b in BUDGETS for k in b}


def test_budgets_are_recorded_per_namespace_or_workload(tmp_path: Path) -> None:
    tool = promtool()
    metric = "wattprint_emissions_budget_grams:30d"
    tests = [
        {
            "expr": _budget_series(b, metric),
            "eval_time": "1m",
            "exp_samples": [{"labels": _budget_series(b, metric), "value": _grams(b)}],
        }
        for b in BUDGETS
    ]
    _promtool_test(
        tool,
        tmp_path,
        _rule_groups(objects("budgets")),
        {"interval": "1m", "input_series": [], "promql_expr_test": tests},
    )


def test_budgets_join_the_burn_rate_rules_of_rules_dir(tmp_path: Path) -> None:
    """A budget set in values reaches the alerts: the rules' burn rate is computed from it."""
    tool = promtool()
    series = []
    for i, b in enumerate(BUDGETS):
        # Each budgeted workload (or one workload of a budgeted namespace) emits
        # 1 g/s: 60 g per 1m step.
        labels = {
            "component": "gpu",
            "gpu": "0",
            "instance": f"n{i}",
            "scheduler": "kubernetes" if b.get("namespace") else "env",
            "namespace": b.get("namespace", ""),
            "workload": b.get("workload") or "trainer",
        }
        text = ",".join(f'{k}="{v}"' for k, v in labels.items() if v)
        series.append(
            {"series": f"wattprint_workload_emissions_grams_total{{{text}}}", "values": "0+60x20"}
        )
    # Burn rate as rules/ defines it: 1 spends the budget in exactly 30 days.
    metric, thirty_days = "wattprint_emissions_budget_burn:ratio_rate5m", 30 * 86400
    tests = [
        {
            "expr": _budget_series(b, metric),
            "eval_time": "10m",
            "exp_samples": [
                {"labels": _budget_series(b, metric), "value": 1.0 * thirty_days / _grams(b)}
            ],
        }
        for b in BUDGETS
    ]
    _promtool_test(
        tool,
        tmp_path,
        _rule_groups(objects("budgets")),
        {"interval": "1m", "input_series": series, "promql_expr_test": tests},
    )


def test_schema_rejects_a_budget_naming_neither_namespace_nor_workload() -> None:
    with pytest.raises(helm_python.HelmValuesError, match="budgets"):
        render({"prometheusRule": {"enabled": True, "budgets": [{"grams": 1000}]}})


def test_schema_rejects_a_budget_without_a_unit() -> None:
    with pytest.raises(helm_python.HelmValuesError, match="budgets"):
        render({"prometheusRule": {"budgets": [{"namespace": "a", "budget": "500"}]}})


def test_dashboards_become_configmaps_for_the_grafana_sidecar() -> None:
    sources = {p.name: json.loads(p.read_text()) for p in (REPO / "dashboards").glob("*.json")}
    assert sources, "dashboards/ holds no dashboards"
    maps = [
        d
        for d in objects("kube-prometheus-stack")
        if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"].get("labels", {})
    ]
    shipped = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "Wattprint"
        ((key, text),) = cm["data"].items()
        shipped[key] = json.loads(text)
    assert sorted(shipped) == sorted(sources)
    differing = [name for name in sources if shipped[name] != sources[name]]
    assert differing == [], "run: python scripts/sync_chart.py"


# --- what the user reads ----------------------------------------------------------


def test_notes_say_how_to_reach_metrics_and_dashboards() -> None:
    _, notes = _render_set("kube-prometheus-stack")
    name = one(objects("kube-prometheus-stack"), "DaemonSet")["metadata"]["name"]
    assert f"port-forward ds/{name} 9950" in notes
    assert "/metrics" in notes
    assert "Grafana" in notes


# Pod Security Standards, baseline level (kubernetes.io/docs/concepts/security/
# pod-security-standards): what of a pod spec it refuses.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def baseline_violations(pod: Doc) -> list[str]:
    found = [f"{k}=true" for k in ("hostPID", "hostIPC", "hostNetwork") if pod.get(k)]
    found += [f"hostPath volume {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    for container in pod["containers"] + pod.get("initContainers", []):
        context = container.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"{container['name']}: privileged")
        added = set(context.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        found += [f"{container['name']}: capability {c}" for c in sorted(added)]
        found += [
            f"{container['name']}: hostPort" for p in container.get("ports", []) if "hostPort" in p
        ]
    return found


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_pod_security_level_needed_is_stated(name: str) -> None:
    """Every way to install the chart needs `privileged` (baseline refuses host
    namespaces and hostPath volumes), and what the user reads says so: the chart's own
    namespace carries the label, or NOTES give the command that sets it."""
    docs, notes = _render_set(name)
    assert baseline_violations(pod_spec(docs)), "baseline would do: say so instead"
    label = "pod-security.kubernetes.io/enforce"
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    if VALUE_SETS[name].get("podSecurity", {}).get("createNamespace"):
        assert [(n["metadata"]["name"], n["metadata"]["labels"][label]) for n in namespaces] == [
            (NAMESPACE, "privileged")
        ]
        assert f"labels namespace {NAMESPACE} {label}=privileged" in notes
    else:
        assert namespaces == []
        command = f"kubectl label namespace {NAMESPACE} {label}=privileged --overwrite"
        assert command in notes
    deploy = (REPO / "docs" / "deploy.md").read_text()
    assert f"{label}=privileged" in deploy and "## Pod Security" in deploy


def test_notes_say_what_the_rules_and_dashboards_need() -> None:
    """The coverage alerts need kube-state-metrics; dashboards without the rules would
    show empty panels: both said where they apply, and only there."""
    _, with_rules = _render_set("kube-prometheus-stack")
    assert "kube-state-metrics" in with_rules and "stay empty" not in with_rules
    _, dashboards_only = render({"dashboards": {"enabled": True}})
    assert "prometheusRule.enabled=true" in dashboards_only
    assert "kube-state-metrics" not in dashboards_only


@pytest.mark.parametrize(
    ("enforced", "fails"), [("baseline", True), ("restricted", True), ("privileged", False)]
)
def test_install_stops_in_a_namespace_that_would_refuse_the_pods(
    tmp_path: Path, enforced: str, fails: bool
) -> None:
    """What `helm install` does where it can read the namespace: the chart's lookup,
    answered here as the API server would for a namespace labelled `enforced` (offline
    rendering has no cluster to ask)."""
    chart = tmp_path / "wattprint"
    shutil.copytree(CHART, chart)
    template = chart / "templates" / "namespace.yaml"
    lookup = 'lookup "v1" "Namespace" "" .Release.Namespace'
    assert lookup in template.read_text()
    answer = (
        'dict "metadata" (dict "name" .Release.Namespace "labels" '
        f'(dict "pod-security.kubernetes.io/enforce" "{enforced}"))'
    )
    template.write_text(template.read_text().replace(lookup, answer))
    loaded = helm_python.Chart.load(chart)
    if not fails:
        loaded.render({}, name=RELEASE, namespace=NAMESPACE)
        return
    with pytest.raises(helm_python.HelmError) as err:
        loaded.render({}, name=RELEASE, namespace=NAMESPACE)
    message = str(err.value)
    assert f'enforces Pod Security "{enforced}"' in message
    assert (
        f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged"
        in message
    )


def test_notes_without_a_service_monitor_name_the_kubernetes_scrape_job() -> None:
    """Pods come and go: the fixed-address scrape file would miss them."""
    _, notes = render({"serviceMonitor": {"enabled": False}})
    named = re.findall(r"deploy/[\w.-]+", notes)
    assert named == ["deploy/prometheus-scrape-kubernetes.yml"], notes
    assert (REPO / named[0]).exists()


def _promtool_knows_kubernetes_sd(tool: str, tmp_path: Path) -> bool:
    probe = tmp_path / "probe.yml"
    probe.write_text("scrape_configs: [{job_name: p, kubernetes_sd_configs: [{role: pod}]}]\n")
    result = subprocess.run([tool, "check", "config", str(probe)], capture_output=True, timeout=60)
    return result.returncode == 0


def test_plain_prometheus_scrape_config_is_valid() -> None:
    """The file as it is, with the promtool ./scripts/test installs (its header says so)."""
    path = REPO / "deploy" / "prometheus-scrape.yml"
    assert [j["job_name"] for j in yaml.safe_load(path.read_text())["scrape_configs"]] == [
        "wattprint"
    ]
    result = subprocess.run(
        [promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_scrape_config_is_valid(tmp_path: Path) -> None:
    tool = promtool()
    path = REPO / "deploy" / "prometheus-scrape-kubernetes.yml"
    config = yaml.safe_load(path.read_text())
    assert [j["job_name"] for j in config["scrape_configs"]] == ["wattprint-kubernetes"]
    if not _promtool_knows_kubernetes_sd(tool, tmp_path):
        # Debian builds Prometheus without Kubernetes discovery; the relabelling of
        # that job is still checked, with the discovery swapped for an empty list.
        for job in config["scrape_configs"]:
            assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
            job["static_configs"] = []
        path = tmp_path / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [tool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_state_survives_pod_replacement_on_the_node_and_is_the_exporters_to_write() -> None:
    docs = objects("defaults")
    pod = pod_spec(docs)
    volume = {v["name"]: v for v in pod["volumes"]}["state"]
    assert volume["hostPath"] == {"path": "/var/lib/wattprint", "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m for m in exporter(docs)["volumeMounts"]}
    assert mounts["state"]["mountPath"] == "/var/lib/wattprint"
    assert not mounts["state"].get("readOnly")
    assert args(docs)["--state.file"] == "/var/lib/wattprint/state.json"
    # The non-root exporter gets the root-created directory through one CAP_CHOWN step.
    (init,) = pod["initContainers"]
    user = pod["securityContext"]["runAsUser"]
    assert init["command"] == ["chown", f"{user}:{user}", "/var/lib/wattprint"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False


def test_state_can_be_turned_off_and_root_needs_no_chown() -> None:
    docs, _ = render({"state": {"enabled": False}})
    assert "state" not in {v["name"] for v in pod_spec(docs)["volumes"]}
    assert args(docs)["--state.file"] == ""
    docs, _ = render({"security": {"runAsRoot": True}})
    assert "initContainers" not in pod_spec(docs)
