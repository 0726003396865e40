"""RAPL source and the auto|rapl|model|none choice, on fixture sysfs trees."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from wattprint.core.model import DeviceReading, SourceResult
from wattprint.sources import rapl
from wattprint.sources.registry import SourceUnavailable
from wattprint.sources.select import build_cpu_source, build_memory_source

FIXTURES = Path(__file__).parent / "fixtures" / "sys"
POWERCAP = Path("class") / "powercap"


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def sysfs_copy(tmp_path: Path, tree: str = "intel-2pkg") -> Path:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / tree, root)
    return root


def zone_file(root: Path, zone: str, name: str = "energy_uj") -> Path:
    return root / POWERCAP / zone / name


def raw(root: Path, zone: str, name: str = "energy_uj") -> int:
    return int(zone_file(root, zone, name).read_text())


def set_raw(root: Path, zone: str, value: int) -> None:
    zone_file(root, zone).write_text(f"{value}\n")


def by_device(result: SourceResult) -> dict[tuple[str, str], DeviceReading]:
    return {d.key: d for d in result.devices}


def deny(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    """EACCES on these files, as non-root users get since Linux 5.10 (chmod cannot
    simulate it: the suite may run as root)."""
    real = rapl._read_int

    def read_int(path: Path) -> int:
        if path in paths:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(rapl, "_read_int", read_int)


def test_reads_packages_and_dram_and_ignores_overlapping_zones(tmp_path: Path) -> None:
    root = sysfs_copy(tmp_path)
    cpu = rapl.discover_zones(root, "cpu")
    memory = rapl.discover_zones(root, "memory")
    # core/uncore are inside the package, psys covers everything, mmio duplicates
    # package 0: reading any of them would count energy twice.
    assert [(z.device, z.path.name) for z in cpu] == [("0", "intel-rapl:0"), ("1", "intel-rapl:1")]
    assert [(z.device, z.path.name) for z in memory] == [
        ("0", "intel-rapl:0:2"),
        ("1", "intel-rapl:1:0"),
    ]


def test_amd_tree_has_packages_and_no_dram(tmp_path: Path) -> None:
    root = sysfs_copy(tmp_path, "amd-2pkg")
    assert [z.device for z in rapl.discover_zones(root, "cpu")] == ["0", "1"]
    zones, reason = rapl.probe(root, "memory")
    assert zones == []
    assert reason == f"no RAPL dram zone under {root / POWERCAP}"


def test_energy_starts_at_zero_and_follows_the_counters(tmp_path: Path) -> None:
    root = sysfs_copy(tmp_path)
    clock = FakeClock()
    cpu = rapl.RaplSource("cpu", root, clock)
    memory = rapl.RaplSource("memory", root, clock)
    first = by_device(cpu.read()) | by_device(memory.read())
    assert {k: (d.energy_uj, d.power_w, d.method) for k, d in first.items()} == {
        ("cpu", "0"): (0, None, "rapl"),
        ("cpu", "1"): (0, None, "rapl"),
        ("memory", "0"): (0, None, "rapl"),
        ("memory", "1"): (0, None, "rapl"),
    }
    start = {z: raw(root, z) for z in ("intel-rapl:1", "intel-rapl:1:0")}
    set_raw(root, "intel-rapl:1", start["intel-rapl:1"] + 700_000_000)
    set_raw(root, "intel-rapl:1:0", start["intel-rapl:1:0"] + 90_000_000)
    clock.t += 2.0
    second = by_device(cpu.read()) | by_device(memory.read())
    assert second["cpu", "1"].energy_uj == 700_000_000
    assert second["cpu", "1"].power_w == pytest.approx(350.0)
    assert second["memory", "1"].energy_uj == 90_000_000
    assert second["memory", "1"].power_w == pytest.approx(45.0)
    assert second["cpu", "0"].energy_uj == 0  # its counter did not move
    assert cpu.name != memory.name  # both are collectors; labels must not collide


def test_wrap_is_corrected_through_max_energy_range(tmp_path: Path) -> None:
    root = sysfs_copy(tmp_path)
    clock = FakeClock()
    cpu = rapl.RaplSource("cpu", root, clock)
    cpu.read()
    before = raw(root, "intel-rapl:0")
    wrap_at = raw(root, "intel-rapl:0", "max_energy_range_uj")
    after = 150_000_000  # the counter passed max_energy_range_uj and restarted
    assert after < before
    set_raw(root, "intel-rapl:0", after)
    clock.t += 1.0
    reading = by_device(cpu.read())["cpu", "0"]
    assert reading.energy_uj == wrap_at - before + after
    assert reading.power_w == pytest.approx((wrap_at - before + after) / 1e6)


def test_counter_never_decreases_through_wrap_failure_and_disappearance(
    tmp_path: Path,
) -> None:
    root = sysfs_copy(tmp_path)
    clock = FakeClock()
    cpu = rapl.RaplSource("cpu", root, clock)
    wrap_at = raw(root, "intel-rapl:0", "max_energy_range_uj")
    zone1 = root / POWERCAP / "intel-rapl:1"
    saved = tmp_path / "saved-zone"

    def step(value1: int | None = None) -> None:
        set_raw(root, "intel-rapl:0", (raw(root, "intel-rapl:0") + 150_000_000) % wrap_at)
        if value1 is not None:
            set_raw(root, "intel-rapl:1", value1)

    def vanish() -> None:  # the driver is unloaded
        shutil.move(zone1, saved)

    def come_back() -> None:  # ... and loaded again: the counter starts low
        shutil.move(saved, zone1)
        step(1_000)

    steps: list[Callable[[], None]] = [
        lambda: step(150_100_000_000),
        lambda: step(150_300_000_000),  # package 0 wraps here
        vanish,
        step,
        come_back,
        lambda: step(51_000),
    ]
    history = [by_device(cpu.read())]
    for change in steps:
        change()
        clock.t += 1.0
        history.append(by_device(cpu.read()))
    for device in ("0", "1"):
        values = [h["cpu", device].energy_uj for h in history]
        assert values == sorted(values), (device, values)
    # Package 0 counted every increase, the wrap included.
    assert history[-1]["cpu", "0"].energy_uj == 5 * 150_000_000
    # Package 1: 300 J before it vanished, nothing invented for the gap, then 50 mJ.
    package1 = [h["cpu", "1"].energy_uj for h in history]
    assert package1[-3:] == [300_000_000, 300_000_000, 300_050_000]


@pytest.mark.parametrize("failure", ["permission denied", "energy_uj replaced by a directory"])
def test_unreadable_zone_logs_once_and_counts_every_failure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    failure: str,
) -> None:
    root = sysfs_copy(tmp_path)
    clock = FakeClock()
    cpu = rapl.RaplSource("cpu", root, clock)
    cpu.read()
    set_raw(root, "intel-rapl:1", raw(root, "intel-rapl:1") + 5_000_000)
    clock.t += 1.0
    kept = by_device(cpu.read())["cpu", "1"].energy_uj
    assert kept == 5_000_000

    target = zone_file(root, "intel-rapl:1")
    if failure == "permission denied":
        deny(monkeypatch, target)
    else:
        target.unlink()
        target.mkdir()
    caplog.set_level(logging.INFO, logger="wattprint.sources.rapl")
    results = []
    for _ in range(3):
        set_raw(root, "intel-rapl:0", raw(root, "intel-rapl:0") + 1_000_000)
        clock.t += 1.0
        results.append(cpu.read())

    assert [len(r.errors) for r in results] == [1, 1, 1]
    assert all("cpu 1 (intel-rapl:1)" in r.errors[0] for r in results)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    last = by_device(results[-1])
    assert last["cpu", "1"].energy_uj == kept
    assert last["cpu", "1"].power_w is None
    assert last["cpu", "0"].energy_uj == 3_000_000  # the other package is unaffected
    explained = "\n".join(cpu.explain())
    assert "cpu 1: rapl" in explained and "last read failed" in explained
    if failure == "permission denied":
        assert "permission denied; run as root or grant read access" in results[0].errors[0]


# --- choosing the source ----------------------------------------------------------


def proc_tree(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\nphysical id\t: 0\n\n"
    )
    (proc / "stat").write_text("cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 10 0 10 80 0 0 0 0 0 0\n")
    (proc / "meminfo").write_text("MemTotal:       16777216 kB\nMemFree:  1 kB\n")
    return proc


def test_auto_uses_rapl_where_readable(tmp_path: Path) -> None:
    root = sysfs_copy(tmp_path)
    proc = proc_tree(tmp_path)
    cpu = build_cpu_source("auto", root, proc)
    memory = build_memory_source("auto", root, proc)
    assert cpu is not None and memory is not None
    assert {d.method for d in cpu.read().devices} == {"rapl"}
    assert [d.key for d in memory.read().devices] == [("memory", "0"), ("memory", "1")]


def test_auto_falls_back_to_model_and_says_why_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = sysfs_copy(tmp_path)
    proc = proc_tree(tmp_path)
    deny(monkeypatch, zone_file(root, "intel-rapl:1"))
    caplog.set_level(logging.DEBUG, logger="wattprint")
    cpu = build_cpu_source("auto", root, proc)
    assert cpu is not None and cpu.name == "cpu_model"
    assert {d.method for d in cpu.read().devices} == {"model"}
    assert cpu.explain()[0] == (
        "cpu: model (RAPL energy_uj not readable: permission denied; "
        "run as root or grant read access)"
    )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "permission denied" in lines[0]
    assert caplog.records[0].levelno == logging.WARNING


def test_auto_without_powercap_uses_the_models(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path)
    empty = tmp_path / "empty-sys"
    empty.mkdir()
    cpu = build_cpu_source("auto", empty, proc)
    memory = build_memory_source("auto", sysfs_copy(tmp_path, "amd-2pkg"), proc)
    assert cpu is not None and memory is not None
    assert cpu.explain()[0] == f"cpu: model (no RAPL package zone under {empty / POWERCAP})"
    assert memory.name == "memory_model"
    assert memory.explain()[0].startswith("memory: model (no RAPL dram zone under ")


def test_explicit_rapl_that_cannot_work_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = sysfs_copy(tmp_path)
    proc = proc_tree(tmp_path)
    deny(monkeypatch, zone_file(root, "intel-rapl:0"))
    with pytest.raises(SourceUnavailable) as cpu_error:
        build_cpu_source("rapl", root, proc)
    assert str(cpu_error.value) == (
        "--cpu.source=rapl: RAPL energy_uj not readable: permission denied; "
        "run as root or grant read access"
    )
    with pytest.raises(SourceUnavailable, match=r"^--memory\.source=rapl: no RAPL dram zone"):
        build_memory_source("rapl", sysfs_copy(tmp_path / "amd", "amd-2pkg"), proc)
    assert isinstance(cpu_error.value, ValueError)


def test_model_and_none_modes(tmp_path: Path) -> None:
    root = sysfs_copy(tmp_path)
    proc = proc_tree(tmp_path)
    cpu = build_cpu_source("model", root, proc, tdp_watts=123.0)
    assert cpu is not None and cpu.name == "cpu_model"
    assert "TDP 123 W (--cpu.tdp-watts)" in "\n".join(cpu.explain())
    assert build_cpu_source("none", root, proc) is None
    assert build_memory_source("none", root, proc) is None
    with pytest.raises(SourceUnavailable, match=r"^--cpu\.source=gpu: must be one of"):
        build_cpu_source("gpu", root, proc)
    with pytest.raises(SourceUnavailable, match=r"memory model: cannot read .*/no-proc/meminfo: "):
        build_memory_source("model", root, tmp_path / "no-proc")


def test_a_zone_failing_again_after_recovering_is_warned_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "intel-2pkg", sysfs)
    energy = sysfs / "class" / "powercap" / "intel-rapl:1" / "energy_uj"
    source = rapl.RaplSource("cpu", sysfs, clock=lambda: 0.0)
    source.read()
    good = energy.read_text()
    for _ in range(2):  # fails, recovers, fails again: two warnings, one per outage
        energy.unlink()
        energy.mkdir()
        source.read()
        source.read()
        energy.rmdir()
        energy.write_text(good)
        source.read()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
