"""Pieces for end-to-end runs with faked node clocks or several scrapers: a Prometheus
2.42 that has tried its targets before the exporter exists (so its first good scrape
comes at the start of the replay, as in production), an exporter launched with
clock_fakes (its wall clock and kernel chosen by the test), a TCP relay that makes a
second Prometheus scrape from another address, and a person's curl loop.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from prom_harness import free_port, run_prometheus, stop_process

GPU_JOB = '{component="gpu", workload="phased-load"}'
GPU_IDLE = '{component="gpu", gpu="0"}'
# Refusals Prometheus counts (and logs) per target; each is a sample it did not keep.
REFUSED = (
    "prometheus_target_scrapes_sample_out_of_order_total",
    "prometheus_target_scrapes_sample_out_of_bounds_total",
    "prometheus_target_scrapes_sample_duplicate_timestamp_total",
)


def replay_flags(target: str, trace: Path, speed: float) -> list[str]:
    return [
        f"--web.listen-address={target}",
        "--gpu.source=replay",
        f"--gpu.replay-file={trace}",
        f"--replay.speed={speed}",
        "--cpu.source=model",
        "--memory.source=model",
        "--carbon.provider=static",
        "--carbon.zone=DE",
        "--sample.interval=250ms",
    ]


def wait_until(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@dataclass
class Prometheus:
    url: str
    log: Path

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        reply = requests.get(f"{self.url}/api/v1/query", params=params, timeout=10)
        assert reply.status_code == 200, f"{expr}: {reply.text}"
        result: list[dict[str, Any]] = reply.json()["data"]["result"]
        return result

    def value(self, expr: str, at: float | None = None) -> float:
        result = self.query(expr, at)
        assert len(result) == 1, f"{expr}: {result}"
        return float(result[0]["value"][1])

    def stored(self, selector: str, at: float | None = None) -> list[tuple[float, float]]:
        """(time, value) of every sample stored for one series in the last 10 minutes."""
        result = self.query(f"{selector}[10m]", at)
        assert len(result) == 1, f"{selector}: {result}"
        return [(float(t), float(v)) for t, v in result[0]["values"]]

    def refused(self) -> dict[str, float]:
        text = requests.get(f"{self.url}/metrics", timeout=10).text
        families = text_string_to_metric_families(text)
        return {s.name: s.value for f in families for s in f.samples if s.name in REFUSED}

    def increase(self, selector: str) -> float:
        """increase() over the whole run, at the series' last sample: no extrapolation
        at the end, and none at the start below the counter's first value."""
        at = self.value(f"timestamp({selector})")
        return self.value(f"increase({selector}[10m])", at)


@contextmanager
def prometheus_scraping(
    binary: str, tmp: Path, targets: Sequence[str], rule_files: Sequence[Path] = ()
) -> Iterator[Prometheus]:
    """A Prometheus scraping `targets` every second, once it has tried them all."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": "wattprint", "static_configs": [{"targets": targets}]}],
    }
    with run_prometheus(binary, tmp, yaml.safe_dump(config)) as url:
        prometheus = Prometheus(url, tmp / "prometheus.log")
        for target in targets:
            wait_until(
                lambda t=target: prometheus.query(f'up{{instance="{t}"}}'),  # type: ignore[misc]
                30,
                f"Prometheus's first scrape of {target}",
            )
        yield prometheus


@contextmanager
def exporter_process(command: Sequence[str], target: str, log: Path) -> Iterator[str]:
    """The exporter, started by `command`; its URL once it answers."""
    with log.open("wb") as out:
        proc = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://{target}"
    try:

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return requests.get(f"{url}/healthz", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_until(healthy, 30, "the exporter")
        yield url
    finally:
        stop_process(proc)


def own_counters(url: str) -> dict[str, float]:
    """The exporter's counters as any client sees them: `name{labels}` -> value."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ", ".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def own(counters: dict[str, float], name: str, selector: str) -> float:
    """The one counter of `name` whose labels include those of `selector`."""

    def pairs(text: str) -> set[str]:
        return {p.strip() for p in text.strip("{}").split(",") if p.strip()}

    wanted = pairs(selector)
    found = [
        v
        for key, v in counters.items()
        if key.split("{", 1)[0] == name and wanted <= pairs(key.split("{", 1)[1])
    ]
    assert len(found) == 1, f"{name}{selector}: {found}"
    return found[0]


def wait_for_the_end(url: str, replay_s: float) -> dict[str, float]:
    """Wait for the replay to end (the GPU counter stands still for a second, four
    sample intervals) and every scraper to have its last values; return the exporter's
    counters then."""
    time.sleep(replay_s)
    name = "wattprint_gpu_energy_joules_total"

    def still() -> bool:
        before = own(own_counters(url), name, "{}")
        time.sleep(1.0)
        return own(own_counters(url), name, "{}") == before

    wait_until(still, 30, "the end of the replay")
    time.sleep(2.5)  # two more scrapes at 1 s
    return own_counters(url)


class Relay:
    """Forwards TCP connections to `target` from another loopback address, so that the
    exporter sees the scraper behind it as another host."""

    def __init__(self, target: str, source: str = "127.0.0.2") -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._source = source
        self._listener = socket.create_server(("127.0.0.1", free_port()))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()

    def __enter__(self) -> Relay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(
                self._target, timeout=10, source_address=(self._source, 0)
            )
        except OSError:
            client.close()
            return

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)
        client.close()
        upstream.close()


class CurlLoop:
    """A person on the Prometheus host running `curl .../metrics` every `period` s."""

    def __init__(self, url: str, period: float = 0.3) -> None:
        self._url = url
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.answered = 0

    def __enter__(self) -> CurlLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        with requests.Session() as session:
            session.trust_env = False
            session.headers["User-Agent"] = "curl/8.5.0"
            while not self._stop.wait(self._period):
                try:
                    if session.get(f"{self._url}/metrics", timeout=5).status_code == 200:
                        self.answered += 1
                except requests.RequestException:
                    pass
