"""Only Prometheus-like scrapers shape what Prometheus stores.

Each new workload or unattributed series is served at 0 first, so that increase() counts
its first interval (collector.py). Who gets that 0 is decided per request (server.py's
scraper_identity): a request carrying X-Prometheus-Scrape-Timeout-Seconds, as Prometheus
and vmagent send with every scrape, is a scraper, told apart by address and product;
anything else (curl, a health probe, a browser) gets the plain values and changes
nothing. Before, scrapers were told apart by address alone, and a `curl .../metrics` on
the Prometheus host (docs/runbooks.md tells people to run it) took the 0 Prometheus
needed: increase() of the unattributed GPU energy read 0 instead of 1,040 J.

The end-to-end test replays the recorded H200 trace to a real Prometheus 2.42 pair (one
scraping from 127.0.0.1, one from 127.0.0.2) while a curl loop scrapes from 127.0.0.1
every 0.3 s.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from clock_fakes import DISCIPLINED, UNSYNCHRONIZED, ClockControl, NodeClocks
from conftest import TRACE, require_tool
from e2e_stack import (
    GPU_IDLE,
    GPU_JOB,
    CurlLoop,
    Prometheus,
    Relay,
    exporter_process,
    own,
    prometheus_scraping,
    replay_flags,
    wait_for_the_end,
)
from prom_harness import free_port
from test_http_abuse import Steady
from wattprint.core.model import KernelClock, Snapshot
from wattprint.export.collector import MAX_SCRAPERS, SnapshotCollector
from wattprint.export.server import ExporterApp, ExporterServer
from wattprint.sampler.loop import Sampler, SamplerParts

TIMEOUT = "X-Prometheus-Scrape-Timeout-Seconds"
PROMETHEUS = {TIMEOUT: "10", "User-Agent": "Prometheus/2.42.0"}
VMAGENT = {TIMEOUT: "10", "User-Agent": "vm_promscrape"}
NOT_SCRAPERS = [
    {"User-Agent": "curl/8.5.0", "Accept": "*/*"},
    {"User-Agent": "kube-probe/1.30"},
    {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0", "Accept": "text/html"},
    {"User-Agent": "Prometheus/2.42.0"},  # someone's script borrowing the name
]


Served = tuple[float, float | None]  # a sample's value and timestamp


@dataclass
class Node:
    server: ExporterServer
    first: Snapshot  # the read the unattributed series was 0 at
    latest: Snapshot

    def scrape(self, headers: dict[str, str], source: str = "127.0.0.1") -> Served:
        """The unattributed CPU sample (value, timestamp) served to this client."""
        address = ("127.0.0.1", self.server.port)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = f"GET /metrics HTTP/1.1\r\nHost: x\r\n{head}Connection: close\r\n\r\n"
        with socket.create_connection(address, timeout=5, source_address=(source, 0)) as sock:
            sock.sendall(request.encode())
            body = b""
            while chunk := sock.recv(65536):
                body += chunk
        text = body.decode().split("\r\n\r\n", 1)[1]
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "wattprint_unattributed_energy_joules_total":
                    return s.value, None if s.timestamp is None else float(s.timestamp)
        raise AssertionError(text[-2000:])

    @property
    def value(self) -> float:
        return self.latest.energy[0].energy_uj / 1e6


NodeFactory = Callable[..., Node]


@pytest.fixture(name="node_factory")
def node_factory_fixture() -> Iterator[NodeFactory]:
    servers: list[ExporterServer] = []

    def start(kernel: KernelClock = DISCIPLINED, timestamps: bool = True) -> Node:
        sampler = Sampler(SamplerParts(sources=[Steady()]))
        clocks = NodeClocks(kernel=kernel)
        clocks.install(sampler)
        first = sampler.sample_once()  # the baseline read
        clocks.advance(0.05)
        latest = sampler.sample_once()  # 5 J unattributed: a new series
        collector = SnapshotCollector(lambda: sampler.latest, timestamps=timestamps)
        server = ExporterServer("127.0.0.1:0", ExporterApp(collector.render, lambda: True))
        server.start()
        servers.append(server)
        return Node(server, first, latest)

    yield start
    for server in servers:
        server.stop()


def test_a_curl_a_probe_or_a_browser_takes_no_zero(node_factory: NodeFactory) -> None:
    node = node_factory()
    for headers in NOT_SCRAPERS * 3:
        assert node.scrape(headers)[0] == node.value
    zero, at = node.scrape(PROMETHEUS)
    assert zero == 0
    assert node.first.clock is not None
    assert at == pytest.approx(node.first.clock.stamp, abs=1e-3)  # when it really was 0
    assert node.scrape(PROMETHEUS)[0] == node.value


def test_a_head_from_prometheus_takes_no_zero(node_factory: NodeFactory) -> None:
    # A HEAD is answered without a body: had it taken the series' first 0, the GET
    # after it would start the series at its value and lose the first interval.
    node = node_factory()
    address = ("127.0.0.1", node.server.port)
    head = "".join(f"{k}: {v}\r\n" for k, v in PROMETHEUS.items())
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(
            f"HEAD /metrics HTTP/1.1\r\nHost: x\r\n{head}Connection: close\r\n\r\n".encode()
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    assert node.scrape(PROMETHEUS)[0] == 0
    assert node.scrape(PROMETHEUS)[0] == node.value


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("127.0.0.1", PROMETHEUS), ("127.0.0.2", PROMETHEUS)),  # an HA pair
        (("127.0.0.1", PROMETHEUS), ("127.0.0.1", VMAGENT)),  # two kinds on one host
    ],
    ids=["ha-pair", "prometheus-and-vmagent"],
)
def test_each_scraper_counts_the_first_interval(
    node_factory: NodeFactory, one: tuple[str, dict[str, str]], other: tuple[str, dict[str, str]]
) -> None:
    node = node_factory()
    for source, headers in (one, other):
        assert node.scrape(headers, source)[0] == 0
        assert node.scrape(headers, source)[0] == node.value


def test_an_upgraded_prometheus_is_the_same_scraper(node_factory: NodeFactory) -> None:
    node = node_factory()
    assert node.scrape(PROMETHEUS)[0] == 0
    upgraded = PROMETHEUS | {"User-Agent": "Prometheus/2.53.1"}
    assert node.scrape(upgraded)[0] == node.value


def test_unstamped_a_zero_goes_to_one_scraper_and_never_again(node_factory: NodeFactory) -> None:
    """Without a timestamp, a 0 after the value reads as a counter reset: the series
    counted twice. So it goes to the first scraper only, even to one forgotten since."""
    node = node_factory(UNSYNCHRONIZED)
    assert node.scrape(PROMETHEUS) == (0, None)
    assert node.scrape(PROMETHEUS) == (node.value, None)
    assert node.scrape(PROMETHEUS, "127.0.0.2") == (node.value, None)
    for i in range(MAX_SCRAPERS + 4):  # the first scraper is forgotten
        crowd = {TIMEOUT: "10", "User-Agent": f"scraper-{i}/1"}
        assert node.scrape(crowd, "127.0.0.3") == (node.value, None)
    assert node.scrape(PROMETHEUS) == (node.value, None)


def test_without_timestamps_a_client_sending_the_header_takes_no_zero(
    node_factory: NodeFactory,
) -> None:
    """--sample.timestamps=false, the clock trusted: the 0 is stamped, so a client that
    scrapes with Prometheus's header first takes nothing from Prometheus."""
    node = node_factory(timestamps=False)
    assert node.first.clock is not None and node.first.clock.stamp is not None
    hostile = {TIMEOUT: "10", "User-Agent": "Prometheus/2.42.0"}
    assert node.scrape(hostile, "127.0.0.3") == (0, pytest.approx(node.first.clock.stamp, abs=1e-3))
    assert node.scrape(hostile, "127.0.0.3") == (node.value, None)
    zero, at = node.scrape(PROMETHEUS)
    assert (zero, at) == (0, pytest.approx(node.first.clock.stamp, abs=1e-3))
    assert node.scrape(PROMETHEUS) == (node.value, None)  # the values go unstamped


