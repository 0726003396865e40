"""The container image: scripts/build-image builds the Dockerfile with buildah (from a
Debian bookworm base it makes with mmdebstrap), and `buildah run --isolation=chroot`
runs it as a node would: `--version`, `doctor` and the exporter on a fake sysfs/procfs
tree until /metrics answers. The image runs as a non-root user, writes nothing to its
root file system (so Kubernetes' readOnlyRootFilesystem holds) and holds no compiler.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import requests

import wattprint
from procfs_fixture import FakeProc
from prom_harness import free_port, stop_process

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SYS_TREE = REPO / "tests" / "fixtures" / "sys" / "intel-2pkg"
IMAGE = "localhost/wattprint:test"
NODE = "/fixture"  # where the fake node's tree is mounted inside the container
NODE_FLAGS = (f"--path.sysfs={NODE}/sys", f"--path.procfs={NODE}/proc", "--gpu.source=none")
# The compilers a "slim" image must not carry (cc1 is gcc's actual compiler).
COMPILER_CHECK = """
import glob, shutil
found = [n for n in ("cc", "gcc", "c++", "g++", "cpp", "clang", "tcc") if shutil.which(n)]
found += glob.glob("/usr/lib/gcc/*/*/cc1") + glob.glob("/usr/libexec/gcc/*/*/cc1")
print(" ".join(found))
"""


def _require(tool: str) -> None:
    """Skip without the tool (or root, which buildah's chroot isolation needs here);
    fail under CI=true, where scripts/test installs them."""
    missing = None
    if shutil.which(tool) is None:
        missing = f"{tool} is not installed (Debian package {tool}; scripts/test installs it)"
    elif os.geteuid() != 0:
        missing = "building and running the image with buildah needs root"
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(missing)
        pytest.skip(missing)


def _buildah(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"buildah {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return done.stdout


def _run_argv(
    ctr: str,
    argv: Sequence[str],
    *,
    user: str | None = None,
    node: Path | None = None,
    state: Path | None = None,
) -> list[str]:
    opts = ["--isolation=chroot"]
    if user is not None:
        opts += ["--user", user]
    if node is not None:
        opts += ["--volume", f"{node}:{NODE}:ro"]
    if state is not None:
        # The state file's directory is the node's, as the chart's hostPath makes it.
        opts += ["--volume", f"{state}:/var/lib/wattprint"]
    return ["buildah", "run", *opts, ctr, "--", *argv]


def run_in(
    ctr: str, *argv: str, user: str | None = None, node: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _run_argv(ctr, argv, user=user, node=node),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def image() -> str:
    _require("buildah")
    _require("mmdebstrap")
    build = subprocess.run(
        [str(REPO / "scripts" / "build-image"), IMAGE],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if build.returncode != 0:
        output = (build.stdout + build.stderr)[-4000:]
        pytest.fail(f"scripts/build-image failed ({build.returncode}):\n{output}")
    return IMAGE


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = _buildah("from", "--pull=never", image).strip()
    try:
        yield name
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A node with two RAPL packages (tests/fixtures/sys) and one process that names
    its workload, readable by the image's unprivileged user."""
    root = tmp_path_factory.mktemp("node")
    shutil.copytree(SYS_TREE, root / "sys")
    proc = FakeProc.snapshot(root / "proc")
    proc.add(4242, utime=500, environ={"WATTPRINT_WORKLOAD": "train"})
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def serve_metrics(ctr: str, node: Path, log: Path, user: str | None = None) -> str:
    """Start the exporter in the container, return its first /metrics page once it
    measures, stop it."""
    port = free_port()
    argv = ["wattprint", *NODE_FLAGS, f"--web.listen-address=127.0.0.1:{port}"]
    state = log.with_suffix(".state")
    state.mkdir()
    state.chmod(0o777)
    with log.open("wb") as out:
        # chroot isolation shares the host's network, so the test reaches the port.
        proc = subprocess.Popen(
            _run_argv(ctr, argv, user=user, node=node, state=state),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    pytest.fail(f"exporter exited {proc.returncode}:\n{log.read_text()}")
                try:
                    # Ready (as a readiness probe sees it) once the first sample is in:
                    # before, /metrics answers with the build info alone.
                    health = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
                except requests.ConnectionError:
                    time.sleep(0.3)
                    continue
                if health.status_code != 200:
                    time.sleep(0.1)
                    continue
                reply = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
                assert reply.status_code == 200, reply.text
                # The default --state.file is in the node's directory, not the image.
                assert (state / "state.json.lock").is_file()
                return reply.text
            pytest.fail(f"no /metrics within 60 s:\n{log.read_text()}")
        finally:
            stop_process(proc)


def test_version_is_the_repository_version(container: str) -> None:
    done = run_in(container, "wattprint", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wattprint {wattprint.__version__}"


def test_runs_as_a_non_root_user_with_wattprint_as_entry_point(image: str, container: str) -> None:
    config = json.loads(_buildah("inspect", "--type", "image", image))["OCIv1"]["config"]
    assert config.get("User") == "65534:65534"
    assert config.get("Entrypoint") == ["wattprint"]
    done = run_in(container, "python3", "-c", "import os; print(os.getuid(), os.getgid())")
    assert done.stdout.split() == ["65534", "65534"], done.stderr


def test_doctor_reads_the_mounted_node(container: str, node: Path) -> None:
    done = run_in(container, "wattprint", "doctor", *NODE_FLAGS, node=node)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"cpu 1: rapl ({NODE}/sys/class/powercap/intel-rapl:1/energy_uj)" in done.stdout
    assert f"memory 0: rapl ({NODE}/sys/class/powercap/intel-rapl:0:2/energy_uj)" in done.stdout
    assert f"reading processes from {NODE}/proc" in done.stdout


def test_exporter_serves_metrics_of_the_fake_node(
    container: str, node: Path, tmp_path: Path
) -> None:
    text = serve_metrics(container, node, tmp_path / "exporter.log")
    for device in ("0", "1"):
        for component in ("cpu", "memory"):
            labels = f'component="{component}",device="{device}",estimated="false",method="rapl"'
            assert f"wattprint_measurement_info{{{labels}}} 1.0" in text
    assert 'wattprint_collector_success{collector="procfs"} 1.0' in text


def _upper_dir(ctr: str) -> Path:
    """The container's own overlay layer: every file the container writes lands here."""
    merged = _buildah("mount", ctr).strip()
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if fields[4] != merged:
                continue
            tail = fields[fields.index("-") + 1 :]  # fstype, source, super options
            assert tail[0] == "overlay", f"{merged} is {tail[0]}, not overlay"
            options = dict(o.split("=", 1) for o in tail[2].split(",") if "=" in o)
            return Path(options["upperdir"])
    finally:
        _buildah("umount", ctr)
    pytest.fail(f"{merged} is not in /proc/self/mountinfo")


def _snapshot(upper: Path) -> dict[str, tuple[int, int, int]]:
    # Directory times are left out: buildah adds and removes its own mount points
    # (/run/.containerenv) in /run on every run.
    state = {}
    for path in [upper, *upper.rglob("*")]:
        st = path.lstat()
        when = 0 if path.is_dir() else st.st_mtime_ns
        state[str(path.relative_to(upper))] = (st.st_mode, st.st_size, when)
    return state


def test_root_file_system_is_never_written(container: str, node: Path, tmp_path: Path) -> None:
    upper = _upper_dir(container)
    # The first run leaves buildah's own mount points (/etc/hosts, /fixture) behind.
    assert run_in(container, "true", node=node).returncode == 0
    before = _snapshot(upper)
    assert run_in(container, "wattprint", "--version").returncode == 0
    assert run_in(container, "wattprint", "doctor", *NODE_FLAGS, node=node).returncode == 0
    serve_metrics(container, node, tmp_path / "nobody.log")
    # RAPL on a real node needs uid 0 (docs/deploy.md); root must not write either.
    serve_metrics(container, node, tmp_path / "root.log", user="0:0")
    after = _snapshot(upper)
    written = sorted(p for p in after.keys() | before.keys() if after.get(p) != before.get(p))
    assert not written, f"the container wrote {len(written)} paths to its root: {written[:10]}"


def test_no_compiler_is_left_in_the_image(container: str) -> None:
    done = run_in(container, "python3", "-c", COMPILER_CHECK)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
