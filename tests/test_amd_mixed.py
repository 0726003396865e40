"""One exporter on a node with NVIDIA and AMD GPUs side by side (fake pynvml and fake
amdsmi): both in the exposition under labels that never collide, energy conserved per
GPU at every sample, and the recording rules, unchanged, sum and split it right
(promtool runs them over what the exporter served)."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from clock_fakes import NodeClocks
from conftest import require_tool
from fake_amdsmi import Board, FakeAmdSmi, FakeProcess
from fake_nvml import FakeGpu, FakeNvml
from procfs_fixture import FakeProc
from wattprint.carbon.base import CarbonSettings
from wattprint.carbon.service import CarbonService
from wattprint.export.collector import SnapshotCollector
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import read_proc_table
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources import amdsmi, nvml
from wattprint.sources.registry import SourceContext
from wattprint.sources.select import choose_all

RULES = Path(__file__).resolve().parents[1] / "rules" / "recording.rules.yml"
SECONDS = 310
# Watts each package draws: NVIDIA 2 x 400 (counters); AMD 600 (counter), 300 (no
# counter: power integrated, estimated), 700 (CPX, 8 partitions, one counter).
NVIDIA_W, AMD_COUNTER_W, AMD_INTEGRATED_W = 2 * 400, 600 + 700, 300


def nvidia(index: int) -> FakeGpu:
    samples = [
        {
            "energy_mj": 5_000_000 + 400_000 * k,  # 400 W, one sample a second
            "power_mw": 400_000,
            "processes": [{"pid": 201 + index, "sm_util": 80}],
        }
        for k in range(SECONDS + 5)
    ]
    return FakeGpu(index, f"GPU-4e5f-000{index}", "NVIDIA H200", samples)


def amd() -> FakeAmdSmi:
    exact = {"resolution_uj": 1.0}  # whole joules each second: promtool compares exactly
    boards = [
        Board(bus=0x0C, serial="a0", power_w=600.0, **exact),  # type: ignore[arg-type]
        Board(bus=0x1C, serial="a1", power_w=300.0, has_counter=False, **exact),  # type: ignore[arg-type]
        Board(bus=0x2C, serial="a2", power_w=700.0, partitions=8, **exact),  # type: ignore[arg-type]
    ]
    boards[0].procs = {0: [FakeProcess(301, 0.7)]}
    boards[2].procs = {2: [FakeProcess(302, 0.5)]}
    return FakeAmdSmi(boards)


def labels(text: str, name: str) -> list[dict[str, str]]:
    return [
        s.labels
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_one_exporter_serves_both_vendors_conserved_and_the_rules_sum_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nv, smi = FakeNvml(gpus=[nvidia(0), nvidia(1)]), amd()
    monkeypatch.setattr(nvml, "_load_pynvml", lambda: nv)
    monkeypatch.setattr(amdsmi, "_load_amdsmi", lambda: smi)
    proc = FakeProc(tmp_path / "proc")
    for pid, job in {201: "nv-a", 202: "nv-b", 301: "amd-a", 302: "amd-b"}.items():
        proc.add(pid, start=pid, environ={"WATTPRINT_WORKLOAD": job})
    clocks = NodeClocks()
    # What parts.build_sources runs for --gpu.source=auto, on the fake clock.
    sources, notes = choose_all("auto", SourceContext("gpu", False, clock=clocks.monotonic))
    assert [s.name for s in sources] == ["nvml", "amdsmi"] and notes == []
    root = str(tmp_path / "proc")
    sampler = Sampler(
        SamplerParts(
            sources=sources,
            read_procs=lambda: read_proc_table(root),
            resolver=IdentityResolver(procfs_root=root),
            carbon=CarbonService(CarbonSettings(zone="DE"), environ={}),
        )
    )
    clocks.install(sampler)
    collector = SnapshotCollector(lambda: sampler.latest, False)
    series: dict[str, list[str]] = defaultdict(lambda: ["_"] * (SECONDS + 1))
    for second in range(SECONDS + 1):
        if second:
            nv.advance()
            smi.step()
            clocks.advance(1.0)
            proc.tick(800)
        snapshot = sampler.sample_once()
        left: dict[str, int] = defaultdict(int)
        for d in snapshot.devices:
            left[d.device] += d.energy_uj
        for s in snapshot.energy:
            left[s.gpu] -= s.energy_uj
        assert set(left.values()) == {0}, (second, dict(left))
        text = collector.render().decode()
        for family in text_string_to_metric_families(text):
            if family.name not in ("wattprint_gpu_energy_joules", "wattprint_measurement_info"):
                continue
            for s in family.samples:
                pairs = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                key = f'{s.name}{{instance="n1:9950",job="wattprint",{pairs}}}'
                series[key][second] = repr(float(s.value))

    info = labels(text, "wattprint_measurement_info")
    devices = [i["device"] for i in info if i["component"] == "gpu"]
    assert sorted(devices) == ["0", "1", "amd0", "amd1", "amd2"]  # one each, no collision
    estimated = {i["device"]: i["estimated"] for i in info if i["component"] == "gpu"}
    assert estimated == {
        "0": "false",
        "1": "false",
        "amd0": "false",
        "amd1": "true",
        "amd2": "false",
    }
    served = {x["gpu"] for x in labels(text, "wattprint_gpu_energy_joules_total")}
    assert served == set(devices)
    jobs = {x["workload"] for x in labels(text, "wattprint_workload_energy_joules_total")}
    assert jobs == {"nv-a", "nv-b", "amd-a", "amd-b"}

    total = NVIDIA_W + AMD_COUNTER_W + AMD_INTEGRATED_W
    lines = "\n".join(
        f"      - series: '{key}'\n        values: '{' '.join(values)}'"
        for key, values in sorted(series.items())
    )
    at = 'instance="n1:9950",component="gpu"'
    by_method = "instance_component_method:wattprint_energy_joules:rate5m"
    test = f"""rule_files:
  - {RULES}
evaluation_interval: 1m
tests:
  - interval: 1s
    input_series:
{lines}
    promql_expr_test:
      - expr: instance_component:wattprint_energy_joules:rate5m
        eval_time: 5m10s
        exp_samples:
          - labels: 'instance_component:wattprint_energy_joules:rate5m{{{at}}}'
            value: {total}
      - expr: instance_component_method:wattprint_energy_joules:rate5m
        eval_time: 5m10s
        exp_samples:
          - labels: '{by_method}{{{at},method="nvml_energy_counter"}}'
            value: {NVIDIA_W}
          - labels: '{by_method}{{{at},method="amdsmi_energy_counter"}}'
            value: {AMD_COUNTER_W}
          - labels: '{by_method}{{{at},method="amdsmi_power_integrated"}}'
            value: {AMD_INTEGRATED_W}
      - expr: instance_component:wattprint_energy_estimated:ratio_rate5m
        eval_time: 5m10s
        exp_samples:
          - labels: 'instance_component:wattprint_energy_estimated:ratio_rate5m{{{at}}}'
            value: {AMD_INTEGRATED_W / total!r}
"""
    (tmp_path / "mixed.test.yml").write_text(test)
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(tmp_path / "mixed.test.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
