"""Who a process works for: a Kubernetes pod's job, a Slurm job, or a declared name.

Resolvers are tried in order: kubernetes (cgroup -> pod UID -> pod list), slurm (job
cgroup, else SLURM_JOB_ID), env (the first configured variable in the process's
environment, else in its nearest ancestor's). A process none of them claims is
unattributed.

Results are cached per (pid, start time): a PID the kernel hands to a new process
gets a fresh lookup, never the old process's identity. A process in a pod the pod list
does not know yet stays unattributed and is looked up again at every call (a
dictionary lookup, no file read) until its pod appears. A process nobody claims is
checked again when it runs another program: exec() gives it a new environment, and
comes after the cgroup moves that make a job's processes (slurmstepd moves a task into
the job's cgroup after fork, then execs it). exec() sets a new name and a new stack
start in its stat (the sampler's process table: ProcInfo.program), so a change there
says so at no read of its own; a rename without an exec (prctl, setproctitle) costs
one needless read. Only without a table, or to catch a move without an exec, is it
read again after a while (recheck_s, 10 minutes unless told).
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TypeVar

from wattprint.core.model import Workload
from wattprint.host.identity import slurm
from wattprint.host.identity.cgroup import JobCgroup, cgroup_paths, kubernetes_pod
from wattprint.host.identity.env import first_value, read_environ
from wattprint.host.identity.kubernetes import DEFAULT_JOB_LABELS, KubernetesPods
from wattprint.host.procfs import ProcInfo, ProcTable, read_proc

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_JOB_LABELS", "RECHECK_S", "IdentityResolver", "KubernetesPods"]

ENV_SCHEDULER = "env"
DEFAULT_ENV_VARS = ("WATTPRINT_WORKLOAD",)
# An unclaimed process that kept its name is read again this often (see the docstring).
RECHECK_S = 600.0
# Deeper process trees than this are loops or pathological; stop climbing.
_MAX_ANCESTORS = 64

V = TypeVar("V")


@dataclass(slots=True)
class _Entry:
    workload: Workload | None
    pod_uid: str | None = None  # set while the pod is not in the pod list yet
    recheck_at: float = 0.0  # for unclaimed processes: when to read their files again
    program: tuple[bytes, int] | None = None  # ProcInfo.program when read (None: unknown)


class IdentityResolver:
    """Tells who a process works for (pod, Slurm job, declared name), cached per process."""

    def __init__(
        self,
        procfs_root: str = "/proc",
        env_vars: Sequence[str] = DEFAULT_ENV_VARS,
        kubernetes: KubernetesPods | None = None,
        cache_size: int = 65536,
        recheck_s: float = RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.procfs_root = procfs_root
        self.env_vars = tuple(env_vars)
        self.kubernetes = kubernetes
        self.cache_size = cache_size
        self.recheck_s = recheck_s
        self._clock = clock
        self._cache: OrderedDict[tuple[int, int], _Entry] = OrderedDict()
        # Each process's own value of env_vars, so that descendants climbing the tree
        # read an ancestor's environment once.
        self._env: OrderedDict[tuple[int, int], str | None] = OrderedDict()
        self.errors_total = 0

    def resolve(
        self, pid: int, start_ticks: int, table: ProcTable | None = None
    ) -> Workload | None:
        """The workload of process (pid, start_ticks), or None (unattributed).

        table, the sampler's latest process table, gives the parent chain for inheriting
        an environment variable; without it parents are read from /proc. Never raises.
        """
        key = (pid, start_ticks)
        entry = self._cache.get(key)
        if entry is not None:
            self._cache.move_to_end(key)
            if entry.workload is not None:
                return entry.workload
            if entry.pod_uid is not None and self.kubernetes is not None:
                entry.workload = self.kubernetes.lookup(entry.pod_uid)
                return entry.workload
            info = table.procs.get(pid) if table is not None else None
            execd = info is not None and entry.program not in (None, info.program)
            if not execd and self._clock() < entry.recheck_at:
                return None
        try:
            entry = self._resolve_files(pid, start_ticks, table)
        except Exception:  # one odd process must not stop the sampler
            self.errors_total += 1
            (log.warning if self.errors_total == 1 else log.debug)(
                "resolving the workload of pid %d failed", pid, exc_info=True
            )
            return None
        if entry is None:
            return None
        self._put(self._cache, key, entry)
        return entry.workload

    def resolve_job(self, job: JobCgroup) -> Workload | None:
        """The workload of a job cgroup's processes: what resolve() says of each of them."""
        if job.scheduler == slurm.SCHEDULER:
            return Workload(scheduler=slurm.SCHEDULER, workload=job.ident)
        if self.kubernetes is None:
            return None
        workload = self.kubernetes.lookup(job.ident)
        if workload is None:
            self.kubernetes.request_refresh(job.ident)
        return workload

    @property
    def cached(self) -> int:
        """Processes whose identity is cached (bounded by cache_size)."""
        return len(self._cache)

    def forget_missing(self, alive: Iterable[tuple[int, int]]) -> None:
        """Drop what is cached for processes not in alive ((pid, start_ticks) pairs)."""
        keep = alive if isinstance(alive, AbstractSet) else set(alive)
        for cache in (self._cache, self._env):
            for key in cache.keys() - keep:  # a set operation: no Python loop over all
                del cache[key]

    def _resolve_files(self, pid: int, start_ticks: int, table: ProcTable | None) -> _Entry | None:
        """Read the process's cgroup (and environment); None if it has gone meanwhile."""
        # Its program before its files: an exec() after this shows next time.
        listed = table.procs.get(pid) if table is not None else None
        try:
            with open(f"{self.procfs_root}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
                paths = cgroup_paths(f.read())
        except (FileNotFoundError, ProcessLookupError):
            return None
        entry = self._from_cgroup(paths)
        own_value: str | None = None
        read_env = entry is None
        if entry is None:
            environ = read_environ(pid, self.procfs_root)
            own_value = first_value(environ, self.env_vars)
            workload = slurm.from_environ(environ)
            if workload is None:
                value = own_value or self._inherited(pid, start_ticks, table)
                if value is not None:
                    workload = Workload(scheduler=ENV_SCHEDULER, workload=value)
            entry = _Entry(workload)
        # The files read may belong to a new process that took over the PID after the
        # caller listed it: their answer must not be cached under the old one's key.
        now = read_proc(pid, self.procfs_root)
        if now is None or now.start_ticks != start_ticks:
            return None
        if read_env:
            self._put(self._env, (pid, start_ticks), own_value)
        if entry.workload is None and entry.pod_uid is None:
            # Spread the rechecks so that processes first seen together are not all read
            # again in the same sample.
            entry.recheck_at = self._clock() + self.recheck_s * (0.5 + random.random())
            entry.program = listed.program if listed is not None else None
        return entry

    def _from_cgroup(self, paths: list[str]) -> _Entry | None:
        if self.kubernetes is not None:
            ref = kubernetes_pod(paths)
            if ref is not None:
                workload = self.kubernetes.lookup(ref.pod_uid)
                if workload is None:
                    self.kubernetes.request_refresh(ref.pod_uid)
                    return _Entry(None, pod_uid=ref.pod_uid)
                return _Entry(workload)
        workload = slurm.from_cgroup(paths)
        return _Entry(workload) if workload is not None else None

    def _inherited(self, pid: int, start_ticks: int, table: ProcTable | None) -> str | None:
        """The env_vars value of the nearest ancestor that has one."""
        seen = {pid}
        child_start = start_ticks
        info = self._proc(pid, table)
        ppid = info.ppid if info is not None else 0
        for _ in range(_MAX_ANCESTORS):
            if ppid <= 0 or ppid in seen:
                return None
            parent = self._proc(ppid, table)
            # A parent younger than its child is a new process that reused the PID.
            if parent is None or parent.start_ticks > child_start:
                return None
            key = (parent.pid, parent.start_ticks)
            if key in self._env:
                value = self._env[key]
                self._env.move_to_end(key)
            else:
                value = first_value(read_environ(parent.pid, self.procfs_root), self.env_vars)
                self._put(self._env, key, value)
            if value is not None:
                return value
            seen.add(ppid)
            child_start = parent.start_ticks
            ppid = parent.ppid
        return None

    def _proc(self, pid: int, table: ProcTable | None) -> ProcInfo | None:
        info = table.procs.get(pid) if table is not None else None
        return info if info is not None else read_proc(pid, self.procfs_root)

    def _put(self, cache: OrderedDict[tuple[int, int], V], key: tuple[int, int], value: V) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > self.cache_size:
            cache.popitem(last=False)
