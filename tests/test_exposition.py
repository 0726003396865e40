"""The full /metrics of a fixture node: checked by promtool and compared with a golden file.

The node: two H200s replayed through the fake pynvml (one held by a job declared with
WATTPRINT_WORKLOAD), RAPL from the two-package fixture tree, the embedded carbon
intensity for DE. Run with UPDATE_GOLDEN=1 to rewrite the golden file after an
intended change, and review the diff.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from clock_fakes import UNSYNCHRONIZED, NodeClocks
from conftest import require_tool
from fake_nvml import FakeNvml
from procfs_fixture import FakeProc
from wattprint.carbon.base import CarbonSettings
from wattprint.carbon.service import CarbonService
from wattprint.durability.statefile import STATE_ERROR_REASONS
from wattprint.export.collector import SnapshotCollector
from wattprint.export.scraper import SCRAPER
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import read_proc_table
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources.memory_model import MemoryModelSource
from wattprint.sources.nvml import NvmlSource
from wattprint.sources.rapl import RaplSource

GOLDEN = Path(__file__).parent / "golden" / "fixture-node.prom"
CONTRACT = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
SYSFS = Path(__file__).parent / "fixtures" / "sys" / "intel-2pkg"
# Values that depend on the machine's timing, masked before comparing.
VOLATILE = re.compile(
    r"^(wattprint_collector_duration_seconds\{[^}]*\}"
    r"|wattprint_sampler_last_success_timestamp_seconds|wattprint_clock_time_seconds"
    r"|process_\w+) .*$",
    re.M,
)


def fixture_clocks() -> NodeClocks:
    """The fixture node's clocks (a time daemon keeps them), at its first read."""
    return NodeClocks(start=1795990100.0, mono=100.0)


def fixture_node(
    tmp_path: Path, timestamps: bool = True, clocks: NodeClocks | None = None
) -> tuple[Sampler, SnapshotCollector]:
    sysfs = tmp_path / "sys"
    shutil.copytree(SYSFS, sysfs)
    proc = FakeProc(tmp_path / "proc")
    proc.add(
        4242,
        start=77,
        cpu_ticks=0,
        rss_bytes=8 << 30,
        environ={"WATTPRINT_WORKLOAD": "llama-finetune"},
    )
    fake = FakeNvml.from_trace(copies=2)
    for entry in fake.gpus[1].samples:
        entry["processes"] = [{"pid": 4242, "sm_util": 90, "used_memory_bytes": 1 << 33}]
    for entry in fake.gpus[0].samples:
        entry["processes"] = []
    clocks = clocks or fixture_clocks()
    now = clocks.monotonic
    root = str(tmp_path / "proc")
    sampler = Sampler(
        SamplerParts(
            sources=[
                NvmlSource(nvml=fake, clock=now),
                RaplSource("cpu", str(sysfs), now),
                RaplSource("memory", str(sysfs), now),
            ],
            read_procs=lambda: read_proc_table(root),
            resolver=IdentityResolver(procfs_root=root),
            carbon=CarbonService(CarbonSettings(zone="DE"), environ={}),
            interval=1.0,
        )
    )
    clocks.install(sampler)
    sampler.sample_once()
    zones = sorted(p for p in (sysfs / "class" / "powercap").iterdir() if p.name.count(":") >= 1)
    for step in range(1, 31):
        fake.advance()
        clocks.advance(1.0)
        for zone in zones:
            energy = zone / "energy_uj"
            wrap = int((zone / "max_energy_range_uj").read_text())
            energy.write_text(str((int(energy.read_text()) + 95_000_000) % wrap))
        proc.set_cpu(4242, step * 150, start=77, rss_bytes=8 << 30)
        proc.tick(1600)
        sampler.sample_once()
    return sampler, SnapshotCollector(lambda: sampler.latest, timestamps)


def test_exposition_matches_golden_and_passes_promtool(tmp_path: Path) -> None:
    _, collector = fixture_node(tmp_path)
    collector.render()  # the first scrape sees new series at 0 (next test)
    text = collector.render().decode()
    masked = VOLATILE.sub(r"\1 <volatile>", text)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(masked)
    assert masked == GOLDEN.read_text()
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, text=True, capture_output=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # promtool 2.42 reads only the text format; OpenMetrics goes through its parser.
    families = list(om_families(collector.render(openmetrics=True).decode()))
    assert {f.name for f in families} == set(re.findall(r"^# TYPE (\S+?)(?:_total)? ", text, re.M))


