"""A stand-in for the Kubernetes API server's pod list, on 127.0.0.1 (plain HTTP)."""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"
TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.fake-service-account-token"
NODE = "node-a"


def fixture_pages() -> list[dict[str, Any]]:
    return [json.loads((FIXTURES / f"pods-page-{i}.json").read_text()) for i in (1, 2)]


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeApiServer:
    def __init__(self, pages: list[dict[str, Any]] | None = None) -> None:
        self.pages = pages if pages is not None else fixture_pages()
        self.token = TOKEN
        self.fail_status: int | None = None  # answer every request with this status
        self.expire_next_continue = False  # answer the next paged request 410 Gone
        self.requests: list[tuple[str, dict[str, list[str]], str | None]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                auth = self.headers.get("Authorization")
                with server.lock:
                    server.requests.append((url.path, query, auth))
                    code, body = server.answer(url.path, query, auth)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def add_pod(self, pod: dict[str, Any]) -> None:
        with self.lock:
            self.pages[-1]["items"].append(copy.deepcopy(pod))

    def answer(
        self, path: str, query: dict[str, list[str]], auth: str | None
    ) -> tuple[int, dict[str, Any]]:
        if self.fail_status is not None:
            reason = {401: "Unauthorized", 403: "Forbidden"}.get(self.fail_status, "InternalError")
            message = (
                'pods is forbidden: User "system:serviceaccount:monitoring:wattprint" '
                'cannot list resource "pods" in API group "" at the cluster scope'
            )
            return self.fail_status, status_body(self.fail_status, reason, message)
        if path != "/api/v1/pods":
            return 404, status_body(404, "NotFound", "the server could not find the resource")
        if auth != f"Bearer {self.token}":
            return 401, status_body(401, "Unauthorized", "Unauthorized")
        if query.get("fieldSelector") != [f"spec.nodeName={NODE}"] or "limit" not in query:
            return 400, status_body(400, "BadRequest", "this fake wants the node's pods, paged")
        token = query.get("continue", [""])[0]
        if not token:
            return 200, self.pages[0]
        if self.expire_next_continue:
            self.expire_next_continue = False
            return 410, status_body(410, "Expired", "The provided continue parameter is too old")
        for i, page in enumerate(self.pages[:-1]):
            if page["metadata"].get("continue") == token:
                return 200, self.pages[i + 1]
        return 400, status_body(400, "BadRequest", "unknown continue token")
