"""The trackers' shared directory and the election beside the node lock (issue 43):
another user's files there never stop or redirect a tracker; a link, a file or a FIFO
where a directory or a regular file should be is one line, never a hang."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wattprint.core.model import Workload
from wattprint.host.identity.tracked import TrackedResolver
from wattprint.host.procfs import read_proc

from .jobnode import PACKAGE, JobNode, job_node, one_line

__all__ = ["job_node"]

VICTIM_UID, ATTACKER_UID = 64101, 64102


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A root exporter's trackers directory: 1777, under a path every user can reach."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as two other users")
    base = Path(tempfile.mkdtemp(prefix="wattprint-shared-"))
    os.chmod(base, 0o755)
    trackers = base / "state.json.lock.trackers"
    trackers.mkdir()
    os.chmod(trackers, 0o1777)
    # The other users run this checkout's package from a copy they can read: a CI clone
    # sits in a 0700 temporary directory.
    shutil.copytree(PACKAGE / "wattprint", base / "package" / "wattprint")
    for where, _dirs, files in os.walk(base / "package"):
        os.chmod(where, 0o755)
        for name in files:
            os.chmod(os.path.join(where, name), 0o644)
    try:
        yield trackers
    finally:
        shutil.rmtree(base, ignore_errors=True)


def other_users_python() -> str:
    """An interpreter another user may run (this venv's may sit in root's home), with
    this one's packages on its path."""
    for path in (sys.executable, sys._base_executable, "/usr/bin/python3"):
        real = os.path.realpath(path)
        if all(os.stat(p).st_mode & 0o001 for p in [*Path(real).parents, Path(real)]):
            return real
    pytest.skip("no Python interpreter that another user may run")


def as_user(uid: int, code: str, shared_dir: Path) -> subprocess.Popen[str]:
    package = shared_dir.parent / "package"
    paths = [str(package), *(p for p in sys.path if p.endswith("site-packages"))]
    return subprocess.Popen(
        [other_users_python(), "-c", textwrap.dedent(code)],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(paths)),
        cwd="/",
        preexec_fn=lambda: (os.setgid(uid), os.setuid(uid)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class Inner:
    def resolve(self, pid: int, start_ticks: int, table: object = None) -> Workload | None:
        return None


def test_a_registration_planted_for_a_victims_pid_neither_blocks_nor_redirects_it(
    shared_dir: Path,
) -> None:
    victim = as_user(
        VICTIM_UID,
        f"""
        import os, sys
        from wattprint.host.identity.tracked import REGISTRATIONS, Registration
        from wattprint.host.procfs import read_proc
        print(os.getpid(), read_proc(os.getpid()).start_ticks, flush=True)
        sys.stdin.readline()  # the attacker planted its file meanwhile
        tracker = object()
        try:
            REGISTRATIONS.add({str(shared_dir)!r}, tracker,
                              Registration(os.getpid(), read_proc(os.getpid()).start_ticks,
                                           "victim-job", "rank0"))
            print("registered", flush=True)
        except OSError as err:
            print("failed", err, flush=True)
        sys.stdin.readline()
        REGISTRATIONS.remove({str(shared_dir)!r}, tracker)
        """,
        shared_dir,
    )
    try:
        assert victim.stdout is not None and victim.stdin is not None
        pid, ticks = (int(x) for x in victim.stdout.readline().split())
        planted = shared_dir / f"{pid}-{ticks}.json"
        attacker = as_user(
            ATTACKER_UID,
            f"""
            from pathlib import Path
            Path({str(planted)!r}).write_text('{{"workload": "evil", "tracker": "x"}}')
            """,
            shared_dir,
        )
        assert attacker.wait(30) == 0, attacker.communicate()
        assert planted.stat().st_uid == ATTACKER_UID
        victim.stdin.write("\n")
        victim.stdin.flush()
        assert victim.stdout.readline().strip() == "registered"
        # The sampler books the victim's process to the victim's own registration.
        resolver = TrackedResolver(Inner(), str(shared_dir))
        assert resolver.resolve(pid, ticks) == Workload("env", "victim-job", pod="rank0")
        assert read_proc(pid) is not None
    finally:
        with contextlib.suppress(OSError):
            victim.stdin.write("\n")  # type: ignore[union-attr]
            victim.stdin.flush()  # type: ignore[union-attr]
        victim.communicate(timeout=30)
    # Its last tracker gone, the victim's own file is removed; the planted one is not its.
    assert [p.name for p in shared_dir.iterdir()] == [planted.name]


TRACKER = """
from wattprint import EmissionsTracker
began = time.monotonic()
tracker = EmissionsTracker(project_name="job", output_dir=sys.argv[1])
tracker.start()
print("went on", round(time.monotonic() - began), flush=True)
tracker.stop()
"""


def _lock(job_node: JobNode) -> Path:
    job_node.state.mkdir(exist_ok=True)
    return job_node.state / "state.json.lock"


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("fifo-start-log", "state.json.lock.start.log is a FIFO"),
        ("election-symlink", "state.json.lock.start is a symbolic link: not followed"),
        ("trackers-symlink", "state.json.lock.trackers is a symbolic link"),
        ("trackers-file", "state.json.lock.trackers is not a directory"),
    ],
)
def test_a_planted_file_beside_the_node_lock_is_one_line_never_a_hang(
    job_node: JobNode, fault: str, said: str
) -> None:
    lock = _lock(job_node)
    elsewhere = job_node.tmp / "elsewhere"
    elsewhere.mkdir()
    if fault == "fifo-start-log":
        os.mkfifo(f"{lock}.start.log")
    elif fault == "election-symlink":
        Path(f"{lock}.start").symlink_to(elsewhere / "victim")
    elif fault == "trackers-symlink":
        Path(f"{lock}.trackers").symlink_to(elsewhere)
    else:
        Path(f"{lock}.trackers").write_text("")
    proc = job_node.python(TRACKER, str(job_node.out))
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert stdout.split()[:2] == ["went", "on"] and int(stdout.split()[2]) < 30, stderr
    line = one_line(stderr, "wattprint: not tracking:")
    assert said in line, line
    assert list(elsewhere.iterdir()) == []  # nothing written where a link points


