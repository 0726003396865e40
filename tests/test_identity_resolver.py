from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakeapiserver import NODE, TOKEN, FakeApiServer, fixture_pages
from procfs_fixture import FakeProc
from wattprint.core.model import Workload
from wattprint.host.identity import slurm as slurm_identity
from wattprint.host.identity.cgroup import JobCgroup
from wattprint.host.identity.kubernetes import KubernetesPods
from wattprint.host.identity.resolver import RECHECK_S, IdentityResolver
from wattprint.host.identity.tracked import TrackedResolver
from wattprint.host.procfs import read_proc_table
from wattprint.sampler.usage import ForgetsExited, JobResolver

JOB_POD_UID = "d2a7a51b-8257-4172-8276-eaa2845be93e"  # resnet-train, v2-systemd-containerd.txt
RESNET = Workload("kubernetes", "resnet-train", "ml-team", "resnet-train-x7k2p")


def env(name: str) -> Workload:
    return Workload(scheduler="env", workload=name)


def slurm(job: str) -> Workload:
    return Workload(scheduler="slurm", workload=job)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    return FakeProc.snapshot(tmp_path / "proc")


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        yield s


@pytest.fixture
def pods(server: FakeApiServer, tmp_path: Path) -> KubernetesPods:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    return KubernetesPods(server.url, NODE, token_path=str(token), ca_path=None, timeout_s=2.0)


def test_order_kubernetes_then_slurm_then_env(fake: FakeProc, pods: KubernetesPods) -> None:
    assert pods.refresh()
    # A pod process with the variable set still belongs to its pod's job.
    fake.add(100, cgroup_fixture="v2-systemd-containerd.txt", environ={"WATTPRINT_WORKLOAD": "x"})
    fake.add(101, cgroup_fixture="v1-slurm.txt", environ={"WATTPRINT_WORKLOAD": "x"})
    fake.add(102, cgroup_fixture="v2-slurm.txt")
    fake.add(103, environ={"SLURM_JOB_ID": "777", "WATTPRINT_WORKLOAD": "x"})
    fake.add(104, environ={"WATTPRINT_WORKLOAD": "nightly-eval"})
    fake.add(105)
    r = IdentityResolver(fake.path, kubernetes=pods)

    got = {pid: r.resolve(pid, 1000) for pid in range(100, 106)}

    assert got == {
        100: RESNET,
        101: slurm("4242"),
        102: slurm("4243"),
        103: slurm("777"),
        104: env("nightly-eval"),
        105: None,
    }
    assert r.errors_total == 0


def test_pod_cgroup_without_kubernetes_falls_through(fake: FakeProc) -> None:
    fake.add(100, cgroup_fixture="v2-systemd-containerd.txt", environ={"WATTPRINT_WORKLOAD": "x"})
    assert IdentityResolver(fake.path).resolve(100, 1000) == env("x")


def test_every_fixture_pod_resolves_through_its_cgroup(
    fake: FakeProc, pods: KubernetesPods
) -> None:
    assert pods.refresh()
    fixtures = {
        "v2-systemd-containerd.txt": "resnet-train",
        "v1-cgroupfs-containerd.txt": "llama-ft",
        "v2-systemd-crio.txt": "debug-shell",
        "v2-systemd-docker.txt": "inference-api",
        "v1-systemd-crio.txt": "vllm-prod",
        "v2-systemd-static-pod.txt": "kube-apiserver-node-a",
        "v2-cgroupfs-docker.txt": "wattprint",
    }
    for pid, name in enumerate(fixtures, start=200):
        fake.add(pid, cgroup_fixture=name)
    r = IdentityResolver(fake.path, kubernetes=pods)

    got = {name: r.resolve(pid, 1000) for pid, name in enumerate(fixtures, start=200)}

    assert {name: w.workload if w else None for name, w in got.items()} == fixtures
    assert all(w is not None and w.scheduler == "kubernetes" for w in got.values())


def test_pod_unknown_at_first_is_attributed_once_listed(
    fake: FakeProc, pods: KubernetesPods, server: FakeApiServer
) -> None:
    assert pods.refresh()
    new = fixture_pages()[0]["items"][0]
    new["metadata"].update(uid="4cd1a753-6722-4d9b-abda-28f030fe97ed", name="resnet-train-b9q4z")
    fake.add(300, cgroup_fixture="v2-cgroupfs-containerd.txt")  # that UID's cgroup
    r = IdentityResolver(fake.path, kubernetes=pods)

    assert r.resolve(300, 1000) is None
    assert r.resolve(300, 1000) is None
    server.add_pod(new)
    assert pods.refresh()

    assert r.resolve(300, 1000) == Workload(
        "kubernetes", "resnet-train", "ml-team", "resnet-train-b9q4z"
    )