def contract() -> dict[str, tuple[str, frozenset[str]]]:
    """docs/metrics.md's table: metric -> (type, label names)."""
    rows = re.findall(
        r"^\| `((?:wattprint|process)_\w+)` \| (gauge|counter) \| ([^|]*) \|$", CONTRACT, re.M
    )
    return {
        name: (kind, frozenset(x.strip() for x in labels.split(",") if x.strip() not in ("", "—")))
        for name, kind, labels in rows
    }


def test_exposition_is_exactly_the_documented_contract(tmp_path: Path) -> None:
    """Every metric docs/metrics.md lists is served with exactly its labels, and nothing
    is served that it does not list."""
    _, collector = fixture_node(tmp_path)
    collector.render()
    served: dict[str, tuple[str, set[frozenset[str]]]] = {}
    for family in text_string_to_metric_families(collector.render().decode()):
        name = family.name + ("_total" if family.type == "counter" else "")
        served[name] = (family.type, {frozenset(s.labels) for s in family.samples})
    documented = contract()
    assert len(documented) >= 20, "docs/metrics.md: the table was not found"
    assert set(served) == set(documented), (
        f"served, not documented: {sorted(set(served) - set(documented))}; "
        f"documented, not served: {sorted(set(documented) - set(served))}"
    )
    for name, (kind, labels) in documented.items():
        assert served[name] == (kind, {labels}), (name, served[name], kind, labels)


def test_every_state_error_reason_is_documented_and_served(tmp_path: Path) -> None:
    """docs/metrics.md lists exactly the reasons the code counts (STATE_ERROR_REASONS,
    a Literal mypy holds every count to), and each is served at 0 from the start."""
    block = re.search(
        r"<!-- state error reasons:.*?-->\n(.*?)\n *<!-- end state error reasons -->",
        CONTRACT,
        re.S,
    )
    assert block, "docs/metrics.md: the table of state error reasons is gone"
    documented = re.findall(r"^ *\| `(\w+)` \|", block.group(1), re.M)
    assert len(documented) == len(set(documented))
    _, collector = fixture_node(tmp_path)
    served = {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(collector.render().decode())
        if family.name == "wattprint_state_errors"
        for s in family.samples
    }
    assert set(documented) == set(STATE_ERROR_REASONS) == set(served)
    assert set(served.values()) == {0.0}


def sample_value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"{name} {labels} not exported")


def test_new_series_are_first_served_at_zero_then_with_their_value(tmp_path: Path) -> None:
    """PromQL's increase() drops the value a counter is born with: serve 0 first."""
    sampler, collector = fixture_node(tmp_path)
    first = collector.render().decode()
    second = collector.render().decode()
    job = {"component": "gpu", "gpu": "1", "workload": "llama-finetune"}
    name = "wattprint_workload_energy_joules_total"
    assert sample_value(first, name, **job) == 0
    assert sample_value(first, "wattprint_unattributed_energy_joules_total", gpu="0") == 0
    assert sample_value(first, "wattprint_workload_emissions_grams_total", **job) == 0
    assert sample_value(first, "wattprint_gpu_energy_joules_total", gpu="1") > 0
    snapshot = sampler.latest
    assert snapshot is not None
    held = next(s for s in snapshot.energy if s.workload and s.gpu == "1")
    assert sample_value(second, name, **job) == held.energy_uj / 1e6


def stamps(text: str, name: str) -> dict[str, float | None]:
    """The timestamp of each sample of a family, by its gpu/package label."""
    found: dict[str, float | None] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels.get("gpu", sample.labels.get("package", ""))
                found[key] = None if sample.timestamp is None else float(sample.timestamp)
    return found


