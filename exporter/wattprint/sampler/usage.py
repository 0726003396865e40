"""Who used what between two samples: each process's workload (through the resolver and
the workload cap), and CPU ticks and resident memory per workload, from /proc and from
job cgroups."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from wattprint.attribution.cardinality import OVERFLOW, WorkloadCap
from wattprint.core.model import Workload
from wattprint.durability.document import Restored
from wattprint.host.identity.cgroup import JobCgroup
from wattprint.host.procfs import TICKS_PER_S, ProcTable
from wattprint.sampler.once import LogOnce
from wattprint.sampler.series import SeriesBook

# Ended jobs remembered (see UsageTracker.ended_jobs): days of short jobs on a busy node.
_ENDED_JOBS_KEPT = 100_000


class Resolver(Protocol):
    """Names the workload of a process (host/identity)."""

    def resolve(
        self, pid: int, start_ticks: int, table: ProcTable | None = None
    ) -> Workload | None: ...


@runtime_checkable
class JobResolver(Protocol):
    """A resolver that also names a job cgroup's workload."""

    def resolve_job(self, job: JobCgroup) -> Workload | None: ...


@runtime_checkable
class ForgetsExited(Protocol):
    """A resolver that keeps identities and wants to hear which processes still live."""

    def forget_missing(self, live: Iterable[tuple[int, int]]) -> None: ...