def test_api_refusing_leaves_pod_processes_unattributed(
    fake: FakeProc, pods: KubernetesPods, server: FakeApiServer
) -> None:
    server.fail_status = 403
    assert not pods.refresh()
    fake.add(100, cgroup_fixture="v2-systemd-containerd.txt")
    fake.add(101, environ={"WATTPRINT_WORKLOAD": "outside-k8s"})
    r = IdentityResolver(fake.path, kubernetes=pods)

    assert r.resolve(100, 1000) is None
    assert r.resolve(101, 1000) == env("outside-k8s")
    assert pods.errors_total == 1
    assert r.errors_total == 0

    server.fail_status = None
    assert pods.refresh()
    assert r.resolve(100, 1000) == RESNET


def test_env_inherited_from_nearest_ancestor(fake: FakeProc) -> None:
    fake.add(10, ppid=1, start=100, environ={"WATTPRINT_WORKLOAD": "outer"})
    fake.add(11, ppid=10, start=110, environ={"WATTPRINT_WORKLOAD": "sweep-3"})  # launcher
    fake.add(12, ppid=11, start=120)  # a wrapper that cleared its environment
    fake.add(13, ppid=12, start=130)  # a rank
    fake.add(14, ppid=1, start=140)  # unrelated
    table = read_proc_table(fake.path)

    for use_table in (table, None):
        r = IdentityResolver(fake.path)
        assert r.resolve(13, 130, use_table) == env("sweep-3")
        assert r.resolve(12, 120, use_table) == env("sweep-3")
        assert r.resolve(10, 100, use_table) == env("outer")
        assert r.resolve(14, 140, use_table) is None


def test_parent_pid_reused_by_a_younger_process_is_not_an_ancestor(fake: FakeProc) -> None:
    # 20's parent died and its PID went to a process started after 21.
    fake.add(20, ppid=1, start=500, environ={"WATTPRINT_WORKLOAD": "impostor"})
    fake.add(21, ppid=20, start=400)

    assert IdentityResolver(fake.path).resolve(21, 400, read_proc_table(fake.path)) is None


def test_env_variable_list_in_order(fake: FakeProc) -> None:
    fake.add(30, environ={"TORCHELASTIC_RUN_ID": "run-42"})
    fake.add(31, environ={"TORCHELASTIC_RUN_ID": "run-42", "WATTPRINT_WORKLOAD": "mine"})
    fake.add(32, environ={"WATTPRINT_WORKLOAD": ""})  # empty is unset
    r = IdentityResolver(fake.path, env_vars=("WATTPRINT_WORKLOAD", "TORCHELASTIC_RUN_ID"))

    assert r.resolve(30, 1000) == env("run-42")
    assert r.resolve(31, 1000) == env("mine")
    assert r.resolve(32, 1000) is None


def test_unreadable_environ_is_no_match_not_an_error(fake: FakeProc) -> None:
    fake.add(40, cgroup_fixture="v2-slurm.txt")
    fake.add(41)
    for pid in (40, 41):
        (fake.root / str(pid) / "environ").unlink()
        (fake.root / str(pid) / "environ").mkdir()  # any read fails, like EACCES
    r = IdentityResolver(fake.path)

    assert r.resolve(40, 1000) == slurm("4243")  # from the cgroup alone
    assert r.resolve(41, 1000) is None
    assert r.errors_total == 0


def test_pid_reuse_gets_a_fresh_identity(fake: FakeProc) -> None:
    fake.add(50, start=1000, environ={"WATTPRINT_WORKLOAD": "first"})
    r = IdentityResolver(fake.path)
    assert r.resolve(50, 1000) == env("first")

    fake.remove(50)
    fake.add(50, start=2000, environ={"WATTPRINT_WORKLOAD": "second"})

    assert r.resolve(50, 2000) == env("second")


def test_files_of_a_process_that_took_over_the_pid_are_not_cached(fake: FakeProc) -> None:
    # The sampler listed (60, 1000); by the time it resolves, 60 is a new process.
    fake.add(60, start=3000, environ={"WATTPRINT_WORKLOAD": "newcomer"})
    r = IdentityResolver(fake.path)

    assert r.resolve(60, 1000) is None
    assert r.resolve(60, 3000) == env("newcomer")


def test_process_gone_before_resolving(fake: FakeProc) -> None:
    r = IdentityResolver(fake.path)
    assert r.resolve(70, 1000) is None
    assert r.errors_total == 0
    assert r.cached == 0
    fake.add(70, environ={"WATTPRINT_WORKLOAD": "late"})
    assert r.resolve(70, 1000) == env("late")


def test_identity_cached_per_process(fake: FakeProc) -> None:
    fake.add(80, environ={"WATTPRINT_WORKLOAD": "kept"})
    r = IdentityResolver(fake.path)
    assert r.resolve(80, 1000) == env("kept")

    (fake.root / "80" / "environ").write_bytes(b"WATTPRINT_WORKLOAD=changed\0")

    assert r.resolve(80, 1000) == env("kept")


