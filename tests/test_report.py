"""`wattprint report` against real Prometheus servers.

Two servers, each started once for the module:
- `replay`: the real exporter replays the recorded H200 trace at 4x and a Prometheus
  scrapes it every second; the job's GPU energy must match the trace's own counter.
- `backfilled`: a Prometheus over blocks written by promtool from a synthetic fleet
  (two nodes, an exporter restart, a seven-minute scrape gap, estimated devices, PUE,
  a budget), where every expected number follows from the generator below.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import TRACE, require_tool
from prom_harness import (
    Stack,
    free_port,
    import_openmetrics,
    replay_stack,
    require_vm_tool,
    run_prometheus,
    run_victoriametrics,
)
from wattprint.report.arguments import parse_time
from wattprint.report.common import CODECARBON_COLUMNS, iso
from wattprint.report.jobs import JobReport
from wattprint.report.progress import Progress
from wattprint.report.queries import make_window
from wattprint.report.render import CSV_COLUMNS, render_codecarbon

slow = pytest.mark.slow  # starts Prometheus (and the exporter)

JOULES_PER_KWH = 3.6e6


def report(
    url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wattprint", "report", f"--prometheus.url={url}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def report_json(url: str, *args: str) -> dict[str, Any]:
    result = report(url, "--format=json", *args)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def parse_table(text: str) -> dict[str, list[dict[str, str]]]:
    """Sections of the aligned table, by title ("" for the first), as rows of cells."""
    sections: dict[str, list[dict[str, str]]] = {}
    blocks = [b.splitlines() for b in text.strip().split("\n\n")]
    for lines in blocks[1:]:  # blocks[0] names the server and the range
        title = lines.pop(0) if sections or not lines[0].startswith("WORKLOAD") else ""
        if not lines or lines[0].startswith(" "):
            continue  # a list of notes, not a table
        header = re.split(r"\s{2,}", lines[0].strip())
        rows = [dict(zip(header, re.split(r"\s{2,}", line.strip()))) for line in lines[1:]]
        assert all(len(r) == len(header) for r in rows), lines
        sections[title] = rows
    return sections


# -- the replayed trace --------------------------------------------------------------------


@dataclass
class TraceTruth:
    held_energy_j: float  # counter rise over the intervals the workload held the GPU
    held_seconds: float  # trace time from the first to the last such interval's end
    workload: str


def trace_truth(path: Path) -> TraceTruth:
    lines = path.read_text().splitlines()
    samples = [json.loads(line) for line in lines[1:] if line.strip()]
    held, first, last, previous = 0, None, None, None
    workloads = set()
    for sample in samples:
        gpu = sample["gpus"][0]
        # The state in a sample applies to the interval that ends at it.
        if previous is not None and gpu["processes"]:
            held += gpu["energy_mj"] - previous["gpus"][0]["energy_mj"]
            first = previous["t"] if first is None else first
            last = sample["t"]
            workloads |= {p["identity"]["workload"] for p in gpu["processes"]}
        previous = sample
    assert first is not None and last is not None and len(workloads) == 1
    return TraceTruth(held / 1000, last - first, workloads.pop())


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = require_tool("prometheus")
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE}")
    with replay_stack(prometheus, TRACE, tmp_path_factory.mktemp("replay"), speed=4.0) as stack:
        header = json.loads(TRACE.read_text().split("\n", 1)[0])
        span = max(p["end"] for p in header["phases"]) - min(p["start"] for p in header["phases"])
        # The replay ends after the trace's span at 4x; two more scrapes carry its end.
        stack.wait_until(lambda: time.time() > stack.started + span / stack.speed + 1, 90)
        stack.wait_for_scrapes(2)
        yield stack


@slow
def test_job_gpu_energy_equals_the_trace_counter(replay: Stack) -> None:
    truth = trace_truth(TRACE)
    document = report_json(replay.prometheus_url, f"--workload={truth.workload}")
    (job,) = document["jobs"]
    gpu_j = job["energy_kwh"]["gpu"] * JOULES_PER_KWH
    assert gpu_j == pytest.approx(truth.held_energy_j, rel=0.01)
    (gpu,) = job["gpus"]
    assert gpu["gpu"] == "0" and gpu["instance"] == replay.exporter_target
    assert gpu["model"] == "NVIDIA H200"
    assert gpu["energy_kwh"] == pytest.approx(job["energy_kwh"]["gpu"])
    # The replayed process holds the GPU for the trace's held span at 4x; the report
    # sees it through 1 s scrapes.
    assert job["duration_seconds"] == pytest.approx(truth.held_seconds / replay.speed, abs=1.5)
    # A constant intensity and PUE: emissions = energy x intensity x PUE.
    intensity = float(replay.query("wattprint_grid_carbon_intensity_grams_per_kwh")[0]["value"][1])
    assert job["intensity_g_per_kwh"] == pytest.approx(intensity, rel=1e-6)
    assert job["pue"] == pytest.approx(1.0)
    assert job["emissions_kg"]["total"] * 1000 == pytest.approx(
        gpu_j / JOULES_PER_KWH * intensity, rel=1e-6
    )
    assert job["estimated_share"]["gpu"] == 0  # replayed NVML counter: measured
    assert job["zones"] == ["DE"]


@slow
def test_every_format_parses_back_with_the_same_numbers(replay: Stack) -> None:
    url = replay.prometheus_url
    job = report_json(url)["jobs"][0]
    energy, emissions = job["energy_kwh"]["total"], job["emissions_kg"]["total"]

    table = report(url)
    assert table.returncode == 0, table.stderr
    sections = parse_table(table.stdout)
    (row,) = sections[""]
    assert row["WORKLOAD"] == job["workload"] and row["SCHEDULER"] == job["scheduler"]
    assert float(row["ENERGY kWh"]) == pytest.approx(energy, rel=1e-3)
    assert float(row["GPU kWh"]) == pytest.approx(job["energy_kwh"]["gpu"], rel=1e-3)
    assert float(row["CO2e kg"]) == pytest.approx(emissions, rel=1e-3)
    assert float(row["g/kWh"]) == pytest.approx(job["intensity_g_per_kwh"], rel=1e-3)
    (gpu_row,) = sections["Energy per GPU"]
    assert float(gpu_row["ENERGY kWh"]) == pytest.approx(energy, rel=1e-3)
    assert gpu_row["MODEL"] == "NVIDIA H200"
    (part,) = sections["Measured and estimated"]
    assert part["COMPONENT"] == "gpu" and part["METHOD"] == "replay"

    result = report(url, "--format=csv")
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 1 and tuple(rows[0]) == CSV_COLUMNS
    assert float(rows[0]["energy_kwh"]) == pytest.approx(energy, rel=1e-12)
    assert float(rows[0]["emissions_kg"]) == pytest.approx(emissions, rel=1e-12)
    assert float(rows[0]["duration_seconds"]) == pytest.approx(job["duration_seconds"])
    device, kwh = rows[0]["gpu_energy_kwh_by_device"].split("=")
    assert device == f"{replay.exporter_target}/0" and float(kwh) == pytest.approx(energy)

    result = report(url, "--format=codecarbon-csv")
    assert result.returncode == 0, result.stderr
    reader = csv.DictReader(io.StringIO(result.stdout))
    # The columns codecarbon itself writes, in its order.
    with (TRACE.parent / "codecarbon-4-processes" / "cc_single_parent.csv").open() as f:
        assert tuple(next(csv.reader(f))) == tuple(reader.fieldnames or ()) == CODECARBON_COLUMNS
    (cc,) = list(reader)
    assert cc["run_id"] == job["workload"]
    assert float(cc["gpu_energy"]) == pytest.approx(job["energy_kwh"]["gpu"], rel=1e-12)
    assert float(cc["energy_consumed"]) == pytest.approx(energy, rel=1e-12)
    assert float(cc["emissions"]) == pytest.approx(emissions, rel=1e-12)
    duration = float(cc["duration"])
    assert float(cc["emissions_rate"]) == pytest.approx(emissions / duration)
    assert float(cc["gpu_power"]) == pytest.approx(energy * JOULES_PER_KWH / duration)
    assert cc["gpu_count"] == "1" and cc["gpu_model"] == "1 x NVIDIA H200"
    assert cc["country_iso_code"] == "DEU" and cc["water_consumed"] == "0.0"


@slow
def test_unknown_workload_is_one_line_and_exit_1(replay: Stack) -> None:
    result = report(replay.prometheus_url, "--workload=phased-lod")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "unknown workload 'phased-lod'" in result.stderr and "phased-load" in result.stderr


@slow
def test_range_without_data_is_one_line_and_exit_1(replay: Stack) -> None:
    truth = trace_truth(TRACE)
    before = f"{replay.started - 600:.0f}"
    result = report(
        replay.prometheus_url, f"--workload={truth.workload}", f"--since={before}", "--range=5m"
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "has no data between" in result.stderr


def test_unreachable_server_is_one_line_and_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = report(url, "--workload=anything")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"wattprint: cannot reach Prometheus at {url}")


@pytest.mark.parametrize(
    "args",
    [
        ["--range=1h", "--since=2024-01-01T00:00:00Z", "--until=now"],
        ["--since=yesterday-ish"],
        ["--range=-5m"],
        ["--format=xml"],
        ["--until=2024-01-01", "--since=2024-02-01"],
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str]) -> None:
    result = report(f"http://127.0.0.1:{free_port()}", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("wattprint: ")


def test_basic_auth_needs_the_password_from_the_environment() -> None:
    env = {k: v for k, v in os.environ.items() if k != "WATTPRINT_PROMETHEUS_PASSWORD"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattprint",
            "report",
            f"--prometheus.url=http://127.0.0.1:{free_port()}",
            "--prometheus.username=alice",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2 and "WATTPRINT_PROMETHEUS_PASSWORD" in result.stderr


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A Prometheus behind TLS (a self-signed certificate) and basic auth."""
    import bcrypt

    prometheus = require_tool("prometheus")
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    tmp = tmp_path_factory.mktemp("guarded")
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(tmp / "key.pem"),
            "-out",
            str(tmp / "cert.pem"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {tmp / 'cert.pem'}\n  key_file: {tmp / 'key.pem'}\n"
        f"basic_auth_users:\n  alice: '{hashed}'\n"
    )
    with run_prometheus(prometheus, tmp, web_config=web) as url:
        yield url, tmp / "cert.pem"


