"""Kubernetes API faults, against a local API server that pages the pod list as the real
one does: down, 401, 403, slow, and a pod list too large for one answer."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from wattprint.host.identity.kubernetes import KubernetesPods

from .faultrig import Node, Rig, RigFactory, use_app_part, wait_for, warnings_about

NODE_NAME = "node-a"
TOKEN = "service-account-token-for-tests"
PODS_PER_JOB = 8


def pod_uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


def pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"train-{i // PODS_PER_JOB}-worker-{i % PODS_PER_JOB}",
            "namespace": "ml",
            "uid": pod_uid(i),
            "labels": {"batch.kubernetes.io/job-name": f"train-{i // PODS_PER_JOB}"},
        },
        "spec": {"nodeName": NODE_NAME},
    }


def pod_cgroup(i: int) -> str:
    uid = pod_uid(i).replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
        f"cri-containerd-{i:064x}.scope\n"
    )


class PodApi:
    """GET /api/v1/pods with limit and continue, and the faults a test asks for."""

    def __init__(self, count: int) -> None:
        self.pods = [pod(i) for i in range(count)]
        self.fail_status: int | None = None
        self.delay_s = 0.0
        self.page_sizes: list[int] = []
        self.stopping = threading.Event()
        self.port = 0
        self.httpd: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if api.delay_s and api.stopping.wait(api.delay_s):
                    return
                code, body = api.answer(self.path, self.headers.get("Authorization"))
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        # The same port again after a restart, as a Service address stays the same.
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def answer(self, path: str, auth: str | None) -> tuple[int, dict[str, Any]]:
        status = self.fail_status or (401 if auth != f"Bearer {TOKEN}" else None)
        if status is not None:
            reason = {401: "Unauthorized", 403: "Forbidden"}.get(status, "InternalError")
            return status, {"kind": "Status", "code": status, "reason": reason}
        url = urlsplit(path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        assert url.path == "/api/v1/pods"
        assert query["fieldSelector"] == f"spec.nodeName={NODE_NAME}"
        offset = int(query.get("continue", "0"))
        limit = int(query["limit"])
        items = self.pods[offset : offset + limit]
        self.page_sizes.append(len(items))
        rest = len(self.pods) - offset - len(items)
        meta = {"resourceVersion": "1"}
        if rest:
            meta.update({"continue": str(offset + len(items)), "remainingItemCount": str(rest)})
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}


@pytest.fixture
def api() -> Iterator[PodApi]:
    server = PodApi(count=5000)
    yield server
    server.stopping.set()
    server.stop()


@pytest.fixture
def pods(api: PodApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KubernetesPods:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    client = KubernetesPods(
        api.url,
        NODE_NAME,
        token_path=str(token),
        ca_path=None,
        refresh_interval_s=0.1,
        timeout_s=0.2,
        min_refresh_gap_s=0.05,
    )

    def from_environment(node_name: str, job_labels: tuple[str, ...]) -> KubernetesPods:
        assert node_name == NODE_NAME
        return client

    # What the exporter would find in a pod's service account, pointed at the local server.
    use_app_part(monkeypatch, "KubernetesPods", SimpleNamespace(from_environment=from_environment))
    return client


def k8s_rig(node: Node, rig_factory: RigFactory, pods: KubernetesPods) -> Rig:
    # A worker of the first job, and one of a job on the last page of the list.
    node.add_process(700, cgroup=pod_cgroup(3))
    node.add_process(701, cgroup=pod_cgroup(4999))
    rig = rig_factory(**{"kubernetes.node-name": NODE_NAME})
    wait_for(lambda: pods.last_success is not None, what="the first pod listing")
    return rig


def cpu_share(rig: Rig, workload: str) -> float:
    return rig.energy("workload", component="cpu", scheduler="kubernetes", workload=workload)


def test_large_pod_list_is_paged(
    node: Node, rig_factory: RigFactory, pods: KubernetesPods, api: PodApi
) -> None:
    rig = k8s_rig(node, rig_factory, pods)
    rig.steps(3)
    assert cpu_share(rig, "train-0") > 0
    assert cpu_share(rig, "train-624") > 0  # on the tenth page
    assert pods.pod_count == 5000
    assert max(api.page_sizes) == pods.page_limit == 500
    assert rig.errors("kubernetes") == 0 and rig.success("kubernetes") == 1


@pytest.mark.parametrize("fault", ["down", "401", "403", "slow"])
def test_api_fault_keeps_the_last_list(
    node: Node,
    rig_factory: RigFactory,
    pods: KubernetesPods,
    api: PodApi,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    rig = k8s_rig(node, rig_factory, pods)
    rig.steps(2)
    caplog.set_level(logging.INFO)
    if fault == "down":
        api.stop()
    elif fault == "slow":
        api.delay_s = 1.0  # past the client's 0.2 s timeout
    else:
        api.fail_status = int(fault)
    wait_for(lambda: pods.errors_total >= 3, what="three failed listings")

    before = cpu_share(rig, "train-0")
    started = time.monotonic()
    rig.step()
    assert time.monotonic() - started < 0.5  # a sample never waits for the API server
    rig.steps(2)
    assert rig.errors("kubernetes") >= 3
    assert rig.success("kubernetes") == 0
    # The last good list stays in use: known pods are still billed.
    assert cpu_share(rig, "train-0") > before
    said = warnings_about(caplog, "listing pods failed")
    assert len(said) == 1, said
    if fault in ("401", "403"):
        assert f"HTTP {fault}" in said[0]

    if fault == "down":
        api.start()
    api.delay_s, api.fail_status = 0.0, None
    failed = pods.errors_total
    wait_for(lambda: not pods.last_error, what="a good listing")
    rig.steps(2)
    assert rig.errors("kubernetes") >= failed  # the count never goes back
    assert any("works again" in r.getMessage() for r in caplog.records)


def test_success_comes_back_after_the_api_recovers(
    node: Node, rig_factory: RigFactory, pods: KubernetesPods, api: PodApi
) -> None:

    rig = k8s_rig(node, rig_factory, pods)
    api.fail_status = 403
    wait_for(lambda: pods.errors_total >= 1, what="a failed listing")
    api.fail_status = None
    wait_for(lambda: not pods.last_error, what="a good listing")
    rig.steps(2)
    assert rig.success("kubernetes") == 1
