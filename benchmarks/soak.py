"""Soak: the real exporter process for --minutes under churn and injected faults.

    python benchmarks/soak.py [--minutes 30] [--speed 20] [--procs-per-minute 1000]

The exporter runs as `wattprint` in a child process, with only pynvml replaced by a fake
that plays the recorded H200 trace (tests/fixtures/h200/phased-load.jsonl) on two
GPUs at --speed, looping, the energy counter rising across loops. Everything else is
the production code path, pointed at trees and servers this script changes underneath:

- /proc: a fixture tree where --procs-per-minute short-lived processes (2-20 s) start
  and end, with PIDs reused after a minute, tagged by WATTPRINT_WORKLOAD themselves, by
  inheritance from a tagged parent, or not at all; some hold the GPUs;
- sysfs: RAPL package and dram zones whose energy_uj rise at --speed and wrap;
- GPUs: at random one is lost for 5-40 s, sometimes both (NVML reopens), and half the
  time it comes back after a driver reload (the raw counter restarts near 0);
- carbon: the uk-grid provider against a local server that at random goes down for
  30-120 s (503, 429 with Retry-After, timeouts, invalid JSON, a trickled body);
- restarts: every 2-5 minutes the exporter is killed with SIGKILL and started again
  1-20 s later over its state file, while the fake GPUs' counters go on.

At each restart it compares what the device counters gained across the outage (from
the last stamped sample before the kill to the first after the restart) with what the
fake GPUs' raw counters gained between those times: the difference is lost joules.

Every second it scrapes /metrics and checks that no counter went down and that, per
component and GPU, the workload and unattributed counters add up to the device counters
(docs/metrics.md invariant 1; tests/faults/faultrig.py ScrapeLedger). Every minute
it records the exporter's CPU, RSS, threads and open files and prints a table.
Targets: RSS growth <= 5 MB after minute 5, flat threads and fds, no crash, no
conservation failure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))


from carbon_fakes import FakeApi, Reply, uk_national_body  # noqa: E402
from fake_nvml import FakeNvml  # noqa: E402
from procfs_fixture import stat_line  # noqa: E402

# What a restarted exporter continues from its state file.
CONTINUED_COUNTERS = ("_joules_total", "_grams_total", "wattprint_restarts_total")
TRACE_HZ = 10  # the trace has a sample every 100 ms
CLK_TCK = 100
NODE_CPUS = 256
GPUS = 2
PID_BASE = 20_000
PID_RANGE = 1_000  # PIDs are handed out again after this many processes
SYS_FIXTURE = REPO / "tests" / "fixtures" / "sys" / "intel-2pkg"
RAPL_WATTS = {"package": 250.0, "dram": 40.0}

# -- the child: wattprint with a fake pynvml --------------------------------------------


class SoakNvml(FakeNvml):
    """The trace at `speed`, looping; GPUs lost, reset and busy as the control file says."""

    control: Path
    speed: float
    started: float
    _mtime: int = -1
    _state: dict[str, Any]
    _reset_base: dict[int, int]
    _resets_seen: dict[int, int]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        # The trace plays at `speed`: so does the power the counter implies.
        return int(700_000 * self.speed)

    def _sync(self) -> None:
        try:
            mtime = os.stat(self.control).st_mtime_ns
            if mtime != self._mtime:
                self._state = json.loads(self.control.read_text())
                self._mtime = mtime
        except (OSError, ValueError):
            pass  # mid-write: keep the previous state
        samples = self.gpus[0].samples
        elapsed = int((time.monotonic() - self.started) * TRACE_HZ * self.speed)
        loops, self.position = divmod(elapsed, len(samples))
        span = samples[-1]["energy_mj"] - samples[0]["energy_mj"]
        lost = set(self._state.get("lost", []))
        for gpu in self.gpus:
            looped = loops * span
            # Driver reloads: the parent says from which raw value the counter restarted,
            # so that a restarted exporter process sees the same counter.
            base = int(self._state.get("reset_base", {}).get(str(gpu.index), 0))
            gpu.energy_offset_mj = looped - base
        self.faults = {i: self.NVMLError_GpuIsLost for i in lost}

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._sync()
        return super().nvmlDeviceGetPowerUsage(handle)

    def _pids(self, handle: int) -> list[int]:
        self._entry(handle)  # a lost GPU fails here too
        return [int(p) for p in self._state.get("gpu_pids", {}).get(str(handle), [])]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(
                pid=pid,
                usedGpuMemory=1 << 30,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for pid in self._pids(handle)
        ]

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen: int) -> list[Any]:
        pids = self._pids(handle)
        if not pids:
            raise self.NVMLError_NotFound()
        return [
            SimpleNamespace(
                pid=pid,
                timeStamp=self.position + 1,
                smUtil=(pid * 7 + self.position) % 100,
                memUtil=0,
                encUtil=0,
                decUtil=0,
            )
            for pid in pids
        ]


def raw_energy_mj(samples: list[dict[str, Any]], speed: float, since_start: float) -> int:
    """The fake GPU counter (before driver reloads) `since_start` seconds in."""
    elapsed = int(since_start * TRACE_HZ * speed)
    loops, position = divmod(elapsed, len(samples))
    span = samples[-1]["energy_mj"] - samples[0]["energy_mj"]
    return int(samples[position]["energy_mj"]) + loops * span


def child(control: Path, speed: float, started: float, flags: list[str]) -> int:
    # The node's wall clock: what clock.json says it is shifted by (the parent steps it),
    # on a node whose kernel says a time daemon keeps the clock. Patched before
    # wattprint's modules bind time.time as a default argument.
    shift = {"s": 0.0}
    clock_file = control.with_name("clock.json")
    real_time = time.time

    def follow_clock() -> None:
        while True:
            time.sleep(0.01)
            try:
                shift["s"] = float(json.loads(clock_file.read_text())["shift"])
            except (OSError, ValueError, KeyError):
                continue

    time.time = lambda: real_time() + shift["s"]
    import threading

    import wattprint.sampler.clock
    from wattprint.core.model import KernelClock

    wattprint.sampler.clock.read_kernel_clock = lambda: KernelClock(True, 0.05)
    threading.Thread(target=follow_clock, daemon=True).start()
    fake = SoakNvml(gpus=FakeNvml.from_trace(copies=GPUS).gpus)
    # The clock is system-wide: a restarted child plays on from where the first began.
    fake.control, fake.speed, fake.started = control, speed, started
    fake._state, fake._reset_base, fake._resets_seen = {}, {}, {}
    sys.modules["pynvml"] = fake  # type: ignore[assignment]
    from wattprint.cli.main import main as wattprint_main

    return wattprint_main(flags)


# -- the parent: the node changing underneath -------------------------------------------


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass
class Proc:
    pid: int
    ppid: int
    start: int
    ends_at: float
    environ: dict[str, str]
    ticks: int = 0
    rss_pages: int = 0
    tagged: bool = False


class ProcTree:
    """A /proc where processes come and go, atomically as the kernel shows them."""

    def __init__(self, root: Path, speed: float, rng: random.Random) -> None:
        self.root = root
        self.staging = root.parent / "proc-staging"
        self.staging.mkdir()
        root.mkdir()
        self.speed = speed
        self.rng = rng
        self.live: dict[int, Proc] = {}
        self.node_ticks = 10_000_000
        self.serial = 0
        self.started_total = 0
        (root / "meminfo").write_text("MemTotal:       2113418000 kB\nMemFree: 1 kB\n")
        boot_id = root / "sys" / "kernel" / "random" / "boot_id"
        boot_id.parent.mkdir(parents=True)
        boot_id.write_text("5f1c1d7e-2b8e-4a53-9a57-1f0e6f2f8c11\n")
        self._write_node_stat()

    def _write_node_stat(self) -> None:
        busy = sum(p.ticks for p in self.live.values())
        idle = max(self.node_ticks - busy, 0)
        write_atomic(self.root / "stat", f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\n".encode())

    def _stat(self, p: Proc) -> bytes:
        return stat_line(p.pid, "trainer", p.ppid, p.ticks, 0, p.start, p.rss_pages).encode()

    def spawn(self, now: float) -> None:
        pid = PID_BASE + self.serial % PID_RANGE
        self.serial += 1
        self.started_total += 1
        if pid in self.live:  # still running a minute later: let it go now
            self.end(pid)
        roll = self.rng.random()
        parents = [p for p in self.live.values() if p.tagged and p.ppid == 1]
        environ = {"PATH": "/usr/bin"}
        ppid = 1
        if roll < 0.6:
            environ["WATTPRINT_WORKLOAD"] = f"job-{self.serial // 25}"
        elif roll < 0.9 and parents:
            ppid = self.rng.choice(parents).pid  # inherits its parent's workload
        proc = Proc(
            pid=pid,
            ppid=ppid,
            start=self.node_ticks // NODE_CPUS,
            ends_at=now + self.rng.uniform(2, 20),
            environ=environ,
            rss_pages=self.rng.randint(1_000, 500_000),
            tagged=roll < 0.9,
        )
        stage = self.staging / str(pid)
        stage.mkdir()
        (stage / "stat").write_bytes(self._stat(proc))
        (stage / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
        (stage / "environ").write_bytes(
            b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items())
        )
        os.rename(stage, self.root / str(pid))
        self.live[pid] = proc

    def end(self, pid: int) -> None:
        del self.live[pid]
        gone = self.staging / f"gone-{pid}"
        os.rename(self.root / str(pid), gone)
        shutil.rmtree(gone)

    def tick(self, now: float, dt: float) -> None:
        for pid in [p.pid for p in self.live.values() if p.ends_at <= now]:
            self.end(pid)
        self.node_ticks += int(NODE_CPUS * CLK_TCK * self.speed * dt)
        for p in self.live.values():
            p.ticks += int(self.rng.random() * CLK_TCK * self.speed * dt)
            write_atomic(self.root / str(p.pid) / "stat", self._stat(p))
        self._write_node_stat()

    def gpu_candidates(self) -> list[int]:
        return [p.pid for p in self.live.values() if p.tagged]


class Rapl:
    """RAPL zones whose counters rise at `speed` and wrap at max_energy_range_uj."""

    def __init__(self, root: Path, speed: float) -> None:
        shutil.copytree(SYS_FIXTURE, root)
        self.speed = speed
        self.zones = []
        for zone in sorted((root / "class" / "powercap").glob("intel-rapl:*")):
            name = (zone / "name").read_text().strip()
            watts = RAPL_WATTS["dram" if name == "dram" else "package"]
            wrap = int((zone / "max_energy_range_uj").read_text())
            self.zones.append((zone / "energy_uj", watts, wrap))

    def tick(self, dt: float) -> None:
        for path, watts, wrap in self.zones:
            value = int(path.read_text()) + int(watts * 1e6 * dt * self.speed)
            write_atomic(path, f"{value % wrap}\n".encode())


class Carbon:
    """A uk-grid API that goes down at random, in a random way, and comes back."""

    def __init__(self, rng: random.Random) -> None:
        self.api = FakeApi()
        self.rng = rng
        self.down = False
        self.switch_at = 0.0
        self.outages = 0
        self.kinds: dict[str, int] = defaultdict(int)

    def tick(self, now: float) -> None:
        if now < self.switch_at:
            return
        if self.down or not self.switch_at:
            self.down = False
            grams = self.rng.uniform(80, 250)
            self.api.on("/intensity", Reply(200, uk_national_body(None, grams, time.time() - 60)))
            self.switch_at = now + self.rng.uniform(60, 240)
            return
        self.down = True
        self.outages += 1
        kind = self.rng.choice(["503", "429", "timeout", "invalid_json", "trickle"])
        self.kinds[kind] += 1
        reply = {
            "503": Reply(503, {"error": "unavailable"}),
            "429": Reply(429, {"error": "slow down"}, headers={"Retry-After": "20"}),
            "timeout": Reply(200, {}, delay_s=15),
            "invalid_json": Reply(200, "<html>maintenance</html>"),
            "trickle": Reply(200, uk_national_body(None, 150, time.time()), trickle_s=0.5),
        }[kind]
        self.api.on("/intensity", reply)
        self.switch_at = now + self.rng.uniform(30, 120)


@dataclass
class Restart:
    down_s: float
    before: dict[str, tuple[float, float]]  # GPU -> (sample stamp, device joules)
    after: dict[str, tuple[float, float]] = field(default_factory=dict)
    skip: set[int] = field(default_factory=set)  # GPUs lost or reloaded around the outage


def device_stamps(text: str) -> dict[str, tuple[float, float]]:
    """Each GPU's device counter and the time its sample was taken (its stamp)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        if family.name != "wattprint_gpu_energy_joules":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.timestamp is not None:
                out[sample.labels["gpu"]] = (float(sample.timestamp), sample.value)
    return out


