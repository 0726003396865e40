"""Hostile and absurd settings (issue 33): each is refused at start with one line and
status 2, never taken and left to fail every sample or hang the start."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_cli import wattprint
from wattprint.config.options import ConfigError, build_config
from wattprint.export.webconfig import WebConfigError, load_web_config


@pytest.mark.parametrize(
    ("flag", "named"),
    [
        ("--embodied.gpu-kgco2e=NVIDIA H200=1e308", "--embodied.gpu-kgco2e"),
        ("--embodied.gpu-kgco2e=NVIDIA H200=20000", "--embodied.gpu-kgco2e"),
        ("--embodied.node-kgco2e=1e308", "--embodied.node-kgco2e"),
        ("--cpu.tdp-watts=1e308", "--cpu.tdp-watts"),
        ("--cpu.tdp-watts=1e15", "--cpu.tdp-watts"),
        ("--memory.watts-per-gib=1e308", "--memory.watts-per-gib"),
        ("--memory.watts-per-gib=inf", "--memory.watts-per-gib"),
        ("--pue=1e308", "--pue"),
    ],
)
def test_an_absurd_figure_is_refused_at_start(flag: str, named: str) -> None:
    result = wattprint(flag, "doctor")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "flag",
    [
        "--embodied.gpu-kgco2e=NVIDIA H200=164",
        "--embodied.node-kgco2e=2500",
        "--cpu.tdp-watts=500",
        "--memory.watts-per-gib=0.4",
    ],
)
def test_real_figures_are_taken(flag: str) -> None:
    result = wattprint(flag, "doctor")
    assert result.returncode in (0, 1), result.stderr  # doctor's verdict on this machine
    assert "bad value" not in result.stderr


@pytest.mark.parametrize("cost", [15, 20, 31])
def test_a_high_bcrypt_cost_is_refused_at_start_not_computed(tmp_path: Path, cost: int) -> None:
    # The hash need not be real: at cost 31 computing one would take days.
    hashed = f"$2y${cost}$" + "a" * 53
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  alice: {hashed}\n")
    try:
        result = wattprint(
            f"--web.config.file={web}", "--web.listen-address=127.0.0.1:0", timeout=20
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"cost {cost}: still starting after 20 s, not listening, nothing said")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"bcrypt cost {cost}" in lines[0], result.stderr


LAUGHS = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{chr(98 + n)}: &{chr(98 + n)} [{','.join(['*' + chr(97 + n)] * 9)}]\n" for n in range(8)
    )
    + "carbon.zone: *i\n"
)

HOSTILE = [
    (b"pue: 1.2\npue: 1.5\n", "key 'pue' is given twice"),
    (LAUGHS.encode(), "aliases (*name) are not allowed"),
    (b"carbon.zone: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested deeper than 32"),
    (b"carbon.zone: " + b"{a: " * 50_000 + b"b" + b"}" * 50_000 + b"\n", "nested deeper than 32"),
    (b"carbon.zone: Z\xfcrich\n", "is not UTF-8"),
    (b"[a]: 1\n", "a key must be a plain name"),
    (b"? {a: 1}\n: 2\n", "a key must be a plain name"),
    (b"carbon.zone: " + b"x" * (2 * 1024 * 1024) + b"\n", "is over 1048576 bytes"),
]


@pytest.mark.parametrize(("content", "named"), HOSTILE)
def test_a_hostile_config_file_is_one_line(tmp_path: Path, content: bytes, named: str) -> None:
    path = tmp_path / "wattprint.yml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as raised:
        build_config({}, environ={}, config_file=str(path))
    message = str(raised.value)
    assert named in message and str(path) in message and "\n" not in message


@pytest.mark.parametrize(("content", "named"), HOSTILE[:6])
def test_a_hostile_web_config_is_one_line(tmp_path: Path, content: bytes, named: str) -> None:
    path = tmp_path / "web.yml"
    path.write_bytes(content.replace(b"carbon.zone", b"basic_auth_users"))
    with pytest.raises(WebConfigError) as raised:
        load_web_config(str(path))
    message = str(raised.value)
    assert named in message and str(path) in message and "\n" not in message


def test_the_billion_laughs_exits_2_at_once(tmp_path: Path) -> None:
    path = tmp_path / "wattprint.yml"
    path.write_text(LAUGHS)
    result = wattprint(f"--config.file={path}", "doctor", timeout=20)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("line", ["NO", "no", "No", "'NO'"])
def test_norway_is_a_zone_not_false(tmp_path: Path, line: str) -> None:
    """YAML 1.1 read NO as false; the zone option is a string."""
    path = tmp_path / "wattprint.yml"
    path.write_text(f"carbon.zone: {line}\n")
    assert build_config({}, environ={}, config_file=str(path)).carbon_zone.upper() == "NO"


@pytest.mark.parametrize(("line", "stamped"), [("true", True), ("yes", True), ("false", False)])
def test_booleans_still_read_as_booleans(tmp_path: Path, line: str, stamped: bool) -> None:
    path = tmp_path / "wattprint.yml"
    path.write_text(f"sample.timestamps: {line}\n")
    assert build_config({}, environ={}, config_file=str(path)).sample_timestamps is stamped


def test_a_duplicate_web_config_user_is_refused(tmp_path: Path) -> None:
    hashed = "$2y$04$" + "a" * 53
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: {hashed}\n  alice: {hashed}\n")
    with pytest.raises(WebConfigError, match="key 'alice' is given twice"):
        load_web_config(str(path))


def test_listening_on_port_0_logs_the_port_bound() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wattprint",
            "--web.listen-address=127.0.0.1:0",
            "--gpu.source=none",
            "--cpu.source=none",
            "--memory.source=none",
            "--carbon.zone=DE",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("WATTPRINT_")}
        | {"WATTPRINT_STATE_FILE": ""},
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        line = ""
        while "listening on" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, line
            line = proc.stderr.readline()
        port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", line).group(1))  # type: ignore[union-attr]
        assert port != 0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the port logged is the one it serves
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_config_file_that_is_not_a_file_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "wattprint.yml"
    if kind == "fifo":
        os.mkfifo(path)  # nobody ever writes: reading it would wait forever
    else:
        path = Path("/dev/zero")  # endless
    result = wattprint(f"--config.file={path}", "doctor", timeout=20)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"wattprint: --config.file {path} is not a file"
    ], result.stderr
