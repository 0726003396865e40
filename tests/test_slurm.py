"""Slurm for real (tests/slurm_cluster.py): sbatch and srun jobs on a running slurmctld,
slurmd and slurmdbd, measured by a real exporter process that names them from the
cgroups slurmd made, checked against Slurm's own accounting (sacct), and the job's
figure written into its AdminComment by `wattprint slurm-epilog`.

The machine has no RAPL: CPU energy is the TDP model's (/proc/stat utilization), which
is split among jobs by CPU time like RAPL's would be."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pm_counters_fake import PmCountersNode
from prom_harness import free_port
from slurm_cluster import NODE, SlurmCluster, slurm
from wattprint.sources.cpu_model import WATTS_PER_THREAD

__all__ = ["slurm"]  # the session's cluster, started by the first test that asks

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
INTERVAL = "250ms"
# A job's CPU load: busy for `busy` of every 50 ms, for `seconds` (from the wall-clock
# time `start`, if given: jobs that share the node then load it over the same window).
LOAD = (
    "python3 -c 'import time\n"
    "time.sleep(max({start} - time.time(), 0))\n"
    "end = max({start}, time.time()) + {seconds}\n"
    "while time.time() < end:\n"
    "    t = time.time()\n"
    "    while time.time() - t < 0.05 * {busy}: pass\n"
    "    time.sleep(0.05 * (1 - {busy}))'\n"
)

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Exporter:
    """A real exporter process on this node (no GPU, the CPU model, a state file)."""

    def __init__(self, tmp: Path, state_file: Path | None = None, *flags: str) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.url = f"http://{self.address}/metrics"
        self.log = tmp / "exporter.log"
        self.state_file = state_file
        self.flags = flags
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO / "exporter"), WATTPRINT_STATE_FILE="")
        args = [f"--state.file={self.state_file}"] if self.state_file else []
        args += self.flags
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "wattprint", f"--web.listen-address={self.address}",
                    "--gpu.source=none", "--carbon.zone=DE", f"--sample.interval={INTERVAL}",
                    *args,
                ],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                if 'scheduler="slurm"' in self.scrape_text() or self.sampled():
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, "the exporter took no sample"
            time.sleep(0.1)

    def sampled(self) -> bool:
        return "wattprint_sampler_last_success_timestamp_seconds " in self.scrape_text()

    def scrape_text(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url, timeout=5) as reply:
            return str(reply.read().decode())

    def scrape(self) -> Series:
        """Every sample of /metrics; again until no series is new (new ones show 0)."""
        seen: Series = {}
        for _ in range(5):
            series: Series = {}
            for family in text_string_to_metric_families(self.scrape_text()):
                for s in family.samples:
                    series[(s.name, frozenset(s.labels.items()))] = s.value
            if series.keys() <= seen.keys():
                return series
            seen = series
        return seen

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Exporter]:
    running = Exporter(tmp_path, tmp_path / "state" / "state.json")
    running.start()
    yield running
    running.stop()


def install_epilog(slurm: SlurmCluster, url: str) -> Path:
    """slurmd's Epilog runs deploy/slurm/epilog.sh (with this checkout's wattprint,
    reading `url`, a summary asked for) until the test ends; the path of its log."""
    wrapper = slurm.root / "bin" / "wattprint"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={REPO / "exporter"} exec {sys.executable} -m wattprint "$@"\n'
    )
    wrapper.chmod(0o755)
    log = slurm.root / "log" / "epilog.log"
    hook = slurm.root / "etc" / "epilog.sh"
    hook.write_text(
        f"#!/bin/sh\nexport WATTPRINT={wrapper} WATTPRINT_EXPORTER_URL={url} "
        f"WATTPRINT_EPILOG_LOG={log} WATTPRINT_EPILOG_SUMMARY=1 WATTPRINT_STATE_FILE=\n"
        f"exec {REPO / 'deploy' / 'slurm' / 'epilog.sh'}\n"
    )
    hook.chmod(0o755)
    return log


@pytest.fixture
def epilog_log(slurm: SlurmCluster, exporter: Exporter) -> Iterator[Path]:
    log = install_epilog(slurm, exporter.url)
    yield log
    (slurm.root / "etc" / "epilog.sh").unlink()


def admin_comment(slurm: SlurmCluster, job: int, timeout: float = 30) -> str:
    """The job's AdminComment in sacct, once it has one (or "" after timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        (row,) = slurm.sacct(str(job), "JobID,AdminComment", "-X")
        if row["AdminComment"] or time.monotonic() > deadline:
            return row["AdminComment"]
        time.sleep(0.5)