@slow
def test_tls_and_basic_auth(guarded: tuple[str, Path]) -> None:
    url, ca = guarded
    password = {"WATTPRINT_PROMETHEUS_PASSWORD": "s3cret"}
    # It holds no wattprint data: getting that far means TLS and auth worked.
    empty = "no wattprint workload data on"
    result = report(url, f"--prometheus.ca-file={ca}", "--prometheus.username=alice", env=password)
    assert result.returncode == 1 and empty in result.stderr, result.stderr
    result = report(
        url, "--prometheus.insecure-skip-verify", "--prometheus.username=alice", env=password
    )
    assert result.returncode == 1 and empty in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1  # no warning about the skipped verification
    result = report(url, f"--prometheus.ca-file={ca}")
    assert result.returncode == 1 and "refused access (HTTP 401)" in result.stderr
    result = report(
        url,
        f"--prometheus.ca-file={ca}",
        "--prometheus.username=alice",
        env={"WATTPRINT_PROMETHEUS_PASSWORD": "wrong"},
    )
    assert result.returncode == 1 and "refused access (HTTP 401)" in result.stderr
    result = report(url, "--prometheus.username=alice", env=password)  # not our CA
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"wattprint: TLS with Prometheus at {url} failed")


def test_bearer_token_from_a_file(tmp_path: Path) -> None:
    """Prometheus itself cannot check tokens (a proxy in front of it does): a stand-in
    answers like an empty Prometheus when the token is right, 401 otherwise."""
    import http.server
    import threading

    class Proxy(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))  # else a reset
            if self.headers.get("Authorization") != "Bearer tok3n":
                self.send_response(401)
                self.end_headers()
                return
            data: Any = {"resultType": "vector", "result": []} if "query" in self.path else []
            body = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        (tmp_path / "token").write_text("tok3n\n")
        (tmp_path / "wrong").write_text("nope\n")
        result = report(url, f"--prometheus.bearer-token-file={tmp_path / 'token'}")
        assert result.returncode == 1 and "no wattprint workload data" in result.stderr
        result = report(url, f"--prometheus.bearer-token-file={tmp_path / 'wrong'}")
        assert result.returncode == 1 and "refused access (HTTP 401)" in result.stderr
        result = report(url, f"--prometheus.bearer-token-file={tmp_path / 'missing'}")
        assert result.returncode == 2 and "cannot read" in result.stderr
    finally:
        server.shutdown()
        server.server_close()


