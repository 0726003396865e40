"""The CPU and memory power models, on fixture /proc contents and an injected clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wattprint.sources.counters import PowerIntegrator
from wattprint.sources.cpu_model import CpuModelSource, lookup_tdp
from wattprint.sources.memory_model import MemoryModelSource

# The documented model (docs/power-models.md), restated here so that a change to the
# constants in the code has to be a deliberate change to this test too.
IDLE_W, MAX_W = 0.74, 3.5  # CCF per logical CPU
IDLE_FRACTION = IDLE_W / MAX_W
WATTS_PER_GIB = 3 / 8


def model_power(tdp: float, utilization: float) -> float:
    return tdp * (IDLE_FRACTION + (1 - IDLE_FRACTION) * utilization)


class FakeClock:
    def __init__(self, t: float = 50.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def cpuinfo(model: str, packages: int, threads: int, physical_id: bool = True) -> str:
    blocks = []
    for n in range(packages * threads):
        lines = [f"processor\t: {n}", "vendor_id\t: GenuineIntel"]
        if model:
            lines.append(f"model name\t: {model}")
        if physical_id:
            lines.append(f"physical id\t: {n // threads}")
        lines.append("flags\t\t: fpu vme de pse tsc msr pae")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n\n"


def stat_text(cpus: list[tuple[int, int, int, int, int, int, int, int]]) -> str:
    """One /proc/stat from per-CPU (user nice system idle iowait irq softirq steal)."""
    total = [sum(col) for col in zip(*cpus, strict=True)]
    lines = ["cpu  " + " ".join(map(str, [*total, 0, 0]))]
    lines += [f"cpu{n} " + " ".join(map(str, [*c, 0, 0])) for n, c in enumerate(cpus)]
    lines += ["intr 123 0 0", "ctxt 456", "btime 1700000000", "procs_running 1"]
    return "\n".join(lines) + "\n"


def make_proc(tmp_path: Path, info: str, mem_kb: int = 131_072_000) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(info)
    (proc / "meminfo").write_text(f"MemTotal:       {mem_kb} kB\nMemFree:        1024 kB\n")
    return proc


@pytest.mark.parametrize(
    ("name", "watts"),
    [
        ("Intel(R) Xeon(R) Platinum 8480+", 350),
        ("Intel(R) Xeon(R) Gold 6248R CPU @ 3.00GHz", 205),
        ("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", 150),
        ("AMD EPYC 9654 96-Core Processor", 360),
        ("AMD EPYC 7763 64-Core Processor", 280),
        ("AMD EPYC 7543P 32-Core Processor", None),  # not 7543's entry
        ("Intel(R) Xeon(R) Processor", None),  # what the H200 VM showed
    ],
)
def test_tdp_table_matches_whole_product_numbers(name: str, watts: float | None) -> None:
    found = lookup_tdp(name)
    assert (found[1] if found else None) == watts


def test_cpu_power_follows_utilization_per_package(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, cpuinfo("Intel(R) Xeon(R) Platinum 8480+", packages=2, threads=2))
    idle = (0, 0, 0, 1000, 0, 0, 0, 0)
    (proc / "stat").write_text(stat_text([idle] * 4))
    clock = FakeClock()
    source = CpuModelSource(proc, clock=clock)
    first = source.read()
    assert [(d.device, d.energy_uj, d.power_w) for d in first.devices] == [
        ("0", 0, None),
        ("1", 0, None),
    ]
    # Over 2.5 s: package 0 is busy 150 of 200 jiffies (user, nice, system, irq and
    # softirq all count; iowait is idle; steal counts for neither), package 1 50 of 200.
    (proc / "stat").write_text(
        stat_text(
            [
                (50, 10, 30, 1010, 10, 5, 5, 40),  # busy 100 of 120
                (20, 0, 30, 1030, 0, 0, 0, 0),  # busy 50 of 80
                (10, 0, 10, 1070, 10, 0, 0, 0),  # busy 20 of 100
                (30, 0, 0, 1070, 0, 0, 0, 0),  # busy 30 of 100
            ]
        )
    )
    clock.t += 2.5
    second = {d.device: d for d in source.read().devices}
    for device, utilization in (("0", 150 / 200), ("1", 50 / 200)):
        power = model_power(350, utilization)
        assert second[device].power_w == pytest.approx(power)
        assert second[device].energy_uj == int(power * 2.5 * 1e6)
        assert second[device].method == "model"
    # Fully idle for the next second: the package draws its idle floor, not zero.
    (proc / "stat").write_text(
        stat_text(
            [
                (50, 10, 30, 1110, 10, 5, 5, 40),
                (20, 0, 30, 1130, 0, 0, 0, 0),
                (10, 0, 10, 1170, 10, 0, 0, 0),
                (30, 0, 0, 1170, 0, 0, 0, 0),
            ]
        )
    )
    clock.t += 1.0
    third = {d.device: d for d in source.read().devices}
    assert third["0"].power_w == third["1"].power_w == pytest.approx(350 * IDLE_FRACTION)


def test_cpu_without_physical_ids_is_one_device_with_per_thread_default(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, cpuinfo("", packages=1, threads=4, physical_id=False))
    (proc / "stat").write_text(stat_text([(0, 0, 0, 100, 0, 0, 0, 0)] * 4))
    clock = FakeClock()
    source = CpuModelSource(proc, clock=clock)
    source.read()
    (proc / "stat").write_text(stat_text([(100, 0, 0, 100, 0, 0, 0, 0)] * 4))  # all busy
    clock.t += 1.0
    [reading] = source.read().devices
    assert reading.device == "0"
    assert reading.power_w == pytest.approx(4 * MAX_W)  # CCF: max watts per thread
    assert "3.5 W x 4 threads" in "\n".join(source.explain())


def test_tdp_flag_overrides_the_table(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, cpuinfo("AMD EPYC 9654 96-Core Processor", packages=1, threads=2))
    (proc / "stat").write_text(stat_text([(0, 0, 0, 100, 0, 0, 0, 0)] * 2))
    clock = FakeClock()
    source = CpuModelSource(proc, tdp_watts=200.0, clock=clock)
    source.read()
    clock.t += 1.0
    assert source.read().devices[0].power_w == pytest.approx(200 * IDLE_FRACTION)


def test_unreadable_stat_counts_an_error_and_the_next_read_covers_the_gap(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, cpuinfo("AMD EPYC 9654", packages=1, threads=1))
    (proc / "stat").write_text(stat_text([(0, 0, 0, 100, 0, 0, 0, 0)]))
    clock = FakeClock()
    source = CpuModelSource(proc, clock=clock)
    source.read()
    (proc / "stat").unlink()
    clock.t += 1.0
    failed = source.read()
    assert len(failed.errors) == 1 and "stat" in failed.errors[0]
    assert failed.devices[0].energy_uj == 0 and failed.devices[0].power_w is None
    (proc / "stat").write_text(stat_text([(300, 0, 0, 400, 0, 0, 0, 0)]))  # 50 % over 3 s
    clock.t += 2.0
    [reading] = source.read().devices
    assert reading.energy_uj == int(model_power(360, 0.5) * 3.0 * 1e6)


def test_memory_power_from_installed_size(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, cpuinfo("x", 1, 1), mem_kb=125 * 1024 * 1024)
    clock = FakeClock()
    source = MemoryModelSource(proc, clock=clock)
    [first] = source.read().devices
    assert (first.device, first.energy_uj, first.power_w) == ("all", 0, None)
    clock.t += 10.0
    [reading] = source.read().devices
    assert reading.power_w == pytest.approx(125 * WATTS_PER_GIB)
    assert reading.energy_uj == 468_750_000  # 46.875 W x 10 s
    assert (reading.component, reading.method) == ("memory", "model")
    assert "125.0 GiB" in "\n".join(source.explain())


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=2000, allow_nan=False),
            st.floats(min_value=0, max_value=5, allow_nan=False),
        ),
        max_size=200,
    )
)
def test_integrated_energy_is_monotonic_and_exact_to_a_microjoule(
    intervals: list[tuple[float, float]],
) -> None:
    energy = PowerIntegrator()
    exact = 0.0
    previous = 0
    for power, seconds in intervals:
        energy.add(power, seconds)
        exact += power * seconds * 1e6
        assert energy.total >= previous
        previous = energy.total
    # Integer micro-joules with the fraction carried: never more than 1 µJ behind.
    assert exact - 1 - 1e-9 * exact <= energy.total <= exact + 1e-9 * exact
