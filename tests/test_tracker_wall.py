"""The job tools' figures at the wall (issue 44): with a platform source, the exporter
serves each workload's share of the rest of the server as component="platform". The
trackers' and `wattprint run`'s files and messages give the chips (codecarbon's
energy_consumed keeps codecarbon's meaning: cpu + gpu + ram) and, beside them, the
chips plus that share "at the wall"; without a platform source, "wall: not measured"."""

from __future__ import annotations

import csv
import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import wattprint

# W of the workload "w" by component; the platform's is the rest of the server's share.
POWER = {"gpu": 10.0, "cpu": 5.0, "memory": 1.0, "platform": 4.0}
CHIPS_W = POWER["gpu"] + POWER["cpu"] + POWER["memory"]
STEP = 0.25  # s between the fake's samples


class Node:
    """A fake exporter's /metrics: the workload's counters rise at POWER, one sample
    each STEP; `platform`: whether a platform source reads the node's input."""

    def __init__(self, platform: bool) -> None:
        self.platform = platform
        self.born = time.time()
        self.full = False  # the node's --workload.max-series full

    def body(self) -> bytes:
        now = self.born + STEP * ((time.time() - self.born) // STEP)
        ran = now - self.born
        lines = ["# TYPE wattprint_workload_energy_joules counter"]
        for component, watts in POWER.items():
            if component == "platform" and not self.platform:
                continue
            gpu = "0" if component == "gpu" else ""
            labels = f'component="{component}",gpu="{gpu}",scheduler="env",namespace=""'
            lines.append(
                f'wattprint_workload_energy_joules_total{{{labels},workload="w",pod=""}} '
                f"{100 + watts * ran}"
            )
        if self.platform:
            lines += [
                "# TYPE wattprint_node_energy_joules counter",
                f"wattprint_node_energy_joules_total {1000 + 30 * ran}",
                "# TYPE wattprint_platform_energy_joules counter",
                f"wattprint_platform_energy_joules_total {200 + 6 * ran}",
            ]
        lines += [
            "# TYPE wattprint_sampler_last_success_timestamp_seconds gauge",
            f"wattprint_sampler_last_success_timestamp_seconds {now}",
            "# TYPE wattprint_sampler_interval_seconds gauge",
            f"wattprint_sampler_interval_seconds {STEP}",
            'wattprint_carbon_fallback_active{zone="DE"} 0',
        ]
        if self.full:
            lines += ["# TYPE wattprint_workloads gauge", "wattprint_workloads 3"]
            lines += ["# TYPE wattprint_workloads_max gauge", "wattprint_workloads_max 3"]
        return ("\n".join(lines) + "\n").encode()


@pytest.fixture(params=[True, False], ids=["platform", "no-platform"])
def node(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Node, str]]:
    fake = Node(platform=request.param)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server calls it by this name
            body = fake.body()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def _check(document: dict, fake: Node, said: str) -> None:  # type: ignore[type-arg]
    chips = sum(c["energy_j"] for c in document["raw"]["components"].values())
    assert "platform" not in document["raw"]["components"]
    assert chips > 0
    wall = document["job"]["wall"]
    if fake.platform:
        # The job's share of the rest of the server, beside the chips; `report
        # --from-files` adds the files' raw.platform up as it adds the chips.
        share = document["raw"]["platform"]["energy_j"]
        assert share == pytest.approx(chips * POWER["platform"] / CHIPS_W, rel=0.05)
        assert document["raw"]["platform_nodes"] == [["wattprint", document["host"]]]
        assert wall["energy_kwh"] * 3.6e6 == pytest.approx(chips + share)
        assert "at the wall: " in said and "+ the rest of the server" in said
    else:
        assert wall["energy_kwh"] is None and wall["unavailable"].startswith("no platform")
        assert "wall: not measured (no platform reading" in said


def test_a_trackers_rows_keep_the_chips_and_say_the_wall(
    node: tuple[Node, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, url = node
    monkeypatch.setenv("WATTPRINT_EXPORTER_URL", url)
    monkeypatch.setenv("WATTPRINT_WORKLOAD", "w")
    out = tmp_path / "out"
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("wattprint.tracker")
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.INFO)
    try:
        tracker = wattprint.EmissionsTracker(output_dir=str(out), save_to_file=True)
        tracker.start()
        time.sleep(1.0)
        tracker.stop()
    finally:
        logger.removeHandler(handler)
    [stopped] = [line for line in said if " stopped: " in line]
    [path] = out.glob("wattprint-*.json")
    document = json.loads(path.read_text())
    _check(document, fake, stopped)
    # codecarbon's energy_consumed is the chips': cpu + gpu + ram, the platform apart.
    [row] = list(csv.DictReader((out / "emissions.csv").open()))
    parts = sum(float(row[c]) for c in ("cpu_energy", "gpu_energy", "ram_energy"))
    assert float(row["energy_consumed"]) == pytest.approx(parts, rel=1e-6)
    chips = sum(c["energy_j"] for c in document["raw"]["components"].values())
    assert float(row["energy_consumed"]) * 3.6e6 == pytest.approx(chips, rel=1e-3)


def test_run_says_the_wall_beside_the_chips(node: tuple[Node, str], tmp_path: Path) -> None:
    fake, url = node
    env = dict(os.environ, PYTHONPATH=str(Path(wattprint.__file__).parents[1]))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattprint",
            "run",
            f"--exporter.url={url}",
            "--workload=w",
            f"--output.dir={tmp_path / 'out'}",
            "--",
            "sleep",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    [path] = (tmp_path / "out").glob("wattprint-w-*.json")
    # The summary's table has the chips and the wall side by side, or says why not.
    lines = result.stderr.splitlines()
    at = [n for n, line in enumerate(lines) if line.startswith("Chips (ENERGY")]
    assert at, result.stderr
    header, row = lines[at[0] + 1].split(), lines[at[0] + 2].split()
    assert header[:4] == ["WORKLOAD", "CHIPS", "J", "PLATFORM"] and row[0] == "w", lines
    chips, platform, wall = (row[i] for i in (1, 2, 3))
    if fake.platform:
        assert float(wall) == pytest.approx(float(chips) + float(platform), rel=1e-3)
        said = "at the wall: + the rest of the server"
    else:
        assert wall == "n/a" and "no figure at the wall: no platform reading" in result.stderr
        said = "wall: not measured (no platform reading"
    _check(json.loads(path.read_text()), fake, said)


def test_a_trackers_rows_say_when_the_workload_cap_was_full(
    node: tuple[Node, str], tmp_path: Path
) -> None:
    # As `wattprint run`'s report does: a tracker reading an exporter it cannot register
    # with, whose --workload.max-series is full, says its energy may be in "other".
    fake, url = node
    fake.full = True
    tracker = wattprint.track("w", output_dir=str(tmp_path / "out"), exporter_url=url)
    assert tracker.start()
    job = tracker.stop()
    assert job is not None
    [full] = [n for n in job.notes if "--workload.max-series (3) was full" in n]
    assert 'counted as workload="other", and this tracker\'s energy may be there' in full