def test_run_with_a_fifo_at_the_samplers_log_samples_itself(job_node: JobNode) -> None:
    os.mkfifo(f"{_lock(job_node)}.start.log")
    marker = job_node.tmp / "ran"
    began = time.monotonic()
    result = job_node.run("--workload=nightly", command=("touch", str(marker)), timeout=60)
    assert time.monotonic() - began < 30
    assert result.returncode == 0 and marker.exists(), result.stderr
    line = one_line(result.stderr, "ts=", contains="sampling in this process")
    assert "state.json.lock.start.log is a FIFO" in line and "sampling in this process" in line
    assert list(job_node.out.glob("wattprint-nightly-*.json"))  # measured all the same


def test_one_users_registrations_never_push_anothers_registered_job_out(
    shared_dir: Path,
) -> None:
    # Any local user can register names in a root exporter's trackers directory (one per
    # process it runs). Over a full workload cap each user lifts only its share: another
    # user's flood, even one that names the victim's job too, leaves the victim counted.
    from wattprint.attribution.cardinality import OVERFLOW, WorkloadCap

    attacker = as_user(
        ATTACKER_UID,
        f"""
        import json, subprocess, sys
        from pathlib import Path
        from wattprint.host.procfs import read_proc
        names = [f"flood-{{i}}" for i in range(6)] + ["victim-job"]
        children = [subprocess.Popen(["sleep", "60"]) for _ in names]
        for child, name in zip(children, names):
            ticks = read_proc(child.pid).start_ticks
            Path({str(shared_dir)!r}, f"{{child.pid}}-{{ticks}}.json").write_text(
                json.dumps({{"workload": name, "tracker": ""}}))
        print("planted", flush=True)
        sys.stdin.readline()
        for child in children:
            child.kill()
        """,
        shared_dir,
    )
    victim = as_user(
        VICTIM_UID,
        f"""
        import os, sys
        from wattprint.host.identity.tracked import REGISTRATIONS, Registration
        from wattprint.host.procfs import read_proc
        tracker = object()
        ticks = read_proc(os.getpid()).start_ticks
        REGISTRATIONS.add({str(shared_dir)!r}, tracker,
                          Registration(os.getpid(), ticks, "victim-job", ""))
        print("registered", flush=True)
        sys.stdin.readline()
        REGISTRATIONS.remove({str(shared_dir)!r}, tracker)
        """,
        shared_dir,
    )
    try:
        for proc, said in ((attacker, "planted"), (victim, "registered")):
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == said, proc.communicate(timeout=30)
        resolver = TrackedResolver(Inner(), str(shared_dir))
        assert resolver.registrants(Workload("env", "flood-0")) == {ATTACKER_UID}
        assert resolver.registrants(Workload("env", "victim-job")) == {ATTACKER_UID, VICTIM_UID}
        cap = WorkloadCap(max_workloads=16, retention=600.0)  # a share of one
        cap.begin([], None)
        for i in range(16):
            cap.admit(Workload("env", f"job-{i}"))
        flood = [cap.admit(Workload("env", f"flood-{i}"), resolver.registrants) for i in range(6)]
        assert sum(w is not OVERFLOW for w in flood) == 1
        victims = Workload("env", "victim-job")
        assert cap.admit(victims, resolver.registrants) == victims
    finally:
        for proc in (attacker, victim):
            with contextlib.suppress(OSError):
                proc.stdin.write("\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
            proc.communicate(timeout=30)


def test_a_registration_landing_in_the_tick_of_the_last_read_is_seen(tmp_path: Path) -> None:
    # The sampler re-reads the trackers' directory when it changed: a registration
    # renamed in within the clock tick of its last read (a coarse file-system clock)
    # leaves the directory's mtime as it was, and must still be seen.
    from wattprint.host.identity.tracked import _REFRESH_S

    directory = tmp_path / "state.json.lock.trackers"
    directory.mkdir()
    resolver = TrackedResolver(Inner(), str(directory))
    late = Workload("env", "late")
    assert resolver.registrants(late) == frozenset()
    before = os.stat(directory)
    me = read_proc(os.getpid())
    assert me is not None
    (directory / f"{os.getpid()}-{me.start_ticks}.json").write_text(
        '{"workload": "late", "tracker": ""}'
    )
    os.utime(directory, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same tick
    time.sleep(2 * _REFRESH_S)
    assert resolver.registrants(late) == {os.getuid()}
