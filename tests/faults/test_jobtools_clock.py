"""A job's duration survives a step of the node's wall clock (issue 43): `date -s` an
hour ahead in the middle of `wattprint run` must not make it an hour long, with its
power 360x too low."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .jobnode import JobNode, job_node

__all__ = ["job_node"]

LABELS = 'component="cpu",gpu="",scheduler="env",namespace="",workload="stepjob",pod=""'


def metrics(sampled: float, joules: float) -> bytes:
    return (
        "# TYPE wattprint_workload_energy_joules counter\n"
        f"wattprint_workload_energy_joules_total{{{LABELS}}} {joules}\n"
        "# TYPE wattprint_sampler_last_success_timestamp_seconds gauge\n"
        f"wattprint_sampler_last_success_timestamp_seconds {sampled}\n"
        "# TYPE wattprint_sampler_interval_seconds gauge\n"
        "wattprint_sampler_interval_seconds 0.1\n"
    ).encode()


class Exporter(BaseHTTPRequestHandler):
    """A node's exporter whose wall clock the test steps: its samples' times follow it."""

    shift = 0.0
    joules = 0.0

    def do_GET(self) -> None:
        body = metrics(time.time() + Exporter.shift, Exporter.joules)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_wall_clock_step_mid_job_does_not_change_its_duration(job_node: JobNode) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    marker = job_node.tmp / "started"

    def step() -> None:  # once the command runs: an hour ahead, and 100 J used
        while not marker.exists():
            time.sleep(0.02)
        Exporter.shift, Exporter.joules = 3600.0, 100.0

    stepper = threading.Thread(target=step, daemon=True)
    stepper.start()
    try:
        result = job_node.run(
            f"--exporter.url={url}",
            "--workload=stepjob",
            command=("sh", "-c", f"touch {marker}; sleep 1"),
        )
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    [path] = job_node.out.glob("wattprint-stepjob-*.json")
    document = json.loads(path.read_text())
    duration = document["raw"]["end"] - document["raw"]["start"]
    assert 0.9 < duration < 4, duration
    assert document["raw"]["components"]["cpu"]["energy_j"] == 100.0
    assert any("wall clock stepped by +36" in note for note in document["job"]["notes"])
