"""`wattprint report` against a server whose query answers are malformed (issue 33):
one line and status 1, never a traceback."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from test_report import report

MALFORMED: list[Any] = [
    [],
    {"resultType": "vector", "result": "abc"},
    {"resultType": "vector", "result": [{"value": "x"}]},
    {"resultType": "vector", "result": [{"value": [1]}]},
    {"resultType": "matrix", "result": [{"values": [[1, "many"]]}]},
    {"resultType": "vector", "result": [{"metric": 5, "value": [1, "2"]}]},
    {"resultType": "vector", "result": [7]},
]


@pytest.fixture(name="server")
def server_fixture() -> Iterator[dict[str, Any]]:
    answer: dict[str, Any] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def reply(self) -> None:
            data = answer["data"] if "query" in self.path else []
            body = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = reply

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    answer["url"] = f"http://127.0.0.1:{httpd.server_port}"
    try:
        yield answer
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("data", MALFORMED)
def test_a_malformed_query_answer_is_one_line(server: dict[str, Any], data: Any) -> None:
    server["data"] = data
    result = report(server["url"], "--workload=job-a")
    assert "Traceback" not in result.stderr
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "not a Prometheus result" in result.stderr
