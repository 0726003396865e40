"""Bounded cardinality: how many workloads a node exports, and how long their labels are.

Every workload gets series of its own (energy and emissions per component and GPU, and
one info series per GPU it holds), kept for --workload.retention after its last process.
Any process can name its own workload (WATTPRINT_WORKLOAD), so without a bound one
tenant starting thousands of processes with random names makes thousands of series on
every Prometheus that scrapes the node, for ten minutes each.

WorkloadCap gives at most `max_workloads` workloads series of their own. Beyond that,
a new workload is counted as OVERFLOW (workload="other"): its energy is still split
and conserved exactly, only under that one name. The decision is made once per
workload and holds for its whole life:
- a workload that has series keeps them, however many others come;
- a workload that went to "other" stays there while it is seen, even when room frees
  up, so that its own series, if any, never start in the middle of its life and
  understate it; once it has been gone for a whole retention period it is forgotten,
  and if it comes back it is new again;
- a slot frees up when an admitted workload's series expire (retention), and the next
  new workload gets it;
- a workload a tracker or `wattprint run` registered (it asked to be measured) gets
  series of its own over a full cap, up to twice the cap, and leaves "other" if it was
  there: a job name run every few minutes is counted every time. Any local user can
  register, so each user (the registration's owner) may lift at most 1/REGISTERED_SHARE
  of the cap (at least one) over it at a time: one user's names never take the room the
  others' registered jobs need.

Label values longer than MAX_LABEL_LENGTH characters are cut, and end in a hash of the
whole value so that two long names sharing a prefix stay two workloads.

Pure: no I/O. The sampler logs and exports what it counts.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable

from wattprint.core.model import DEFAULT_MAX_WORKLOADS, CapStatus, Workload

# Kubernetes names and label values are at most 63 characters (pod names 253, rarely
# over 100 in practice); Slurm job ids are short. Only self-declared names reach this.
MAX_LABEL_LENGTH = 128
HASH_CHARS = 8
# The overflow workload. Its scheduler is one no resolver produces, so a workload a user
# named "other" (scheduler "env") keeps its own series.
OVERFLOW = Workload(scheduler="overflow", workload="other")
# Workloads remembered as overflowed at most (least recently seen forgotten first): a
# flood of new names must not grow memory without end either.
MAX_REMEMBERED = 65536
# A user's registered workloads over a full cap: at most this fraction of the cap.
REGISTERED_SHARE = 16


def bound_label(value: str, limit: int = MAX_LABEL_LENGTH) -> str:
    """value, or, if longer than limit characters, its start, "~" and a hash of all of it
    (limit characters in all)."""
    if len(value) <= limit:
        return value
    import hashlib  # only for an overlong value; its import (OpenSSL) costs start-up time

    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    return f"{value[: limit - HASH_CHARS - 1]}~{digest}"


def bound_workload(workload: Workload, limit: int = MAX_LABEL_LENGTH) -> Workload:
    """workload, or a copy with its long label values cut (the same one each time)."""
    if max(len(workload.workload), len(workload.namespace), len(workload.pod)) <= limit:
        return workload
    return _bound_long(workload, limit)


# The resolver hands out the same Workload for a process every sample: hash it once.
@functools.lru_cache(maxsize=4096)
def _bound_long(workload: Workload, limit: int) -> Workload:
    return workload._replace(
        workload=bound_label(workload.workload, limit),
        namespace=bound_label(workload.namespace, limit),
        pod=bound_label(workload.pod, limit),
    )


class WorkloadCap:
    """Decides, per workload, whether it gets series of its own or goes to OVERFLOW.

    Call begin() once per sample, before resolving, with the workloads that have series
    now (the sampler's live workloads: they lose theirs only by expiring) and the time
    of the sample before; then admit() for every resolved workload.
    """

    def __init__(
        self,
        max_workloads: int = DEFAULT_MAX_WORKLOADS,
        retention: float = 600.0,
        label_limit: int = MAX_LABEL_LENGTH,
        remember: int = MAX_REMEMBERED,
    ) -> None:
        self.max_workloads = max_workloads
        self.retention = retention
        self.label_limit = label_limit
        self.remember = remember
        # Each admitted workload keyed by itself: admit() hands out the object the
        # sampler's series are keyed by (one restored from the state file is another
        # object than the resolver's), so their lookups compare by identity.
        self._admitted: dict[Workload, Workload] = {}
        # Overflowed workload -> time of the last sample that saw it, oldest first.
        self._overflowed: OrderedDict[Workload, float] = OrderedDict()
        self._seen: set[Workload] = set()  # overflowed workloads seen in this sample
        self._last_time = 0.0
        self.overflowed_total = 0
        self.registered_over_total = 0  # registered workloads admitted over a full cap
        self._lifted: dict[Workload, int] = {}  # admitted over a full cap -> the user's

    def begin(self, live: Iterable[Workload], previous_time: float | None) -> None:
        """Start a sample. live: the workloads that have series now; previous_time: the
        time of the sample before (None before the first)."""
        self._admitted = {w: w for w in live}
        self._admitted.pop(OVERFLOW, None)
        self._lifted = {w: uid for w, uid in self._lifted.items() if w in self._admitted}
        if previous_time is None:
            return
        # The previous sample saw these; only now is its time known. The sampler's own
        # expiry works the same way: on sample times, once a sample is complete.
        self._last_time = previous_time
        for workload in self._seen:
            if workload in self._overflowed:
                self._overflowed[workload] = previous_time
                self._overflowed.move_to_end(workload)
        self._seen.clear()
        while self._overflowed:
            workload, seen = next(iter(self._overflowed.items()))
            if previous_time - seen <= self.retention:
                break
            del self._overflowed[workload]

    def admit(
        self, workload: Workload, registrants: Callable[[Workload], Collection[int]] | None = None
    ) -> Workload:
        """The workload whose series pay for `workload`: itself (labels bounded), or
        OVERFLOW. One that users registered (`registrants`: their uids; a tracker or
        `wattprint run` asked for it to be measured) gets series of its own over a full
        cap too, up to twice the cap and within one of those users' share, and leaves
        "other" where it went there before."""
        admitted = self._admitted.get(workload)
        if admitted is not None:  # the common case, every sample: its own bound
            return admitted
        bounded = bound_workload(workload, self.label_limit)
        admitted = self._admitted.get(bounded)
        if admitted is not None:
            return admitted
        if bounded == OVERFLOW:
            return bounded
        full = len(self._admitted) >= self.max_workloads
        if (
            (full or bounded in self._overflowed)
            and registrants is not None
            and len(self._admitted) < 2 * self.max_workloads
            and (payer := self._payer(registrants(workload), full)) is not None
        ):
            if bounded in self._overflowed:  # a name run again: not stuck in "other"
                del self._overflowed[bounded]
                self._seen.discard(bounded)
            if full:
                self.registered_over_total += 1
                self._lifted[bounded] = payer
            self._admitted[bounded] = bounded
            return bounded
        if bounded in self._overflowed:
            self._seen.add(bounded)
            return OVERFLOW
        if len(self._admitted) < self.max_workloads:
            self._admitted[bounded] = bounded
            return bounded
        self.overflowed_total += 1
        self._overflowed[bounded] = self._last_time
        self._seen.add(bounded)
        while len(self._overflowed) > self.remember:
            self._overflowed.popitem(last=False)
        return OVERFLOW

    def _payer(self, users: Collection[int], full: bool) -> int | None:
        """Of the users who registered a workload, the one whose share lifts it over a
        full cap (any of them below a full one); None: none may."""
        if not full:
            return min(users, default=None)
        share = max(1, self.max_workloads // REGISTERED_SHARE)
        lifted = list(self._lifted.values())
        return next((uid for uid in sorted(users) if lifted.count(uid) < share), None)

    def status(self, live: Collection[Workload]) -> CapStatus:
        workloads = len(live) - (OVERFLOW in live)
        return CapStatus(
            self.max_workloads, workloads, self.overflowed_total, self.registered_over_total
        )
