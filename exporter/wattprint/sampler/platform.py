"""The sampler's platform component: where a source reads the node's input energy
(component "node"), the rest of the server is a device of its own, ("platform", "node"),
whose energy each sample is the node's less the components' (attribution/platform.py),
split among the workloads that used the components. Without a node reading, nothing here
does anything and nothing is exported."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from wattprint.attribution.platform import PlatformBook
from wattprint.core.model import CollectorStatus
from wattprint.sampler.devices import DeviceKey, DeviceLedger
from wattprint.sampler.once import LogOnce
from wattprint.sampler.series import SeriesBook

NODE: DeviceKey = ("node", "node")
PLATFORM: DeviceKey = ("platform", "node")
MEASURED = frozenset(("gpu", "cpu", "memory"))


class PlatformAccrual:
    """Closes each sample's platform interval and splits its energy."""

    def __init__(self, devices: DeviceLedger, book: SeriesBook, once: LogOnce) -> None:
        self._devices = devices
        self._book = book
        self._once = once
        self.platform = PlatformBook()
        self._total = 0  # this process's cumulative platform energy (the ledger's source)
        self._closed_at: float | None = None  # monotonic: the last closed interval's end
        self._closed = False  # this sample closed an interval
        self._ok = True

    def close(
        self, deltas: dict[DeviceKey, int], read_at: float, rebased: Collection[DeviceKey] = ()
    ) -> None:
        """Before the restart gaps are booked: this sample's platform energy, into the
        ledger and `deltas` as a device of its own, unless the node's reading is stale."""
        self._closed = False
        node = self._devices.readings.get(NODE)
        if node is None:
            return  # no platform source (or none read yet)
        self._book.tally = {}
        components = sum(d for (c, _), d in deltas.items() if c in MEASURED)
        if NODE in rebased:  # after a gap not bridged: the gap's platform is not known
            self.platform.rebase()
        if self._closed_at is None or NODE in rebased:
            if NODE not in deltas:
                return
            components = 0  # the node's first reading is its baseline: it says nothing yet
        errors = self.platform.errors_total
        rest = self.platform.close(deltas.get(NODE), components)
        self._ok = self.platform.errors_total == errors
        if not self._ok and "platform" not in self._once:
            self._once.warn(
                "platform",
                "platform: the platform energy counts 0 (logged once; counted in "
                'wattprint_collector_errors_total{collector="platform"}): '
                + self.platform.last_error,
            )
        if rest is None:
            return
        self._total += rest
        power = None
        if self._closed_at is not None and read_at > self._closed_at and NODE not in rebased:
            power = rest / 1e6 / (read_at - self._closed_at)
        self._closed_at = read_at
        reading = replace(
            node,
            component="platform",
            energy_uj=self._total,
            power_w=power,
            raw_uj=None,  # derived: a restart's gap is estimated from its last power
            raw_wrap_uj=None,
            max_power_w=None,
        )
        deltas[PLATFORM] = self._devices.account(reading, read_at)
        self._closed = True

    def standing(self, held: Collection[DeviceKey]) -> set[DeviceKey]:
        """Where the node's reading stands (not new, not failed), so does the platform's
        last power: both are served, not dropped between a BMC's refreshes."""
        return {NODE, PLATFORM} & self._devices.readings.keys() if NODE in held else set()

    def attribute(self, deltas: dict[DeviceKey, int], grams_per_uj: float, now: float) -> None:
        """After the components' energy is split: the platform's energy by their parts."""
        used, self._book.tally = self._book.tally, None
        if used is None:
            return
        platform_uj = deltas.get(PLATFORM, 0) if self._closed else None
        parts = self.platform.attribute(platform_uj, used)
        if parts:
            self._book.add("platform", "", parts, grams_per_uj, now)

    def status(self) -> list[CollectorStatus]:
        """collector="platform" where there is a node reading: 0 while it reads below its parts."""
        if NODE not in self._devices.readings:
            return []
        return [CollectorStatus("platform", self._ok, 0.0, self.platform.errors_total)]
