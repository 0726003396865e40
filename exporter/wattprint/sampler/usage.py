"""Who used what between two samples: each process's workload (through the resolver and
the workload cap), and CPU ticks and resident memory per workload, from /proc and from
job cgroups. A mixin of the sampler, which owns the fields below."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from wattprint.attribution.cardinality import OVERFLOW, WorkloadCap
from wattprint.core.model import Workload
from wattprint.host.procfs import TICKS_PER_S, ProcTable

if TYPE_CHECKING:
    from wattprint.sampler.loop import SamplerParts


class UsageMixin:
    parts: SamplerParts
    _cap: WorkloadCap
    _last_seen: dict[Workload, float]
    _previous_time: float | None
    _prev_ticks: dict[tuple[int, int], int]
    _prev_cpu_total: int | None
    _prev_cgroup: dict[str, int]
    _cgroups_resumed: bool
    _job_workloads: dict[str, Workload]

    def _log_once(self, key: str, message: str) -> None:
        raise NotImplementedError  # RestartMixin's, ahead of this class in Sampler's bases

    def _pid_resolver(self, table: ProcTable | None) -> Callable[[int], Workload | None]:
        resolver = self.parts.resolver
        procs = table.procs if table is not None else {}
        in_job = table.in_job if table is not None else {}
        self._cap.begin(self._last_seen, self._previous_time)

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
                self._log_once("identity", f"identity resolution failed: {err}")
                return None
            return self._admit(workload) if workload is not None else None

        return resolve_pid

    def _job_workload(self, key: str, table: ProcTable) -> Workload | None:
        # A job cgroup's key names one job for its whole life (a pod's UID, a Slurm job
        # id are in its path): resolved once, as a process is (identity/__init__.py).
        workload = self._job_workloads.get(key)
        if workload is None:
            resolve_job = getattr(self.parts.resolver, "resolve_job", None)
            if resolve_job is None:
                return None
            try:
                workload = resolve_job(table.jobs[key].job)
            except Exception as err:  # identity is best effort; energy stays conserved
                self._log_once("identity", f"identity resolution failed: {err}")
                return None
            if workload is None:
                return None  # a pod the pod list does not know yet: asked again next time
            admitted = self._admit(workload)
            # The object the series are keyed by where it is the same workload (one
            # restored from the state file): each sample's lookups then match by identity.
            self._job_workloads[key] = admitted if admitted == workload else workload
            return admitted
        return self._admit(workload)

    def _admit(self, workload: Workload) -> Workload:
        """The workload whose series pay for `workload` (see cardinality.py)."""
        admitted = self._cap.admit(workload)
        if admitted is workload or admitted == workload:  # itself, or the equal one kept
            return admitted
        if admitted is OVERFLOW:
            if "workload-cap" not in self.parts.log_once:
                self._log_once(
                    "workload-cap",
                    f"{self._cap.max_workloads} workloads have series on this node "
                    '(--workload.max-series): new ones are counted as workload="other" '
                    "(wattprint_workload_overflow_total)",
                )
        elif "workload-label" not in self.parts.log_once:
            longest = max((workload.workload, workload.namespace, workload.pod), key=len)
            self._log_once(
                "workload-label",
                f"a workload label value is {len(longest)} characters long "
                f"({longest[:40]!r}...): exported cut to {self._cap.label_limit}, "
                "ending in a hash of the whole value",
            )
        return admitted

    def _usage(
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
        ticks: dict[tuple[int, int], int] = {}
        for pid, info in table.procs.items():
            key = (pid, info.start_ticks)
            ticks[key] = info.cpu_ticks
            workload = resolve_pid(pid)
            if workload is None or workload in by_cgroup:
                continue
            self._last_seen[workload] = now
            # A process absent from the previous table started since then: all of its
            # CPU time belongs to this interval (short-lived workers must count too).
            baseline = self._prev_ticks.get(key, 0 if self._prev_ticks else info.cpu_ticks)
            used = info.cpu_ticks - baseline
            if used > 0:
                cpu[workload] = cpu.get(workload, 0) + used
            rss[workload] = rss.get(workload, 0) + info.rss_bytes
        self._prev_ticks = ticks
        forget = getattr(self.parts.resolver, "forget_missing", None)
        if forget is not None:
            forget(ticks.keys())  # identities of exited processes are not needed again
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
        first = self._prev_cpu_total is None
        resumed = self._cgroups_resumed
        live = table.live_jobs
        previous = self._prev_cgroup
        workloads = self._job_workloads
        last_seen = self._last_seen
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
                workload = self._admit(workload)
            counted.add(workload)
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
        self._prev_cgroup = usec
        self._cgroups_resumed = False
        if not workloads.keys() <= usec.keys():  # an ended job's, or more
            self._job_workloads = {k: w for k, w in workloads.items() if k in usec}
        return counted


def _ticks(usec: int) -> int:
    return usec * TICKS_PER_S // 1_000_000
