"""`wattprint report` against a server whose query answers are malformed (issue 33) or
hostile (issue 43: nested deep, absurd times, a flood of escape codes, a trickle): one
line and status 1, never a traceback, never past --prometheus.timeout."""

from __future__ import annotations

import http.server
import json
import threading
import time
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
            # A query's POST body read first: a server closing with it unread makes the
            # kernel reset the connection, under the answer the client is still reading.
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = answer.get("data") if "query" in self.path else []
            body = json.dumps({"status": "success", "data": data}).encode()
            if "query" in self.path and "raw" in answer:
                body = answer["raw"]
            self.send_response(answer.get("code", 200))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not answer.get("trickle"):
                self.wfile.write(body)
                return
            for byte in body:  # one byte every 0.2 s: each read is quick, the whole is not
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)

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


def one_line(result: Any) -> str:
    assert "Traceback" not in result.stderr
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr[:1000]
    return str(result.stderr)


VECTOR = '{"status":"success","data":{"resultType":"vector","result":[%s]}}'


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("[" * 100_000 + "]" * 100_000, "is nested too deep: not a Prometheus result"),
        (
            '{"status":"success","data":' * 100 + "{}" + "}" * 100,
            "is nested over 64 deep: not a Prometheus result",
        ),
        (VECTOR % ('{"metric":{},"value":[1%s,"1"]}' % ("0" * 400)), "a number of 401 digits"),
        (VECTOR % '{"metric":{},"value":["NaN","1"]}', "a sample's time is not a finite number"),
        (VECTOR % '{"metric":{},"value":[NaN,"1"]}', "NaN is not a number"),
        (VECTOR % '{"metric":{},"value":["1e300","1"]}', "a sample's time is 1e+300, over 1e+10"),
    ],
)
def test_a_hostile_answer_is_one_line(server: dict[str, Any], raw: str, said: str) -> None:
    server["raw"] = raw.encode()
    assert said in one_line(report(server["url"], "--workload=job-a"))


def test_a_flood_of_escape_codes_in_an_error_is_printed_short_and_clean(
    server: dict[str, Any],
) -> None:
    error = "bad query \x1b]0;owned\x07\x1b[2J" + "\x1b[31m" * 1_000_000  # 5 MB
    server["raw"] = json.dumps({"status": "error", "error": error}).encode()
    server["code"] = 400
    said = one_line(report(server["url"], "--workload=job-a"))
    assert "rejected a query: bad query \\x1b]0;owned\\x07\\x1b[2J" in said
    assert len(said) < 400 and "\x1b" not in said and "\x07" not in said


def test_a_trickling_server_is_given_up_on_at_the_timeout(server: dict[str, Any]) -> None:
    server["raw"] = json.dumps({"status": "success", "data": MALFORMED[1]}).encode()
    server["trickle"] = True  # the whole answer would take over 10 s, each byte 0.2 s
    began = time.monotonic()
    said = one_line(report(server["url"], "--workload=job-a", "--prometheus.timeout=2s"))
    took = time.monotonic() - began
    assert "did not answer in full within 2 s (--prometheus.timeout)" in said
    assert took < 8, took  # one request's 2 s, and the start of Python
