"""Cost of process discovery and identity resolution per sample, 2,000 processes.

Builds a fixture /proc with 2,000 processes (pods, Slurm tasks, env-tagged ranks,
system daemons) in a temporary directory and times, per call:
  read_proc_table        one read of every /proc/PID/stat + /proc/stat + /proc/meminfo
  resolve x 2,000 cold   first sight of every process: cgroup, environ, parent chain
  resolve x 2,000 cached what the sampler pays every sample once processes are known
  forget_missing         dropping dead processes' cache entries
and read_proc_table on this machine's real /proc (procfs formats each file on read,
so it costs more than a fixture file): scaled to 2,000 processes from the ones running,
or, with --spawn, with idle child processes forked to make up 2,000.

    python benchmarks/bench_procs.py [--processes 2000] [--repeat 50] [--spawn]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import read_proc_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from idle_children import spawn_idle

POD_CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
    "cri-containerd-{cid:064x}.scope\n"
)
ENV_FILLER = "".join(f"VAR_{i}=value-{i}-with-some-length\0" for i in range(40))


def build_proc(root: Path, n: int) -> None:
    (root / "stat").write_text("cpu  4705 356 584 3699176 2300 0 131 7 0 0\nintr 1\n")
    (root / "meminfo").write_text("MemTotal:       2113418000 kB\nMemFree: 1 kB\n")
    for pid in range(1000, 1000 + n):
        d = root / str(pid)
        d.mkdir()
        kind = pid % 4
        ppid = 1 if kind != 2 else pid - 1 if pid % 8 == 6 else 1
        rest = " ".join(["0"] * 28)
        (d / "stat").write_text(
            f"{pid} (proc {pid}) S {ppid} {pid} {pid} 0 -1 4194560 2270 0 0 0 "
            f"{pid * 3} {pid} 0 0 20 0 4 0 {pid * 10} 1213816832 {pid * 7} "
            f"18446744073709551615 {rest}\n"
        )
        environ = ENV_FILLER
        if kind == 0:  # a pod's container
            uid = f"{pid:08x}_0aa6_4394_a7f8_d4afc6864c09"
            cgroup = POD_CGROUP.format(uid=uid, cid=pid)
        elif kind == 1:  # a Slurm task
            cgroup = f"0::/system.slice/slurmstepd.scope/job_{pid // 100}/step_0/user/task_0\n"
        else:  # env-tagged ranks (some inherit it from their parent) and daemons
            cgroup = "0::/system.slice/some.service\n"
            if kind == 2 and pid % 8 == 2:
                environ += f"WATTPRINT_WORKLOAD=run-{pid // 50}\0"
        (d / "cgroup").write_text(cgroup)
        (d / "environ").write_text(environ)


def per_call_ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(wall, CPU) milliseconds per call."""
    fn()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        fn()
    return (
        (time.perf_counter() - wall) / repeat * 1e3,
        (time.process_time() - cpu) / repeat * 1e3,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--spawn", action="store_true", help="fork idle processes up to --processes")
    args = ap.parse_args()
    n = args.processes

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "proc"
        root.mkdir()
        build_proc(root, n)
        proc = str(root)

        table = read_proc_table(proc)
        assert len(table.procs) == n
        keys = [(p.pid, p.start_ticks) for p in table.procs.values()]

        def resolve_all(r: IdentityResolver) -> int:
            return sum(r.resolve(pid, start, table) is not None for pid, start in keys)

        cold = IdentityResolver(proc)
        t0 = time.perf_counter()
        attributed = resolve_all(cold)
        cold_ms = (time.perf_counter() - t0) * 1e3

        rows = [
            ("read_proc_table (fixture /proc)", per_call_ms(lambda: read_proc_table(proc), 20)),
            (f"resolve x {n} cached", per_call_ms(lambda: resolve_all(cold), args.repeat)),
            ("forget_missing", per_call_ms(lambda: cold.forget_missing(keys), args.repeat)),
        ]

    children: list[int] = []
    if args.spawn:
        children, pipe = spawn_idle(max(0, n - len(read_proc_table().procs)))
    try:
        real = read_proc_table()
        real_wall, real_cpu = per_call_ms(read_proc_table, args.repeat)
    finally:
        if children:
            os.close(pipe)
            for pid in children:
                os.waitpid(pid, 0)
    scale = n / max(1, len(real.procs))
    rows.insert(
        1,
        (
            f"read_proc_table (real /proc, {len(real.procs)} procs, x{scale:.2f})",
            (real_wall * scale, real_cpu * scale),
        ),
    )

    print(f"{n} processes, {attributed} attributed; cold resolve of all: {cold_ms:.1f} ms once")
    print(f"{'':<52} {'wall ms':>9} {'CPU ms':>9}   (per call)")
    for name, (wall, cpu) in rows:
        print(f"{name:<52} {wall:>9.3f} {cpu:>9.3f}")
    print(f"CPUs: {os.cpu_count()}")


if __name__ == "__main__":
    main()
