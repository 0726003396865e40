"""--gpu.source and doctor with AMD SMI: auto picks NVML, AMD SMI or both; a missing
library is one line in doctor, never an error; asked for by name, its absence is."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from fake_amdsmi import STATUS_DRIVER_NOT_LOADED, eight_gpu_node
from fake_nvml import FakeNvml
from procfs_fixture import FakeProc
from wattprint.cli import main as cli
from wattprint.sources import amdsmi, nvml
from wattprint.sources.registry import SourceContext, SourceUnavailable, is_estimated
from wattprint.sources.select import choose_all

# No PCI devices: what the bus shows is each test's to say.
GPU = SourceContext("gpu", False, sysfs_root="/nonexistent")


def pci(root: Path, *devices: tuple[str, str]) -> SourceContext:
    """A sysfs whose PCI bus shows these (vendor, class) devices."""
    for i, (vendor, pci_class) in enumerate(devices):
        device = root / "bus" / "pci" / "devices" / f"0000:{0x0C + i:02x}:00.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(pci_class + "\n")
    return SourceContext("gpu", False, sysfs_root=root)


def no_amdsmi() -> None:
    raise ImportError("No module named 'amdsmi'")


def no_nvml() -> FakeNvml:
    return FakeNvml.from_trace(init_error=pynvml.NVMLError_LibraryNotFound)


@pytest.fixture
def both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "_load_pynvml", lambda: FakeNvml.from_trace(copies=2))
    monkeypatch.setattr(amdsmi, "_load_amdsmi", eight_gpu_node)


def test_auto_on_a_node_with_both_vendors_runs_both_and_labels_never_collide(both: None) -> None:
    sources, notes = choose_all("auto", GPU)
    assert [s.name for s in sources] == ["nvml", "amdsmi"] and notes == []
    labels = [d.device for s in sources for d in s.read().devices]
    assert labels == ["0", "1", "amd0", "amd1", "amd2", "amd3", "amd4", "amd5", "amd6", "amd14"]
    assert sources[1].explain()[0].startswith("gpu amd0 (AMD Instinct MI300X, ")


def test_auto_without_amdsmi_is_nvml_and_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "_load_pynvml", lambda: FakeNvml.from_trace(copies=2))
    monkeypatch.setattr(amdsmi, "_load_amdsmi", no_amdsmi)
    sources, notes = choose_all("auto", GPU)
    assert [s.name for s in sources] == ["nvml"]
    assert [d.device for d in sources[0].read().devices] == ["0", "1"]  # no prefix alone
    assert notes == ["gpu: amdsmi not used (amdsmi not importable: No module named 'amdsmi')"]


def test_auto_on_an_amd_node_is_amdsmi_with_plain_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "_load_pynvml", no_nvml)
    monkeypatch.setattr(amdsmi, "_load_amdsmi", eight_gpu_node)
    sources, notes = choose_all("auto", GPU)
    assert [s.name for s in sources] == ["amdsmi"]
    assert [d.device for d in sources[0].read().devices][:2] == ["0", "1"]
    assert len(notes) == 1 and notes[0].startswith("gpu: nvml not used (NVML init failed")


def test_auto_with_neither_says_both_reasons_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "_load_pynvml", no_nvml)
    fake = eight_gpu_node()
    fake.init_error = STATUS_DRIVER_NOT_LOADED
    monkeypatch.setattr(amdsmi, "_load_amdsmi", lambda: fake)
    sources, [note] = choose_all("auto", GPU)
    assert sources == []
    assert note.startswith("gpu: none (NVML init failed") and "AMD SMI init failed" in note
    assert "\n" not in note


def test_auto_skips_amd_smi_that_finds_no_amd_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "_load_pynvml", lambda: FakeNvml.from_trace(copies=1))
    empty = eight_gpu_node()
    empty.boards = []
    monkeypatch.setattr(amdsmi, "_load_amdsmi", lambda: empty)
    sources, notes = choose_all("auto", GPU)
    assert [s.name for s in sources] == ["nvml"]
    assert notes == ["gpu: amdsmi not used (AMD SMI found no AMD GPU)"]


def test_amdsmi_by_name_without_the_library_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(amdsmi, "_load_amdsmi", no_amdsmi)
    with pytest.raises(SourceUnavailable) as err:
        choose_all("amdsmi", GPU)
    assert str(err.value) == "--gpu.source=amdsmi: amdsmi not importable: No module named 'amdsmi'"


def test_amd_methods_are_registered_measured_and_estimated() -> None:
    assert not is_estimated("amdsmi_energy_counter")
    assert is_estimated("amdsmi_power_integrated")


def test_doctor_lists_both_vendors(
    both: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeProc(tmp_path / "proc")
    (tmp_path / "sys" / "class").mkdir(parents=True)
    args = ["doctor", "--carbon.zone=DE", "--gpu.source=auto", "--cpu.source=none"]
    args += ["--memory.source=none"]
    roots = [f"--path.sysfs={tmp_path}/sys", f"--path.procfs={tmp_path}/proc"]
    assert cli.main([*args, *roots]) == 0
    out = capsys.readouterr().out
    assert "  gpu 0 (NVIDIA H200, " in out
    assert "  gpu amd6 (AMD Instinct MI300X, " in out and "PCI 0000:6c:00.0" in out
    assert "AMD SMI GPUs 7, 8, 9, 10, 11, 12, 13 share its energy" in out
    assert "amdsmi (gpu): AMD Instinct GPUs through AMD SMI" in out


def test_amd_gpus_on_the_bus_without_the_library_fail_the_collector(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(nvml, "_load_pynvml", no_nvml)
    monkeypatch.setattr(amdsmi, "_load_amdsmi", no_amdsmi)
    # Two MI300X (processing accelerators) and an AMD CPU's host bridge (0x1022).
    ctx = pci(tmp_path, ("0x1002", "0x120000"), ("0x1002", "0x120000"), ("0x1022", "0x060000"))
    sources, [note] = choose_all("auto", ctx)
    assert [s.name for s in sources] == ["amdsmi"] and note.startswith("gpu: nvml not used")
    result = sources[0].read()
    assert result.devices == []
    assert result.errors == [
        "amdsmi not importable: No module named 'amdsmi'; "
        "2 AMD GPU(s) on the PCI bus are not measured"
    ]
    assert sources[0].explain() == [f"gpu: none ({result.errors[0]})"]


def test_no_amd_gpu_on_the_bus_keeps_a_missing_library_quiet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(nvml, "_load_pynvml", lambda: FakeNvml.from_trace(copies=1))
    monkeypatch.setattr(amdsmi, "_load_amdsmi", no_amdsmi)
    ctx = pci(tmp_path, ("0x1022", "0x060000"), ("0x10de", "0x030200"))
    sources, notes = choose_all("auto", ctx)
    assert [s.name for s in sources] == ["nvml"]
    assert notes == ["gpu: amdsmi not used (amdsmi not importable: No module named 'amdsmi')"]


def test_a_failing_amd_smi_is_kept_and_retried_where_the_bus_shows_amd_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(nvml, "_load_pynvml", no_nvml)
    fake = eight_gpu_node()
    fake.init_error = STATUS_DRIVER_NOT_LOADED
    monkeypatch.setattr(amdsmi, "_load_amdsmi", lambda: fake)
    clock = [100.0]
    ctx = pci(tmp_path, ("0x1002", "0x038000"))
    [source], _ = choose_all("auto", replace(ctx, clock=lambda: clock[0]))
    assert source.name == "amdsmi"
    [error] = source.read().errors
    assert error.startswith("AMD SMI init failed") and error.endswith("are not measured")
    fake.init_error = None
    clock[0] += 31
    assert len(source.read().devices) == 8


def test_amd_smi_that_sees_none_of_the_buses_gpus_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(nvml, "_load_pynvml", no_nvml)
    fake = eight_gpu_node()
    boards, fake.boards = fake.boards, []  # no access to /dev/kfd yet, say
    monkeypatch.setattr(amdsmi, "_load_amdsmi", lambda: fake)
    clock = [100.0]
    ctx = pci(tmp_path, ("0x1002", "0x120000"))
    [source], _ = choose_all("auto", replace(ctx, clock=lambda: clock[0]))
    assert source.read().errors == [
        "AMD SMI found no AMD GPU; 1 AMD GPU(s) on the PCI bus are not measured"
    ]
    fake.boards = boards
    clock[0] += 31
    result = source.read()
    assert not result.errors and len(result.devices) == 8
