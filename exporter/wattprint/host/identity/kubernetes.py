"""Pods of this node, listed from the Kubernetes API in a background thread.

The sampler only ever does a dictionary lookup (pod UID -> Workload); listing happens
on its own thread every refresh interval, and sooner (once per unknown pod) when the
sampler meets a pod the list does not know yet, so a new pod's processes are
attributed within seconds instead of after a whole interval. When the API server is
down or refuses the request, the last good list stays in use and the error is counted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from wattprint.core.background import DaemonLoop
from wattprint.core.model import Workload

log = logging.getLogger(__name__)

SCHEDULER = "kubernetes"
DEFAULT_JOB_LABELS = (
    "batch.kubernetes.io/job-name",
    "job-name",
    "training.kubeflow.org/job-name",
    "app.kubernetes.io/instance",
)
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_PATH = f"{SERVICE_ACCOUNT_DIR}/token"
CA_PATH = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
# A static pod runs under the UID the kubelet derives from its manifest; the API server
# knows it as a mirror pod with a UID of its own and this annotation holding the first.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def pod_workload(pod: Mapping[str, Any], job_labels: Sequence[str]) -> Workload:
    """The job a pod belongs to: a job label, else its controller, else the pod itself.

    A ReplicaSet controller is reported by its Deployment's name: the ReplicaSet name is
    the Deployment name plus "-<pod-template-hash>", and that suffix changes with every
    rollout, which would split one service into a series per rollout. A Node "controls"
    static (mirror) pods; that is no job, so those are named by the pod.
    """
    meta = pod.get("metadata") or {}
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or "")
    labels = meta.get("labels") or {}
    workload = ""
    for key in job_labels:
        value = labels.get(key)
        if value:
            workload = str(value)
            break
    if not workload:
        for owner in meta.get("ownerReferences") or []:
            if owner.get("controller") and owner.get("name") and owner.get("kind") != "Node":
                workload = str(owner["name"])
                suffix = "-" + str(labels.get("pod-template-hash") or "")
                if owner.get("kind") == "ReplicaSet" and len(suffix) > 1:
                    workload = workload.removesuffix(suffix)
                break
    return Workload(scheduler=SCHEDULER, workload=workload or name, namespace=namespace, pod=name)


class KubernetesPods(DaemonLoop):
    """Background-refreshed map of this node's pods, by pod UID."""

    thread_name = "wattprint-k8s-pods"
    stop_timeout_s = 5.0

    def __init__(
        self,
        api_url: str | None,
        node_name: str,
        token_path: str | None = TOKEN_PATH,
        ca_path: str | None = CA_PATH,
        job_labels: Sequence[str] = DEFAULT_JOB_LABELS,
        refresh_interval_s: float = 30.0,
        timeout_s: float = 10.0,
        page_limit: int = 500,
        min_refresh_gap_s: float = 2.0,
    ) -> None:
        if api_url is None:
            api_url = in_cluster_api_url()
            if api_url is None:
                raise ValueError("no api_url and KUBERNETES_SERVICE_HOST is not set")
        if not node_name:
            raise ValueError("node_name is empty: listing every pod of the cluster is too costly")
        self.api_url, self.node_name = api_url.rstrip("/"), node_name  # what is listed
        self.token_path, self.ca_path = token_path, ca_path  # how the API is trusted
        self.job_labels = tuple(job_labels)
        self.refresh_interval_s = refresh_interval_s
        self.timeout_s = timeout_s
        self.page_limit = page_limit
        # Never list more often than this, however many unknown pods ask for a refresh.
        self.min_refresh_gap_s = min_refresh_gap_s
        self.errors_total = 0
        self.last_success: float | None = None  # wall time of the last complete listing
        self.last_error = ""
        # Replaced whole by the refresh thread, so a reader never sees a half-built map.
        self._pods: dict[str, Workload] = {}
        self._asked: set[str] = set()  # unknown UIDs that already triggered a refresh
        self._asked_lock = threading.Lock()  # the sampler adds, the refresh thread prunes
        # Here, not at module level: an exporter outside Kubernetes never loads requests.
        import requests

        self._session = requests.Session()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_environment(
        cls,
        node_name: str,
        job_labels: Sequence[str] = DEFAULT_JOB_LABELS,
        refresh_interval_s: float = 30.0,
        timeout_s: float = 10.0,
        page_limit: int = 500,
    ) -> KubernetesPods | None:
        """In-cluster client from the service account, or None outside a cluster."""
        api_url = in_cluster_api_url()
        if api_url is None or not os.path.exists(TOKEN_PATH):
            return None
        if not node_name:
            log.warning(
                "running in Kubernetes but the node name is unknown: pods are not resolved "
                "(set NODE_NAME from spec.nodeName)"
            )
            return None
        return cls(
            api_url,
            node_name,
            job_labels=job_labels,
            refresh_interval_s=refresh_interval_s,
            timeout_s=timeout_s,
            page_limit=page_limit,
        )

    def lookup(self, pod_uid: str) -> Workload | None:
        return self._pods.get(pod_uid)

    @property
    def pod_count(self) -> int:
        return len(self._pods)

    def request_refresh(self, pod_uid: str) -> None:
        """Ask for an early listing because pod_uid is unknown; once per UID."""
        with self._asked_lock:
            if pod_uid in self._asked:
                return
            if len(self._asked) > 10_000:  # UIDs that never show up must not pile up
                self._asked.clear()
            self._asked.add(pod_uid)
        self._wake.set()

    def _interrupt(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float | None = None) -> None:
        super().stop(timeout_s)
        self._session.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.refresh()
            self._wake.wait(self.refresh_interval_s)
            self._wake.clear()
            gap = min(self.min_refresh_gap_s, self.refresh_interval_s)
            self._stop.wait(max(0.0, started + gap - time.monotonic()))

    def refresh(self) -> bool:
        """List the node's pods once; on failure keep the previous list and count the error."""
        try:
            pods = self._list()
        except Exception as e:  # the thread must outlive anything the API server answers
            self.errors_total += 1
            first = not self.last_error
            self.last_error = str(e) or type(e).__name__
            (log.warning if first else log.debug)("listing pods failed: %s", self.last_error)
            return False
        if self.last_error:
            log.info("listing pods works again (%d pods)", len(pods))
        self.last_error = ""
        self._pods = pods
        with self._asked_lock:
            self._asked.difference_update(pods)
        self.last_success = time.time()
        return True

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_path:
            # Read every time: projected service account tokens are rotated on disk.
            with open(self.token_path, encoding="utf-8") as f:
                headers["Authorization"] = "Bearer " + f.read().strip()
        return headers

    def _list(self) -> dict[str, Workload]:
        headers = self._headers()
        verify: bool | str = self.ca_path if self.ca_path and os.path.exists(self.ca_path) else True
        params = {"fieldSelector": f"spec.nodeName={self.node_name}", "limit": str(self.page_limit)}
        pods: dict[str, Workload] = {}
        restarted = False
        while True:
            r = self._session.get(
                f"{self.api_url}/api/v1/pods",
                params=params,
                headers=headers,
                timeout=self.timeout_s,
                verify=verify,
            )
            if r.status_code == 410 and "continue" in params and not restarted:
                # The continue token expired (the list changed too much): start over once.
                restarted = True
                pods = {}
                del params["continue"]
                continue
            if r.status_code != 200:
                raise RuntimeError(f"GET {r.url}: HTTP {r.status_code} {r.reason}")
            body = r.json()
            for item in body.get("items") or []:
                meta = item.get("metadata") or {}
                uid = meta.get("uid")
                if not uid:
                    continue
                workload = pod_workload(item, self.job_labels)
                pods[str(uid)] = workload
                mirror = (meta.get("annotations") or {}).get(MIRROR_ANNOTATION)
                if mirror:
                    pods[str(mirror)] = workload
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return pods
            params["continue"] = str(token)


def in_cluster_api_url() -> str | None:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"https://{host}:{port}"
