"""A small client for the Prometheus HTTP API (v1), as `wattprint report` needs it.

Every failure becomes a PrometheusError whose str() is one line a user can act on:
the server cannot be reached, refuses the credentials, is not a Prometheus, or
rejects a query.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import requests


class PrometheusError(Exception):
    """Talking to Prometheus failed; str() is one line."""


@dataclass(frozen=True)
class Series:
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


class PrometheusClient:
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
            if post:
                # A query naming many series can outgrow a URL; only the query
                # endpoints take POST.
                reply = self._session.post(
                    f"{self.url}{path}", data=params, timeout=self.timeout, verify=self._verify
                )
            else:
                reply = self._session.get(
                    f"{self.url}{path}", params=params, timeout=self.timeout, verify=self._verify
                )
        except requests.exceptions.SSLError as err:
            raise PrometheusError(
                f"TLS with {where} failed ({_reason(err)}); see --prometheus.ca-file "
                "and --prometheus.insecure-skip-verify"
            ) from None
        except requests.exceptions.Timeout:
            raise PrometheusError(
                f"{where} did not answer within {self.timeout:g} s (--prometheus.timeout)"
            ) from None
        except requests.exceptions.RequestException as err:
            raise PrometheusError(f"cannot reach {where}: {_reason(err)}") from None
        if reply.status_code in (401, 403):
            raise PrometheusError(
                f"{where} refused access (HTTP {reply.status_code}); check "
                "--prometheus.bearer-token-file or --prometheus.username and "
                "WATTPRINT_PROMETHEUS_PASSWORD"
            )
        try:
            body = reply.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "status" not in body:
            if reply.status_code == 404:
                raise PrometheusError(
                    f"{self.url} has no {path} (HTTP 404): --prometheus.url must be the "
                    "server's base URL, e.g. http://prometheus:9090"
                )
            raise PrometheusError(
                f"{where} answered HTTP {reply.status_code} without the API's JSON "
                f"for {path}: is the URL right?"
            )
        if body["status"] != "success":
            error = str(body.get("error", "unknown error")).splitlines()[0]
            raise PrometheusError(f"{where} rejected a query: {error}")
        return body.get("data")

    @staticmethod
    def _parse(data: Any) -> list[Series]:
        kind = data.get("resultType")
        out: list[Series] = []
        for item in data.get("result", []):
            if kind == "vector":
                raw = [item["value"]]
            elif kind == "matrix":
                raw = item.get("values", [])
            else:
                raise PrometheusError(f"unexpected Prometheus result type {kind!r}")
            samples = [(float(t), float(v)) for t, v in raw]
            samples = [(t, v) for t, v in samples if math.isfinite(v)]
            out.append(Series(dict(item.get("metric", {})), samples))
        return out

    def instant(self, expr: str, at: float) -> list[Series]:
        """An instant query; a range selector returns its raw samples."""
        return self._parse(
            self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}"}, post=True)
        )

    def range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        params = {
            "query": expr,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": format_ms(step),
        }
        return self._parse(self._call("/api/v1/query_range", params, post=True))

    def label_values(self, label: str, match: str) -> list[str]:
        """Every value of `label` on series matching `match`, over all stored data."""
        data = self._call(f"/api/v1/label/{label}/values", [("match[]", match)])
        return [str(v) for v in data or []]

    def retention(self) -> str | None:
        """The server's --storage.tsdb.retention.time as it reports it, if it does."""
        try:
            data = self._call("/api/v1/status/runtimeinfo", {})
        except PrometheusError as err:
            # Thanos, Mimir and other Prometheus-compatible servers may lack this
            # endpoint; the caller falls back to a default.
            if "HTTP 404" in str(err) or "without the API" in str(err):
                return None
            raise
        value = data.get("storageRetention") if isinstance(data, dict) else None
        return str(value) if value else None