class UsageTracker:
    """CPU ticks and memory per workload between two samples, and who each process is."""

    def __init__(
        self, resolver: Resolver | None, cap: WorkloadCap, book: SeriesBook, once: LogOnce
    ) -> None:
        self.resolver = resolver
        self.cap = cap
        self.job_workloads: dict[str, Workload] = {}  # job cgroup -> its workload
        self.prev_ticks: dict[tuple[int, int], int] = {}  # (pid, start) -> CPU ticks
        self.prev_cpu_total: int | None = None  # the node's ticks at the last sample
        self.prev_cgroup: dict[str, int] = {}  # job cgroup -> CPU microseconds
        # Jobs whose cgroup has gone: they ended, and a process that outlives its job
        # (it left the cgroup, or names the job in its environment) is no longer the
        # job's, as in the scheduler's own accounting. Insertion order: oldest first.
        self.ended_jobs: dict[Workload, None] = {}
        self._cgroups_resumed = False
        self._resolve_job = resolver.resolve_job if isinstance(resolver, JobResolver) else None
        self._forget = resolver.forget_missing if isinstance(resolver, ForgetsExited) else None
        self._book = book
        self._once = once

    def pid_resolver(self, table: ProcTable | None) -> Callable[[int], Workload | None]:
        resolver = self.resolver
        procs = table.procs if table is not None else {}
        in_job = table.in_job if table is not None else {}
        self.cap.begin(self._book.last_seen, self._book.previous_time)

        def resolve_pid(pid: int) -> Workload | None:
            info = procs.get(pid)
            if info is None:
                key = in_job.get(pid)
                return None if key is None or table is None else self._job_workload(key, table)
            if resolver is None:
                return None
            try:
                workload = resolver.resolve(pid, info.start_ticks, table)
            except Exception as err:  # identity is best effort; energy stays conserved
                self._once.warn("identity", f"identity resolution failed: {err}")
                return None
            return self.admit(workload) if workload is not None else None

        return resolve_pid

    def _job_workload(self, key: str, table: ProcTable) -> Workload | None:
        # A job cgroup's key names one job for its whole life (a pod's UID, a Slurm job
        # id are in its path): resolved once, as a process is (host/identity/resolver.py).
        workload = self.job_workloads.get(key)
        if workload is None:
            if self._resolve_job is None:
                return None
            try:
                workload = self._resolve_job(table.jobs[key].job)
            except Exception as err:  # identity is best effort; energy stays conserved
                self._once.warn("identity", f"identity resolution failed: {err}")
                return None
            if workload is None:
                return None  # a pod the pod list does not know yet: asked again next time
            admitted = self.admit(workload)
            # The object the series are keyed by where it is the same workload (one
            # restored from the state file): each sample's lookups then match by identity.
            self.job_workloads[key] = admitted if admitted == workload else workload
            return admitted
        return self.admit(workload)

    def admit(self, workload: Workload) -> Workload:
        """The workload whose series pay for `workload` (see attribution/cardinality.py)."""
        admitted = self.cap.admit(workload, getattr(self.resolver, "registrants", None))
        if admitted is workload or admitted == workload:  # itself, or the equal one kept
            return admitted
        if admitted is OVERFLOW:
            if "workload-cap" not in self._once:
                self._once.warn(
                    "workload-cap",
                    f"{self.cap.max_workloads} workloads have series on this node "
                    '(--workload.max-series): new ones are counted as workload="other" '
                    "(wattprint_workload_overflow_total)",
                )
        elif "workload-label" not in self._once:
            longest = max((workload.workload, workload.namespace, workload.pod), key=len)
            self._once.warn(
                "workload-label",
                f"a workload label value is {len(longest)} characters long "
                f"({longest[:40]!r}...): exported cut to {self.cap.label_limit}, "
                "ending in a hash of the whole value",
            )
        return admitted

    def usage(
        self,
        table: ProcTable | None,
        resolve_pid: Callable[[int], Workload | None],
        now: float,
    ) -> tuple[dict[Workload, int], dict[Workload, int]]:
        """CPU ticks used in the interval and resident bytes now, per workload."""
        cpu: dict[Workload, int] = {}
        rss: dict[Workload, int] = {}
        if table is None:
            return cpu, rss
        # A process of a job its cgroup counts, but outside it (it moved in after it was
        # first seen, or carries the job's id in its environment), must not count twice.
        by_cgroup = self._cgroup_usage(table, now, cpu, rss)
        last_seen = self._book.last_seen
        ticks: dict[tuple[int, int], int] = {}
        for pid, info in table.procs.items():
            key = (pid, info.start_ticks)
            ticks[key] = info.cpu_ticks
            workload = resolve_pid(pid)
            if workload is None or workload in by_cgroup or workload in self.ended_jobs:
                continue
            last_seen[workload] = now
            # A process absent from the previous table started since then: all of its
            # CPU time belongs to this interval (short-lived workers must count too).
            baseline = self.prev_ticks.get(key, 0 if self.prev_ticks else info.cpu_ticks)
            used = info.cpu_ticks - baseline
            if used > 0:
                cpu[workload] = cpu.get(workload, 0) + used
            rss[workload] = rss.get(workload, 0) + info.rss_bytes
        self.prev_ticks = ticks
        if self._forget is not None:
            self._forget(ticks.keys())  # identities of exited processes are not needed again
        return cpu, rss

    def _cgroup_usage(
        self,
        table: ProcTable,
        now: float,
        cpu: dict[Workload, int],
        rss: dict[Workload, int],
    ) -> set[Workload]:
        """Add the job cgroups' CPU ticks and memory; return the workloads they count."""
        # Once per job every sample, on a node of a hundred jobs: what the loop reads
        # is fetched once, and an idle job's unchanged CPU time is not converted.
        first = self.prev_cpu_total is None
        resumed = self._cgroups_resumed
        live = table.live_jobs
        previous = self.prev_cgroup
        workloads = self.job_workloads
        last_seen = self._book.last_seen
        usec: dict[str, int] = {}
        counted: set[Workload] = set()
        for key, usage in table.jobs.items():
            cpu_usec = usec[key] = usage.cpu_usec
            workload = workloads.get(key)
            if workload is None:
                workload = self._job_workload(key, table)
                if workload is None:
                    continue  # a pod the pod list does not know yet: unattributed
            else:
                workload = self.admit(workload)
            counted.add(workload)
            self.ended_jobs.pop(workload, None)  # a job requeued under its old id
            if key in live:  # an ended job's cgroup lingers a while: it must expire
                last_seen[workload] = now
            baseline = previous.get(key)
            if baseline is None:
                # A job first seen since the previous sample, or since the state was
                # saved, started meanwhile: all of its CPU time is new.
                started = (usage.new and not first) or resumed
                baseline = 0 if started else cpu_usec
            if cpu_usec != baseline:
                # In the node's ticks, as a difference of whole ticks so that no
                # fraction is lost or counted twice from one interval to the next.
                used = _ticks(cpu_usec) - _ticks(baseline)
                if used > 0:
                    cpu[workload] = cpu.get(workload, 0) + used
            rss[workload] = rss.get(workload, 0) + usage.memory_bytes
        self.prev_cgroup = usec
        self._cgroups_resumed = False
        if not workloads.keys() <= usec.keys():  # an ended job's, or more
            for key in workloads.keys() - usec.keys():
                self.ended_jobs[workloads[key]] = None
            while len(self.ended_jobs) > _ENDED_JOBS_KEPT:
                del self.ended_jobs[next(iter(self.ended_jobs))]
            self.job_workloads = {k: w for k, w in workloads.items() if k in usec}
        return counted

    def node_ticks(self, table: ProcTable | None) -> int:
        """The node's CPU ticks since the last sample (0 without two tables to compare)."""
        if table is None or self.prev_cpu_total is None:
            return 0
        return max(table.cpu_ticks_total - self.prev_cpu_total, 0)

    def end_sample(self, table: ProcTable | None) -> None:
        if table is not None:
            self.prev_cpu_total = table.cpu_ticks_total

    def restore(self, restored: Restored) -> None:
        """Go on from a state file's CPU baselines, so the gap's CPU time is counted."""
        self.prev_ticks = dict(restored.ticks)
        self.prev_cpu_total = restored.cpu_total
        self.prev_cgroup = dict(restored.cgroups)
        self._cgroups_resumed = True


def _ticks(usec: int) -> int:
    return usec * TICKS_PER_S // 1_000_000
