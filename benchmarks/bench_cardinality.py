"""Scrape cost when one tenant floods a node with workload names, with and without the cap.

    python benchmarks/bench_cardinality.py [--processes 3000] [--scrapes 300]

Builds a fixture /proc in a temporary directory (8 busy CPUs) and starts two
exporters on it side by side (benchmarks/fake_node.py: 8 fake H200s replaying the
recorded trace, CPU and memory models): one with the default --workload.max-series=500,
one with the cap out of reach (100000), which is what every version before the cap did.
Once both serve, --processes processes appear, each naming its own random workload
(WATTPRINT_WORKLOAD) and having used CPU and memory, so each gets CPU and memory series.
Scrapes them alternately, so machine noise hits both alike, then the capped one alone,
and prints, per exporter, scrape p50/p99, the size of /metrics, the number of samples
and of workloads, and how far the parts are from the devices in the scraped text; then
the CPU time of one sample and of one scrape's serialization, measured in this process.
Target: p99 under 50 ms with the cap.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from wattprint.carbon.base import CarbonSettings
from wattprint.carbon.service import CarbonService
from wattprint.export.collector import SnapshotCollector
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import read_proc_table
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources.cpu_model import CpuModelSource
from wattprint.sources.memory_model import MemoryModelSource
from wattprint.sources.nvml import NvmlSource

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_node import free_port, percentile, wait_ready  # noqa: E402
from fake_nvml import FakeNvml  # noqa: E402
from procfs_fixture import stat_line  # noqa: E402

CPUS = 8  # two packages of four
CLK_TCK = 100
FIRST_PID = 10_000


class FloodedProc:
    """/proc of a node with CPUS busy CPUs, flooded with processes on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ticks = 0
        root.mkdir(parents=True)
        (root / "cpuinfo").write_text(
            "".join(
                f"processor\t: {cpu}\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                f"physical id\t: {cpu // 4}\ncore id\t\t: {cpu % 4}\n\n"
                for cpu in range(CPUS)
            )
        )
        (root / "meminfo").write_text("MemTotal:       2113418000 kB\nMemFree: 1000000 kB\n")
        init = root / "1"
        init.mkdir()
        (init / "stat").write_text(stat_line(1, "systemd", 0, 100, 50, 1, 3000))
        (init / "cgroup").write_text("0::/init.scope\n")
        (init / "environ").write_bytes(b"")
        self.advance()

    def flood(self, count: int, seed: int = 12) -> None:
        """count processes, each naming its own random workload. They are new to the
        sampler, so all the CPU time they have counts in its next interval, and their
        resident memory in every one: each workload gets CPU and memory series, which
        stay as long as the process runs (the exporter reads its /proc every second)."""
        rng = random.Random(seed)
        alphabet = string.ascii_lowercase + string.digits
        for i in range(count):
            pid = FIRST_PID + i
            d = self.root / str(pid)
            d.mkdir()
            name = "".join(rng.choices(alphabet, k=16))
            (d / "environ").write_bytes(f"PATH=/usr/bin\0WATTPRINT_WORKLOAD={name}\0".encode())
            (d / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
            (d / "stat").write_text(stat_line(pid, "worker", 1, 50, 0, 5000, 25_000))

    def work(self, count: int, ticks: int) -> None:
        """The first count flooded processes have used ticks of CPU time each."""
        for i in range(count):
            pid = FIRST_PID + i
            (self.root / str(pid) / "stat").write_text(
                stat_line(pid, "worker", 1, ticks, 0, 5000, 25_000)
            )

    def advance(self) -> None:
        """One second of node time: all CPUs busy."""
        self.ticks += 1
        per_cpu = CLK_TCK * self.ticks
        lines = [f"cpu  {per_cpu * CPUS} 0 0 0 0 0 0 0 0 0"]
        lines += [f"cpu{cpu} {per_cpu} 0 0 0 0 0 0 0 0 0" for cpu in range(CPUS)]
        (self.root / "stat").write_text("\n".join(lines) + "\nbtime 1764400000\n")


def check(text: str) -> tuple[int, int, str]:
    """(samples, workloads, conservation) of one scrape's text."""
    samples = 0
    workloads: set[str] = set()
    devices: dict[str, float] = defaultdict(float)
    parts: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples += 1
            if s.name == "wattprint_workload_energy_joules_total":
                workloads.add(s.labels["workload"])
            if s.name in (
                "wattprint_workload_energy_joules_total",
                "wattprint_unattributed_energy_joules_total",
            ):
                parts[s.labels["component"]] += s.value
            elif s.name.endswith("_energy_joules_total") and s.name.count("_") == 4:
                devices[s.name.split("_")[1]] += s.value
    worst = max(abs(parts[c] - d) / d for c, d in devices.items() if d) if devices else 0.0
    return samples, len(workloads), f"{worst:.1e}"


def in_process_costs(
    root_proc: FloodedProc, count: int, gpus: int, caps: dict[str, str]
) -> dict[str, tuple[float, float]]:
    """CPU time (ms) of one sample and of one scrape's serialization, per cap, measured
    in this process with the thread's own CPU clock, so other load on the machine
    hardly shows."""
    root = root_proc.root
    ticks = 50
    costs = {}
    for name, cap in caps.items():
        fake = FakeNvml.from_trace(copies=gpus)
        fake.position = 150
        sampler = Sampler(
            SamplerParts(
                sources=[
                    NvmlSource(nvml=fake),
                    CpuModelSource(root, tdp_watts=350),
                    MemoryModelSource(root),
                ],
                read_procs=lambda: read_proc_table(root),
                resolver=IdentityResolver(procfs_root=str(root)),
                carbon=CarbonService(CarbonSettings(zone="DE"), environ={}),
                max_workloads=int(cap),
            )
        )
        collector = SnapshotCollector(lambda s=sampler: s.latest, True)
        sampler.sample_once()
        ticks += 50
        root_proc.work(count, ticks)  # so that every workload gets CPU series too
        sampler.sample_once()
        collector.render()  # the first scrape, with every series born
        samples, scrapes = [], []
        for _ in range(10):
            fake.advance()
            start = time.thread_time()
            sampler.sample_once()
            samples.append((time.thread_time() - start) * 1000)
            start = time.thread_time()
            collector.render()
            scrapes.append((time.thread_time() - start) * 1000)
        costs[name] = (statistics.median(samples), statistics.median(scrapes))
    return costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=3000)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        proc = FloodedProc(Path(tmp) / "proc")
        stop = threading.Event()

        def churn() -> None:
            while not stop.wait(1.0):
                proc.advance()

        churner = threading.Thread(target=churn, daemon=True)
        churner.start()
        caps = {"cap 500": "500", "no cap": "100000"}
        ports = {name: free_port() for name in caps}
        exporters = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "fake_node.py"),
                    "--gpus",
                    str(args.gpus),
                    "--",
                    f"--web.listen-address=127.0.0.1:{ports[name]}",
                    f"--path.procfs={proc.root}",
                    "--cpu.source=model",
                    "--cpu.tdp-watts=350",
                    "--memory.source=model",
                    f"--workload.max-series={cap}",
                    "--carbon.zone=DE",
                    "--log.level=error",
                    # Two exporters side by side: each needs its own node lock.
                    f"--state.file={tmp}/{name.replace(' ', '-')}-state.json",
                ]
            )
            for name, cap in caps.items()
        ]
        urls = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
        try:
            for url in urls.values():
                wait_ready(url, timeout=60)
            proc.flood(args.processes)
            time.sleep(5)  # every process resolved, every series born
            session = requests.Session()
            session.trust_env = False
            latencies: dict[str, list[float]] = {name: [] for name in urls}
            last: dict[str, bytes] = {}
            for _ in range(args.scrapes):
                for name, url in urls.items():
                    start = time.perf_counter()
                    last[name] = session.get(url, timeout=30).content
                    latencies[name].append((time.perf_counter() - start) * 1000)
                time.sleep(0.05)
            # The capped exporter alone: the other's sampler and scrapes no longer
            # compete for the CPUs.
            exporters[1].terminate()
            exporters[1].wait(timeout=10)
            alone: list[float] = []
            for _ in range(args.scrapes):
                start = time.perf_counter()
                session.get(urls["cap 500"], timeout=30)
                alone.append((time.perf_counter() - start) * 1000)
                time.sleep(0.05)
        finally:
            for exporter in exporters:
                exporter.terminate()
                exporter.wait(timeout=10)
        costs = in_process_costs(proc, args.processes, args.gpus, caps)
        stop.set()

    print(
        f"\n{args.processes} processes with random workload names, {args.gpus} fake GPUs, "
        f"1 Hz sampling; {args.scrapes} scrapes each, alternating\n"
    )
    print(
        "| exporter | p50 ms | p99 ms | max ms | /metrics bytes | samples | workloads "
        "| parts vs devices |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, values in latencies.items():
        samples, workloads, worst = check(last[name].decode())
        print(
            f"| {name} | {statistics.median(values):.1f} | {percentile(values, 0.99):.1f} "
            f"| {max(values):.1f} | {len(last[name]):,} | {samples:,} | {workloads:,} "
            f"| {worst} |"
        )
    print(
        f"| cap 500, alone | {statistics.median(alone):.1f} | {percentile(alone, 0.99):.1f} "
        f"| {max(alone):.1f} | | | | |"
    )
    print(f"\nload average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("\nCPU time in one process (thread CPU clock, median of 10)\n")
    print("| exporter | one sample, ms | one scrape's serialization, ms |")
    print("|---|---:|---:|")
    for name, (sample_ms, scrape_ms) in costs.items():
        print(f"| {name} | {sample_ms:.1f} | {scrape_ms:.1f} |")
    ratio = percentile(latencies["no cap"], 0.99) / percentile(latencies["cap 500"], 0.99)
    print(f"\np99 no cap / cap 500: {ratio:.1f}x")
    capped_p99 = percentile(alone, 0.99)
    print(f"target p99 < 50 ms with the cap (alone): {'met' if capped_p99 < 50 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