# ---- end to end: a real Prometheus HA pair and a curl loop -------------------------------

SPEED = 4.0


@dataclass
class PairRun:
    replicas: dict[str, Prometheus]  # by the address each scrapes from
    counters: dict[str, float]
    curls: int


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PairRun]:
    prometheus = require_tool("prometheus")
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    tmp = tmp_path_factory.mktemp("scrapers")
    target = f"127.0.0.1:{free_port()}"
    control = ClockControl(tmp / "clock.json")
    control.set(kernel="disciplined")  # stamped: each replica gets its own 0
    replay_s = 70.0 / SPEED  # the trace's length, replayed
    with (
        Relay(target, source="127.0.0.2") as relay,
        prometheus_scraping(prometheus, tmp / "a", [target]) as first,
        prometheus_scraping(prometheus, tmp / "b", [relay.address]) as second,
        exporter_process(
            control.command(*replay_flags(target, TRACE, SPEED)), target, tmp / "exporter.log"
        ) as url,
        CurlLoop(url, period=0.3) as curl,
    ):
        counters = wait_for_the_end(url, replay_s)
        yield PairRun({"127.0.0.1": first, "127.0.0.2": second}, counters, curl.answered)


@pytest.mark.slow
@pytest.mark.parametrize("replica", ["127.0.0.1", "127.0.0.2"])
@pytest.mark.parametrize(
    ("name", "selector"),
    [
        ("wattprint_workload_energy_joules_total", GPU_JOB),
        ("wattprint_unattributed_energy_joules_total", GPU_IDLE),
    ],
    ids=["job", "unattributed"],
)
def test_prometheus_records_every_joule_whoever_else_scrapes(
    pair_run: PairRun, replica: str, name: str, selector: str
) -> None:
    """Both replicas of the pair count each series' first interval, though a curl from
    the first one's host scraped three times as often as they did."""
    assert pair_run.curls > 50
    prometheus = pair_run.replicas[replica]
    exporter = own(pair_run.counters, name, selector)
    assert exporter > 100  # joules: the series is worth measuring
    recorded = prometheus.increase(f"{name}{selector}")
    assert recorded == pytest.approx(exporter, rel=0.01)
    assert prometheus.value(f"min_over_time({name}{selector}[10m])") == 0


