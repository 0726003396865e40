"""Embodied (Scope 3) emissions: amortized over the service life, accrued to whoever
holds the hardware by the policy of its idle energy, conserved exactly like energy."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clock_fakes import DISCIPLINED
from test_cli import wattprint
from wattprint.attribution.embodied import GPU_FIGURES, EmbodiedSettings, accrue, explain
from wattprint.config.options import ConfigError, build_config
from wattprint.config.parsers import parse_gpu_figures, parse_lifetime
from wattprint.core.model import DeviceReading, GpuProcess, Snapshot, SourceResult, Workload
from wattprint.sampler.clock import StampClock
from wattprint.sampler.loop import Sampler, SamplerParts

H100 = "NVIDIA H100 80GB HBM3"
JOB = Workload("slurm", "4242")
OTHER = Workload("env", "notebook")


@dataclass
class Gpus:
    """GPUs whose holders the test sets; energy is irrelevant to embodied accrual."""

    models: dict[int, str]
    name: str = "nvml"
    processes: dict[int, tuple[GpuProcess, ...]] = field(default_factory=dict)
    mig: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    def read(self) -> SourceResult:
        return SourceResult(
            devices=[
                DeviceReading(
                    "gpu",
                    str(i),
                    0,
                    300.0,
                    "nvml_energy_counter",
                    uuid=f"GPU-{i}",
                    model=model,
                    processes=self.processes.get(i, ()),
                    mig_slices=self.mig.get(i, ()),
                )
                for i, model in sorted(self.models.items())
            ]
        )

    def explain(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def sampler_for(gpus: Gpus, **embodied: object) -> Sampler:
    clock = Clock()
    sampler = Sampler(
        SamplerParts(
            sources=[gpus],
            retention=1e9,
            clock=clock,
            # Wall and monotonic time move together here: no clock step.
            stamp_clock=StampClock(clock, lambda: DISCIPLINED),
            embodied=EmbodiedSettings(**embodied),  # type: ignore[arg-type]
        )
    )
    sampler.clock = clock  # type: ignore[attr-defined]
    return sampler


def embodied_grams(snapshot: Snapshot) -> dict[Workload | None, float]:
    out: dict[Workload | None, float] = defaultdict(float)
    for s in snapshot.energy:
        out[s.workload] += s.embodied_ug / 1e6
    return out


def test_a_job_holding_8_h100s_for_an_hour_accrues_37_4_grams() -> None:
    # 8 x 164,000 g / (4 x 8,766 h) = 37.41 g for one hour.
    gpus = Gpus({i: H100 for i in range(8)})
    gpus.processes = {i: (GpuProcess(100 + i, sm_util=90, identity=JOB),) for i in range(8)}
    sampler = sampler_for(gpus)
    sampler.sample_once()
    for _ in range(3600):
        sampler.clock.now += 1.0  # type: ignore[attr-defined]
        snapshot = sampler.sample_once()
    grams = embodied_grams(snapshot)
    assert round(grams[JOB], 1) == 37.4
    assert grams[JOB] == pytest.approx(8 * 164_000 / (4 * 8766), abs=1e-5)
    assert grams.get(None, 0.0) == 0.0  # the job held every GPU the whole hour
    assert GPU_FIGURES[H100].kgco2e == 164.0


def test_a_free_gpu_accrues_to_unattributed_and_an_unknown_model_to_nobody() -> None:
    gpus = Gpus({0: H100, 1: H100, 2: "NVIDIA Mystery 1"})
    gpus.processes = {0: (GpuProcess(1, identity=JOB),), 2: (GpuProcess(3, identity=OTHER),)}
    sampler = sampler_for(gpus)
    sampler.sample_once()
    for _ in range(10):
        sampler.clock.now += 360.0  # type: ignore[attr-defined]
        snapshot = sampler.sample_once()
    per_gpu_hour = 164_000 / (4 * 8766)
    grams = embodied_grams(snapshot)
    assert grams[JOB] == pytest.approx(per_gpu_hour, abs=1e-5)
    assert grams[None] == pytest.approx(per_gpu_hour, abs=1e-5)  # GPU 1, free
    assert OTHER not in grams  # its GPU has no figure: nothing is made up
    devices = {d.device: d for d in snapshot.embodied if d.component == "gpu"}
    assert devices["2"].figure is None and devices["2"].embodied_ug == 0
    # A user figure makes the unknown model count.
    sampler = sampler_for(gpus, gpu_overrides=(("NVIDIA Mystery 1", 200.0),))
    sampler.sample_once()
    sampler.clock.now += 3600.0  # type: ignore[attr-defined]
    grams = embodied_grams(sampler.sample_once())
    assert grams[OTHER] == pytest.approx(200_000 / (4 * 8766), abs=1e-5)


holder = st.tuples(
    st.integers(1, 12),
    st.one_of(st.none(), st.integers(0, 100)),
    st.sampled_from([JOB, OTHER, Workload("kubernetes", "train", "ml", "p-0"), None]),
    st.one_of(st.none(), st.integers(1, 3)),
)
step = st.tuples(
    st.floats(0.05, 7200.0),
    st.lists(st.lists(holder, max_size=4), min_size=3, max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=20), st.floats(0.5, 10.0))
def test_embodied_parts_add_up_to_each_devices_accrual_exactly(steps: list, years: float) -> None:
    gpus = Gpus({0: H100, 1: "NVIDIA H200", 2: H100}, mig={2: ((1, 3), (2, 2), (3, 2))})
    sampler = sampler_for(
        gpus,
        lifetime_s=years * 8766 * 3600,
        gpu_overrides=(("NVIDIA H200", 164.0),),
        node_kgco2e=2500.0,
    )
    sampler.sample_once()
    elapsed = 0.0
    previous: dict[tuple[str, str, Workload | None], int] = {}
    for seconds, holders in steps:
        sampler.clock.now += seconds  # type: ignore[attr-defined]
        elapsed += seconds
        for gpu, procs in enumerate(holders):
            gpus.processes[gpu] = tuple(
                GpuProcess(
                    pid, sm_util=util, gpu_instance_id=gi if gpu == 2 else None, identity=who
                )
                for pid, util, who, gi in procs
            )
        snapshot = sampler.sample_once()
        residual: dict[tuple[str, str], int] = defaultdict(int)
        for d in snapshot.embodied:
            residual[("cpu" if d.component == "node" else "gpu", d.device)] += d.embodied_ug
        for s in snapshot.energy:
            residual[(s.component, s.gpu)] -= s.embodied_ug
        assert all(v == 0 for v in residual.values()), dict(residual)
        now = {(s.component, s.gpu, s.workload): s.embodied_ug for s in snapshot.energy}
        assert all(now.get(k, 0) >= v for k, v in previous.items())  # counters never fall
        previous = now
        # And no rounding is lost: each device holds what its figure says to the micro-gram.
        for d in snapshot.embodied:
            expected = (2500.0 if d.component == "node" else 164.0) * 1e9 * elapsed
            # Under a micro-gram, plus what unix-time floats lose (about 0.2 us a step,
            # so at most 1 us of accrual here).
            rate = expected / elapsed / (years * 8766 * 3600)
            assert abs(d.embodied_ug - expected / (years * 8766 * 3600)) <= 1.0 + rate * 1e-6


def test_accrual_carries_fractions_of_a_microgram() -> None:
    carry, total = 0.0, 0
    for _ in range(100_000):
        ug, carry = accrue(164.0, parse_lifetime("4"), 0.001, carry)
        total += ug
    # 100 s at 1 ms steps (1.3 ug each) is 100 s at once, to the micro-gram.
    assert total == accrue(164.0, parse_lifetime("4"), 100.0, 0.0)[0]


def test_flags_parse_and_reject_with_one_line() -> None:
    assert parse_gpu_figures("NVIDIA H200=164, NVIDIA A100-SXM4-80GB=150") == (
        ("NVIDIA H200", 164.0),
        ("NVIDIA A100-SXM4-80GB", 150.0),
    )
    config = build_config(
        {"embodied.gpu-kgco2e": "NVIDIA H200=164", "embodied.lifetime": "5"}, environ={}
    )
    assert config.embodied_lifetime == 5 * 8766 * 3600
    for flag, bad, says in [
        ("embodied.gpu-kgco2e", "NVIDIA H200", "is not MODEL=KG"),
        ("embodied.gpu-kgco2e", "NVIDIA H200=lots", "is not a number of kg"),
        ("embodied.gpu-kgco2e", "NVIDIA H200=-3", "must be zero or more"),
        ("embodied.lifetime", "forever", "is not a number of years"),
        ("embodied.lifetime", "400", "is not a plausible service life"),
        ("embodied.node-kgco2e", "-1", "must be zero or a positive number"),
    ]:
        with pytest.raises(ConfigError) as err:
            build_config({flag: bad}, environ={})
        assert says in str(err.value) and f"--{flag}" in str(err.value)
        assert "\n" not in str(err.value)


def test_doctor_lines_name_the_figure_or_say_there_is_none() -> None:
    lines = explain(EmbodiedSettings(), [H100, "NVIDIA H200"])
    assert any(
        H100 in line and "164 kgCO2e" in line and "4.68 g per GPU-hour" in line for line in lines
    )
    assert any("NVIDIA H200: no embodied figure known, counts nothing" in line for line in lines), (
        lines
    )
    assert any("node (rest of the server): no figure, counts nothing" in line for line in lines)


def test_doctor_says_a_replayed_h200_counts_nothing_until_given_a_figure(
    trace_path: Path,
) -> None:
    args = (f"--gpu.replay-file={trace_path}", "--carbon.zone=DE", "--state.file=")
    unknown = wattprint("doctor", *args)
    assert unknown.returncode == 0, unknown.stderr
    assert "gpu NVIDIA H200: no embodied figure known, counts nothing" in unknown.stdout
    given = wattprint("doctor", *args, "--embodied.gpu-kgco2e=NVIDIA H200=164")
    assert "gpu NVIDIA H200: 164 kgCO2e (--embodied.gpu-kgco2e, user)" in given.stdout