def report_restarts(restarts: list[Restart], gpus: Gpus, last: Any) -> list[str]:
    """Lost joules: the raw counters' rise across each outage less the device counters'."""
    from faults.faultrig import value

    problems = []
    worst = 0.0
    checked = 0
    offset = time.time() - time.monotonic()  # stamps are wall time; the fake runs on monotonic
    for number, r in enumerate(restarts, start=1):
        for gpu, (t0, j0) in r.before.items():
            if gpu not in r.after or int(gpu) in r.skip:
                continue
            t1, j1 = r.after[gpu]
            checked += 1
            raw = gpus.raw_between(int(gpu), t0 - offset, t1 - offset)
            lost = raw - (j1 - j0)
            worst = max(worst, abs(lost))
            # One fake-trace step is the raw counter's resolution.
            if abs(lost) > gpus.step_joules():
                problems.append(f"restart {number}, GPU {gpu}: {lost:+.1f} J lost")
    resumed = value(last, "wattprint_restarts_total", outcome="resumed") if last else 0
    fresh = value(last, "wattprint_restarts_total", outcome="fresh") if last else 0
    downs = [r.down_s for r in restarts] or [0.0]
    print(
        f"restarts: {len(restarts)} (SIGKILL, down {min(downs):.0f}-{max(downs):.0f} s); "
        f"resumed {resumed:g}, fresh {fresh:g}; largest |lost joules| per GPU and restart "
        f"{worst:.1f} J (resolution {gpus.step_joules():.0f} J) over {checked} GPU outages "
        "with stamped samples on both sides (unstamped stretches after a clock step, and "
        "GPUs lost or reloaded meanwhile, are not checked)"
    )
    return problems