def job_energy(series: Series, job: int | str, component: str = "cpu") -> float:
    """The job's energy (J) as the exporter names it: its Slurm job id."""
    total = 0.0
    for (name, labels), value in series.items():
        d = dict(labels)
        if (
            name == "wattprint_workload_energy_joules_total"
            and d["scheduler"] == "slurm"
            and d["workload"] == str(job)
            and d["component"] == component
        ):
            total += value
    return total


def workloads(series: Series) -> set[tuple[str, str]]:
    return {
        (dict(labels)["scheduler"], dict(labels)["workload"])
        for name, labels in series
        if name == "wattprint_workload_energy_joules_total"
    }


def micro(value: float) -> int:
    return round(value * 1_000_000)


def conservation(series: Series) -> dict[str, tuple[int, int]]:
    """Per component: (workloads + unattributed, the node's counters), in micro-joules."""
    parts: dict[str, int] = {}
    devices: dict[str, int] = {}
    for (name, labels), value in series.items():
        d = dict(labels)
        if name in (
            "wattprint_workload_energy_joules_total",
            "wattprint_unattributed_energy_joules_total",
        ):
            parts[d["component"]] = parts.get(d["component"], 0) + micro(value)
        elif name in ("wattprint_cpu_energy_joules_total", "wattprint_memory_energy_joules_total"):
            component = name.split("_")[1]
            devices[component] = devices.get(component, 0) + micro(value)
    return {c: (parts.get(c, 0), devices[c]) for c in devices}


def seconds(total_cpu: str) -> float:
    """sacct's TotalCPU ([DD-[HH:]]MM:SS[.mmm]) in seconds."""
    days, _, clock = total_cpu.rpartition("-")
    value = 0.0
    for part in clock.split(":"):
        value = value * 60 + float(part)
    return value + (int(days) * 86400 if days else 0)


def total_cpu(slurm: SlurmCluster, job: int) -> float:
    """The CPU time sacct has for the job: the sum of its steps' (batch, srun steps)."""
    slurm.wait_accounted(str(job))
    rows = slurm.sacct(str(job), "JobID,TotalCPU")
    return sum(seconds(r["TotalCPU"]) for r in rows if "." in r["JobID"])