# -- a synthetic fleet, backfilled -------------------------------------------------------

SCRAPE = 15
INTENSITY = 400.0
NODE_PUE = {"node-a:9950": 1.5, "node-b:9950": 1.2}
MODELS = {"node-a:9950": "NVIDIA H100 80GB HBM3", "node-b:9950": "NVIDIA A100-SXM4-80GB"}
RESTART = 1500  # node-a's exporter restarts just after this scrape (s after t0)
GAP = (1200, 1620)  # node-b is not scraped in between (seven minutes, over the lookback)
BUDGET_GRAMS = 500.0


@dataclass(frozen=True)
class Use:
    workload: str
    namespace: str
    pod: str
    instance: str
    component: str
    gpu: str
    watts: float
    start: int  # seconds after t0, on the scrape grid
    end: int


USES = [
    Use("train", "ml", "train-0", "node-a:9950", "gpu", "0", 300, 600, 2400),
    Use("train", "ml", "train-0", "node-a:9950", "gpu", "1", 250, 600, 2400),
    Use("train", "ml", "train-0", "node-a:9950", "cpu", "", 40, 600, 2400),
    Use("train", "ml", "train-1", "node-b:9950", "gpu", "0", 200, 600, 2400),
    Use("infer", "serving", "infer-0", "node-a:9950", "gpu", "2", 100, 3000, 4200),
]
END = 4800
METHODS = {  # (instance, component, device) -> method; node-b integrates power
    ("node-a:9950", "gpu", "0"): "nvml_energy_counter",
    ("node-a:9950", "gpu", "1"): "nvml_energy_counter",
    ("node-a:9950", "gpu", "2"): "nvml_energy_counter",
    ("node-a:9950", "cpu", "0"): "model",
    ("node-a:9950", "memory", "all"): "model",
    ("node-b:9950", "gpu", "0"): "nvml_power_integrated",
}