# ---- end to end: timestamps off, a client sending the scrape header every 50 ms -----------


class HeaderLoop(CurlLoop):
    """A client that sends Prometheus's scrape header, every 50 ms, from Prometheus's host."""

    def _run(self) -> None:
        with requests.Session() as session:
            session.trust_env = False
            session.headers[TIMEOUT] = "10"
            while not self._stop.wait(self._period):
                with contextlib.suppress(requests.RequestException):
                    if session.get(f"{self._url}/metrics", timeout=5).status_code == 200:
                        self.answered += 1


@pytest.fixture(scope="module")
def unstamped_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PairRun]:
    prometheus = require_tool("prometheus")
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    tmp = tmp_path_factory.mktemp("unstamped")
    target = f"127.0.0.1:{free_port()}"
    control = ClockControl(tmp / "clock.json")
    control.set(kernel="disciplined")
    flags = [*replay_flags(target, TRACE, SPEED), "--sample.timestamps=false"]
    with (
        prometheus_scraping(prometheus, tmp / "p", [target]) as scraper,
        exporter_process(control.command(*flags), target, tmp / "exporter.log") as url,
        HeaderLoop(url, period=0.05) as hostile,
    ):
        counters = wait_for_the_end(url, 70.0 / SPEED)
        yield PairRun({"127.0.0.1": scraper}, counters, hostile.answered)


@pytest.mark.slow
def test_unstamped_every_new_series_reaches_prometheus_at_0_whoever_sends_the_header(
    unstamped_run: PairRun,
) -> None:
    assert unstamped_run.curls > 200
    prometheus = unstamped_run.replicas["127.0.0.1"]
    names = ("wattprint_workload_energy_joules_total", "wattprint_unattributed_energy_joules_total")
    series = [s["metric"] for n in names for s in prometheus.query(n)]
    assert len(series) >= 4
    for labels in series:
        selector = "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
        assert prometheus.value(f"min_over_time({selector}[10m])") == 0, selector
    for name, selector in (
        ("wattprint_workload_energy_joules_total", GPU_JOB),
        ("wattprint_unattributed_energy_joules_total", GPU_IDLE),
    ):
        exporter = own(unstamped_run.counters, name, selector)
        assert prometheus.increase(f"{name}{selector}") == pytest.approx(exporter, rel=0.01)