@dataclass
class Gpus:
    control: Path
    rng: random.Random
    lost: dict[int, float] = field(default_factory=dict)  # GPU -> back at
    resets: dict[int, int] = field(default_factory=dict)
    pids: dict[int, list[int]] = field(default_factory=dict)
    next_fault: float = 0.0
    next_holders: float = 0.0
    losses: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)
    speed: float = 1.0
    started: float = 0.0
    reset_base: dict[int, int] = field(default_factory=dict)
    reset_at: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, GPU)

    def raw(self, gpu: int, at: float) -> int:
        """The fake GPU's raw counter (mJ) at monotonic time `at`."""
        return raw_energy_mj(self.samples, self.speed, at - self.started)

    def raw_between(self, gpu: int, start: float, end: float) -> float:
        return (self.raw(gpu, end) - self.raw(gpu, start)) / 1000

    def step_joules(self) -> float:
        """The most one trace step adds: the raw counter's resolution at this speed."""
        rises = [b["energy_mj"] - a["energy_mj"] for a, b in zip(self.samples, self.samples[1:])]
        return 2 * max(rises) / 1000

    def tick(self, now: float, candidates: list[int]) -> None:
        changed = False
        for gpu, back_at in list(self.lost.items()):
            if now >= back_at:
                del self.lost[gpu]
                if self.rng.random() < 0.5:
                    self.resets[gpu] = self.resets.get(gpu, 0) + 1
                    self.reset_base[gpu] = self.raw(gpu, now)
                changed = True
        if now >= self.next_fault:
            self.next_fault = now + self.rng.uniform(20, 90)
            victims = range(GPUS) if self.rng.random() < 0.3 else [self.rng.randrange(GPUS)]
            for gpu in victims:
                self.lost.setdefault(gpu, now + self.rng.uniform(5, 40))
                self.losses += 1
            changed = True
        if now >= self.next_holders:
            self.next_holders = now + self.rng.uniform(3, 10)
            for gpu in range(GPUS):
                count = self.rng.choice([0, 1, 1, 2, 4])
                self.pids[gpu] = self.rng.sample(candidates, min(count, len(candidates)))
            changed = True
        if changed:
            state = {
                "lost": sorted(self.lost),
                "resets": {str(g): n for g, n in self.resets.items()},
                "reset_base": {str(g): b for g, b in self.reset_base.items()},
                "gpu_pids": {str(g): p for g, p in self.pids.items()},
            }
            write_atomic(self.control, json.dumps(state).encode())


