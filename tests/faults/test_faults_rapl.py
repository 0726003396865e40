"""RAPL faults in the sysfs tree, between samples: EACCES, a counter wrap, a zone that
disappears and comes back."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from wattprint.sources import rapl

from .faultrig import Node, Rig, RigFactory, warnings_about


def cpu_joules(rig: Rig, package: str) -> float:
    return rig.energy("cpu", package=package)


def test_permission_denied_mid_run(
    node: Node,
    rig_factory: RigFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig: Rig = rig_factory()
    rig.steps(3)
    caplog.set_level(logging.INFO)
    held = cpu_joules(rig, "1")
    denied = node.zone("intel-rapl:1") / "energy_uj"
    real = rapl._read_int

    def read_int(path: Path) -> int:
        # EACCES as a non-root reader gets since Linux 5.10; chmod cannot do it for root.
        if path == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(rapl, "_read_int", read_int)
    rig.steps(4)
    assert rig.errors("rapl") == 4
    assert rig.success("rapl") == 0
    assert cpu_joules(rig, "1") == held
    assert cpu_joules(rig, "0") == pytest.approx(6 * 180)  # the other package goes on
    said = warnings_about(caplog, "intel-rapl:1")
    assert len(said) == 1 and "run as root or grant read access" in said[0]

    monkeypatch.setattr(rapl, "_read_int", real)
    rig.steps(3)
    assert rig.success("rapl") == 1
    # Counting resumes from the first good read: the unreadable stretch is not guessed.
    assert cpu_joules(rig, "1") == pytest.approx(held + 2 * 150)


def test_wrap_between_samples_is_counted_once(node: Node, rig_factory: RigFactory) -> None:
    rig: Rig = rig_factory()
    wrap = int((node.zone("intel-rapl:1") / "max_energy_range_uj").read_text())
    # 50 J before the wrap at the first read (set later, it would be a jump no CPU makes).
    node.set_raw("intel-rapl:1", wrap - 50_000_000)
    rig.step(advance=False)
    before = cpu_joules(rig, "1")
    rig.steps(3)  # 150 J a step: the counter wraps in the first one
    assert node.raw("intel-rapl:1") < 3 * 150_000_000
    assert cpu_joules(rig, "1") - before == pytest.approx(3 * 150)
    assert rig.errors("rapl") == 0


def test_zone_disappears_and_comes_back(
    node: Node, rig_factory: RigFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:

    rig: Rig = rig_factory()
    rig.steps(3)
    caplog.set_level(logging.INFO)
    package = node.zone("intel-rapl:0")
    dram = node.zone("intel-rapl:1:0")
    held_cpu, held_memory = cpu_joules(rig, "0"), rig.energy("memory")
    # The driver is unloaded: its zones vanish from the tree.
    shutil.move(package, tmp_path / "package-0")
    shutil.move(dram, tmp_path / "dram-1")
    rig.steps(3)
    assert rig.errors("rapl") == 3
    assert rig.errors("rapl_dram") == 3
    assert cpu_joules(rig, "0") == held_cpu
    assert rig.energy("memory") == pytest.approx(held_memory + 3 * 20)  # dram 0 goes on
    assert len(warnings_about(caplog, "intel-rapl:0")) == 1
    assert len(warnings_about(caplog, "intel-rapl:1:0")) == 1
    assert "no longer present" in warnings_about(caplog, "intel-rapl:0")[0]

    # ... and loaded again, with counters that start low.
    shutil.move(tmp_path / "package-0", package)
    shutil.move(tmp_path / "dram-1", dram)
    node.set_raw("intel-rapl:0", 5_000)
    node.set_raw("intel-rapl:1:0", 5_000)
    rig.steps(3)
    assert rig.success("rapl") == 1 and rig.success("rapl_dram") == 1
    assert cpu_joules(rig, "0") == pytest.approx(held_cpu + 2 * 180)
    assert rig.errors("rapl") == 3
