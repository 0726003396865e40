"""Bounded cardinality: at most --workload.max-series workloads per node get series of
their own, label values are length-bounded, and the scrape limits the deploy files set
hold the worst case a node can export."""

from __future__ import annotations

import hashlib
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from procfs_fixture import FakeProc
from test_helm import render
from wattprint.attribution.cardinality import (
    MAX_LABEL_LENGTH,
    OVERFLOW,
    WorkloadCap,
    bound_label,
    bound_workload,
)
from wattprint.carbon.base import CarbonSettings
from wattprint.carbon.service import CarbonService
from wattprint.core.model import DeviceReading, GpuProcess, SourceResult, Workload
from wattprint.export.collector import SnapshotCollector
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import read_proc_table
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources.rapl import RaplSource

REPO = Path(__file__).resolve().parent.parent
SYSFS = Path(__file__).parent / "fixtures" / "sys" / "intel-2pkg"


def env(name: str) -> Workload:
    return Workload("env", name)


# ---- label length ---------------------------------------------------------------------


def test_short_labels_are_kept_as_they_are() -> None:
    assert bound_label("train-llm") == "train-llm"
    exact = "x" * MAX_LABEL_LENGTH
    assert bound_label(exact) == exact
    workload = Workload("kubernetes", "job", "team-a", "job-abcde")
    assert bound_workload(workload) is workload


def test_a_long_label_is_cut_and_ends_in_a_hash_of_the_whole_value() -> None:
    prefix = "a" * 10_000
    first, second = bound_label(prefix + "1"), bound_label(prefix + "2")
    assert len(first) == len(second) == MAX_LABEL_LENGTH
    assert first.startswith("a" * 100) and re.fullmatch(r"a+~[0-9a-f]{8}", first)
    assert first != second  # same start, different ends: still two workloads
    assert first.endswith(hashlib.sha256((prefix + "1").encode()).hexdigest()[:8])
    assert bound_label(prefix + "1") == first  # the same name, the same label every time
    # Characters, not bytes: a multi-byte name is cut at a character boundary.
    assert len(bound_label("é" * 300)) == MAX_LABEL_LENGTH


def test_every_label_of_a_workload_is_bounded() -> None:
    long = "n" * 300
    bounded = bound_workload(Workload("kubernetes", long, long + "-ns", long + "-pod"))
    assert bounded.scheduler == "kubernetes"
    assert {len(bounded.workload), len(bounded.namespace), len(bounded.pod)} == {128}
    assert len({bounded.workload, bounded.namespace, bounded.pod}) == 3


# ---- the cap ---------------------------------------------------------------------------


def test_beyond_the_cap_new_workloads_go_to_other_and_are_counted_once() -> None:
    cap = WorkloadCap(max_workloads=3)
    live: dict[Workload, float] = {}
    cap.begin(live, None)
    assert [cap.admit(env(n)) for n in "abcde"] == [
        env("a"),
        env("b"),
        env("c"),
        OVERFLOW,
        OVERFLOW,
    ]
    assert cap.admit(env("d")) is OVERFLOW  # seen again in the same sample: not counted again
    assert cap.overflowed_total == 2
    assert cap.admit(env("a")) == env("a")  # admitted workloads keep their series
    assert cap.admit(OVERFLOW) is OVERFLOW
    live.update({env("a"): 0.0, env("b"): 0.0, env("c"): 0.0, OVERFLOW: 0.0})
    assert cap.status(live).workloads == 3  # "other" takes no slot


def test_registered_workloads_over_the_cap_are_exported() -> None:
    from wattprint.core.model import Snapshot

    cap = WorkloadCap(max_workloads=1)
    cap.begin([], None)
    assert cap.admit(env("a")) == env("a")
    assert cap.admit(env("b")) is OVERFLOW
    assert cap.admit(env("c"), lambda _: {1000}) == env("c")  # a tracker's: its own series
    snapshot = Snapshot(1.0, (), (), (), (), workload_cap=cap.status({env("a"): 0, env("c"): 0}))
    text = SnapshotCollector(lambda: snapshot, False).render().decode()
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("wattprint_workload")
    }
    # The full cap is said for both: the workload counted as "other", and the one
    # counted over the cap, which left "other" nothing to show.
    assert values["wattprint_workload_overflow_total"] == 1
    assert values["wattprint_workload_registered_over_cap_total"] == 1