# -- checking the exporter --------------------------------------------------------------


def proc_usage(pid: int) -> tuple[float, float, int, int]:
    """(CPU seconds, RSS MiB, threads, open fds) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    rss = int(status["VmRSS"].split()[0]) / 1024
    threads = int(status["Threads"])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return cpu, rss, threads, fds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Minute:
    minute: int
    cpu_pct: float
    rss_mib: float
    threads: int
    fds: int
    scrapes: int
    failures: int
    workload_series: int
    nvml_errors: float
    carbon_errors: float


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--speed", type=float, default=20.0)
    parser.add_argument("--procs-per-minute", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temporary tree and log")
    parser.add_argument("--no-restarts", action="store_true", help="never kill the exporter")
    parser.add_argument("--restart-every", default="120,300", help="seconds between kills: MIN,MAX")
    parser.add_argument(
        "--clock-step-every",
        default="240,480",
        help="seconds between wall-clock steps (+1 h for 13 s, then back): MIN,MAX",
    )
    parser.add_argument("--child", metavar="CONTROL", help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, default=0.0, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        flags = [a for a in rest if a != "--"]
        return child(Path(args.child), args.speed, args.started, flags)
    # The checks import pytest and the whole exporter: the parent's business only, so
    # that the child's RSS is the exporter's own.
    sys.path.insert(0, str(REPO / "tests"))
    from faults.faultrig import ScrapeLedger, Series, parse, value

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="wattprint-soak-"))
    procs = ProcTree(work / "proc", args.speed, rng)
    rapl = Rapl(work / "sys", args.speed)
    carbon = Carbon(rng)
    control = work / "control.json"
    gpus = Gpus(control, rng)
    gpus.samples = FakeNvml.from_trace(copies=1).gpus[0].samples
    gpus.speed = args.speed
    now = time.monotonic()
    gpus.started = now
    carbon.tick(now)
    gpus.next_fault = now + 30
    gpus.tick(now, [])
    port = free_port()
    flags = [
        f"--web.listen-address=127.0.0.1:{port}",
        "--gpu.source=nvml",
        "--cpu.source=rapl",
        "--memory.source=rapl",
        f"--path.sysfs={work / 'sys'}",
        f"--path.procfs={work / 'proc'}",
        "--carbon.provider=uk-grid",
        "--carbon.zone=GB",
        f"--carbon.api-url={carbon.api.url}",
        "--carbon.refresh-interval=10s",
        "--carbon.fallback-after=1m",
        "--sample.interval=50ms",
        "--workload.retention=2m",
        f"--state.file={work / 'state' / 'state.json'}",
    ]
    log_path = work / "exporter.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATTPRINT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "exporter"), env.get("PYTHONPATH", "")])

    def launch() -> subprocess.Popen[bytes]:
        command = [sys.executable, __file__, f"--child={control}", f"--speed={args.speed}"]
        command += [f"--started={gpus.started!r}", "--", *flags]
        with open(log_path, "ab") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_up(proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                if session.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text(), file=sys.stderr)
                raise SystemExit("the exporter did not come up")
            time.sleep(0.05)

    url = f"http://127.0.0.1:{port}"
    session = requests.Session()
    session.trust_env = False
    exporter = launch()
    wait_up(exporter)
    restarts: list[Restart] = []
    kill_range = tuple(float(x) for x in args.restart_every.split(","))
    step_range = tuple(float(x) for x in args.clock_step_every.split(","))
    clock_file = work / "clock.json"
    write_atomic(clock_file, b'{"shift": 0}')
    next_step = time.monotonic() + rng.uniform(*step_range)
    step_back_at = math.inf
    clock_steps = 0
    next_kill = math.inf if args.no_restarts else time.monotonic() + rng.uniform(*kill_range)
    stamped: dict[str, tuple[float, float]] = {}  # GPU -> (stamp, joules) of the last scrape

    start = time.monotonic()
    end = start + args.minutes * 60 + 0.5  # so that the last minute is recorded
    spawn_every = 60.0 / args.procs_per_minute
    next_spawn = start
    next_scrape = start
    next_minute = start + 60
    last_tick = start
    prev: Series = {}
    ledger = ScrapeLedger()
    minutes: list[Minute] = []
    failures: list[str] = []
    scrapes = scrape_errors = minute_scrapes = minute_failures = 0
    cpu0 = proc_usage(exporter.pid)[0]
    cpu_done = 0.0  # CPU seconds of exporter processes killed during this minute
    crashed = False
    while (now := time.monotonic()) < end:
        if exporter.poll() is not None:
            crashed = True
            break
        while next_spawn <= now:
            procs.spawn(now)
            next_spawn += spawn_every
        if now - last_tick >= 0.25:
            procs.tick(now, now - last_tick)
            rapl.tick(now - last_tick)
            last_tick = now
        gpus.tick(now, procs.gpu_candidates())
        carbon.tick(now)
        if now >= next_step:
            # `date -s` an hour ahead, noticed and undone 13 s later.
            write_atomic(clock_file, b'{"shift": 3600}')
            clock_steps += 1
            step_back_at = now + 13
            next_step = now + rng.uniform(*step_range)
        if now >= step_back_at:
            write_atomic(clock_file, b'{"shift": 0}')
            step_back_at = math.inf
        if now >= next_kill:
            before = dict(stamped)
            skip = set(gpus.lost)
            resets = dict(gpus.resets)
            # The killed process's CPU this minute, before it takes its counters along.
            cpu_done += proc_usage(exporter.pid)[0] - cpu0
            exporter.send_signal(signal.SIGKILL)
            exporter.wait()
            down = rng.uniform(1, 20)
            time.sleep(down)
            exporter = launch()
            wait_up(exporter)
            gpus.tick(time.monotonic(), procs.gpu_candidates())
            skip |= set(gpus.lost) | {g for g, n in gpus.resets.items() if resets.get(g) != n}
            restarts.append(Restart(down, before, skip=skip))
            cpu0 = proc_usage(exporter.pid)[0]
            # Counters of the process itself (errors, clock steps) start again with it, a
            # reset Prometheus handles; the energy, emissions and restart counters come
            # from the state file and must not go down, so only those are checked across.
            ledger.previous = {
                k: v for k, v in ledger.previous.items() if k[0].endswith(CONTINUED_COUNTERS)
            }
            next_kill = time.monotonic() + rng.uniform(*kill_range)
            continue
        if now >= next_scrape:
            next_scrape += 1.0
            try:
                response = session.get(f"{url}/metrics", timeout=5)
                response.raise_for_status()
                cur = parse(response.text)
                stamped = device_stamps(response.text)
                if restarts and not restarts[-1].after:
                    restarts[-1].after = dict(stamped)
            except requests.RequestException as err:
                scrape_errors += 1
                failures.append(f"scrape failed: {err}")
                minute_failures += 1
            else:
                scrapes += 1
                minute_scrapes += 1
                for problem in ledger.check(cur):
                    failures.append(problem)
                    minute_failures += 1
                prev = cur
        if now >= next_minute:
            next_minute += 60
            cpu, rss, threads, fds = proc_usage(exporter.pid)
            row = Minute(
                minute=len(minutes) + 1,
                cpu_pct=100 * (cpu - cpu0 + cpu_done) / 60,
                rss_mib=rss,
                threads=threads,
                fds=fds,
                scrapes=minute_scrapes,
                failures=minute_failures,
                workload_series=sum(
                    1 for (n, _) in prev if n == "wattprint_workload_energy_joules_total"
                ),
                nvml_errors=value(prev, "wattprint_collector_errors_total", collector="nvml"),
                carbon_errors=value(prev, "wattprint_carbon_errors_total"),
            )
            minutes.append(row)
            cpu0, cpu_done = cpu, 0.0
            minute_scrapes = minute_failures = 0
            print(
                f"minute {row.minute:3d}: cpu {row.cpu_pct:5.1f}%  rss {row.rss_mib:6.1f} MiB  "
                f"threads {row.threads:3d}  fds {row.fds:3d}  series {row.workload_series:4d}  "
                f"failures {row.failures}",
                flush=True,
            )
        time.sleep(0.02)

    if not crashed:
        exporter.send_signal(signal.SIGTERM)
        try:
            exit_code = exporter.wait(timeout=15)
        except subprocess.TimeoutExpired:
            exporter.kill()
            exit_code = exporter.wait()
            failures.append("the exporter did not stop within 15 s of SIGTERM")
    else:
        exit_code = exporter.returncode
    carbon.api.close()
    log_text = log_path.read_text(errors="replace")
    report(args, minutes, scrapes, failures, crashed, exit_code, log_text, procs, gpus, carbon)
    print(f"wall-clock steps: {clock_steps} (+1 h for 13 s, then back)")
    lost = report_restarts(restarts, gpus, prev)
    failures.extend(lost)
    if args.keep:
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    ok = not crashed and not failures and exit_code == 0
    return 0 if ok else 1


def report(
    args: argparse.Namespace,
    minutes: list[Minute],
    scrapes: int,
    failures: list[str],
    crashed: bool,
    exit_code: int | None,
    log_text: str,
    procs: ProcTree,
    gpus: Gpus,
    carbon: Carbon,
) -> None:
    print()
    print(
        f"Soak: {args.minutes:g} min at {args.speed:g}x replay, 2 fake H200s, "
        f"{procs.started_total} processes started ({args.procs_per_minute}/min), "
        f"{gpus.losses} GPU losses ({sum(gpus.resets.values())} with a counter reset), "
        f"{carbon.outages} carbon provider outages ({dict(carbon.kinds)})"
    )
    print()
    print(
        "| minute | CPU % | RSS MiB | threads | open fds | workload series | scrapes | failures |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in minutes:
        print(
            f"| {m.minute} | {m.cpu_pct:.1f} | {m.rss_mib:.1f} | {m.threads} | {m.fds} | "
            f"{m.workload_series} | {m.scrapes} | {m.failures} |"
        )
    print()
    warm = [m for m in minutes if m.minute >= 5]
    lines = log_text.splitlines()
    warnings = sum("level=warn " in line for line in lines)
    errors = sum("level=error " in line or "Traceback" in line for line in lines)
    if warm:
        growth = max(m.rss_mib for m in warm) - warm[0].rss_mib
        threads = sorted({m.threads for m in warm})
        fds = sorted({m.fds for m in warm})
        print(f"RSS growth after minute 5: {growth:+.1f} MiB (target <= 5 MB)")
        print(f"threads after minute 5: {threads[0]}..{threads[-1]}; fds: {fds[0]}..{fds[-1]}")
    last = minutes[-1] if minutes else None
    if last is not None:
        print(
            f"errors counted: nvml {last.nvml_errors:g}, carbon {last.carbon_errors:g} "
            f"(collector and carbon error counters at the last minute)"
        )
    print(
        f"scrapes checked: {scrapes}; counter decreases or conservation failures: "
        f"{len(failures)}; crashed: {'yes' if crashed else 'no'}; exit code {exit_code}"
    )
    print(f"exporter log: {len(lines)} lines, {warnings} warnings, {errors} errors/tracebacks")
    for problem in failures[:10]:
        print(f"  FAIL {problem}")


if __name__ == "__main__":
    sys.exit(main())
