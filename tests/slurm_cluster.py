"""A real one-node Slurm for the tests: munged, MariaDB, slurmdbd, slurmctld and slurmd
(Debian's slurm-wlm 22.05, cgroup v1), every file under one temp directory, every port
on 127.0.0.1, every daemon a child of the test process (run in the foreground) and
stopped when the session ends.

The node is named NODE, so slurmd makes its cgroups as slurm_<NODE> (Debian builds it
for several slurmd daemons a host) and nothing else on the machine is touched. It
needs root (slurmd makes cgroups and runs jobs as their users): without it, or without
the packages scripts/test installs, the tests skip, and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from prom_harness import free_port

NODE = "wpnode"
CLUSTER = "wattprint"
ACCOUNT = "energy"
DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Two CPUs declared whatever the machine has: two one-CPU jobs share the node, and a
# two-process job still fits beside a one-process one (cores are not constrained).
NODE_CPUS = 3
# slurmctld and slurmdbd run only on the host their config names.
HOST = socket.gethostname().split(".")[0]


def unavailable(reason: str) -> None:
    """Skip locally, fail under CI=true (scripts/test installs everything)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"a real Slurm cannot run here: {reason}")
    pytest.skip(f"a real Slurm cannot run here: {reason}")


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def cgroup(self) -> str:
        """slurmd's cgroup (the parent of uid_U/job_J/step_S) in every v1 hierarchy."""
        return f"slurm_{NODE}"

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        """A Slurm client command's stdout."""
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, script: str, *options: str) -> int:
        """Submit a batch script (its body, run by /bin/sh); the job id."""
        path = self.root / "jobs" / f"job-{time.monotonic_ns()}.sh"
        path.parent.mkdir(exist_ok=True)
        path.write_text("#!/bin/sh\n" + script)
        out = self.run(
            "sbatch",
            "--parsable",
            f"--output={self.root}/jobs/%j.out",
            f"--chdir={self.root}/jobs",
            *options,
            str(path),
        )
        return int(out.strip().split(";")[0].split("_")[0])

    def state(self, job: str) -> str:
        """The job's state as slurmctld has it ("" once it forgot the job)."""
        out = self.run("squeue", "-h", "-j", job, "-o", "%T", check=False)
        return out.strip().splitlines()[0] if out.strip() else ""

    def wait_running(self, job: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while (state := self.state(str(job))) != "RUNNING":
            assert state in ("PENDING", "CONFIGURING", ""), f"job {job} is {state}"
            assert time.monotonic() < deadline, f"job {job} did not start ({state})"
            time.sleep(0.2)

    def wait_ended(self, *jobs: int, timeout: float = 120) -> None:
        """Until squeue lists none of the jobs (or their array tasks)."""
        deadline = time.monotonic() + timeout
        ids = ",".join(str(j) for j in jobs)
        while self.run("squeue", "-h", "-j", ids, "-o", "%i", check=False).strip():
            assert time.monotonic() < deadline, f"jobs {ids} did not end"
            time.sleep(0.3)

    def sacct(self, job: str, fields: str, *options: str) -> list[dict[str, str]]:
        """sacct's rows for the job, one dict a row (fields as sacct names them)."""
        out = self.run("sacct", "-n", "-P", "-j", job, "-o", fields, *options, check=True)
        names = fields.split(",")
        return [dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines()]

    def wait_accounted(self, job: str, timeout: float = 30) -> dict[str, str]:
        """The job's allocation row once slurmdbd has its end (the state and CPU time)."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.sacct(job, "JobID,State,TotalCPU,AdminComment", "-X")
            if rows and rows[0]["State"] not in ("PENDING", "RUNNING", "COMPLETING"):
                return rows[0]
            assert time.monotonic() < deadline, f"sacct has not got job {job}'s end: {rows}"
            time.sleep(0.5)

    def job_pids(self, job: int) -> list[int]:
        """The processes in the job's freezer cgroup (every step), as slurmd put them."""
        pids: list[int] = []
        base = CGROUP_ROOT / "freezer" / self.cgroup
        for procs in base.glob(f"uid_*/job_{job}/step_*/cgroup.procs"):
            pids += [int(p) for p in procs.read_text().split()]
        return pids

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def _configure(root: Path) -> dict[str, int]:
    ports = {name: free_port() for name in ("mariadb", "slurmdbd", "slurmctld", "slurmd")}
    for sub in ("etc", "log", "run", "munge", "db", "ctld", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    auth = f"AuthType=auth/munge\nAuthInfo=socket={root}/munge/socket\n"
    _write(
        root / "etc" / "slurm.conf",
        f"ClusterName={CLUSTER}\n"
        f"SlurmctldHost={HOST}(127.0.0.1)\n"
        "SlurmUser=root\nSlurmdUser=root\n"
        f"SlurmctldPort={ports['slurmctld']}\nSlurmdPort={ports['slurmd']}\n"
        f"{auth}"
        f"StateSaveLocation={root}/ctld\nSlurmdSpoolDir={root}/spool\n"
        f"SlurmctldPidFile={root}/run/slurmctld.pid\nSlurmdPidFile={root}/run/slurmd.pid\n"
        f"SlurmctldLogFile={root}/log/slurmctld.log\nSlurmdLogFile={root}/log/slurmd.log\n"
        "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n"
        "JobAcctGatherType=jobacct_gather/cgroup\nJobAcctGatherFrequency=task=1\n"
        "AccountingStorageType=accounting_storage/slurmdbd\n"
        f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={ports['slurmdbd']}\n"
        # For slurmdbd connections the munge socket is named here, not in AuthInfo.
        f"AccountingStoragePass={root}/munge/socket\n"
        "JobCompType=jobcomp/none\nMpiDefault=none\nReturnToService=2\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        "SlurmdParameters=config_overrides\n"
        "SchedulerParameters=sched_min_interval=100000\n"
        "KillWait=5\nMinJobAge=600\nInactiveLimit=0\nSlurmdTimeout=60\n"
        f"Epilog={root}/etc/epilog\n"
        f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory=1000 State=UNKNOWN\n"
        f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP\n",
    )
    _write(
        root / "etc" / "cgroup.conf",
        "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
        "ConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n",
    )
    # slurmd's epilog: what a test put in etc/epilog.sh (the job's own env), if anything.
    _write(
        root / "etc" / "epilog",
        f"#!/bin/sh\n[ -x {root}/etc/epilog.sh ] || exit 0\nexec {root}/etc/epilog.sh\n",
        mode=0o755,
    )
    # slurmdbd refuses a config that others can read (it holds the database password).
    _write(
        root / "etc" / "slurmdbd.conf",
        f"{auth}DbdHost={HOST}\nDbdAddr=127.0.0.1\nDbdPort={ports['slurmdbd']}\n"
        "SlurmUser=root\n"
        f"PidFile={root}/run/slurmdbd.pid\nLogFile={root}/log/slurmdbd.log\n"
        "StorageType=accounting_storage/mysql\n"
        # 127.0.0.1, not localhost: the client library takes localhost for its socket.
        f"StorageHost=127.0.0.1\nStoragePort={ports['mariadb']}\n"
        "StorageUser=root\nStorageLoc=slurm_acct_db\n",
        mode=0o600,
    )
    return ports


def _start(cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    log = (cluster.root / "log" / f"{name}.out").open("ab")
    cluster.procs[name] = subprocess.Popen(
        argv, env=cluster.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait(cluster: SlurmCluster, what: str, ready: Callable[[], bool], timeout: float = 60) -> None:
    """Until ready() is true; a daemon that exits meanwhile stops the wait."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        for name, proc in cluster.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited ({proc.returncode}) waiting for {what}: "
                    + (cluster.log(name) or (cluster.root / "log" / f"{name}.out").read_text())
                )
        try:
            if ready():
                return
        except (OSError, subprocess.SubprocessError, AssertionError) as error:
            last = str(error)
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what} {last}")
        time.sleep(0.2)


def _node_idle(cluster: SlurmCluster) -> bool:
    out = cluster.run("sinfo", "-h", "-n", NODE, "-o", "%T", check=False).strip()
    return out == "idle"


def start(root: Path) -> SlurmCluster:
    """Start the whole cluster under root; the node is idle when it returns."""
    ports = _configure(root)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(root),
        "SLURM_CONF": f"{root}/etc/slurm.conf",
        "WATTPRINT_STATE_FILE": "",
    }
    cluster = SlurmCluster(root, env)
    try:
        _start(
            cluster,
            "munged",
            [
                "munged", "--foreground", "--force",
                f"--socket={root}/munge/socket", f"--key-file={root}/munge/munge.key",
                f"--pid-file={root}/run/munged.pid", f"--log-file={root}/log/munged.log",
                f"--seed-file={root}/munge/seed",
            ],
        )  # fmt: skip
        subprocess.run(
            [
                "mariadb-install-db", "--no-defaults", f"--datadir={root}/db", "--user=root",
                "--auth-root-authentication-method=normal", "--skip-test-db",
            ],
            capture_output=True, check=True, timeout=120,
        )  # fmt: skip
        _start(
            cluster,
            "mariadbd",
            [
                "mariadbd", "--no-defaults", f"--datadir={root}/db", "--user=root",
                "--bind-address=127.0.0.1", f"--port={ports['mariadb']}",
                f"--socket={root}/run/mysqld.sock", f"--pid-file={root}/run/mysqld.pid",
                # A test database that lives for one session: anyone on 127.0.0.1 is
                # its root, and nothing is synced to disk.
                "--skip-grant-tables", "--innodb-flush-log-at-trx-commit=0",
                "--innodb-buffer-pool-size=64M",
                "--innodb-lock-wait-timeout=900", "--skip-log-bin",
                f"--log-error={root}/log/mariadbd.log",
            ],
        )  # fmt: skip
        _wait(cluster, "munged", lambda: (root / "munge" / "socket").exists())
        _wait(cluster, "MariaDB", lambda: _listening(ports["mariadb"]))
        _start(cluster, "slurmdbd", ["slurmdbd", "-D"])
        _wait(cluster, "slurmdbd", lambda: _listening(ports["slurmdbd"]))
        for what in (
            ("cluster", CLUSTER),
            ("account", ACCOUNT, f"cluster={CLUSTER}"),
            ("user", "root", f"account={ACCOUNT}", f"cluster={CLUSTER}"),
        ):
            _wait(cluster, f"sacctmgr add {what[0]}", partial(_sacctmgr, cluster, what))
        _start(cluster, "slurmctld", ["slurmctld", "-D", "-i"])
        _wait(cluster, "slurmctld", lambda: _listening(ports["slurmctld"]))
        _start(cluster, "slurmd", ["slurmd", "-D", "-N", NODE])
        _wait(cluster, f"sinfo to show {NODE} idle", lambda: _node_idle(cluster))
    except BaseException:
        stop(cluster)
        raise
    return cluster


def _sacctmgr(cluster: SlurmCluster, what: tuple[str, ...]) -> bool:
    done = subprocess.run(
        ["sacctmgr", "-i", "add", *what],
        env=cluster.env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    if done.returncode != 0 and "Nothing new added" not in said:
        raise AssertionError(f"(sacctmgr: {said.strip()[-500:]})")
    return True


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def stop(cluster: SlurmCluster) -> list[str]:
    """Cancel every job, stop the daemons (last started first); what is left running."""
    if "slurmctld" in cluster.procs and cluster.procs["slurmctld"].poll() is None:
        cluster.run("scancel", "--full", "-u", "root", check=False)
        deadline = time.monotonic() + 30
        while cluster.run("squeue", "-h", "-o", "%i", check=False).strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)
    for name in reversed(list(cluster.procs)):
        proc = cluster.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    left = [f"{name} (pid {p.pid})" for name, p in cluster.procs.items() if p.poll() is None]
    # A job step (slurmstepd and its tasks) outlives slurmd unless it was cancelled.
    for tasks in (CGROUP_ROOT / "freezer" / cluster.cgroup).glob("**/cgroup.procs"):
        left += [f"pid {pid} in {tasks.parent}" for pid in tasks.read_text().split()]
    left += _processes_of(cluster.root)
    if not left:
        _remove_cgroups(cluster.cgroup)
    return left


def _processes_of(root: Path) -> list[str]:
    """What ps would show of the cluster: any process whose command line or environment
    names its directory (every daemon's does: their files, SLURM_CONF)."""
    mark = str(root).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        if mark in cmdline or mark in environ:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"pid {entry.name}: {command[:80]}")
    return found


def _remove_cgroups(name: str) -> None:
    """slurmd's empty cgroup directories, deepest first (rmdir removes a cgroup)."""
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for directory in sorted(top.glob("**/"), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()


def requirements() -> str | None:
    """Why a real Slurm cannot run here, or None."""
    missing = [d for d in DAEMONS if shutil.which(d, path="/usr/sbin:/usr/bin") is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed (Debian slurm-wlm, slurmdbd, munge, "
            "mariadb-server; scripts/test installs them)"
        )
    if os.geteuid() != 0:
        return "slurmd must run as root"
    if not (CGROUP_ROOT / "freezer").is_dir() or not (CGROUP_ROOT / "cpuacct").is_dir():
        return "no cgroup v1 freezer and cpuacct hierarchies under /sys/fs/cgroup"
    return None


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The one Slurm of the session, started by the first test that asks for it."""
    reason = requirements()
    if reason is not None:
        unavailable(reason)
    root = tmp_path_factory.mktemp("slurm")
    try:
        cluster = start(root)
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        unavailable(str(error)[-1500:])
        raise
    try:
        yield cluster
    finally:
        left = stop(cluster)
        assert not left, f"still running after the Slurm teardown: {left}"
