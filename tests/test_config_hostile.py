"""Hostile and absurd settings (issue 33): each is refused at start with one line and
status 2, never taken and left to fail every sample or hang the start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from test_cli import wattprint


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