def test_samples_carry_the_time_the_devices_were_read(tmp_path: Path) -> None:
    """A value stamped with the scrape time is up to one sample interval late."""
    sampler, collector = fixture_node(tmp_path)
    snapshot = sampler.latest
    assert snapshot is not None
    first = collector.render().decode()
    second = collector.render().decode()
    for name in (
        "wattprint_gpu_energy_joules_total",
        "wattprint_gpu_power_watts",
        "wattprint_cpu_energy_joules_total",
        "wattprint_memory_energy_joules_total",
        "wattprint_unattributed_energy_joules_total",
        "wattprint_workload_emissions_grams_total",
    ):
        assert set(stamps(second, name).values()) == {snapshot.time}, name
    # A new series' 0 is stamped when it really was 0: the sample before its energy.
    job = stamps(first, "wattprint_workload_energy_joules_total")["1"]
    held = next(s for s in snapshot.energy if s.workload and s.gpu == "1")
    assert job == held.born < snapshot.time
    # Info series keep no timestamp, so Prometheus ends them when they go.
    assert set(stamps(second, "wattprint_workload_gpu_info").values()) == {None}
    assert set(stamps(second, "wattprint_measurement_info").values()) == {None}


def test_a_lost_gpu_keeps_its_counter_and_loses_its_power(tmp_path: Path) -> None:
    """Its counter is stamped like the rest: an old stamp repeated for an hour would
    be dropped by Prometheus as out of bounds, with a warning at every scrape."""
    clocks = fixture_clocks()
    sampler, collector = fixture_node(tmp_path, clocks=clocks)
    fake = sampler.parts.sources[0]._nvml  # type: ignore[attr-defined]
    fake.faults[0] = fake.NVMLError_GpuIsLost
    clocks.advance(1.0)
    after = sampler.sample_once()
    text = collector.render().decode()
    assert stamps(text, "wattprint_gpu_energy_joules_total") == {"0": after.time, "1": after.time}
    assert set(stamps(text, "wattprint_gpu_power_watts")) == {"1"}


def test_stamps_never_go_back_when_the_clock_does(tmp_path: Path) -> None:
    """Nor do they advance 1 ms a sample: they stop until the clock is past them."""
    clocks = fixture_clocks()
    sampler, collector = fixture_node(tmp_path, clocks=clocks)
    before = sampler.latest
    assert before is not None
    clocks.advance(1.0)
    clocks.step(-3600.0)
    after = sampler.sample_once()
    assert after.time == before.time + 1.0
    text = collector.render().decode()
    assert set(stamps(text, "wattprint_gpu_energy_joules_total").values()) == {None}


def test_timestamps_can_be_turned_off(tmp_path: Path) -> None:
    _, collector = fixture_node(tmp_path, timestamps=False)
    for scrape, text in enumerate((collector.render().decode(), collector.render().decode())):
        families = list(text_string_to_metric_families(text))
        assert len(families) > 20
        stamped = [s for f in families for s in f.samples if s.timestamp is not None]
        if scrape:
            assert stamped == []
        else:  # a new series' 0 alone, stamped with when it was 0 (the clock trusted)
            assert stamped and all(s.value == 0 for s in stamped)


def test_a_series_first_scraped_an_hour_after_birth_gets_no_stale_zero(tmp_path: Path) -> None:
    """Prometheus would drop a 0 stamped over an hour back, and log a warning."""
    clocks = fixture_clocks()
    sampler, collector = fixture_node(tmp_path, clocks=clocks)
    clocks.advance(3600)
    snapshot = sampler.sample_once()
    text = collector.render().decode()
    job = {"component": "gpu", "gpu": "1", "workload": "llama-finetune"}
    held = next(s for s in snapshot.energy if s.workload and s.gpu == "1")
    assert sample_value(text, "wattprint_workload_energy_joules_total", **job) == (
        held.energy_uj / 1e6
    )
    assert stamps(text, "wattprint_workload_energy_joules_total")["1"] == snapshot.time


def job_sample(collector: SnapshotCollector, scraper: str) -> tuple[float, float | None]:
    token = SCRAPER.set(scraper)
    try:
        text = collector.render().decode()
    finally:
        SCRAPER.reset(token)
    job = {"component": "gpu", "gpu": "1", "workload": "llama-finetune"}
    value = sample_value(text, "wattprint_workload_energy_joules_total", **job)
    return value, stamps(text, "wattprint_workload_energy_joules_total")["1"]