def is_estimated(instance: str, component: str, gpu: str) -> bool:
    """A GPU by its own method; CPU and memory by any of the node's devices."""
    methods = {
        method
        for (i, c, device), method in METHODS.items()
        if i == instance and c == component and (component != "gpu" or device == gpu)
    }
    return bool(methods & {"model", "nvml_power_integrated"})


def energy_until(use: Use, t: float) -> float:
    """Joules the use drew from t0 to t (the truth, not what any counter shows)."""
    return use.watts * max(0.0, min(t, use.end) - use.start)


def scraped(instance: str) -> list[int]:
    times = range(0, END + 1, SCRAPE)
    if instance == "node-b:9950":
        return [t for t in times if not GAP[0] < t <= GAP[1]]
    return list(times)


def counter_value(use: Use, t: int) -> float | None:
    """What the exporter's workload counter shows at t: None before the job's first
    energy and after its series is dropped (10 minutes after its end), zero again after
    node-a's restart."""
    if t <= use.start or t > use.end + 600:
        return None
    if use.instance == "node-a:9950" and t > RESTART:
        if use.end <= RESTART:
            return None
        return energy_until(use, t) - energy_until(use, RESTART)
    return energy_until(use, t)


def labels(**values: str) -> str:
    return ",".join(f'{k}="{v}"' for k, v in values.items() if v)


