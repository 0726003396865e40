"""What an exporter restart costs a job: the recorded H200 trace replayed through the
real exporter, a real Prometheus scraping it, the exporter SIGKILLed 20 s into the job
and started again after an outage, with and without its state file.

For each scrape interval (1 s, 15 s) and outage (5 s, 60 s) it prints the job's and the
device's GPU energy as `wattprint report` and PromQL `increase()` give them, against
the trace's own counter. Run: `.venv/bin/python benchmarks/restart.py` (about 10 min).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from conftest import TRACE  # noqa: E402
from prom_harness import free_port, run_prometheus  # noqa: E402
from test_report import JOULES_PER_KWH, trace_truth  # noqa: E402

KILL_AT_TRACE_S = 26.0  # 20 s into the job, which starts 6 s into the trace
JOB = 'wattprint_workload_energy_joules_total{workload="phased-load",component="gpu"}'


def query(url: str, expr: str, at: float | None = None) -> float:
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    result = requests.get(f"{url}/api/v1/query", params=params, timeout=10).json()
    values = result["data"]["result"]
    return float(values[0]["value"][1]) if values else float("nan")


def trimmed(trace: Path, since_start: float, speed: float, out: Path) -> Path:
    """The trace without the samples before `since_start` wall seconds into the first
    run: where the hardware is when the exporter comes back (its counter went on)."""
    header, *lines = trace.read_text().splitlines()
    first_t = json.loads(lines[0])["t"]
    kept = [x for x in lines if x.strip() and json.loads(x)["t"] >= first_t + since_start * speed]
    out.write_text("\n".join([header, *(kept or lines[-1:])]) + "\n")
    return out


def exporter(
    target: str, state: str, speed: float, log: Path, trace: Path = TRACE
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "wattprint",
                f"--web.listen-address={target}",
                f"--gpu.replay-file={trace}",
                f"--replay.speed={speed}",
                "--carbon.zone=DE",
                f"--state.file={state}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_healthy(target: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://{target}/healthz", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise TimeoutError("exporter not healthy")


def run(prometheus: str, scrape: str, down: float, keep_state: bool, speed: float) -> dict:
    samples = [json.loads(x) for x in TRACE.read_text().splitlines()[1:] if x.strip()]
    span = samples[-1]["t"] - samples[0]["t"]
    device_truth = (samples[-1]["gpus"][0]["energy_mj"] - samples[0]["gpus"][0]["energy_mj"]) / 1e3
    job_truth = trace_truth(TRACE).held_energy_j
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        target = f"127.0.0.1:{free_port()}"
        config = (
            f"global: {{scrape_interval: {scrape}, evaluation_interval: {scrape}}}\n"
            "scrape_configs:\n"
            f"  - job_name: wattprint\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        state = str(tmp / "state.json") if keep_state else ""
        log = tmp / "exporter.log"
        with run_prometheus(prometheus, tmp / "prom", config) as url:
            proc = exporter(target, state, speed, log)
            started = time.monotonic()
            wait_healthy(target)
            time.sleep(max(KILL_AT_TRACE_S / speed - (time.monotonic() - started), 0))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            time.sleep(down)
            rest = trimmed(TRACE, time.monotonic() - started, speed, tmp / "rest.jsonl")
            proc = exporter(target, state, speed, log, rest)
            try:
                wait_healthy(target)
                scrape_s = float(scrape.rstrip("s"))
                # Until the trace has ended and the restarted exporter was scraped twice.
                until = max(started + span / speed, time.monotonic()) + 2 * scrape_s + 1
                time.sleep(max(until - time.monotonic(), 0))
                last = query(url, f"timestamp({JOB})")
                increase = query(url, f"increase({JOB}[30m])", at=last)
                device = query(url, "max_over_time(wattprint_gpu_energy_joules_total[30m])")
                device_rise = query(url, "increase(wattprint_gpu_energy_joules_total[30m])")
                report = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "wattprint",
                        "report",
                        f"--prometheus.url={url}",
                        "--workload=phased-load",
                        "--format=json",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                job = json.loads(report.stdout)["jobs"][0] if report.returncode == 0 else None
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
    reported = job["energy_kwh"]["gpu"] * JOULES_PER_KWH if job else float("nan")
    return {
        "report_job": reported / job_truth - 1,
        "increase_job": increase / job_truth - 1,
        "device_counter": device / device_truth - 1,
        "device_increase": device_rise / device_truth - 1,
        "noted": bool(job and any("restarted" in n for n in job["notes"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--speed", type=float, default=1.0, help="replay speed")
    args = parser.parse_args()
    prometheus = "prometheus"
    print(f"replay speed {args.speed:g}x; errors against the trace's counter")
    print(
        "scrape  down  state  report(job)  increase(job)  device counter  "
        "increase(device)  report notes it"
    )
    for scrape in ("1s", "15s"):
        for down in (5.0, 60.0):
            for keep in (False, True):
                r = run(prometheus, scrape, down / 1, keep, args.speed)
                print(
                    f"{scrape:>6} {down:>4.0f}s  {'yes' if keep else 'no':>5}  "
                    f"{r['report_job']:+10.2%}  {r['increase_job']:+12.2%}  "
                    f"{r['device_counter']:+13.2%}  {r['device_increase']:+15.2%}  "
                    f"{'yes' if r['noted'] else 'no'}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
