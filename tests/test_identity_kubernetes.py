from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fakeapiserver import NODE, TOKEN, FakeApiServer, fixture_pages
from wattprint.core.model import Workload
from wattprint.host.identity.kubernetes import DEFAULT_JOB_LABELS, KubernetesPods, pod_workload


def k8s(namespace: str, pod: str, workload: str) -> Workload:
    return Workload(scheduler="kubernetes", workload=workload, namespace=namespace, pod=pod)


# Every pod of the fixture pod list, by UID, and the job it belongs to.
EXPECTED = {
    # a Job: batch.kubernetes.io/job-name
    "d2a7a51b-8257-4172-8276-eaa2845be93e": k8s("ml-team", "resnet-train-x7k2p", "resnet-train"),
    # a PyTorchJob worker: training.kubeflow.org/job-name
    "7e93e1f5-0aa6-4394-a7f8-d4afc6864c09": k8s("research", "llama-ft-worker-0", "llama-ft"),
    # a bare pod: its own name
    "eb2bc7cc-6405-4ff5-bd2f-59e27635c743": k8s("default", "debug-shell", "debug-shell"),
    # a Deployment's pod: the ReplicaSet name without its pod-template-hash
    "4908cb16-d5f4-4d23-8100-64a6f20ece0e": k8s(
        "serving", "inference-api-7d9f8b6c5d-qx2lm", "inference-api"
    ),
    # app.kubernetes.io/instance wins over the StatefulSet owner
    "7309dba1-ae00-414f-a43f-d41c85d7cbf9": k8s("serving", "vllm-0", "vllm-prod"),
    # a static pod, by its mirror pod's UID and by the kubelet's hash the cgroup uses
    "5f0c2a8e-6b1d-4c3e-9f7a-8d2b4e6c0a13": k8s(
        "kube-system", "kube-apiserver-node-a", "kube-apiserver-node-a"
    ),
    "0956783103ba8372a592a2476683bdab": k8s(
        "kube-system", "kube-apiserver-node-a", "kube-apiserver-node-a"
    ),
    # a DaemonSet's pod: the controller's name
    "61d0c7fd-ad4a-4cac-8ee7-15a4530df8b9": k8s("monitoring", "wattprint-r8v4n", "wattprint"),
}


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    p = tmp_path / "token"
    p.write_text(TOKEN + "\n")
    return p


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        yield s


def make_pods(
    url: str, token_file: Path, refresh_interval_s: float = 30.0, min_refresh_gap_s: float = 2.0
) -> KubernetesPods:
    return KubernetesPods(
        url,
        NODE,
        token_path=str(token_file),
        ca_path=None,
        page_limit=3,
        timeout_s=2.0,
        refresh_interval_s=refresh_interval_s,
        min_refresh_gap_s=min_refresh_gap_s,
    )


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def listings(server: FakeApiServer) -> int:
    """How many times the pod list was started (its first page asked for)."""
    return sum("continue" not in q for _, q, _ in server.requests)


def test_lists_all_pages_of_the_node(server: FakeApiServer, token_file: Path) -> None:
    pods = make_pods(server.url, token_file)

    assert pods.refresh()

    for uid, workload in EXPECTED.items():
        assert pods.lookup(uid) == workload, uid
    assert pods.lookup("00000000-0000-0000-0000-000000000000") is None
    assert pods.errors_total == 0
    assert pods.last_success is not None
    # Two pages: the second asked for with the first page's continue token.
    assert len(server.requests) == 2
    first, second = (q for _, q, _ in server.requests)
    assert first["fieldSelector"] == second["fieldSelector"] == [f"spec.nodeName={NODE}"]
    assert first["limit"] == ["3"]
    assert "continue" not in first
    assert second["continue"] == [server.pages[0]["metadata"]["continue"]]
    assert {auth for _, _, auth in server.requests} == {f"Bearer {TOKEN}"}


def test_rotated_token_is_read_again(server: FakeApiServer, token_file: Path) -> None:
    pods = make_pods(server.url, token_file)
    assert pods.refresh()

    server.token = "rotated-token"
    assert not pods.refresh()  # still the old token on disk
    token_file.write_text("rotated-token")
    assert pods.refresh()
    assert server.requests[-1][2] == "Bearer rotated-token"


