"""Real Prometheus servers (and a real exporter replaying a GPU trace) for slow tests.

    with replay_stack(prometheus, trace, tmp_path) as stack:   # exporter + Prometheus
        stack.wait_for_scrapes(2)
        stack.query("wattprint_gpu_energy_joules_total")

    with run_prometheus(prometheus, tmp_path, tsdb=blocks) as url:  # e.g. backfilled
        ...

Everything listens on free loopback ports and is stopped (then killed) on exit; the
processes' output lands in files under the temp dir, quoted when one fails to start.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import socketserver
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from clock_fakes import kept_clock_exporter

# The exporter reads this host's real /proc: a process of anything else running here
# (another test run, a user's job) that names its workload in WATTPRINT_WORKLOAD would
# show up as a second job. Only the trace's workloads may appear.
ONLY_THE_TRACE = "--workload.env-vars=WATTPRINT_TEST_NO_SUCH_VARIABLE"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Stack:
    prometheus_url: str
    exporter_url: str
    exporter_target: str  # the `instance` label Prometheus gives the exporter
    started: float  # wall time the exporter started, i.e. trace start at --replay.speed
    speed: float
    logs: Path

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, str] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        reply = requests.get(f"{self.prometheus_url}/api/v1/query", params=params, timeout=10)
        reply.raise_for_status()
        result: list[dict[str, Any]] = reply.json()["data"]["result"]
        return result

    def wait_until(self, check: Callable[[], object], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up after {timeout:.0f} s; logs in {self.logs}")
            time.sleep(0.2)

    def wait_for_scrapes(self, count: int) -> None:
        """Return once Prometheus has scraped the exporter `count` more times."""
        expr = f'count_over_time(up{{instance="{self.exporter_target}"}}[1h])'

        def scrapes() -> int:
            result = self.query(expr)
            return int(float(result[0]["value"][1])) if result else 0

        target = scrapes() + count
        self.wait_until(lambda: scrapes() >= target)


def _wait_http(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float, any_answer: bool = False
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            # any_answer: behind TLS and auth, "401" already says the server is up.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the unverified readiness probe
                status = requests.get(url, timeout=1, verify=False).status_code
            if status == 200 or any_answer:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {timeout:.0f} s: {log.read_text()[-2000:]}")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def run_prometheus(
    prometheus: str,
    tmp: Path,
    config_text: str = "",
    tsdb: Path | None = None,
    web_config: Path | None = None,
) -> Iterator[str]:
    """A Prometheus on a free loopback port, over `tsdb` (default tmp/tsdb); its URL.

    web_config: a --web.config.file (TLS, basic auth); the URL is then https."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(config_text or "global: {}\n")
    log_path = tmp / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb or tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                *([f"--web.config.file={web_config}"] if web_config else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"{'https' if web_config else 'http'}://127.0.0.1:{port}"
        _wait_http(f"{url}/-/ready", proc, log_path, 30, any_answer=web_config is not None)
        yield url
    finally:
        stop_process(proc)


@contextmanager
def replay_stack(
    prometheus: str,
    trace: Path,
    tmp: Path,
    *,
    speed: float = 4.0,
    sample_interval: str = "250ms",
    scrape_interval: str = "1s",
    rule_files: Sequence[Path] = (),
    exporter_args: Sequence[str] = (),
) -> Iterator[Stack]:
    """Start the exporter replaying `trace` and a Prometheus scraping it."""
    tmp.mkdir(parents=True, exist_ok=True)
    exporter_port = free_port()
    target = f"127.0.0.1:{exporter_port}"
    rules = "".join(f"  - {Path(p).resolve()}\n" for p in rule_files)
    config = (
        "global:\n"
        f"  scrape_interval: {scrape_interval}\n"
        f"  evaluation_interval: {scrape_interval}\n"
        + (f"rule_files:\n{rules}" if rules else "")
        + "scrape_configs:\n"
        "  - job_name: wattprint\n"
        "    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )
    with run_prometheus(prometheus, tmp, config) as prometheus_url:
        # Prometheus applies discovered targets a few seconds after it starts; a trace
        # replayed before the first scrape would reach it as one lump. Wait for that
        # first (failing) scrape so that scrapes run steadily when the replay begins.
        up = f'up{{instance="{target}"}}'
        deadline = time.monotonic() + 30
        while not requests.get(
            f"{prometheus_url}/api/v1/query", params={"query": up}, timeout=5
        ).json()["data"]["result"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prometheus never scraped {target}")
            time.sleep(0.1)
        exporter_log = tmp / "exporter.log"
        started = time.time()
        with exporter_log.open("wb") as log:
            exporter = subprocess.Popen(
                [
                    *kept_clock_exporter(tmp),
                    f"--web.listen-address={target}",
                    f"--gpu.replay-file={trace}",
                    f"--replay.speed={speed}",
                    "--carbon.zone=DE",
                    f"--sample.interval={sample_interval}",
                    ONLY_THE_TRACE,
                    *exporter_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            exporter_url = f"http://{target}"
            _wait_http(f"{exporter_url}/healthz", exporter, exporter_log, 30)
            yield Stack(
                prometheus_url=prometheus_url,
                exporter_url=exporter_url,
                exporter_target=target,
                started=started,
                speed=speed,
                logs=tmp,
            )
        finally:
            stop_process(exporter)


# -- VictoriaMetrics -------------------------------------------------------------------
# Debian's victoria-metrics package: the single-node server, vmagent (scrapes and
# writes to it) and vmalert (evaluates rule files against it and writes the results
# and ALERTS back).


def require_vm_tool(name: str) -> str:
    """Like conftest.require_tool (skip locally, fail under CI=true), for the tools of
    the Debian package victoria-metrics."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package victoria-metrics)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def import_openmetrics(url: str, text: str) -> None:
    """Write OpenMetrics text (timestamps in seconds, as promtool takes it) into a
    VictoriaMetrics, and make it searchable at once."""
    lines = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sample, stamp = line.rsplit(" ", 1)
            lines.append(f"{sample} {round(float(stamp) * 1000)}\n")
    reply = requests.post(
        f"{url}/api/v1/import/prometheus", data="".join(lines).encode(), timeout=120
    )
    if reply.status_code != 204:
        raise RuntimeError(f"import into {url} failed: {reply.text[:500]}")
    requests.get(f"{url}/internal/force_flush", timeout=30).raise_for_status()


def _start(argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT)


@contextmanager
def run_victoriametrics(binary: str, tmp: Path, *extra: str) -> Iterator[str]:
    """A single-node VictoriaMetrics on a free loopback port, with its defaults (the
    30 s -search.latencyOffset included) unless `extra` flags say otherwise; its URL."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = tmp / "victoria-metrics.log"
    proc = _start(
        [
            binary,
            f"-storageDataPath={tmp / 'vm-data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-loggerLevel=WARN",
            *extra,
        ],
        log,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/health", proc, log, 30)
        yield url
    finally:
        stop_process(proc)


@contextmanager
def run_vmagent(binary: str, tmp: Path, remote_write: str, scrape_config: str) -> Iterator[str]:
    """vmagent scraping what `scrape_config` (Prometheus syntax) names into `remote_write`."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = tmp / "vmagent.yml"
    config.write_text(scrape_config)
    log = tmp / "vmagent.log"
    proc = _start(
        [
            binary,
            f"-promscrape.config={config}",
            f"-remoteWrite.url={remote_write}/api/v1/write",
            f"-remoteWrite.tmpDataPath={tmp / 'vmagent-data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-loggerLevel=WARN",
        ],
        log,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/health", proc, log, 30)
        yield url
    finally:
        stop_process(proc)


VMALERT_LOOKBACK = "30s"


@contextmanager
def run_vmalert(
    binary: str,
    tmp: Path,
    datasource: str,
    rule_files: Sequence[Path],
    evaluation_interval: str = "1m",
    lookback: str = VMALERT_LOOKBACK,
) -> Iterator[str]:
    """vmalert evaluating `rule_files` against `datasource` (a VictoriaMetrics URL),
    writing recorded series and ALERTS back to it. No Alertmanager: alerts are read
    from ALERTS or vmalert's /api/v1/alerts. `lookback` matches the datasource's
    -search.latencyOffset."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = tmp / "vmalert.log"
    proc = _start(
        [
            binary,
            *(f"-rule={Path(p).resolve()}" for p in rule_files),
            f"-datasource.url={datasource}",
            f"-remoteWrite.url={datasource}",
            f"-evaluationInterval={evaluation_interval}",
            # As docs/scale.md sets it: evaluate as of VictoriaMetrics' own 30 s latency
            # offset (-search.latencyOffset), so that a record is not 30 s late and a
            # ratio of two records 60 s (vmalert 1.79; later ones: -rule.evalDelay).
            f"-datasource.lookback={lookback}",
            # Nothing listens there; vmalert 1.79 needs a notifier and only logs its errors.
            f"-notifier.url=http://127.0.0.1:{free_port()}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-loggerLevel=ERROR",
        ],
        log,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/health", proc, log, 30)
        yield url
    finally:
        stop_process(proc)


@contextmanager
def relay(target: str, source: str = "127.0.0.2") -> Iterator[str]:
    """A TCP relay on a free loopback port to `target`, connecting from `source`; the
    address to scrape instead of `target`.

    The exporter tells its scrapers apart by their address (each gets its own first
    0 of a new series): two scrapers on this one machine need two addresses to be two
    scrapers, as two Prometheus replicas on two hosts are."""
    host, _, port = target.rpartition(":")

    class Pipe(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            try:
                out = socket.create_connection((host, int(port)), source_address=(source, 0))
            except OSError:
                return  # nothing listens there yet: the scraper sees the connection closed
            with out:
                ends = [self.request, out]
                while True:
                    readable, _, _ = select.select(ends, [], [], 60)
                    if not readable:
                        return
                    for end in readable:
                        try:
                            data = end.recv(65536)
                            if data:
                                (out if end is self.request else self.request).sendall(data)
                        except OSError:
                            data = b""  # either side hung up: so does the relay
                        if not data:
                            return

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", 0), Pipe)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
