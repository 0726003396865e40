"""A small client for the Prometheus HTTP API (v1), as `wattprint report` needs it.

Every failure becomes a PrometheusError whose str() is one line a user can act on:
the server cannot be reached, refuses the credentials, is not a Prometheus, or
rejects a query.

Queries go out with `nocache=1`. Prometheus ignores it; VictoriaMetrics otherwise
moves an instant query within its -search.latencyOffset (30 s) of now back by that
offset, and aligns a range query's start and end to multiples of the step for its
response cache, so neither would be evaluated at the times asked.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import socket
from dataclasses import dataclass
from typing import Any

import requests

from wattprint.core.deadline import within
from wattprint.core.safeio import BadDocument, loads_json, number, printable

# An answer larger than this is cut off: the report's queries name one job's series.
MAX_ANSWER_BYTES = 512 << 20
# Unix seconds: a sample's time past 2286 is not one.
MAX_TIME_S = 1e10


class PrometheusError(Exception):
    """Talking to Prometheus failed; str() is one line."""


@dataclass(frozen=True)
class ServerInfo:
    """What the server says it is and how long it keeps data."""

    engine: str  # "Prometheus 2.42.0", "VictoriaMetrics", or what the server calls itself
    retention: str | None  # as the server reports it ("15d"), None where it does not


@dataclass(frozen=True)
class Series:
    """One series of a query's answer: its labels and samples."""

    labels: dict[str, str]
    samples: list[tuple[float, float]]  # (unix seconds, value), oldest first


def quote(value: str) -> str:
    """A PromQL string literal."""
    return json.dumps(value)


def format_ms(seconds: float) -> str:
    """A duration Prometheus reads exactly, to the millisecond.

    A float step ("1.234") goes through float nanoseconds on the server and can lose
    a millisecond; "1234ms" cannot.
    """
    return f"{max(1, round(seconds * 1000))}ms"


def _time(value: Any) -> float:
    """A sample's time: finite, after 1970 and before 2286 (ValueError otherwise)."""
    return number(float(value), "a sample's time", minimum=0.0, maximum=MAX_TIME_S)


def _reason(err: BaseException) -> str:
    # requests wraps urllib3 wraps socket errors; the useful part is the innermost
    # errno text ("Connection refused", "Name or service not known").
    found = re.findall(r"\[Errno -?\d+\] ([^'\")\]]+)", str(err))
    if found:
        return str(found[-1]).strip()
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    return type(err).__name__


