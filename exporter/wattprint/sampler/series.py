"""The sampler's series: one running total per (component, gpu, workload)."""

from __future__ import annotations

from dataclasses import dataclass

from wattprint.attribution.split import Parts, merge
from wattprint.core.model import EnergySeries, Workload
from wattprint.durability.document import Restored

SeriesKey = tuple[str, str, Workload | None]

# series() makes each EnergySeries by tuple.__new__ from these, in this order: a field
# added to EnergySeries must be added there too (tuple.__new__ fills in no default).
assert EnergySeries._fields == (
    *("component", "gpu", "workload"),  # the series' key
    *("energy_uj", "grams", "born", "resumed", "embodied_ug"),  # its Accumulator's
), "SeriesBook.snapshot no longer makes EnergySeries with all of its fields"


@dataclass(slots=True)
class Accumulator:
    """One series' running totals in the sampler."""

    born: float
    energy_uj: int = 0
    grams: float = 0.0
    resumed: bool = False
    embodied_ug: int = 0


class SeriesBook:
    """Every series' totals, when each workload was last seen, and the last sample's time."""

    def __init__(self) -> None:
        self.energy: dict[SeriesKey, Accumulator] = {}
        self.last_seen: dict[Workload, float] = {}
        self.previous_time: float | None = None  # the last sample's; None before the first
        # Each workload's energy added this sample, over all components, while the
        # platform wants it (sampler/platform.py); None: not kept.
        self.tally: Parts | None = None
        self._keys: frozenset[SeriesKey] = frozenset()
        self._order: list[SeriesKey] = []

    def series(
        self, component: str, gpu: str, workload: Workload | None, now: float
    ) -> Accumulator:
        """The series that is paid now (energy or embodied), created if new, and its
        workload seen now."""
        key = (component, gpu, workload)
        acc = self.energy.get(key)
        if acc is None:
            # What is added now was drawn after the previous sample, so the series' true
            # zero is at that sample's time.
            born = now if self.previous_time is None else self.previous_time
            acc = self.energy[key] = Accumulator(born)
        if workload is not None:
            # A workload paid only through replay segments (it held a GPU between two
            # reads) is in no process list: without this its series would never expire.
            self.last_seen[workload] = now
        return acc

    def add(self, component: str, gpu: str, parts: Parts, grams_per_uj: float, now: float) -> None:
        tally = self.tally
        if tally is not None:
            merge(tally, parts)
        for workload, energy in parts.items():
            acc = self.series(component, gpu, workload, now)
            acc.energy_uj += energy
            acc.grams += energy * grams_per_uj

    def add_embodied(self, component: str, gpu: str, parts: Parts, now: float) -> None:
        for workload, ug in parts.items():
            self.series(component, gpu, workload, now).embodied_ug += ug

    def expire(self, now: float, retention: float) -> None:
        """Forget the workloads not seen for `retention` seconds, and their series."""
        gone = {w for w, seen in self.last_seen.items() if now - seen > retention}
        if not gone:
            return
        for workload in gone:
            del self.last_seen[workload]
        for key in [k for k in self.energy if k[2] in gone]:
            del self.energy[key]

    def snapshot(self) -> tuple[tuple[EnergySeries, ...], frozenset[SeriesKey]]:
        """Every series in a stable order, and the set of their keys (the same object
        while no series comes or goes, so a scrape tells in one comparison that none is
        new)."""
        keys = self.energy.keys()
        if keys != self._keys:  # sorted again only when a series comes or goes
            self._keys = frozenset(keys)
            self._order = sorted(keys, key=repr)
        # One per series and sample, hundreds on a node of a hundred jobs: made by
        # tuple.__new__, without the named tuple's own __new__ (a Python call), from the
        # key and the accumulator's numbers in field order (asserted above).
        energy, new = self.energy, tuple.__new__
        series = tuple(
            new(
                EnergySeries,
                (*key, acc.energy_uj, acc.grams, acc.born, acc.resumed, acc.embodied_ug),
            )
            for key in self._order
            for acc in (energy[key],)
        )
        return series, self._keys

    def restore(self, restored: Restored) -> None:
        """Go on from a state file's series: each continues, marked resumed."""
        self.energy = {
            key: Accumulator(born, energy, grams, resumed=True)
            for key, (energy, grams, born) in restored.energy.items()
        }
        for key, ug in restored.embodied.items():
            acc = self.energy.get(key)
            if acc is None:
                acc = self.energy[key] = Accumulator(restored.time, resumed=True)
            acc.embodied_ug = ug
        self.last_seen = dict(restored.last_seen)
        self.previous_time = restored.time

    def shift(self, seconds: float) -> None:
        """Move every saved time by `seconds` (a state file's times into this run's clock)."""
        if self.previous_time is not None:
            self.previous_time += seconds
        for acc in self.energy.values():
            acc.born += seconds
        self.last_seen = {workload: seen + seconds for workload, seen in self.last_seen.items()}