def test_unclaimed_process_is_checked_again_later(fake: FakeProc) -> None:
    fake.add(90)
    clock = Clock()
    r = IdentityResolver(fake.path, recheck_s=60.0, clock=clock)
    assert r.resolve(90, 1000) is None
    # It exec'd a job with the variable set (same PID and start time).
    (fake.root / "90" / "environ").write_bytes(b"WATTPRINT_WORKLOAD=exec-ed\0")

    clock.now += 29.0
    assert r.resolve(90, 1000) is None  # rechecks are 30-90 s apart
    clock.now += 62.0
    assert r.resolve(90, 1000) == env("exec-ed")


def sampled(r: IdentityResolver, fake: FakeProc, pid: int) -> Workload | None:
    """What the sampler gets for pid: resolved with the table it read this sample."""
    return r.resolve(pid, 1000, read_proc_table(fake.path))


def test_an_unclaimed_process_is_read_again_when_it_runs_another_program(
    fake: FakeProc,
) -> None:
    # A shell that execs a job (srun, a launcher): same PID, same start time, a new name
    # in its stat, a new environment; the sampler's table carries the name.
    fake.add(91, comm="bash")
    clock = Clock()
    r = IdentityResolver(fake.path, clock=clock)
    assert sampled(r, fake, 91) is None
    (fake.root / "91" / "environ").write_bytes(b"WATTPRINT_WORKLOAD=late-set\0")
    clock.now += 300.0
    # Same name: the same program, not read again (a variable only exec() brings in).
    assert sampled(r, fake, 91) is None
    fake.add(91, comm="train.py", environ={"WATTPRINT_WORKLOAD": "exec-ed"})
    assert sampled(r, fake, 91) == env("exec-ed")


def test_an_exec_of_a_program_of_the_same_name_is_seen_too(fake: FakeProc) -> None:
    # bash exec'ing bash, python3 a python3: the name stays, the stack moves (ASLR).
    fake.add(93, comm="python3")
    r = IdentityResolver(fake.path, clock=Clock())
    assert sampled(r, fake, 93) is None
    fake.add(93, comm="python3", environ={"WATTPRINT_WORKLOAD": "same-name"})
    stat = fake.root / "93" / "stat"
    stat.write_text(stat.read_text().replace(" 140730000000000 ", " 140730000004096 "))
    assert sampled(r, fake, 93) == env("same-name")


def test_an_unclaimed_process_that_keeps_its_name_is_read_again_after_ten_minutes(
    fake: FakeProc,
) -> None:
    # A move into a job's cgroup without an exec (an administrator's echo into
    # cgroup.procs) shows no other way.
    fake.add(92, comm="worker")
    clock = Clock()
    r = IdentityResolver(fake.path, clock=clock)
    assert sampled(r, fake, 92) is None
    (fake.root / "92" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_55/step_0\n")
    clock.now += 1.5 * RECHECK_S + 1
    assert sampled(r, fake, 92) == slurm("55")


def test_resolution_error_is_counted_and_swallowed(fake: FakeProc) -> None:
    fake.add(95)
    (fake.root / "95" / "cgroup").unlink()
    (fake.root / "95" / "cgroup").mkdir()
    r = IdentityResolver(fake.path)

    assert r.resolve(95, 1000) is None
    assert r.errors_total == 1


def test_cache_is_bounded_and_forgets_dead_processes(fake: FakeProc) -> None:
    for pid in range(500, 510):
        fake.add(pid, environ={"WATTPRINT_WORKLOAD": f"w{pid}"})
    r = IdentityResolver(fake.path, cache_size=4)

    for pid in range(500, 510):
        assert r.resolve(pid, 1000) == env(f"w{pid}")
        assert r.cached <= 4

    r.forget_missing([(508, 1000), (509, 1000)])
    assert r.cached == 2


def test_a_tracked_resolver_keeps_the_inner_ones_job_names_cache_and_errors(
    fake: FakeProc, tmp_path: Path
) -> None:
    # The sampler finds these by Protocol; from Python 3.12 that lookup is static, so a
    # wrapper that only forwards through __getattr__ would lose job cgroups' names.
    for pid in range(500, 504):
        fake.add(pid, environ={"WATTPRINT_WORKLOAD": f"w{pid}"})
    inner = IdentityResolver(fake.path)
    tracked = TrackedResolver(inner, str(tmp_path / "trackers"), fake.path)
    for name in ("resolve_job", "forget_missing"):
        inspect.getattr_static(tracked, name)
    assert isinstance(tracked, JobResolver) and isinstance(tracked, ForgetsExited)

    assert tracked.resolve_job(
        JobCgroup(slurm_identity.SCHEDULER, "55", "/job_55", "/job_55", False)
    ) == slurm("55")
    for pid in range(500, 504):
        assert tracked.resolve(pid, 1000) == env(f"w{pid}")
    tracked.forget_missing([(503, 1000)])
    assert inner.cached == 1

    fake.add(504)
    (fake.root / "504" / "cgroup").unlink()
    (fake.root / "504" / "cgroup").mkdir()  # unreadable as a file: a resolution error
    tracked.resolve(504, 1000)
    assert tracked.errors_total == inner.errors_total == 1