def _cut(reply: requests.Response | None) -> None:
    """Shut the socket a response is read from (best effort: urllib3 keeps it inside)."""
    connection = getattr(getattr(reply, "raw", None), "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class PrometheusClient:
    """The queries `wattprint report` sends, with its credentials, TLS and timeout."""

    def __init__(
        self,
        url: str,
        *,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        verify: bool | str = True,
        timeout: float = 120.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        # Passed with every request: a session-wide `verify` loses to the environment's
        # REQUESTS_CA_BUNDLE, and --prometheus.ca-file must win.
        self._verify = verify
        self._session = requests.Session()
        self._session.headers["User-Agent"] = "wattprint-report"
        if bearer_token:
            self._session.headers["Authorization"] = f"Bearer {bearer_token}"
        elif basic_auth:
            self._session.auth = basic_auth
        self.requests = 0

    def close(self) -> None:
        self._session.close()

    def _call(
        self, path: str, params: dict[str, str] | list[tuple[str, str]], post: bool = False
    ) -> Any:
        where = f"Prometheus at {self.url}"
        self.requests += 1
        try:
            status, raw = self._request(path, params, post)
        except requests.exceptions.SSLError as err:
            raise PrometheusError(
                f"TLS with {where} failed ({_reason(err)}); see --prometheus.ca-file "
                "and --prometheus.insecure-skip-verify"
            ) from None
        except (requests.exceptions.Timeout, TimeoutError):
            raise PrometheusError(
                f"{where} did not answer in full within {self.timeout:g} s (--prometheus.timeout)"
            ) from None
        except requests.exceptions.RequestException as err:
            raise PrometheusError(f"cannot reach {where}: {_reason(err)}") from None
        if status in (401, 403):
            raise PrometheusError(
                f"{where} refused access (HTTP {status}); check "
                "--prometheus.bearer-token-file or --prometheus.username and "
                "WATTPRINT_PROMETHEUS_PASSWORD"
            )
        try:
            body = loads_json(raw, f"{where}'s answer to {path}")
        except BadDocument as err:
            # JSON too deep, or a number no JSON encoder writes: a hostile or broken
            # server, said as such; anything else (an HTML page) is a wrong URL.
            body, malformed = None, str(err) if raw.lstrip()[:1] in (b"{", b"[") else ""
        else:
            malformed = ""
        if not isinstance(body, dict) or "status" not in body:
            if status == 404:
                raise PrometheusError(
                    f"{self.url} has no {path} (HTTP 404): --prometheus.url must be the "
                    "server's base URL, e.g. http://prometheus:9090"
                )
            if malformed and status == 200:
                raise PrometheusError(f"{malformed}: not a Prometheus result")
            raise PrometheusError(
                f"{where} answered HTTP {status} without the API's JSON "
                f"for {path}: is the URL right?"
            )
        if body["status"] != "success":
            error = str(body.get("error", "unknown error"))
            raise PrometheusError(f"{where} rejected a query: {printable(error.strip())}")
        return body.get("data")

    def _request(
        self, path: str, params: dict[str, str] | list[tuple[str, str]], post: bool
    ) -> tuple[int, bytes]:
        """The status and body of one request, whole within --prometheus.timeout and
        MAX_ANSWER_BYTES: requests' own timeout bounds each read, so a server that
        trickles a byte at a time would hold it for ever; a watchdog bounds the whole."""
        # Only the query endpoints take POST (a query naming many series can outgrow a URL).
        send = {"data": params} if post else {"params": params}
        opened: list[requests.Response] = []

        def work() -> tuple[int, bytes]:
            with self._session.request(
                "POST" if post else "GET",
                f"{self.url}{path}",
                timeout=self.timeout,
                verify=self._verify,
                stream=True,
                **send,  # type: ignore[arg-type]
            ) as reply:
                opened.append(reply)
                body = bytearray()
                for chunk in reply.iter_content(1 << 20):
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        raise PrometheusError(
                            f"Prometheus at {self.url} answered over {MAX_ANSWER_BYTES >> 20} "
                            f"MiB to {path}: cut off; narrow the report (--workload, --range)"
                        )
                return reply.status_code, bytes(body)

        return within(self.timeout, work, lambda: _cut(opened[0] if opened else None))

    @staticmethod
    def _parse(data: Any) -> list[Series]:
        try:
            return PrometheusClient._series(data)
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise PrometheusError(
                f"the server's answer to a query is not a Prometheus result ({printable(str(err))})"
            ) from None

    @staticmethod
    def _series(data: Any) -> list[Series]:
        kind = data.get("resultType")
        out: list[Series] = []
        for item in data.get("result", []):
            if kind == "vector":
                raw = [item["value"]]
            elif kind == "matrix":
                raw = item.get("values", [])
            else:
                raise PrometheusError(f"unexpected Prometheus result type {kind!r}")
            samples = [(_time(t), float(v)) for t, v in raw]
            samples = [(t, v) for t, v in samples if math.isfinite(v)]
            out.append(Series(dict(item.get("metric", {})), samples))
        return out

    def instant(self, expr: str, at: float) -> list[Series]:
        """An instant query; a range selector returns its raw samples."""
        params = {"query": expr, "time": f"{at:.3f}", "nocache": "1"}
        return self._parse(self._call("/api/v1/query", params, post=True))

    def range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        params = {
            "query": expr,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": format_ms(step),
            "nocache": "1",
        }
        return self._parse(self._call("/api/v1/query_range", params, post=True))

    def label_values(self, label: str, match: str) -> list[str]:
        """Every value of `label` on series matching `match`, over all stored data."""
        data = self._call(f"/api/v1/label/{label}/values", [("match[]", match)])
        return [str(v) for v in data or []]

    def _optional(self, path: str) -> Any:
        """The data of an endpoint that Prometheus has and compatible servers may lack
        (Thanos, Mimir and VictoriaMetrics answer 404, 400 or an error): None there."""
        try:
            return self._call(path, {})
        except PrometheusError as err:
            if any(s in str(err) for s in ("HTTP 404", "without the API", "rejected a query")):
                return None
            raise

    def server(self) -> ServerInfo:
        """Which engine answers, and its retention where it reports one."""
        runtime = self._optional("/api/v1/status/runtimeinfo")
        build = self._optional("/api/v1/status/buildinfo")
        build = build if isinstance(build, dict) else {}
        retention = runtime.get("storageRetention") if isinstance(runtime, dict) else None
        version = str(build.get("version") or "")
        name = str(build.get("application") or "")  # Grafana Mimir says so
        if not name and runtime is None and self._speaks_metricsql():
            # VictoriaMetrics has no runtimeinfo; its buildinfo is empty (1.79) or
            # claims a Prometheus version for Grafana's sake (later releases).
            name, version = "VictoriaMetrics", ""
        if not name:
            name = "Prometheus" if runtime is not None else "Prometheus-compatible server"
        engine = printable(f"{name} {version}" if version else name, 80)
        return ServerInfo(engine, printable(str(retention), 40) if retention else None)

    def _speaks_metricsql(self) -> bool:
        # label_set() is MetricsQL's alone: PromQL servers reject it as unknown.
        try:
            self.instant('label_set(vector(1), "wattprint", "probe")', 0)
        except PrometheusError:
            return False
        return True