def test_two_jobs_sharing_the_node_split_its_cpu_energy_as_sacct_counts_their_cpu(
    slurm: SlurmCluster, exporter: Exporter, epilog_log: Path
) -> None:
    """Two tasks of one job busy in an srun step, one process of another half busy in
    its batch step, side by side for their whole life (more than the node's two CPUs,
    so its load is steady): each named by its job id from its cgroup (the steps counted
    as the job), their CPU energies in the ratio of sacct's TotalCPU, and jobs plus
    unattributed equal to the node's counters."""
    # Both loaded over the same 10 s, then still for 1.5 s, so that the exporter has
    # sampled their CPU time once it is final.
    start = time.time() + 3
    busy = slurm.sbatch(
        "srun -n2 " + LOAD.format(start=start, seconds=10, busy=1.0) + "sleep 1.5\n", "-n2"
    )
    half = slurm.sbatch(LOAD.format(start=start, seconds=10, busy=0.5) + "sleep 1.5\n")
    slurm.wait_running(busy)
    slurm.wait_running(half)
    before = exporter.scrape()  # the node's counters when both had started
    time.sleep(3)
    pids = {job: slurm.job_pids(job) for job in (busy, half)}
    assert all(pids.values()), f"slurmd put no process in the jobs' freezer cgroups: {pids}"
    running = exporter.scrape()
    assert {("slurm", str(busy)), ("slurm", str(half))} <= workloads(running)
    slurm.wait_ended(busy, half)
    ended = exporter.scrape()  # and once both had ended: what a node meter gives each
    time.sleep(1)
    after = exporter.scrape()
    named = {w for s, w in workloads(after) if s == "slurm"}
    # Every step (batch, the srun step) is the job: no series of its own.
    assert named == {str(busy), str(half)}, named
    cpu = {job: total_cpu(slurm, job) for job in (busy, half)}
    energy = {job: job_energy(after, job) for job in (busy, half)}
    node = {c: (d - conservation(before)[c][1]) / 1e6 for c, (_, d) in conservation(ended).items()}
    elapsed = {job: slurm.sacct(str(job), "Elapsed", "-X")[0]["Elapsed"] for job in (busy, half)}
    print(f"TotalCPU {cpu}; CPU energy {energy}; node over both {node} J; Elapsed {elapsed}")
    print({job: {c: job_energy(after, job, c) for c in ("cpu", "memory")} for job in cpu})
    assert cpu[busy] > 1.3 * cpu[half] > 0, cpu
    assert energy[busy] / energy[half] == pytest.approx(cpu[busy] / cpu[half], rel=0.02)
    for component, (parts, device) in conservation(after).items():
        assert parts == device, f"{component}: jobs + unattributed {parts} != node {device}"
    # slurmd's Epilog wrote each job's figure, as its exporter counts it, into sacct.
    for job in (busy, half):
        comment = admin_comment(slurm, job)
        assert comment, epilog_log.read_text()[-2000:]
        written = json.loads(comment.replace("`", '"'))  # sacctmgr's quotes, undone
        print(f"job {job} AdminComment {comment}")
        assert written["nodes"].keys() == {NODE}
        for component in ("cpu", "memory"):
            assert written["energy_j"][component] == pytest.approx(
                job_energy(after, job, component), rel=0.001
            )
        assert written["emissions_g"] == pytest.approx(job_emissions(after, job), rel=0.001)
        part = written["nodes"][NODE]
        assert part["estimated"] == ["cpu", "memory"] and part["measured"] == []
        assert part["intensity_g_per_kwh"] == pytest.approx(intensity(after), rel=0.001)


def job_emissions(series: Series, job: int) -> float:
    return sum(
        value
        for (name, labels), value in series.items()
        if name == "wattprint_workload_emissions_grams_total"
        and ("workload", str(job)) in labels
        and ("scheduler", "slurm") in labels
    )


def intensity(series: Series) -> float:
    """The grid intensity the exporter accounts with (one zone, constant here)."""
    (value,) = [
        v
        for (name, labels), v in series.items()
        if name == "wattprint_grid_carbon_intensity_grams_per_kwh"
        and dict(labels).get("signal", "average") == "average"
    ]
    return value


def unattributed(series: Series, component: str = "cpu") -> float:
    return sum(
        value
        for (name, labels), value in series.items()
        if name == "wattprint_unattributed_energy_joules_total"
        and dict(labels)["component"] == component
    )


def test_a_job_array_is_one_job_id_a_task(slurm: SlurmCluster, exporter: Exporter) -> None:
    """Each task of an array has its own job id (sacct's JobIDRaw) and its own cgroup:
    the exporter names each task by it, never by the array's 12_1 spelling."""
    array = slurm.sbatch(LOAD.format(start=0, seconds=2, busy=1.0) + "sleep 1\n", "--array=0-2")
    slurm.wait_ended(array)
    time.sleep(1)
    series = exporter.scrape()
    slurm.wait_accounted(str(array))
    rows = slurm.sacct(str(array), "JobID,JobIDRaw", "-X")
    assert sorted(r["JobID"] for r in rows) == [f"{array}_{i}" for i in range(3)]
    raw = {r["JobIDRaw"] for r in rows}
    named = {w for s, w in workloads(series) if s == "slurm"}
    assert raw <= named, (raw, named)
    assert not any("_" in w for w in named)
    assert all(job_energy(series, job) > 0 for job in raw)


