"""CPU cost of one sample with 2,000 processes on the node and 8 GPUs x 16 GPU processes.

    python benchmarks/bench_attribution.py [--samples 150] [--cgroups]

Builds a fake /proc of 2,000 processes (in the kernel's formats; 128 of them hold GPUs
and belong to 4 jobs through WATTPRINT_WORKLOAD, the rest are other jobs' and system
processes) and 8 fake H200s, then times the sampler's steps in CPU time (thread_time,
so sleeping does not count): reading /proc, resolving identities (cached after the first
sample), and the attribution itself. Target: <= 10 ms of CPU per sample for attribution.

The identity resolver's clock advances 1 s per sample. Each sample --execs processes
run another program (exec: a new name in their stat), and the resolver reads an
unclaimed one of them again; the ones that keep their name are read again only after
5-15 minutes, beyond the default 150 samples (--samples 1000 includes those rechecks:
the max column shows what such a sample costs). With --cgroups the processes that exec
are in job cgroups, which are not resolved per process. --cgroups puts the processes that hold
no GPU into 100 Slurm job cgroups (a fake cgroup v2 tree): their jobs' cgroups are read
instead of their /proc files.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from fake_nvml import FakeNvml  # noqa: E402
from fakecgroup import FakeCgroupFs  # noqa: E402
from procfs_fixture import FakeProc  # noqa: E402
from wattprint.core.model import DeviceReading, SourceResult  # noqa: E402
from wattprint.host.cgroupfs import CgroupAccounting, CgroupFs  # noqa: E402
from wattprint.host.identity.resolver import IdentityResolver  # noqa: E402
from wattprint.host.procfs import read_proc_table  # noqa: E402
from wattprint.sampler.loop import Sampler, SamplerParts  # noqa: E402
from wattprint.sources.nvml import NvmlSource  # noqa: E402


class ConstantCpu:
    name = "cpu_model"

    def __init__(self) -> None:
        self.energy = 0

    def read(self) -> SourceResult:
        self.energy += 200_000_000
        return SourceResult(
            devices=[
                DeviceReading("cpu", "0", self.energy, 200.0, "model"),
                DeviceReading("memory", "all", self.energy // 10, 20.0, "model"),
            ]
        )

    def explain(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=150)
    parser.add_argument("--processes", type=int, default=2000)
    parser.add_argument("--cgroups", action="store_true")
    parser.add_argument("--execs", type=int, default=5, help="processes that exec a sample")
    args = parser.parse_args()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "proc"
        proc = FakeProc(root, cpus=64)
        fs = FakeCgroupFs(Path(tmp) / "cgroup")
        gpu_pids: list[list[int]] = [[] for _ in range(8)]
        for pid in range(1000, 1000 + args.processes):
            i = pid - 1000
            env = {"WATTPRINT_WORKLOAD": f"job-{i % 4}"} if i < 128 or i % 3 == 0 else {}
            cgroup = "0::/user.slice\n"
            if args.cgroups and i >= 128:
                job = f"/system.slice/slurmstepd.scope/job_{i % 100}"
                cgroup = f"0::{job}/step_0/user/task_0\n"
                fs.set(job, cpu_usec=0, anon=1 << 30)
            proc.add(
                pid,
                start=pid,
                cpu_ticks=0,
                rss_bytes=rng.randrange(1, 4096) << 20,
                environ=env,
                cgroup=cgroup,
            )
            if i < 128:
                gpu_pids[i // 16].append(pid)
        fake = FakeNvml.from_trace(copies=8)
        for gpu in fake.gpus:
            for entry in gpu.samples:
                entry["processes"] = [
                    {"pid": p, "sm_util": rng.randrange(0, 100)} for p in gpu_pids[gpu.index]
                ]
        table_root = str(root)
        accounting = CgroupAccounting(CgroupFs(fs.path), table_root) if args.cgroups else None
        clock = [0.0]
        sampler = Sampler(
            SamplerParts(
                sources=[NvmlSource(nvml=fake), ConstantCpu()],
                read_procs=lambda: read_proc_table(table_root, accounting),
                resolver=IdentityResolver(procfs_root=table_root, clock=lambda: clock[0]),
            )
        )
        sampler.sample_once()  # fills the identity cache, as a long-running exporter has

        read_ms, whole_ms = [], []
        ticks = {pid: 0 for pid in range(1000, 1000 + args.processes)}
        comm: dict[int, str] = {}  # the programs the execs ran
        for _ in range(args.samples):
            clock[0] += 1.0
            fake.advance()
            for n, pid in enumerate(rng.sample(sorted(ticks)[128:], args.execs)):
                comm[pid] = f"exec-{clock[0]:.0f}-{n}"
                proc.set_cpu(pid, ticks[pid], start=pid, comm=comm[pid])
            for pid in rng.sample(sorted(ticks), 200):  # 10 % of processes ran
                ticks[pid] += rng.randrange(1, 100)
                proc.set_cpu(pid, ticks[pid], start=pid, comm=comm.get(pid, "python3"))
            proc.tick(6400)
            t0 = time.thread_time()
            table = read_proc_table(table_root, accounting)
            t1 = time.thread_time()
            sampler.parts.read_procs = lambda t=table: t  # type: ignore[misc]
            sampler.sample_once()
            t2 = time.thread_time()
            read_ms.append((t1 - t0) * 1000)
            whole_ms.append((t2 - t1) * 1000)
        where = "100 job cgroups + 128 GPU processes" if args.cgroups else "no job cgroups"
        print(
            f"\nOne sample, {args.processes} processes ({where}), 8 GPUs x 16 GPU processes, "
            f"{args.samples} samples of 1 s (CPU ms, thread_time)"
        )
        print(f"{'step':<44} {'median':>8} {'p90':>8} {'max':>8}")
        for name, values in (
            ("read /proc (and job cgroups)", read_ms),
            ("identity + attribution + snapshot", whole_ms),
        ):
            p90 = sorted(values)[int(0.9 * len(values))]
            print(f"{name:<44} {statistics.median(values):8.2f} {p90:8.2f} {max(values):8.2f}")
        series = len(sampler.latest.energy) if sampler.latest else 0
        print(f"energy series in the snapshot: {series}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