def openmetrics(t0: int) -> str:
    out: list[str] = []

    def family(name: str, kind: str, series: list[tuple[str, list[tuple[int, float]]]]) -> None:
        out.append(f"# TYPE {name} {kind}")
        sample = f"{name}_total" if kind == "counter" else name
        for label_text, points in series:
            out.extend(f"{sample}{{{label_text}}} {v!r} {t0 + t}" for t, v in points)

    def use_series(emissions: bool) -> list[tuple[str, list[tuple[int, float]]]]:
        result = []
        for use in USES:
            text = labels(
                component=use.component,
                gpu=use.gpu,
                scheduler="kubernetes",
                namespace=use.namespace,
                workload=use.workload,
                pod=use.pod,
                instance=use.instance,
                job="wattprint",
            )
            # Emissions: energy x intensity x PUE, the exporter's invariant 4.
            factor = INTENSITY / JOULES_PER_KWH * NODE_PUE[use.instance] if emissions else 1.0
            points = [
                (t, v * factor)
                for t in scraped(use.instance)
                if (v := counter_value(use, t)) is not None
            ]
            result.append((text, points))
        return result

    family("wattprint_workload_energy_joules", "counter", use_series(emissions=False))
    family("wattprint_workload_emissions_grams", "counter", use_series(emissions=True))
    node_series = [
        (instance, [(t, 1.0) for t in scraped(instance)]) for instance in sorted(NODE_PUE)
    ]
    family(
        "wattprint_measurement_info",
        "gauge",
        [
            (
                labels(component=c, device=d, method=m, instance=i, job="wattprint"),
                dict(node_series)[i],
            )
            for (i, c, d), m in METHODS.items()
        ],
    )
    family(
        "wattprint_pue_ratio",
        "gauge",
        [
            (labels(instance=i, job="wattprint"), [(t, NODE_PUE[i]) for t, _ in points])
            for i, points in node_series
        ],
    )
    family(
        "wattprint_grid_carbon_intensity_grams_per_kwh",
        "gauge",
        [
            (
                labels(zone="DE", provider="static", signal="average", instance=i, job="wattprint"),
                [(t, INTENSITY) for t, _ in points],
            )
            for i, points in node_series
        ],
    )
    gpus = sorted({(u.instance, u.gpu) for u in USES if u.component == "gpu"})
    family(
        "wattprint_gpu_energy_joules",
        "counter",
        [
            (
                labels(gpu=g, uuid=f"GPU-{i}-{g}", model=MODELS[i], instance=i, job="wattprint"),
                [(t, float(t)) for t, _ in dict(node_series)[i]],
            )
            for i, g in gpus
        ],
    )
    family(
        "namespace_workload:wattprint_emissions_budget_grams:30d",
        "gauge",
        [
            (
                labels(namespace="ml", workload="train"),
                [(t, BUDGET_GRAMS) for t in range(0, END + 1, 60)],
            )
        ],
    )
    out.append("# EOF")
    return "\n".join(out) + "\n"


@dataclass
class Fleet:
    url: str
    t0: int
    expected: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module", params=["prometheus", "victoriametrics"])
