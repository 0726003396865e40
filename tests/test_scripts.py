"""./scripts/run as the README gives it: the first start installs into .venv, later
starts do not reinstall (pip is not run at all), a change to pyproject.toml installs
again, and nothing is built inside the checkout."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from wattprint._version import __version__

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def checkout_copy(dest: Path) -> Path:
    """The committed tree plus working changes, as a fresh clone would hold it."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    with tarfile.open(dest / "src.tar", "w") as tar:
        for name in filter(None, files):
            path = REPO / name.decode()
            if path.exists():
                tar.add(path, arcname=name.decode(), recursive=False)
    copy = dest / "wattprint"
    with tarfile.open(dest / "src.tar") as tar:
        tar.extractall(copy, filter="tar")
    return copy


def test_run_installs_once_and_leaves_no_build_directory(tmp_path: Path) -> None:
    copy = checkout_copy(tmp_path)
    before = set(os.listdir(copy))
    log = tmp_path / "pip.log"
    # pip appends to PIP_LOG whenever it runs: the log says whether a start ran pip.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WATTPRINT_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    env["PIP_LOG"] = str(log)

    def start() -> str:
        result = subprocess.run(
            [str(copy / "scripts" / "run"), "--version"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout.strip()

    assert start() == f"wattprint {__version__}"
    assert log.exists(), "the first start did not install"
    log.unlink()
    assert start() == f"wattprint {__version__}"
    assert not log.exists(), "the second start ran pip again"

    os.utime(copy / "pyproject.toml")  # later than the last install
    assert start() == f"wattprint {__version__}"
    assert log.exists(), "a changed pyproject.toml did not reinstall"

    # Only the venv is new at the top (the editable install's egg-info goes under
    # exporter/, ignored by git); no build/.
    assert set(os.listdir(copy)) - before == {".venv"}
