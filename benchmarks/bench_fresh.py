"""What a client asking for /metrics?fresh in a loop costs the node: the exporter's CPU
and its writes (the state file) with no client, with a client scraping /metrics as fast
as it can, and with one asking for /metrics?fresh as fast as it can, from this host (a
tracker's place: honoured, at the capped rate). The exporter runs on the live fake NVML
of the tests, reads this machine's /proc, samples every second and keeps a state file.

    python benchmarks/bench_fresh.py --seconds 20
    python benchmarks/bench_fresh.py --exporter /tmp/old/exporter   # another checkout
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def written(pid: int) -> tuple[int, int]:
    """Bytes and calls of write(2) (sockets send with send(2): files and logs alone)."""
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(io["wchar"]), int(io["syscw"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def client(port: int, target: str, stop: threading.Event, counts: dict[str, int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while not stop.is_set():
        conn.request("GET", target)
        response = conn.getresponse()
        response.read()
        counts["requests"] += 1
        counts["fresh"] += response.getheader("X-Wattprint-Fresh") == "1"
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--exporter", default=str(REPO / "exporter"), help="package dir")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        nvml = Path(tmp) / "nvml"
        nvml.mkdir()
        port = free_port()
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(TESTS / "livefake"), args.exporter]),
            WATTPRINT_TEST_NVML_DIR=str(nvml),
            WATTPRINT_TEST_NVML_T0=str(time.time()),
            XDG_RUNTIME_DIR=tmp,
        )
        flags = [
            f"--web.listen-address=127.0.0.1:{port}",
            f"--state.file={tmp}/state/state.json",
            "--gpu.source=nvml",
            "--cpu.source=model",
            "--memory.source=model",
            "--sample.interval=1s",
            "--carbon.zone=DE",
        ]
        proc = subprocess.Popen(
            [sys.executable, "-m", "wattprint", *flags],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    conn.request("GET", "/healthz")
                    if conn.getresponse().status == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    sys.exit("the exporter did not start")
                time.sleep(0.2)
            time.sleep(2)
            print(f"exporter: {args.exporter}; {args.seconds:g} s per phase, sample every 1 s\n")
            print(
                "| client | exporter CPU (% of a core) | requests/s | fresh answers/s "
                "| file writes/s | KB written/s |"
            )
            print("|---|---|---|---|---|---|")
            for name, target in (
                ("none", None),
                ("/metrics loop", "/metrics"),
                ("/metrics?fresh loop", "/metrics?fresh"),
            ):
                stop = threading.Event()
                counts = {"requests": 0, "fresh": 0}
                thread = None
                cpu0, (bytes0, calls0) = cpu_seconds(proc.pid), written(proc.pid)
                t0 = time.monotonic()
                if target is not None:
                    thread = threading.Thread(target=client, args=(port, target, stop, counts))
                    thread.start()
                time.sleep(args.seconds)
                stop.set()
                if thread is not None:
                    thread.join()
                elapsed = time.monotonic() - t0
                cpu = cpu_seconds(proc.pid) - cpu0
                bytes1, calls1 = written(proc.pid)
                print(
                    f"| {name} | {100 * cpu / elapsed:.1f} | {counts['requests'] / elapsed:.1f} "
                    f"| {counts['fresh'] / elapsed:.1f} | {(calls1 - calls0) / elapsed:.1f} "
                    f"| {(bytes1 - bytes0) / elapsed / 1000:.1f} |"
                )
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