def test_each_replica_of_an_ha_pair_gets_the_zero(tmp_path: Path) -> None:
    """Without its own 0, the second replica would lose the job's first interval."""
    sampler, collector = fixture_node(tmp_path)
    snapshot = sampler.latest
    assert snapshot is not None
    held = next(s for s in snapshot.energy if s.workload and s.gpu == "1")
    value = held.energy_uj / 1e6
    assert job_sample(collector, "10.0.0.1") == (0.0, held.born)
    assert job_sample(collector, "10.0.0.1") == (value, snapshot.time)
    assert job_sample(collector, "10.0.0.2") == (0.0, held.born)
    assert job_sample(collector, "10.0.0.2") == (value, snapshot.time)
    assert job_sample(collector, "10.0.0.1") == (value, snapshot.time)


def test_without_timestamps_each_scraper_gets_the_zero_stamped(tmp_path: Path) -> None:
    """--sample.timestamps=false, the clock trusted: the 0 alone is stamped, so each
    scraper gets one and no client sending the scrape header takes Prometheus's."""
    sampler, collector = fixture_node(tmp_path, timestamps=False)
    snapshot = sampler.latest
    assert snapshot is not None
    held = next(s for s in snapshot.energy if s.workload and s.gpu == "1")
    for scraper in ("10.0.0.1", "10.0.0.2"):
        zero, at = job_sample(collector, scraper)
        assert zero == 0.0 and at is not None and at < snapshot.time
        assert job_sample(collector, scraper) == (held.energy_uj / 1e6, None)


def test_with_the_clock_untrusted_only_the_first_scraper_gets_the_zero(tmp_path: Path) -> None:
    """An unstamped 0 after the value would read as a counter reset: the job twice."""
    clocks = NodeClocks(start=1795990100.0, mono=100.0, kernel=UNSYNCHRONIZED)
    sampler, collector = fixture_node(tmp_path, timestamps=False, clocks=clocks)
    snapshot = sampler.latest
    assert snapshot is not None
    held = next(s for s in snapshot.energy if s.workload and s.gpu == "1")
    assert job_sample(collector, "10.0.0.1") == (0.0, None)
    assert job_sample(collector, "10.0.0.2") == (held.energy_uj / 1e6, None)


def test_no_device_is_served_with_an_empty_label(tmp_path: Path) -> None:
    """Estimated memory is one node-wide device: package="all" (docs/metrics.md), not a
    "" that reads as missing and that Prometheus stores as no label at all."""
    proc = FakeProc(tmp_path / "proc")
    clock = [0.0]
    sampler = Sampler(
        SamplerParts(
            sources=[MemoryModelSource(proc.root, clock=lambda: clock[0])],
            read_procs=lambda: read_proc_table(str(proc.root)),
            resolver=IdentityResolver(procfs_root=str(proc.root)),
            carbon=CarbonService(CarbonSettings(zone="DE"), environ={}),
            interval=1.0,
        )
    )
    for _ in range(2):
        sampler.sample_once()
        clock[0] += 1.0
    text = SnapshotCollector(lambda: sampler.latest, True).render().decode()
    assert sample_value(text, "wattprint_memory_energy_joules_total", package="all") > 0
    assert sample_value(text, "wattprint_memory_power_watts", package="all") > 0
    info = {"component": "memory", "device": "all", "method": "model", "estimated": "true"}
    assert sample_value(text, "wattprint_measurement_info", **info) == 1
    assert not re.search(r'(package|device)=""', text), text


def test_process_metrics_follow_this_process() -> None:
    """process_* describe the exporter itself: a file it opens and CPU it burns show."""
    from wattprint.export.selfmetrics import _process

    def values() -> dict[str, float]:
        return {f.name: f.samples[0][1] for f in _process()}

    before = values()
    with open(__file__, encoding="utf-8"):
        deadline = time.process_time() + 0.05
        while time.process_time() < deadline:
            pass
        after = values()
    assert after["process_open_fds"] == before["process_open_fds"] + 1
    assert after["process_cpu_seconds_total"] >= before["process_cpu_seconds_total"] + 0.04
    assert 0 < after["process_resident_memory_bytes"] < after["process_virtual_memory_bytes"]
    assert after["process_max_fds"] >= after["process_open_fds"]
    assert after["process_start_time_seconds"] < time.time()