def test_a_workload_with_a_long_label_is_admitted_bounded_every_sample() -> None:
    cap = WorkloadCap(max_workloads=2)
    long = Workload("kubernetes", "n" * 300, "ns", "pod")
    cap.begin({}, None)
    bounded = cap.admit(long)
    assert bounded == bound_workload(long) and len(bounded.workload) == MAX_LABEL_LENGTH
    for t in (1.0, 2.0):
        cap.begin({bounded: t}, t)  # the sampler keeps the bounded one as live
        assert cap.admit(long) == bounded  # the resolver hands out the long one again
        assert cap.admit(bounded) is bounded
    assert cap.status({bounded: 2.0}).workloads == 1 and cap.overflowed_total == 0


def test_admit_hands_out_the_workload_object_the_series_are_kept_under() -> None:
    cap = WorkloadCap(max_workloads=2)
    kept = Workload("slurm", "42")  # as the state file gave it back
    cap.begin({kept: 1.0}, None)
    resolved = Workload("slurm", "42")  # the resolver's: equal, another object
    assert cap.admit(resolved) is kept
    assert cap.admit(env("new")) == env("new") and cap.status({kept: 1.0}).workloads == 1


def test_other_holds_whole_workloads_and_a_freed_slot_goes_to_a_new_one() -> None:
    cap = WorkloadCap(max_workloads=2, retention=60)
    live = {env("a"): 0.0, env("b"): 0.0}
    cap.begin(live, None)
    assert cap.admit(env("late")) is OVERFLOW
    # a expires: a slot is free, but "late" is still running; it stays in "other",
    # so that its energy is never split between "other" and a series of its own.
    del live[env("a")]
    cap.begin(live, 0.0)
    assert cap.admit(env("late")) is OVERFLOW
    assert cap.admit(env("new")) == env("new")
    assert cap.overflowed_total == 1
    # Samples 100 s apart, longer than the retention: "late" is seen in each, so it stays.
    cap.begin(live, 100.0)
    assert cap.admit(env("late")) is OVERFLOW
    # Last seen by the sample at 200 s, not by the one at 230 s: at 261 s it has been
    # gone for more than a retention, so it is forgotten and, when it comes back, new:
    # with room it gets series of its own.
    cap.begin({env("b"): 0.0}, 200.0)
    cap.begin({env("b"): 0.0}, 230.0)
    cap.begin({env("b"): 0.0}, 261.0)
    assert cap.admit(env("late")) == env("late")
    assert cap.overflowed_total == 1


def test_a_flood_of_names_is_forgotten_oldest_first() -> None:
    cap = WorkloadCap(max_workloads=1, remember=100)
    cap.begin({}, None)
    for i in range(1000):
        cap.admit(env(f"flood-{i}"))
    assert cap.overflowed_total == 999
    assert len(cap._overflowed) == 100


# ---- the sampler ---------------------------------------------------------------------