@pytest.mark.parametrize("status", [401, 403, 500])
def test_refused_list_counts_an_error_and_raises_nothing(
    server: FakeApiServer, token_file: Path, status: int
) -> None:
    server.fail_status = status
    pods = make_pods(server.url, token_file)

    assert not pods.refresh()
    assert not pods.refresh()

    assert pods.errors_total == 2
    assert str(status) in pods.last_error
    assert pods.lookup(next(iter(EXPECTED))) is None
    assert pods.last_success is None


def test_api_server_down(token_file: Path) -> None:
    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pods = make_pods(f"http://127.0.0.1:{port}", token_file)

    assert not pods.refresh()
    assert pods.errors_total == 1
    assert pods.lookup(next(iter(EXPECTED))) is None


def test_missing_token_file_is_an_error(server: FakeApiServer, tmp_path: Path) -> None:
    pods = make_pods(server.url, tmp_path / "absent")
    assert not pods.refresh()
    assert pods.errors_total == 1


def test_failed_refresh_keeps_the_last_good_list(server: FakeApiServer, token_file: Path) -> None:
    pods = make_pods(server.url, token_file)
    assert pods.refresh()
    server.fail_status = 503

    assert not pods.refresh()

    assert (
        pods.lookup("d2a7a51b-8257-4172-8276-eaa2845be93e")
        == EXPECTED["d2a7a51b-8257-4172-8276-eaa2845be93e"]
    )


def test_expired_continue_token_restarts_the_list(server: FakeApiServer, token_file: Path) -> None:
    server.expire_next_continue = True
    pods = make_pods(server.url, token_file)

    assert pods.refresh()

    assert pods.pod_count == len(EXPECTED)
    assert [("continue" in q) for _, q, _ in server.requests] == [False, True, False, True]


def test_thread_keeps_retrying_until_the_api_answers(
    server: FakeApiServer, token_file: Path
) -> None:
    server.fail_status = 403
    pods = make_pods(server.url, token_file, refresh_interval_s=0.02, min_refresh_gap_s=0.0)
    pods.start()
    try:
        assert wait_for(lambda: pods.errors_total >= 3)
        assert pods.lookup(next(iter(EXPECTED))) is None
        server.fail_status = None
        assert wait_for(lambda: pods.lookup(next(iter(EXPECTED))) is not None)
    finally:
        pods.stop()
    assert pods.last_success is not None


def test_unknown_pod_triggers_an_early_refresh(server: FakeApiServer, token_file: Path) -> None:
    pods = make_pods(server.url, token_file, refresh_interval_s=3600.0, min_refresh_gap_s=0.05)
    pods.start()
    try:
        assert wait_for(lambda: pods.last_success is not None)
        new = fixture_pages()[0]["items"][0]
        new["metadata"]["uid"] = "11111111-2222-3333-4444-555555555555"
        server.add_pod(new)

        pods.request_refresh("11111111-2222-3333-4444-555555555555")

        assert wait_for(lambda: pods.lookup("11111111-2222-3333-4444-555555555555") is not None)
        # A UID asks once: asking again does not list again while the first is pending.
        pods.request_refresh("99999999-2222-3333-4444-555555555555")
        assert wait_for(lambda: listings(server) == 3)
        pods.request_refresh("99999999-2222-3333-4444-555555555555")
        time.sleep(0.3)
        assert listings(server) == 3
    finally:
        pods.stop()


def test_job_labels_are_configurable() -> None:
    pod = fixture_pages()[0]["items"][1]  # the PyTorchJob worker
    pod["metadata"]["labels"]["team.example.com/run"] = "sweep-17"

    w = pod_workload(pod, ("team.example.com/run", *DEFAULT_JOB_LABELS))

    assert w.workload == "sweep-17"
    assert pod_workload(pod, ()).workload == "llama-ft"  # the PyTorchJob controller


def test_not_in_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert KubernetesPods.from_environment(NODE) is None
    with pytest.raises(ValueError):
        KubernetesPods(None, NODE)