def test_a_job_that_ends_while_the_exporter_is_down_keeps_what_was_counted(
    slurm: SlurmCluster, exporter: Exporter
) -> None:
    """Killed mid-job and started again after the job ended: the job's series goes on
    from the state file (not from 0), the outage's CPU energy is booked as the restart
    gap (to unattributed: the job's cgroup is gone, its share cannot be read), and
    jobs plus unattributed still equal the node's counters."""
    job = slurm.sbatch(LOAD.format(start=0, seconds=4, busy=1.0))
    slurm.wait_running(job)
    time.sleep(2)
    before = job_energy(exporter.scrape(), job)
    assert before > 0
    exporter.stop(signal.SIGKILL)
    slurm.wait_ended(job)
    time.sleep(1)
    exporter.start()
    after = exporter.scrape()
    gap = sum(
        value
        for (name, labels), value in after.items()
        if name == "wattprint_restart_gap_energy_joules_total" and ("component", "cpu") in labels
    )
    resumed = after[("wattprint_restarts_total", frozenset({("outcome", "resumed")}))]
    assert resumed == 1
    assert gap > 0
    # At least what was served before the kill; at most what the state file saved in
    # the half second (two samples) after that: less than the node's power for 0.5 s.
    assert before <= job_energy(after, job) <= before + 0.5 * cpu_watts()
    for component, (parts, device) in conservation(after).items():
        assert parts == device, f"{component}: jobs + unattributed {parts} != node {device}"


def cpu_watts() -> float:
    """The CPU model's power at full load on this node (3.5 W a logical CPU, with no
    CPU of its table here): more than any job's."""
    return WATTS_PER_THREAD * (os.cpu_count() or 1)


def test_a_process_that_leaves_its_jobs_cgroup_is_no_longer_the_jobs(
    slurm: SlurmCluster, exporter: Exporter, tmp_path: Path
) -> None:
    """A job's child moves itself out of the job's cgroups (as root can) and outlives
    the job, busy. Slurm's accounting stops counting it when it leaves; so does the
    job's figure, during the job and after it (though the process still carries
    SLURM_JOB_ID): its energy is unattributed, never lost."""
    pid_file = tmp_path / "escaped.pid"
    leave = "; ".join(
        f"echo $$ > /sys/fs/cgroup/{h}/cgroup.procs" for h in ("freezer", "cpuacct", "memory")
    )
    escapee = (
        f"sh -c 'sleep 1; {leave}; echo $$ > {pid_file}; exec python3 -c "
        '"import time\nend = time.time() + 6\nwhile time.time() < end: pass"'
        "' &\n"
    )
    job = slurm.sbatch(escapee + LOAD.format(start=0, seconds=3, busy=1.0) + "sleep 1\n")
    try:
        slurm.wait_ended(job)
        assert pid_file.exists(), "the job's child did not leave its cgroups"
        escaped = int(pid_file.read_text())
        assert os.path.exists(f"/proc/{escaped}"), "the escaped process did not outlive the job"
        time.sleep(0.5)
        ended = exporter.scrape()
        time.sleep(2)
        later = exporter.scrape()
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert job_energy(later, job) == job_energy(ended, job) > 0
    assert unattributed(later) > unattributed(ended)
    # While the job ran, its figure followed what Slurm counted (the job's own CPU).
    cpu = total_cpu(slurm, job)
    print(f"escaped: TotalCPU {cpu} s, job {job_energy(later, job)} J")
    for component, (parts, device) in conservation(later).items():
        assert parts == device, f"{component}: jobs + unattributed {parts} != node {device}"


