"""The state file against a full disk, bad or hostile files and planted symlinks (issue
33): a save that cannot be written whole keeps the old file, and no file of any content
or size stops the exporter or makes a counter it resumes contradict another."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from wattprint.durability import statefile
from wattprint.durability.nodelock import NodeLock

from .faultrig import Node, Rig, RigFactory, value, warnings_about
from .test_faults_nvml import gpu_energy
from .test_restart import BOOT, gap, restarts, set_boot

PAGE = 4096
EMBODIED = {"embodied.gpu-kgco2e": "NVIDIA H200=164", "embodied.node-kgco2e": "2500"}


@pytest.fixture(name="small_disk")
def small_disk_fixture(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs: os.write on it writes what fits and says nothing."""
    mount = tmp_path / "disk"
    mount.mkdir()
    # As root (CI here), else through sudo where it needs no password (scripts/test's way).
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    done = subprocess.run(
        [
            *sudo,
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size=64k,uid={os.getuid()}",
            "wattprint-test",
            str(mount),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        message = f"cannot mount a small tmpfs (needs root or sudo -n): {done.stderr.strip()}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield mount
    finally:
        subprocess.run([*sudo, "umount", "-l", str(mount)], check=False)


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
    assert value(first.series, "wattprint_state_errors_total", reason="write") == 4
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


def _without_monotonic(doc: dict[str, Any]) -> None:
    del doc["monotonic"]


def _text_monotonic(doc: dict[str, Any]) -> None:
    doc["monotonic"] = "yesterday"


def _nan_monotonic(doc: dict[str, Any]) -> None:
    doc["monotonic"] = math.nan


def _no_boot_id(doc: dict[str, Any]) -> None:
    del doc["boot_id"]


def _energy_x1000(doc: dict[str, Any]) -> None:
    for row in doc["energy"]:
        row[3] *= 1000


def _embodied_x1000(doc: dict[str, Any]) -> None:
    assert doc["embodied"], "the fixture's H200s accrue embodied emissions"
    for row in doc["embodied"]:
        row[3] *= 1000


def _gpu_row_removed(doc: dict[str, Any]) -> None:
    doc["devices"] = [
        d for d in doc["devices"] if not (d["component"] == "gpu" and d["device"] == "1")
    ]


def _untouched(doc: dict[str, Any]) -> None:
    """The positive control: the same document, read and written back the same way."""


def _restart_from(
    rig_factory: RigFactory, state: Path, spoil: Callable[[dict[str, Any]], None]
) -> tuple[Rig, dict[str, float]]:
    """Run, kill, spoil the saved document, start again with the same flags: the second
    rig (three scrapes) and the first's last devices' figures, GPU energy and embodied."""
    flags = {"state.file": str(state), **EMBODIED}
    first = rig_factory(**flags)
    first.steps(4)
    served = {gpu: gpu_energy(first, gpu) for gpu in ("0", "1")}
    served["embodied"] = value(first.series, "wattprint_device_embodied_grams_total")
    first.kill()
    doc = json.loads(state.read_bytes())
    spoil(doc)
    state.write_text(json.dumps(doc))
    second = rig_factory(**flags)
    second.steps(3)  # every scrape conserved, no counter down within the run
    return second, served


def _parts_are_the_devices(rig: Rig) -> None:
    for gpu in ("0", "1"):
        parts = rig.energy("workload", component="gpu", gpu=gpu) + rig.energy(
            "unattributed", component="gpu", gpu=gpu
        )
        assert parts == pytest.approx(gpu_energy(rig, gpu))


@pytest.mark.parametrize(
    "spoil",
    [
        _without_monotonic,
        _text_monotonic,
        _nan_monotonic,
        _no_boot_id,
        _energy_x1000,
        _gpu_row_removed,
        _embodied_x1000,
    ],
)
def test_a_state_that_contradicts_itself_is_refused_as_corrupt(
    node: Node,
    rig_factory: RigFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    spoil: Callable[[dict[str, Any]], None],
) -> None:
    set_boot(node, BOOT)
    state = tmp_path / "state" / "state.json"
    caplog.set_level(logging.WARNING)
    second, _ = _restart_from(rig_factory, state, spoil)
    assert value(second.series, "wattprint_state_errors_total", reason="corrupt") == 1
    assert restarts(second, "fresh") == 1 and restarts(second, "resumed") == 0
    assert len(warnings_about(caplog, str(state))) == 1
    # Started again from the hardware's reading: the parts are the devices' again.
    _parts_are_the_devices(second)
    assert json.loads(state.read_bytes())["format"] == "wattprint-state/v1"


def test_the_same_state_unspoiled_resumes(
    node: Node, rig_factory: RigFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The control of the test above: its document untouched, with the same flags
    (embodied for GPU and node), resumes, so a check that refused a sound state fails."""
    set_boot(node, BOOT)
    state = tmp_path / "state" / "state.json"
    caplog.set_level(logging.WARNING)
    second, served = _restart_from(rig_factory, state, _untouched)
    assert value(second.series, "wattprint_state_errors_total") == 0
    assert restarts(second, "resumed") == 1 and restarts(second, "fresh") == 0
    assert warnings_about(caplog, str(state)) == []
    for gpu in ("0", "1"):
        assert gpu_energy(second, gpu) > served[gpu]  # continued, not started from 0
    assert served["embodied"] > 0
    assert value(second.series, "wattprint_device_embodied_grams_total") > served["embodied"]
    _parts_are_the_devices(second)


def _deep(path: Path) -> None:
    path.write_text("[" * 200_000 + "]" * 200_000)


def _huge(path: Path) -> None:
    with path.open("wb") as handle:  # sparse: 17 MiB on paper, nothing on disk
        handle.write(b'{"format": "wattprint-state/v1"')
        handle.seek(17 * 1024 * 1024)
        handle.write(b"}")


@pytest.mark.parametrize(("make", "reason"), [(_deep, "corrupt"), (_huge, "too_large")])
def test_a_deep_or_huge_state_file_is_refused_unread(
    node: Node,
    rig_factory: RigFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    make: Callable[[Path], None],
    reason: str,
) -> None:
    set_boot(node, BOOT)
    state = tmp_path / "state.json"
    make(state)
    caplog.set_level(logging.WARNING)
    rig = rig_factory(**{"state.file": str(state)})
    rig.steps(2)
    assert value(rig.series, "wattprint_state_errors_total", reason=reason) == 1
    assert restarts(rig, "fresh") == 1
    assert len(warnings_about(caplog, str(state))) == 1
    assert state.stat().st_size < 1024 * 1024  # replaced by the exporter's own


def test_symlinks_planted_in_the_state_directory_are_not_written_through(
    node: Node, rig_factory: RigFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    set_boot(node, BOOT)
    directory = tmp_path / "state"
    directory.mkdir()
    victims = {name: tmp_path / f"victim-{name}" for name in ("lock", "tmp")}
    for name, victim in victims.items():
        victim.write_text("precious\n")
        (directory / f"state.json.{name}").symlink_to(victim)
    caplog.set_level(logging.WARNING)
    rig = rig_factory(**{"state.file": str(directory / "state.json")})
    rig.steps(2)
    # The exporter's lock is not taken through the link (app.py warns and goes on).
    with pytest.raises(OSError):
        NodeLock.acquire(str(directory / "state.json.lock"), "127.0.0.1:9400")
    for victim in victims.values():
        assert victim.read_text() == "precious\n"
    # The tmp link is removed and the state written.
    assert json.loads((directory / "state.json").read_bytes())["format"] == "wattprint-state/v1"
    assert value(rig.series, "wattprint_state_errors_total", reason="write") == 0


def test_a_model_killed_in_its_first_sample_books_its_outage_from_the_model(
    node: Node, rig_factory: RigFactory, tmp_path: Path
) -> None:
    set_boot(node, BOOT)
    (node.procfs / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Xeon Platinum 8480+\n\n")
    state = tmp_path / "state.json"
    flags = {"state.file": str(state), "cpu.source": "model", "memory.source": "model"}
    first = rig_factory(**flags)
    first.step()  # a model has no power before its second read: saved as null
    first.kill()
    saved = {d["component"]: d for d in json.loads(state.read_bytes())["devices"]}
    assert saved["memory"]["power_w"] is None and saved["cpu"]["power_w"] is None
    time.sleep(1.0)  # the outage, on the monotonic clock the models integrate over
    second = rig_factory(**flags)
    before = time.monotonic()
    second.step()
    after = time.monotonic()
    second.step()
    memory = next(s for s in second.exporter.sampler.parts.sources if s.name == "memory_model")
    watts = memory.power  # type: ignore[attr-defined]
    outage = (before - saved["memory"]["read_at"], after - saved["memory"]["read_at"])
    booked = gap(second, "memory", estimated="true")
    assert watts * outage[0] <= booked <= watts * outage[1]
    assert gap(second, "cpu", estimated="true") > 0


def test_a_fifo_as_the_state_file_does_not_hang_the_start(
    node: Node, rig_factory: RigFactory, tmp_path: Path
) -> None:
    set_boot(node, BOOT)
    state = tmp_path / "state.json"
    os.mkfifo(state)  # nobody ever writes: a blocking open would wait forever
    rig = rig_factory(**{"state.file": str(state)})
    rig.steps(2)
    assert value(rig.series, "wattprint_state_errors_total", reason="unreadable") == 1
    assert restarts(rig, "fresh") == 1
    assert state.is_file()  # replaced by the exporter's own at its first save


def test_a_state_too_large_to_resume_from_is_not_written(
    node: Node,
    rig_factory: RigFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    set_boot(node, BOOT)
    state = tmp_path / "state.json"
    rig = rig_factory(**{"state.file": str(state)})
    rig.steps(2)
    saved = state.read_bytes()
    # As if the node ran more series than a state file may hold (16 MiB).
    monkeypatch.setattr(statefile, "MAX_STATE_BYTES", len(saved) // 2)
    caplog.set_level(logging.WARNING)
    rig.steps(3)
    assert value(rig.series, "wattprint_state_errors_total", reason="too_large") == 3
    assert len(warnings_about(caplog, "not saved")) == 1
    assert state.read_bytes() == saved  # the last one that can be resumed from
