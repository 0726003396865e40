"""The whole exporter's cost as the node's processes grow, in job cgroups and outside.

For each process count, the script forks that many processes, either spread over job
cgroups (20 per job, so ~100 jobs at 2,000, in Slurm's layout: real cgroups made under
this machine's cgroup v1 cpuacct and memory hierarchies, or v2) or left where they are;
each job holds memory, and one process of each uses a little CPU once the exporter
measures, so that every job has series (see Workers). It starts the exporter (`python -m
wattprint`, no GPU, CPU and memory model, static carbon, 1 Hz sampling) and counts its
CPU time over --window seconds while it and node_exporter are both scraped every
--scrape-every seconds (1). --baseline-rev runs the exporter of an earlier commit too, in
the same runs, interleaved. Each run measures every size in turn (in reverse order every
other run), and the cost at each size against the first size is printed both as the
ratio of the medians and as the median of each run's own ratio. Every figure is min /
median / max of --runs runs. Before all that: RSS at start, the
time from exec to the first /metrics 200 and to the first /metrics with measurements in
it (the first sample done), median of --starts, for each exporter. Both trees are
compiled to bytecode first, as an installed package is (pip compiles a wheel's modules;
without it every start compiles them).

Needs root (to make cgroups) and the Debian package prometheus-node-exporter;
--codecarbon-python PYTHON adds codecarbon's EmissionsTracker (measuring every 1 s)
from that interpreter. Run it on an otherwise idle machine: it measures CPU time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import record

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

PER_JOB = 20
WORKER_MEMORY = 256 * 1024
WORKER_CPU_S = 0.03  # three 10 ms ticks: enough for a job's CPU share to show
CGROUP = "/sys/fs/cgroup"
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CpuClock:
    """A measured process's CPU time to the microsecond, from a cgroup of its own (v1
    cpuacct.usage, v2 cpu.stat), its children's included. /proc/PID/stat counts 10 ms
    ticks: 0.1 % of a core over a 10 s window, as coarse as the figures compared.
    Without a cgroup hierarchy it can write to, the ticks it is."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.v1 = False
        for v1 in (Path(CGROUP, "cpuacct"), Path(CGROUP, "cpu,cpuacct")):
            if (v1 / "cpuacct.usage").exists():
                self.root, self.v1 = v1 / "wattprint_bench_cpu", True
                break
        else:
            if Path(CGROUP, "cgroup.controllers").exists():
                self.root = Path(CGROUP, "wattprint_bench_cpu")
        if self.root is not None:
            try:
                self.root.mkdir(exist_ok=True)
            except OSError:  # not root, or a read-only cgroupfs
                self.root = None
        # (pid, start time): the benchmark forks tens of thousands of processes, so a
        # PID comes round again, and a new process must get a cgroup of its own.
        self.tracked: dict[tuple[int, int], Path] = {}

    @property
    def resolution(self) -> str:
        return "1 us (a cgroup per process)" if self.root else f"1/{TICK} s (/proc/PID/stat)"

    def seconds(self, pid: int) -> float:
        if self.root is None:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / TICK
        start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        where = self.tracked.get((pid, start))
        if where is None:
            where = self.tracked[(pid, start)] = self.root / f"{pid}-{start}"
            where.mkdir(exist_ok=True)
            (where / "cgroup.procs").write_text(str(pid))  # all its threads move with it
        if self.v1:
            return int((where / "cpuacct.usage").read_text()) / 1e9
        for line in (where / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        raise RuntimeError(f"no usage_usec in {where}/cpu.stat")

    def remove(self) -> None:
        """The cgroups made; call once their processes have exited."""
        for where in [*self.tracked.values(), *([self.root] if self.root else [])]:
            with contextlib.suppress(OSError):
                where.rmdir()
        self.tracked = {}


CLOCK = CpuClock()


def cpu_seconds(pid: int) -> float:
    return CLOCK.seconds(pid)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def get(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            r.read()
            return bool(r.status == 200)
    except OSError:
        return False


def wait_ready(url: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if get(url):
            return
        time.sleep(0.002)
    raise RuntimeError(f"{url} not ready")


# -- processes and cgroups --------------------------------------------------------------


class JobCgroups:
    """Slurm-style job cgroups: v1 cpuacct + memory (jobacct_gather/cgroup), or v2."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        if "memory" in _read(f"{CGROUP}/cgroup.controllers"):
            self.roots = [Path(CGROUP)]
            for control in ("cgroup.subtree_control",):
                with contextlib.suppress(OSError):
                    Path(CGROUP, control).write_text("+cpu +memory")
        else:
            self.roots = [Path(CGROUP, "cpuacct"), Path(CGROUP, "memory")]
            if not all(r.is_dir() for r in self.roots):
                raise SystemExit("no cgroup v2 memory controller nor v1 cpuacct + memory")

    def place(self, pids: list[int]) -> int:
        jobs = 0
        for start in range(0, len(pids), PER_JOB):
            jobs += 1
            for root in self.roots:
                job = root / "slurm_bench" / "uid_0" / f"job_{900000 + jobs}"
                task = job / "step_0" / "task_0"
                task.mkdir(parents=True, exist_ok=True)
                if job not in self.dirs:
                    self.dirs.append(job)
                for pid in pids[start : start + PER_JOB]:
                    (task / "cgroup.procs").write_text(str(pid))
        return jobs

    def remove(self) -> None:
        for job in self.dirs:
            for d in sorted(job.rglob("*"), key=lambda p: -len(p.parts)):
                if d.is_dir():
                    with contextlib.suppress(OSError):
                        d.rmdir()
            with contextlib.suppress(OSError):
                job.rmdir()
        for root in self.roots:
            for d in (root / "slurm_bench" / "uid_0", root / "slurm_bench"):
                with contextlib.suppress(OSError):
                    d.rmdir()
        self.dirs = []


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


class Workers:
    """count processes in groups of PER_JOB, each group sharing a pipe: one byte read from
    it tells whichever of them reads it to allocate and touch WORKER_MEMORY bytes (b"m"),
    to use WORKER_CPU_S of CPU (b"c") or only to wake (b"w"); end of file, to exit. A
    group (a job) holds WORKER_MEMORY for each b"m" written to it, in whichever processes
    read them. Idle otherwise, as most of a node's processes are, but like a job's
    processes they hold memory and, now and then, use CPU: without that a job cgroup's
    charge is 0 (a process moved into a v1 memory cgroup leaves its charge behind, and
    v2 never moves charges) and its CPU time does not move, so no job gets a series and
    the per-job export would go unmeasured."""

    def __init__(self, count: int) -> None:
        self.pids: list[int] = []
        self.groups: list[tuple[list[int], int]] = []
        for start in range(0, count, PER_JOB):
            r, w = os.pipe()
            group: list[int] = []
            for _ in range(min(PER_JOB, count - start)):
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child
                    try:  # never back into the parent's code (its cleanup) on an error
                        os.close(w)
                        _work(r)
                    finally:
                        os._exit(0)
                group.append(pid)
            os.close(r)
            self.pids += group
            self.groups.append((group, w))

    def tell(self, what: bytes, per_group: int) -> None:
        for group, w in self.groups:
            os.write(w, what * min(per_group, len(group)))

    def end(self) -> None:
        for _, w in self.groups:
            os.close(w)
        for pid in self.pids:
            os.waitpid(pid, 0)


def _work(r: int) -> None:
    held = []
    while True:
        what = os.read(r, 1)
        if what == b"m":
            held.append(b"x" * WORKER_MEMORY)  # written, so resident and charged
        elif what == b"c":
            end = time.thread_time() + WORKER_CPU_S
            while time.thread_time() < end:
                pass
        elif not what:
            os._exit(0)
        # b"w": only woken, which is enough for its job's CPU time to move


@contextlib.contextmanager
def processes(count: int, cgroups: JobCgroups | None) -> Iterator[Workers]:
    workers = Workers(count)
    try:
        jobs = cgroups.place(workers.pids) if cgroups is not None else 0
        assert cgroups is None or jobs == len(workers.groups)
        workers.tell(b"m", PER_JOB)  # after the move: charged to the job's cgroup
        yield workers
    finally:
        try:
            workers.end()
        finally:  # made again at every run: none may be left behind
            if cgroups is not None:
                cgroups.remove()


# -- the things measured ----------------------------------------------------------------


class Exporter:
    def __init__(self, name: str, source: Path, tmp: Path) -> None:
        self.name, self.source, self.tmp = name, source, tmp

    def command(self, port: int) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ, PYTHONPATH=str(self.source / "exporter"))
        state = self.tmp / f"{self.name}-{port}.json"
        return [
            sys.executable,
            "-m",
            "wattprint",
            "--gpu.source=none",
            "--carbon.zone=DE",
            "--sample.interval=1s",
            "--log.level=warn",
            f"--state.file={state}",
            f"--web.listen-address=127.0.0.1:{port}",
        ], env


@contextlib.contextmanager
def started(cmd: list[str], env: dict[str, str] | None, url: str | None) -> Iterator[int]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if url is not None:
            wait_ready(url)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


CODECARBON = """
import sys, time
from codecarbon import EmissionsTracker
t = EmissionsTracker(measure_power_secs=1, save_to_file=False, log_level="error")
t.start()
print("ready", flush=True)
time.sleep(10**6)
"""


def cost(pid: int, window: float, scrape: list[str], every: float = 1.0) -> float:
    """Percent of one core the process used over window, scraping every `every` s."""
    time.sleep(3)  # past start-up and the first samples
    c0, t0 = cpu_seconds(pid), time.monotonic()
    while time.monotonic() - t0 < window:
        for url in scrape:
            get(url)
        time.sleep(max(0.0, every - (time.monotonic() - t0) % every))
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0) * 100


def fmt(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--procs", type=int, nargs="+", default=[100, 500, 2000, 5000])
    # At least LIST_EVERY_S (60 s): a shorter window may hold no listing of /proc.
    parser.add_argument("--window", type=float, default=60, help="seconds per measurement")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--baseline-rev", help="also run the exporter of this git commit")
    parser.add_argument("--codecarbon-python", help="a python with codecarbon installed")
    parser.add_argument("--placements", nargs="+", default=["cgroups", "outside"])
    parser.add_argument(
        "--scrape-every", type=float, default=1.0, help="seconds between scrapes (1)"
    )
    record.add_option(parser)
    args = parser.parse_args()
    if not args.scrape_every > 0:
        parser.error("--scrape-every must be more than 0 seconds")
    record.start(args.results)

    node_exporter = shutil.which("prometheus-node-exporter")
    if node_exporter is None:
        print("prometheus-node-exporter not installed: apt-get install prometheus-node-exporter")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        exporters = [Exporter("this tree", REPO, tmp)]
        if args.baseline_rev:
            base = tmp / "baseline"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.baseline_rev, "exporter"],
                check=True,
                capture_output=True,
            ).stdout
            archive_path = tmp / "baseline.tar"
            archive_path.write_bytes(archive)
            with tarfile.open(archive_path) as tar:
                tar.extractall(base, filter="data")
            exporters.append(Exporter(f"{args.baseline_rev[:10]}", base, tmp))

        startup(exporters, args.starts)

        ne_port = free_port()
        ne_url = f"http://127.0.0.1:{ne_port}/metrics"
        with contextlib.ExitStack() as stack:
            stack.callback(CLOCK.remove)  # last: after every measured process has exited
            others: dict[str, tuple[int, str | None]] = {}
            if node_exporter:
                pid = stack.enter_context(
                    started(
                        [node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"], None, ne_url
                    )
                )
                others["node_exporter"] = (pid, ne_url)
            if args.codecarbon_python:
                proc = subprocess.Popen(
                    [args.codecarbon_python, "-c", CODECARBON],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                stack.callback(proc.wait)  # exited before its cgroup is removed
                stack.callback(proc.kill)
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                others["codecarbon"] = (proc.pid, None)
            scale(exporters, others, args)
    return 0


def measured(url: str, timeout: float = 60) -> None:
    """Wait until /metrics carries the devices: the exporter's first sample is done."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if b"wattprint_measurement_info{" in r.read():
                    return
        except OSError:
            pass
        time.sleep(0.002)
    raise RuntimeError(f"{url} never served measurements")


def startup(exporters: list[Exporter], starts: int) -> None:
    print(f"\nStart-up (median of {starts}; no GPU, static carbon)\n")
    print(
        "| exporter | first /metrics 200 after exec, ms | first /metrics with measurements, "
        "ms (min / median / max) | RSS at start, MB |"
    )
    print("|---|---|---|---|")
    for exporter in exporters:
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(exporter.source / "exporter")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    times: dict[str, list[float]] = {e.name: [] for e in exporters}
    data: dict[str, list[float]] = {e.name: [] for e in exporters}
    rss: dict[str, list[float]] = {e.name: [] for e in exporters}
    # Starts interleaved, in turn, as the runs below: the machine's drift over the
    # minute this takes falls on every exporter alike.
    for start in range(starts):
        for exporter in exporters if start % 2 == 0 else exporters[::-1]:
            port = free_port()
            cmd, env = exporter.command(port)
            url = f"http://127.0.0.1:{port}/metrics"
            t0 = time.monotonic()
            with started(cmd, env, url) as pid:
                times[exporter.name].append((time.monotonic() - t0) * 1000)
                measured(url)
                data[exporter.name].append((time.monotonic() - t0) * 1000)
                time.sleep(1.5)
                rss[exporter.name].append(rss_mb(pid))
    for name in times:
        memory = statistics.median(rss[name])
        print(f"| {name} | {fmt(times[name])} | {fmt(data[name])} | {memory:.1f} |")


def scale(
    exporters: list[Exporter], others: dict[str, tuple[int, str | None]], args: argparse.Namespace
) -> None:
    cgroups = JobCgroups() if "cgroups" in args.placements else None
    cases = [(count, placement) for count in args.procs for placement in args.placements]
    figures: dict[tuple[int, str], dict[str, list[float]]] = {}
    rss: dict[tuple[int, str], dict[str, float]] = {}
    where: dict[tuple[int, str], str] = {}
    every = args.scrape_every
    names = [e.name for e in exporters]
    # Each run measures every size in turn, with processes made afresh, so that the ratio
    # of one size to another is taken minutes apart, not a size's whole block of runs
    # apart: drift slower than a run (other tenants, kernel threads) largely cancels in
    # each run's own ratio. Every other run goes in reverse order, so that a steady drift
    # within runs does not always fall the same way.
    for run in range(args.runs):
        for case in cases if run % 2 == 0 else cases[::-1]:
            count, placement = case
            row = figures.setdefault(case, {name: [] for name in [*names, *others]})
            in_jobs = cgroups if placement == "cgroups" else None
            with processes(count, in_jobs) as workers:
                jobs = len(workers.groups) if in_jobs is not None else 0
                for exporter in exporters:  # interleaved: same machine state
                    port = free_port()
                    url = f"http://127.0.0.1:{port}/metrics"
                    cmd, env = exporter.command(port)
                    with started(cmd, env, url) as pid:
                        # Once it measures, a process of each job uses CPU: every job
                        # then has CPU and memory series, as on a working node.
                        measured(url)
                        workers.tell(b"c", 1)
                        scrape = [url] + [u for _, u in others.values() if u]
                        row[exporter.name].append(cost(pid, args.window, scrape, every))
                        rss.setdefault(case, {})[exporter.name] = rss_mb(pid)
                for name, (pid, other) in others.items():
                    row[name].append(cost(pid, args.window, [other] if other else [], every))
            where[case] = f"in {jobs} job cgroups" if placement == "cgroups" else "outside cgroups"
            done = f"... run {run + 1}: {count} processes {where[case]}: " + ", ".join(
                f"{name} {values[-1]:.2f} %" for name, values in row.items()
            )
            print(done, file=sys.stderr, flush=True)

    print(
        f"\nCPU, % of one core at 1 Hz sampling, scraped every {every:g} s "
        f"(min / median / max of {args.runs} runs of {args.window:g} s; CPU time to "
        f"{CLOCK.resolution})\n"
    )
    columns = ["processes", "where", *names, "RSS MB", *others]
    columns += [f"{names[0]} / {o}" for o in others]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for case in cases:
        row = figures[case]
        medians = {k: statistics.median(v) for k, v in row.items()}
        cells = [fmt(row[n]) for n in names]
        cells.append(" / ".join(f"{rss[case][n]:.0f}" for n in names))
        cells += [fmt(row[o]) for o in others]
        cells += [f"{medians[names[0]] / max(medians[o], 1e-9):.2f}x" for o in others]
        print(f"| {case[0]} | {where[case]} | " + " | ".join(cells) + " |")
    print(
        f"\nCost at each size / the same placement at {args.procs[0]} processes: the ratio "
        "of the medians, and the median (min / max) of each run's own ratio"
    )
    for name in names:
        print(f"\n{name}:")
        for count, placement in cases:
            mine = figures[(count, placement)][name]
            base = figures[(args.procs[0], placement)][name]
            paired = [a / max(b, 1e-9) for a, b in zip(mine, base, strict=True)]
            print(
                f"- {count} processes {where[(count, placement)]}: "
                f"{statistics.median(mine) / max(statistics.median(base), 1e-9):.2f}x; "
                f"per run {statistics.median(paired):.2f}x ({min(paired):.2f} / {max(paired):.2f})"
            )


if __name__ == "__main__":
    sys.exit(main())
