"""The state file against a full disk, bad or hostile files and planted symlinks (issue
33): a save that cannot be written whole keeps the old file, and no file of any content
or size stops the exporter or makes a counter it resumes contradict another."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .faultrig import Node, RigFactory, value, warnings_about
from .test_faults_nvml import gpu_energy
from .test_restart import BOOT, restarts, set_boot

PAGE = 4096


@pytest.fixture(name="small_disk")
def small_disk_fixture(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs: os.write on it writes what fits and says nothing."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "wattprint-test", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        message = f"cannot mount a small tmpfs (needs root): {done.stderr.strip()}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def leave_free(disk: Path, free: int) -> Path:
    """Fill `disk` but for `free` bytes (whole pages)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * PAGE) == PAGE:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    size = filler.stat().st_size
    os.truncate(filler, max(size - free, 0))
    return filler


def test_a_nearly_full_disk_keeps_the_old_state_whole(
    node: Node,
    rig_factory: RigFactory,
    small_disk: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    set_boot(node, BOOT)
    for n in range(40):  # a node with jobs: a state of a few pages
        node.add_process(700 + n, environ={"WATTPRINT_WORKLOAD": f"job-{n}"}, rss_pages=1000)
    state = small_disk / "state.json"
    first = rig_factory(**{"state.file": str(state)})
    first.steps(3)
    saved = state.read_bytes()
    assert len(saved) > PAGE  # else the short write below could not happen
    # Less room than the file, but not none: os.write writes a page and returns.
    filler = leave_free(small_disk, PAGE)
    assert os.statvfs(small_disk).f_bavail * PAGE < len(saved)
    caplog.set_level(logging.WARNING)
    first.steps(4)
    served = gpu_energy(first, "0")
    assert value(first.series, "wattprint_state_errors_total", reason="write") == 3
    assert len(warnings_about(caplog, "cannot write state file")) == 1
    assert state.read_bytes() == saved  # the last whole state, not a truncated one
    assert not (small_disk / "state.json.tmp").exists()

    first.kill()
    filler.unlink()
    second = rig_factory(**{"state.file": str(state)})
    second.step()
    assert restarts(second, "resumed") == 1 and restarts(second, "fresh") == 0
    assert gpu_energy(second, "0") >= served  # from the saved state, plus its gap
    assert json.loads(state.read_bytes())["format"] == "wattprint-state/v1"
