"""The sampler's devices: each one's last reading, raw counter and exported total."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from wattprint.core.model import DeviceReading
from wattprint.durability.document import SavedDevice
from wattprint.durability.gap import placeholder

DeviceKey = tuple[str, str]  # (component, device)


class DeviceLedger:
    """The devices' side of the books: what each counter rose by, and its exported total."""

    def __init__(self) -> None:
        self.readings: dict[DeviceKey, DeviceReading] = {}
        self.total: dict[DeviceKey, int] = {}  # the exported cumulative
        self.read_at: dict[DeviceKey, float] = {}  # monotonic time of each device's read
        self._raw: dict[DeviceKey, int] = {}  # the source's cumulative at the last read

    def account(self, reading: DeviceReading, read_at: float) -> int:
        """Add a device's increase to its exported counter; return the increase."""
        key = reading.key
        previous = self._raw.get(key)
        if previous is None:
            delta = 0  # first sight: the source's cumulative is the baseline
        elif reading.energy_uj >= previous:
            delta = reading.energy_uj - previous
        else:
            delta = reading.energy_uj  # the source itself restarted from 0
        self._raw[key] = reading.energy_uj
        self.total[key] = self.total.get(key, 0) + delta
        self.readings[key] = reading
        self.read_at[key] = read_at
        return delta

    def resume(self, saved: Mapping[DeviceKey, SavedDevice], read: Collection[DeviceKey]) -> None:
        """Go on from the saved totals; a device not read now (a lost GPU) keeps its
        counter until it comes back."""
        for key, device in saved.items():
            self.total[key] = device.total_uj
            if key not in read:
                self.readings[key] = placeholder(device)
                self.read_at[key] = device.read_at

    def saved(self, pending: Mapping[DeviceKey, SavedDevice], now: float) -> list[SavedDevice]:
        """Each device as the state file keeps it; one whose gap is not booked yet as it
        was saved."""
        return [
            pending.get(key)
            or SavedDevice(
                key[0],
                key[1],
                reading.uuid,
                self.total[key],
                reading.raw_uj,
                reading.raw_wrap_uj,
                reading.power_w,
                self.read_at.get(key, now),
                reading.method,
                reading.model,
            )
            for key, reading in self.readings.items()
        ]

    def snapshot(self, read: Collection[DeviceKey]) -> tuple[DeviceReading, ...]:
        # A device its source could not read this time (a lost GPU) keeps its counter,
        # but its last power reading would be a stale claim: it has none.
        return tuple(
            replace(
                self.readings[key],
                energy_uj=self.total[key],
                segments=(),
                power_w=self.readings[key].power_w if key in read else None,
            )
            for key in sorted(self.readings)
        )