def run_epilog(slurm: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(slurm.env, PYTHONPATH=str(REPO / "exporter"))
    return subprocess.run(
        [sys.executable, "-m", "wattprint", "slurm-epilog", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_epilog_never_fails_a_job_nor_overwrites_another_tools_comment(
    slurm: SlurmCluster, exporter: Exporter, tmp_path: Path
) -> None:
    """No exporter, a job the exporter never saw, an AdminComment the site wrote: one
    line each, exit 0, the job COMPLETED and the node still idle, nothing overwritten."""
    # slurmd's Epilog with the exporter gone: the job completes, nothing is written.
    log = install_epilog(slurm, f"http://127.0.0.1:{free_port()}/metrics")
    try:
        orphan = slurm.sbatch("sleep 0.5\n")
        slurm.wait_ended(orphan)
        assert slurm.wait_accounted(str(orphan))["State"] == "COMPLETED"
        assert admin_comment(slurm, orphan, timeout=3) == ""
        assert "cannot read the exporter" in log.read_text()
        # The site's own AdminComment, set while the job ran, is left as it is.
        install_epilog(slurm, exporter.url)
        site = slurm.sbatch(LOAD.format(start=0, seconds=2, busy=1.0))
        slurm.wait_running(site)
        slurm.run("scontrol", "update", f"jobid={site}", "AdminComment=project:climate-42")
        slurm.wait_ended(site)
        deadline = time.monotonic() + 30
        while f"job {site}:" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.3)
    finally:
        (slurm.root / "etc" / "epilog.sh").unlink()
    assert admin_comment(slurm, site) == "project:climate-42"
    (line,) = [line for line in log.read_text().splitlines() if f"job {site}:" in line]
    assert "another tool's" in line and "not overwritten" in line, line
    assert slurm.run("sinfo", "-h", "-n", NODE, "-o", "%T").strip() == "idle"
    # A job Slurm does not know, and one the exporter has no series of: one line, 0.
    for job, said in (("999999", "no series of Slurm job 999999"), ("x1", "no job id")):
        done = run_epilog(slurm, f"--job-id={job}", f"--exporter-url={exporter.url}")
        assert done.returncode == 0
        assert said in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_each_node_of_a_job_adds_its_part_to_the_comment(
    slurm: SlurmCluster, exporter: Exporter, epilog_log: Path
) -> None:
    """The epilog of a second node (the same exporter, named otherwise) adds its part
    to the document slurmd's Epilog wrote, and the totals become the parts' sums."""
    job = slurm.sbatch(LOAD.format(start=0, seconds=1, busy=1.0))
    slurm.wait_ended(job)
    first = json.loads(admin_comment(slurm, job).replace("`", '"'))
    done = run_epilog(slurm, f"--job-id={job}", f"--exporter-url={exporter.url}", "--node=n2")
    assert done.returncode == 0 and "written" in done.stderr, done.stderr
    both = json.loads(admin_comment(slurm, job).replace("`", '"'))
    assert both["nodes"].keys() == {NODE, "n2"}
    assert both["nodes"][NODE] == first["nodes"][NODE]
    for component, joules in first["energy_j"].items():
        assert both["energy_j"][component] == pytest.approx(2 * joules, rel=1e-6)
    assert both["emissions_g"] == pytest.approx(2 * first["emissions_g"], rel=1e-6)
    assert both["intensity_g_per_kwh"] == pytest.approx(first["intensity_g_per_kwh"], rel=1e-5)
    # The batch host's epilog (slurmd's), and only it, told the user in the job's output.
    output = (slurm.root / "jobs" / f"{job}.out").read_text()
    assert output.count("Wattprint: job") == 1, output
    cpu = first["energy_j"]["cpu"]
    assert f"Wattprint: job {job} used " in output and f"cpu {cpu:.4g} J" in output, output


def test_nodes_whose_epilogs_write_at_once_keep_every_part(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Three more nodes' epilogs (the same exporter, named otherwise) run at the same
    moment after slurmd's: each reads the document, adds its part and writes it back,
    so one overwrites another's; each reads back after a pause, and one whose part is
    gone merges and writes again. All four parts stay. With PUE 1.5 the totals' intensity
    is the grid's, as each part's is, and the PUE stands apart."""
    exporter = Exporter(tmp_path, None, "--pue=1.5")
    exporter.start()
    log = install_epilog(slurm, exporter.url)
    try:
        job = slurm.sbatch(LOAD.format(start=0, seconds=1, busy=1.0))
        slurm.wait_ended(job)
        first = json.loads(admin_comment(slurm, job).replace("`", '"'))
        start = threading.Barrier(3)
        done: dict[str, subprocess.CompletedProcess[str]] = {}

        def node(name: str) -> None:
            start.wait()
            done[name] = run_epilog(
                slurm, f"--job-id={job}", f"--exporter-url={exporter.url}", f"--node={name}"
            )

        threads = [threading.Thread(target=node, args=(n,)) for n in ("n2", "n3", "n4")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        grid = intensity(exporter.scrape())
    finally:
        (slurm.root / "etc" / "epilog.sh").unlink()
        exporter.stop()
    print({n: d.stderr.strip() for n, d in done.items()}, log.read_text()[-500:])
    assert all(d.returncode == 0 and "written" in d.stderr for d in done.values()), done
    kept = json.loads(admin_comment(slurm, job).replace("`", '"'))
    assert kept["nodes"].keys() == {NODE, "n2", "n3", "n4"}, kept
    for component, joules in first["energy_j"].items():
        assert kept["energy_j"][component] == pytest.approx(4 * joules, rel=1e-6)
    assert kept["emissions_g"] == pytest.approx(4 * first["emissions_g"], rel=1e-6)
    for doc in (kept, *kept["nodes"].values()):
        assert doc["pue"] == pytest.approx(1.5)
        assert doc["intensity_g_per_kwh"] == pytest.approx(grid, rel=1e-5)
        kwh = sum(doc["energy_j"].values()) / 3.6e6
        assert doc["emissions_g"] == pytest.approx(kwh * 1.5 * grid, rel=1e-5)


def test_the_summary_goes_to_a_path_with_a_space_never_to_a_link_or_a_device(
    slurm: SlurmCluster, exporter: Exporter, epilog_log: Path
) -> None:
    """slurmd's Epilog (root) appends the user's summary to an output path with a space
    in it; an output that is a symbolic link, or /dev/null, it refuses in its one line,
    writes nothing there, and the job still completes with its AdminComment written."""
    jobs = slurm.root / "jobs"
    target = jobs / "root's file"
    target.write_text("")
    (jobs / "link.out").symlink_to(target)
    outputs = {"space": str(jobs / "my run %j.out"), "link": str(jobs / "link.out")}
    outputs["device"] = "/dev/null"
    ids = {
        kind: slurm.sbatch(LOAD.format(start=0, seconds=1, busy=1.0), f"--output={path}")
        for kind, path in outputs.items()
    }
    slurm.wait_ended(*ids.values())
    for job in ids.values():
        assert slurm.wait_accounted(str(job))["State"] == "COMPLETED"
        assert '"wattprint":1' in admin_comment(slurm, job).replace("`", '"')
    lines = {
        kind: [line for line in epilog_log.read_text().splitlines() if f"job {job}:" in line]
        for kind, job in ids.items()
    }
    print(lines)
    assert all(len(found) == 1 for found in lines.values()), lines
    spaced = jobs / f"my run {ids['space']}.out"
    assert f"Wattprint: job {ids['space']} used " in spaced.read_text()
    assert f"summary appended to {spaced}" in lines["space"][0]
    assert "no summary: " in lines["link"][0] and "a symbolic link" in lines["link"][0]
    assert "Wattprint" not in target.read_text()
    assert "no summary: /dev/null: not written: a character device" in lines["device"][0]


def test_text_a_user_sets_can_neither_redirect_the_summary_nor_forge_the_document(
    slurm: SlurmCluster, exporter: Exporter, epilog_log: Path
) -> None:
    """A job name, comment and mail address that read as other fields in `scontrol show
    job`'s text (` StdOut=... UserId=...`, a line `   AdminComment={...}`): the summary
    still goes to the job's own output, the document holds this node's part alone, and
    a part with a NaN an admin left in the AdminComment is left out, never added."""
    jobs = slurm.root / "jobs"
    jobs.mkdir(exist_ok=True)
    victim = jobs / "victim"
    victim.write_text("")
    forged_part = {"energy_j": {"gpu": 1e9}, "emissions_g": 1e6, "intensity_g_per_kwh": None}
    forged = json.dumps({"wattprint": 1, "energy_j": {"gpu": 1e9}, "nodes": {"evil": forged_part}})
    fake = f" StdOut={victim} UserId=root(0) BatchHost={NODE} "
    job = slurm.sbatch(
        LOAD.format(start=0, seconds=1.5, busy=1.0),
        f"--job-name=x{fake}",
        f"--comment=c\n   AdminComment={forged}\n",
        f"--mail-user=u{fake}",
    )
    slurm.wait_running(job)
    nan_part = json.dumps({"energy_j": {"cpu": 5.0}, "emissions_g": 1.0}).replace("5.0", "NaN")
    slurm.run(
        "scontrol",
        "update",
        f"jobid={job}",
        f'AdminComment={{"wattprint":1,"nodes":{{"n9":{nan_part}}}}}',
    )
    slurm.wait_ended(job)
    assert slurm.wait_accounted(str(job))["State"] == "COMPLETED"
    deadline = time.monotonic() + 30
    while f"job {job}:" not in epilog_log.read_text():
        assert time.monotonic() < deadline, epilog_log.read_text()[-2000:]
        time.sleep(0.3)
    text = admin_comment(slurm, job).replace("`", '"')
    assert "nan" not in text.lower(), text
    written = json.loads(text)
    assert written["nodes"].keys() == {NODE}, written
    assert written["energy_j"].get("gpu", 0) < 1e9
    assert victim.read_text() == ""
    assert f"Wattprint: job {job} used " in (jobs / f"{job}.out").read_text()
    (line,) = [line for line in epilog_log.read_text().splitlines() if f"job {job}:" in line]
    assert "the parts of n9 in it were not figures" in line, line


def test_a_node_that_reads_its_input_writes_the_job_at_the_wall(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The exporter also reads the node's input (a pm_counters tree drawing 300 W): the
    Epilog writes the job's chips and, at the wall, its chips plus its platform share,
    as the exporter's counters hold them, and the summary says both; the node's input is
    the jobs' and unattributed energy of every component, platform included, exactly."""
    node = PmCountersNode(tmp_path / "sys", 300.0).start()
    exporter = Exporter(tmp_path, None, *node.flags())
    try:
        exporter.start()
        log = install_epilog(slurm, exporter.url)
        job = slurm.sbatch(LOAD.format(start=0, seconds=2, busy=1.0))
        slurm.wait_ended(job)
        kept = json.loads(admin_comment(slurm, job).replace("`", '"'))
        series = exporter.scrape()
    finally:
        (slurm.root / "etc" / "epilog.sh").unlink(missing_ok=True)
        exporter.stop()
        node.stop()
    part = kept["nodes"][NODE]
    chips = sum(part["energy_j"].values())
    platform = job_energy(series, job, "platform")
    assert chips > 0 and platform > 0, (part, log.read_text()[-1000:])
    assert part["wall_energy_j"] == pytest.approx(chips + platform, rel=1e-5)
    assert kept["wall_energy_j"] == part["wall_energy_j"]
    assert kept["wall_emissions_g"] > kept["emissions_g"] > 0
    output = (slurm.root / "jobs" / f"{job}.out").read_text()
    assert f"on {NODE}'s chips" in output and "at the wall (with the rest of the server)" in output
    # Every joule of the node's input is a job's or unattributed, per component.
    parts = sum(
        micro(v)
        for (name, _), v in series.items()
        if name
        in ("wattprint_workload_energy_joules_total", "wattprint_unattributed_energy_joules_total")
    )
    ((node_j,),) = [
        (v,) for (name, _), v in series.items() if name == "wattprint_node_energy_joules_total"
    ]
    assert parts == micro(node_j)