def backfilled(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """The fleet in a Prometheus (promtool blocks) or a VictoriaMetrics (its import API):
    every case below runs against both."""
    tmp = tmp_path_factory.mktemp("fleet")
    # Three hours ago, on the minute: inside the default retention, clear of the head.
    t0 = (int(time.time()) // 60) * 60 - 3 * 3600
    source = tmp / "fleet.om"
    source.write_text(openmetrics(t0))
    if request.param == "victoriametrics":
        with run_victoriametrics(require_vm_tool("victoria-metrics"), tmp) as url:
            import_openmetrics(url, source.read_text())
            yield Fleet(url, t0)
        return
    prometheus = require_tool("prometheus")
    promtool = require_tool("promtool")
    tsdb = tmp / "tsdb"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    with run_prometheus(prometheus, tmp, tsdb=tsdb) as url:
        yield Fleet(url, t0)


def expected_energy(workload: str, since: float, until: float) -> dict[tuple[str, str, str], float]:
    """(instance, component, gpu) -> joules the workload drew in (since, until]."""
    out: dict[tuple[str, str, str], float] = {}
    for use in USES:
        if use.workload == workload:
            joules = energy_until(use, until) - energy_until(use, since)
            out[(use.instance, use.component, use.gpu)] = joules
    return out


def check_job(job: dict[str, Any], expected: dict[tuple[str, str, str], float]) -> None:
    by_component: dict[str, float] = {}
    for (_, component, _), joules in expected.items():
        by_component[component] = by_component.get(component, 0.0) + joules
    for component in ("gpu", "cpu", "memory"):
        got = job["energy_kwh"][component] * JOULES_PER_KWH
        assert got == pytest.approx(by_component.get(component, 0.0), rel=1e-9), component
    gpus = {(g["instance"], g["gpu"]): g for g in job["gpus"]}
    expected_gpus = {(i, g): j for (i, c, g), j in expected.items() if c == "gpu"}
    assert set(gpus) == set(expected_gpus)
    for key, joules in expected_gpus.items():
        assert gpus[key]["energy_kwh"] * JOULES_PER_KWH == pytest.approx(joules, rel=1e-9)
        assert gpus[key]["model"] == MODELS[key[0]]
        assert gpus[key]["estimated_share"] == (1.0 if is_estimated(key[0], "gpu", key[1]) else 0.0)
    # PUE weighted by the energy drawn on each node; it divides out of the intensity.
    total = sum(expected.values())
    pue = sum(j * NODE_PUE[i] for (i, _, _), j in expected.items()) / total
    assert job["pue"] == pytest.approx(pue, rel=1e-9)
    assert job["intensity_g_per_kwh"] == pytest.approx(INTENSITY, rel=1e-9)
    assert job["emissions_kg"]["total"] * 1000 == pytest.approx(
        sum(j * NODE_PUE[i] for (i, _, _), j in expected.items()) / JOULES_PER_KWH * INTENSITY,
        rel=1e-9,
    )
    estimated = sum(j for key, j in expected.items() if is_estimated(*key))
    assert job["estimated_share"]["total"] == pytest.approx(estimated / total, rel=1e-9)


@slow
def test_a_whole_life_report_says_where_the_data_starts(backfilled: Fleet) -> None:
    """From the server's oldest workload sample, not now minus its retention (which, for
    Prometheus' default 15 days, would name a day two weeks before any data)."""
    import requests

    raw = requests.get(
        f"{backfilled.url}/api/v1/query",
        params={"query": "wattprint_workload_energy_joules_total[1d]", "nocache": "1"},
        timeout=30,
    ).json()["data"]["result"]
    oldest = min(float(t) for series in raw for t, _ in series["values"])
    assert oldest >= backfilled.t0
    result = report(backfilled.url)
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0]
    assert f"each job's whole life (the server's data reaches back to {iso(oldest)}" in header
    # Two reports of one end cover one range, however far apart they run.
    until = f"--until={time.time():.3f}"
    first = report_json(backfilled.url, until)
    time.sleep(1.5)
    assert report_json(backfilled.url, until)["since"] == first["since"]
    assert parse_time(first["since"]) < oldest


@slow
def test_whole_life_is_exact_across_a_restart_a_gap_and_two_nodes(backfilled: Fleet) -> None:
    document = report_json(backfilled.url, "--workload=train")
    assert document["whole_life"] is True
    (job,) = document["jobs"]
    assert (job["scheduler"], job["namespace"], job["workload"]) == ("kubernetes", "ml", "train")
    check_job(job, expected_energy("train", 0, END))
    uses = [u for u in USES if u.workload == "train"]
    start = backfilled.t0 + min(u.start for u in uses)
    end = backfilled.t0 + max(u.end for u in uses)
    assert parse_time(job["start"]) == pytest.approx(start, abs=0.01)
    assert parse_time(job["end"]) == pytest.approx(end, abs=0.01)
    assert job["duration_seconds"] == pytest.approx(end - start, abs=0.01)
    assert job["budget"]["grams_30d"] == BUDGET_GRAMS
    assert job["budget"]["used"] == pytest.approx(
        job["emissions_kg"]["total"] * 1000 / BUDGET_GRAMS
    )


@slow
def test_a_jobs_start_does_not_depend_on_where_the_steps_fall(backfilled: Fleet) -> None:
    """Each --until puts the whole-life range's step boundaries elsewhere; one that falls
    between a job's start and its first scrape once moved the start up to that boundary
    (up to a scrape interval late)."""
    uses = [u for u in USES if u.workload == "train"]
    start = backfilled.t0 + min(u.start for u in uses)
    base = backfilled.t0 + END + 900
    starts = {
        offset: parse_time(
            report_json(backfilled.url, "--workload=train", f"--until={base + offset}")["jobs"][0][
                "start"
            ]
        )
        for offset in range(0, 600, 17)
    }
    late = {offset: round(t - start, 3) for offset, t in starts.items() if abs(t - start) > 0.01}
    assert not late, f"the job's start moved with --until (offset: seconds late): {late}"


@slow
def test_an_explicit_range_counts_only_what_was_drawn_inside_it(backfilled: Fleet) -> None:
    # Across node-a's restart (1500) and from the start of node-b's gap (1200).
    since, until = backfilled.t0 + 1200, backfilled.t0 + 1800
    document = report_json(
        backfilled.url, "--workload=train", f"--since={since}", f"--until={until}"
    )
    (job,) = document["jobs"]
    check_job(job, expected_energy("train", 1200, 1800))
    assert parse_time(job["start"]) == pytest.approx(since, abs=0.01)
    assert job["duration_seconds"] == pytest.approx(600, abs=0.01)


@slow
@pytest.mark.parametrize(
    ("since", "until", "end"),
    [
        # Both ends 7.3 s after a scrape: counter differencing alone would count from
        # the scrapes before them, 7.3 s early at each end (about 1 % of this range).
        (1807.3, 2293.3, 2293.3),
        # Past the job's end: the job ends where it did, not where the range does.
        (1807.3, 2707.3, 2400),
        # Inside node-b's scrape gap (1200 to 1620): no sample of it in the range.
        (1400, 1560, 1560),
    ],
)
def test_a_range_between_scrapes_is_cut_where_it_asks(
    backfilled: Fleet, since: float, until: float, end: float
) -> None:
    t0 = backfilled.t0
    document = report_json(
        backfilled.url, "--workload=train", f"--since={t0 + since}", f"--until={t0 + until}"
    )
    (job,) = document["jobs"]
    check_job(job, expected_energy("train", since, until))
    assert parse_time(job["start"]) == pytest.approx(t0 + since, abs=0.01)
    assert parse_time(job["end"]) == pytest.approx(t0 + end, abs=0.01)
    assert job["duration_seconds"] == pytest.approx(end - since, abs=0.01)


@slow
def test_a_restart_hidden_inside_one_step_is_read_sample_by_sample(backfilled: Fleet) -> None:
    # 1,000 steps of 1,200 s ending at t0+4000: the step (t0+400, t0+1600] holds the
    # job's first samples and node-a's restart, after which the counter climbs past
    # nothing it had shown before. Step values alone would lose the part before it.
    until = backfilled.t0 + 4000
    args = ("--workload=train", f"--until={until}", "--range=1200000s")
    (job,) = report_json(backfilled.url, *args)["jobs"]
    check_job(job, expected_energy("train", 0, END))
    assert job["duration_seconds"] == pytest.approx(1800, abs=0.01)


@slow
def test_namespace_and_all_workloads(backfilled: Fleet) -> None:
    (job,) = report_json(backfilled.url, "--namespace=serving")["jobs"]
    assert job["workload"] == "infer"
    check_job(job, expected_energy("infer", 0, END))
    assert job["budget"] is None
    jobs = report_json(backfilled.url)["jobs"]
    assert [j["workload"] for j in jobs] == ["train", "infer"]  # by start time
    table = report(backfilled.url)
    sections = parse_table(table.stdout)
    assert [r["WORKLOAD"] for r in sections[""]] == ["train", "infer"]
    assert [r["NAMESPACE"] for r in sections[""]] == ["ml", "serving"]
    assert len(sections["Energy per GPU"]) == 4
    result = report(backfilled.url, "--namespace=nowhere")
    assert result.returncode == 1 and "unknown namespace 'nowhere'" in result.stderr


# -- the arithmetic that does not need a server --------------------------------------------


def test_codecarbon_csv_writes_what_codecarbon_writes_where_it_has_no_figure() -> None:
    """Columns Wattprint has no figure for hold what codecarbon 3.3.2 itself writes
    then (its own files in tests/fixtures/h200/codecarbon-4-processes), not blanks."""
    with (TRACE.parent / "codecarbon-4-processes" / "cc_single_parent.csv").open() as f:
        (theirs,) = list(csv.DictReader(f))
    for zone, cloud in [("DE", "N"), ("gcp:europe-west3", "Y")]:
        job = JobReport("env", "", "train", start=1_700_000_000.0, end=1_700_000_600.0)
        job.components["gpu"].energy_j = 3.6e6
        job.zones = {zone}
        (ours,) = list(
            csv.DictReader(io.StringIO(render_codecarbon([job], make_window(0, 1, False), "")))
        )
        assert (ours["water_consumed"], ours["wue"]) == (theirs["water_consumed"], theirs["wue"])
        assert ours["on_cloud"] == cloud and theirs["on_cloud"] == "N"
        # The job's end in UTC, in codecarbon's format (which has no offset).
        assert ours["timestamp"] == "2023-11-14T22:23:20"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", theirs["timestamp"])


def test_the_step_grid_ends_exactly_at_until() -> None:
    for span in (0.5, 7.0, 3599.9, 86400.0, 15 * 86400.0 + 0.123):
        window = make_window(1_700_000_000.0 - span, 1_700_000_000.0, whole_life=False)
        assert window.at(window.steps) == pytest.approx(1_700_000_000.0, abs=1e-6)
        assert window.since <= 1_700_000_000.0 - span + 1e-6
        assert window.since > 1_700_000_000.0 - span - 1.0  # grows by under a second
        assert window.steps <= 1000 and math.isclose(window.step * 1000, round(window.step * 1000))


def test_times_in_every_accepted_form() -> None:
    now = 1_700_000_000.0
    assert parse_time("now", now) == now
    assert parse_time("1699990000", now) == 1699990000.0
    assert parse_time("6h", now) == now - 6 * 3600
    assert parse_time("2023-11-14T22:13:20Z", now) == now
    assert parse_time("2023-11-14T23:13:20+01:00", now) == now
    assert parse_time("2023-11-14T22:13:20", now) == now  # no zone: UTC
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday", now)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_one_rewritten_line_only_when_slow_and_cleans_up() -> None:
    stream = _Terminal()
    with Progress(stream, enabled=True, after=0.05) as progress:
        progress.say("reading energy counters")
        time.sleep(0.4)
    text = stream.getvalue()
    assert "\n" not in text  # one line, rewritten in place
    assert "\r\x1b[Kwattprint: reading energy counters (" in text
    assert text.endswith("\r\x1b[K")  # erased before the report or an error is printed
    quick = _Terminal()
    with Progress(quick, enabled=True, after=5.0):
        pass
    assert quick.getvalue() == ""
    piped = io.StringIO()
    with Progress(piped, enabled=False, after=0.0) as progress:
        time.sleep(0.1)
    assert piped.getvalue() == ""
