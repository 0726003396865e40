"""What a long-running exporter keeps: a job's series go after --workload.retention, and
the identity cache follows the processes alive, however many come and go."""

from __future__ import annotations

from clock_fakes import NodeClocks
from wattprint.core.model import DeviceReading, GpuProcess, SourceResult, Workload
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.sampler.loop import Sampler, SamplerParts

from .faultrig import CPU_CHILD_PID, CPU_JOB_PID, Node, Rig, RigFactory


def workloads(rig: Rig) -> set[str]:
    return {
        dict(labels)["workload"]
        for name, labels in rig.series
        if name == "wattprint_workload_energy_joules_total"
    }


def test_series_expire_after_retention(node: Node, rig_factory: RigFactory) -> None:
    rig = rig_factory(**{"workload.retention": "1m"})
    clock = NodeClocks()
    clock.install(rig.exporter.sampler)
    rig.steps(2)
    assert workloads(rig) == {"job-a", "phased-load"}

    node.remove_process(CPU_CHILD_PID)
    node.remove_process(CPU_JOB_PID)
    clock.advance(30)
    rig.step()
    assert "job-a" in workloads(rig)  # within retention its series stay
    clock.advance(31)
    rig.step()  # conservation across the expiry is checked here too
    assert workloads(rig) == {"phased-load"}


def test_a_job_seen_only_between_two_reads_expires_too() -> None:
    """A replayed GPU can be held by a job only between two reads (a trace segment):
    such a job is in no process list, yet its series must expire like any other."""
    short = Workload("env", "short-job")

    class Replayed:
        name = "replay"
        energy_uj = 0
        segments: tuple[tuple[int, tuple[GpuProcess, ...]], ...] = ()

        def read(self) -> SourceResult:
            self.energy_uj += 1_000_000
            reading = DeviceReading(
                "gpu", "0", self.energy_uj, 100.0, "replay", segments=self.segments
            )
            return SourceResult([reading])

        def explain(self) -> list[str]:
            return []

        def close(self) -> None:
            pass

    source = Replayed()
    clock = NodeClocks()
    sampler = Sampler(SamplerParts(sources=[source], retention=60))
    clock.install(sampler)
    sampler.sample_once()
    source.segments = ((600_000, (GpuProcess(1, identity=short),)),)
    held = sampler.sample_once()
    assert {s.workload for s in held.energy} == {short, None}
    source.segments = ()
    clock.advance(61)
    assert {s.workload for s in sampler.sample_once().energy} == {None}


def test_identity_cache_follows_the_live_processes(node: Node, rig_factory: RigFactory) -> None:
    rig = rig_factory()
    resolver = rig.exporter.sampler.parts.resolver
    assert isinstance(resolver, IdentityResolver)
    batch: list[int] = []
    for round_ in range(10):  # 500 short-lived processes, 50 at a time
        for pid in batch:
            node.remove_process(pid)
        batch = [2000 + round_ * 50 + i for i in range(50)]
        for pid in batch:
            node.add_process(pid, start=5000 + round_, environ={"WATTPRINT_WORKLOAD": "burst"})
        rig.step()
    alive = len(list(node.procfs.glob("[0-9]*")))
    assert resolver.cached <= alive
    assert workloads(rig) >= {"burst", "job-a"}
