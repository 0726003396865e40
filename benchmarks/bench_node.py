"""Scrape latency of /metrics side by side with node_exporter, and the exporter's own cost.

    python benchmarks/bench_node.py [--scrapes 400] [--cost-seconds 60]

Starts a Wattprint process with 8 fake H200s (recorded trace, 3 ms per energy read and
2.2 ms per process-utilization read, as measured on a real H200) sampling at 1 Hz, and
prometheus-node-exporter (Debian package) with its default collectors, both on loopback.
Scrapes them alternately, so machine noise hits both alike, and prints p50/p99. Then
leaves Wattprint alone with a scrape every 15 s (as Prometheus would) and reports its CPU
time per second and RSS. The fake GPUs' recorded traces live in the exporter's process:
their memory (a process that only loads them, less a bare interpreter) is subtracted
from the RSS reported as the exporter's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


_RSS = "print(int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]))"


def fake_gpus_mb(gpus: int) -> float:
    """Memory the fake GPUs' trace copies take: loaded alone, less a bare interpreter."""
    load = (
        f"import sys; sys.path.insert(0, {str(HERE.parent / 'tests')!r}); "
        f"from fake_nvml import FakeNvml; f = FakeNvml.from_trace(copies={gpus}); "
    )
    with_fake = subprocess.run([sys.executable, "-c", load + _RSS], capture_output=True)
    bare = subprocess.run([sys.executable, "-c", _RSS], capture_output=True)
    return (int(with_fake.stdout) - int(bare.stdout)) / 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scrapes", type=int, default=400)
    parser.add_argument("--cost-seconds", type=float, default=60)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()

    node_exporter = shutil.which("prometheus-node-exporter")
    wp_port, ne_port = free_port(), free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "fake_node.py"),
                "--gpus",
                str(args.gpus),
                "--",
                f"--web.listen-address=127.0.0.1:{wp_port}",
                "--sample.interval=1s",
                "--carbon.zone=DE",
                "--log.level=warn",
                "--state.file=",  # no node lock or resume from an earlier run's state
            ],
        )
    ]
    targets = {"wattprint": f"http://127.0.0.1:{wp_port}/metrics"}
    if node_exporter:
        procs.append(
            subprocess.Popen(
                [node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        targets["node_exporter"] = f"http://127.0.0.1:{ne_port}/metrics"
    else:
        print("prometheus-node-exporter not installed: apt-get install prometheus-node-exporter")
    try:
        for url in targets.values():
            wait_ready(url)
        time.sleep(2)
        session = requests.Session()
        latencies: dict[str, list[float]] = {name: [] for name in targets}
        sizes: dict[str, int] = {}
        for _ in range(args.scrapes):
            for name, url in targets.items():
                start = time.perf_counter()
                body = session.get(url, timeout=10).content
                latencies[name].append((time.perf_counter() - start) * 1000)
                sizes[name] = len(body)
            time.sleep(0.01)
        print(
            f"\nScrape latency, {args.scrapes} scrapes each, alternating "
            f"({args.gpus} fake GPUs, 1 Hz sampling)"
        )
        print(f"{'target':<15} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'bytes':>8}")
        for name, values in latencies.items():
            print(
                f"{name:<15} {statistics.median(values):8.2f} {percentile(values, 0.99):8.2f} "
                f"{max(values):8.2f} {sizes[name]:8d}"
            )
        if "node_exporter" in latencies:
            ratio = percentile(latencies["wattprint"], 0.99) / percentile(
                latencies["node_exporter"], 0.99
            )
            print(f"p99 ratio wattprint / node_exporter: {ratio:.2f}")

        pid = procs[0].pid
        time.sleep(5)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        rss_peak = rss_mb(pid)
        next_scrape = t0
        while time.monotonic() - t0 < args.cost_seconds:
            if time.monotonic() >= next_scrape:
                session.get(targets["wattprint"], timeout=10)
                next_scrape += 15
            rss_peak = max(rss_peak, rss_mb(pid))
            time.sleep(1)
        elapsed = time.monotonic() - t0
        cpu = cpu_seconds(pid) - cpu0
        print(f"\nExporter cost over {elapsed:.0f} s ({args.gpus} GPUs, 1 Hz, scrape every 15 s)")
        print(f"CPU: {cpu / elapsed * 100:.2f} % of one core ({cpu * 1000 / elapsed:.1f} ms/s)")
        fake_mb = fake_gpus_mb(args.gpus)
        print(
            f"RSS: {rss_mb(pid) - fake_mb:.1f} MB now, {rss_peak - fake_mb:.1f} MB peak, "
            f"without the fake GPUs' {fake_mb:.1f} MB (process total {rss_mb(pid):.1f} MB)"
        )
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
