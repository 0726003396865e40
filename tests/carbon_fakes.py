"""A local stand-in for the carbon-intensity APIs: replays the recorded response shapes
on 127.0.0.1 and misbehaves on request (slow, trickling, cut short, wrong status)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests

from wattprint.carbon.base import CarbonSettings
from wattprint.carbon.service import CarbonService


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict/list -> JSON, str/bytes -> as is
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before the status line
    trickle_s: float = 0.0  # between body bytes
    cut: bool = False  # announce the whole body, send half, hang up

    def payload(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return b"" if self.body is None else json.dumps(self.body).encode()


@dataclass
class Seen:
    path: str
    query: dict[str, str]
    headers: dict[str, str]


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a reply sleeping on purpose must not hold up close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hang up on misbehaving replies; that is the point, not news


class FakeApi:
    """Routes by path; each path plays its replies in order and repeats the last."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Reply]] = {}
        self.seen: list[Seen] = []
        self.closing = threading.Event()
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api._serve(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def on(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self.scripts[path] = list(replies)

    def requests_to(self, path: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.path == path]

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        with self._lock:
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            self.seen.append(Seen(parts.path, query, dict(handler.headers.items())))
            script = self.scripts.get(parts.path)
            if not script:
                reply = Reply(404, {"error": "no route"})
            else:
                reply = script.pop(0) if len(script) > 1 else script[0]
        if reply.delay_s and self.closing.wait(reply.delay_s):
            return
        body = reply.payload()
        handler.send_response(reply.status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        for name, value in reply.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        if reply.cut:
            handler.wfile.write(body[: len(body) // 2])
            handler.close_connection = True
        elif reply.trickle_s:
            for i in range(len(body)):
                if self.closing.wait(reply.trickle_s):
                    return
                handler.wfile.write(body[i : i + 1])
                handler.wfile.flush()
        else:
            handler.wfile.write(body)

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeClock:
    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


# -- the providers' documented response shapes, with values and times filled in --


def electricitymaps_body(grams: Any, ts: float, zone: str = "DE") -> dict[str, Any]:
    return {
        "zone": zone,
        "carbonIntensity": grams,
        "datetime": iso(ts),
        "updatedAt": iso(ts + 60),
        "emissionFactorType": "lifecycle",
        "isEstimated": True,
        "estimationMethod": "TIME_SLICER_AVERAGE",
    }


def watttime_body(
    lbs: Any, ts: float, region: str = "CAISO_NORTH", units: str = "lbs_co2_per_mwh"
) -> dict[str, Any]:
    return {
        "data": [{"point_time": iso(ts), "value": lbs}],
        "meta": {
            "data_point_period_seconds": 300,
            "region": region,
            "signal_type": "co2_moer",
            "units": units,
            "generated_at": iso(ts),
        },
    }


def uk_national_body(actual: Any, forecast: Any, ts: float) -> dict[str, Any]:
    return {
        "data": [
            {
                "from": iso(ts)[:16] + "Z",
                "to": iso(ts + 1800)[:16] + "Z",
                "intensity": {"forecast": forecast, "actual": actual, "index": "moderate"},
            }
        ]
    }


def uk_regional_body(regionid: int, forecast: Any, ts: float) -> dict[str, Any]:
    return {
        "data": [
            {
                "regionid": regionid,
                "dnoregion": "UKPN South East",
                "shortname": "South East England",
                "data": [
                    {
                        "from": iso(ts)[:16] + "Z",
                        "to": iso(ts + 1800)[:16] + "Z",
                        "intensity": {"forecast": forecast, "index": "moderate"},
                        "generationmix": [{"fuel": "gas", "perc": 43.6}],
                    }
                ],
            }
        ]
    }


def make_service(
    api: FakeApi,
    clock: Callable[[], float],
    environ: Mapping[str, str] | None = None,
    **settings: Any,
) -> CarbonService:
    """A service against the fake API with test-sized timeouts and a fixed jitter seed."""
    values: dict[str, Any] = {
        "api_url": api.url,
        "refresh_interval_s": 60.0,
        "fallback_after_s": 600.0,
        "timeout_s": 0.3,
    }
    values.update(settings)
    session = requests.Session()
    session.trust_env = False  # a proxy from the environment must not catch 127.0.0.1
    return CarbonService(
        CarbonSettings(**values),
        environ or {},
        clock,
        session=session,
        rng=random.Random(7),
        retry_base_s=1.0,
    )