class Gpus:
    """GPUs every one of whose holders is given (a replayed trace's identities)."""

    name = "replay"

    def __init__(self, count: int) -> None:
        self.count = count
        self.energy_uj = 0
        self.processes: tuple[GpuProcess, ...] = ()

    def read(self) -> SourceResult:
        self.energy_uj += 700_000_001
        return SourceResult(
            [
                DeviceReading(
                    "gpu",
                    str(i),
                    self.energy_uj,
                    700.0,
                    "replay",
                    uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
                    model="NVIDIA H200",
                    processes=self.processes,
                )
                for i in range(self.count)
            ]
        )

    def explain(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def test_replayed_identities_are_capped_bounded_and_conserved() -> None:
    gpus = Gpus(1)
    sampler = Sampler(SamplerParts(sources=[gpus], max_workloads=10))
    sampler.sample_once()
    long = env("x" * 5000)
    jobs = [GpuProcess(i, identity=env(f"job-{i}")) for i in range(30)]
    gpus.processes = (GpuProcess(99, identity=long), *jobs)
    snapshot = sampler.sample_once()
    shares = {s.workload: s.energy_uj for s in snapshot.energy}
    # ten of their own (the long name first, cut), and "other" for the 21 after them;
    # every holder pays, so nothing is unattributed.
    assert set(shares) == {bound_workload(long), *(env(f"job-{i}") for i in range(9)), OVERFLOW}
    assert len(bound_workload(long).workload) == MAX_LABEL_LENGTH
    assert abs(shares[OVERFLOW] - 21 * shares[env("job-0")]) <= 21
    assert sum(shares.values()) == snapshot.devices[0].energy_uj
    assert {w for w, _, _ in snapshot.gpu_holders} == set(shares)
    assert snapshot.workload_cap.workloads == 10
    assert snapshot.workload_cap.overflowed_total == 21


def scrape_limits() -> dict[str, int]:
    """The sample limits the deploy files set, by where they are set."""
    limits = {}
    for name in ("prometheus-scrape.yml", "prometheus-scrape-kubernetes.yml"):
        config = yaml.safe_load((REPO / "deploy" / name).read_text())
        for job in config["scrape_configs"]:
            limits[f"{name} {job['job_name']}"] = job["sample_limit"]
    docs, _ = render({"serviceMonitor": {"enabled": True}})
    (monitor,) = (d for d in docs if d["kind"] == "ServiceMonitor")
    limits["chart default"] = monitor["spec"]["sampleLimit"]
    return limits


def test_the_chart_sample_limit_follows_the_cap() -> None:
    docs, _ = render(
        {"serviceMonitor": {"enabled": True}, "exporter": {"workload": {"maxSeries": 50}}}
    )
    (monitor,) = (d for d in docs if d["kind"] == "ServiceMonitor")
    assert monitor["spec"]["sampleLimit"] == 51 * 28 + 1000
    (daemonset,) = (d for d in docs if d["kind"] == "DaemonSet")
    assert (
        "--workload.max-series=50" in daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    for explicit, expected in ((20000, 20000), (0, None)):
        docs, _ = render({"serviceMonitor": {"enabled": True, "sampleLimit": explicit}})
        (monitor,) = (d for d in docs if d["kind"] == "ServiceMonitor")
        assert monitor["spec"].get("sampleLimit") == expected


def test_the_worst_case_node_fits_the_scrape_limits(tmp_path: Path) -> None:
    """8 GPUs, two CPU packages, and more workloads than the cap, each on every GPU
    and using CPU and memory: the most series a node with the default cap exports."""
    gpu_count, over_cap = 8, 600
    sysfs = tmp_path / "sys"
    shutil.copytree(SYSFS, sysfs)
    proc = FakeProc(tmp_path / "proc")
    for pid in range(1000, 1000 + over_cap):
        proc.add(pid, rss_bytes=1 << 30, environ={"WATTPRINT_WORKLOAD": f"job-{pid}"})
    gpus = Gpus(gpu_count)
    gpus.processes = tuple(GpuProcess(pid) for pid in range(1000, 1000 + over_cap))
    clock = [1_795_990_000.0]
    root = str(tmp_path / "proc")
    sampler = Sampler(
        SamplerParts(
            sources=[
                gpus,
                RaplSource("cpu", str(sysfs), lambda: clock[0]),
                RaplSource("memory", str(sysfs), lambda: clock[0]),
            ],
            read_procs=lambda: read_proc_table(root),
            resolver=IdentityResolver(procfs_root=root),
            carbon=CarbonService(CarbonSettings(zone="DE"), environ={}),
            clock=lambda: clock[0],
        )
    )
    zones = sorted(p for p in (sysfs / "class" / "powercap").iterdir() if ":" in p.name)
    for step in range(1, 4):
        clock[0] += 1
        for zone in zones:
            energy = zone / "energy_uj"
            energy.write_text(str(int(energy.read_text()) + 95_000_000))
        for pid in range(1000, 1000 + over_cap):
            proc.set_cpu(pid, step * 10, rss_bytes=1 << 30)
        proc.tick(8 * 100 * step, busy=over_cap * 10 * step)
        sampler.sample_once()
    text = SnapshotCollector(lambda: sampler.latest, True).render().decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    per_workload = Counter(s.labels["workload"] for s in samples if "workload" in s.labels)

    # Every workload (the 500 admitted and "other") has the most series one can have:
    # energy and emissions for each GPU, the CPU and memory, and an info series per GPU.
    assert len(per_workload) == 500 + 1
    assert set(per_workload.values()) == {3 * gpu_count + 4}
    fixed = len(samples) - sum(per_workload.values())
    print(f"{len(samples)} samples: 501 x {3 * gpu_count + 4} workload series + {fixed} fixed")
    for where, limit in scrape_limits().items():
        assert len(samples) <= limit, where
        # and not so loose that a runaway exporter would go unnoticed
        assert limit <= 1.2 * len(samples), where


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "many", "100001"])
def test_max_series_must_be_a_whole_number_of_workloads(value: str) -> None:
    from wattprint.config.options import ConfigError, build_config

    with pytest.raises(ConfigError, match=r"--workload\.max-series"):
        build_config({"workload.max-series": value}, environ={})
    assert build_config({}, environ={}).workload_max_series == 500
