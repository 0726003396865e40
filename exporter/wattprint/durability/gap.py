"""What a state file vouches for: the energy a device used while the exporter was down."""

from __future__ import annotations

from dataclasses import dataclass

from wattprint.core.model import DeviceReading, fields_from
from wattprint.durability.document import SavedDevice, Unsafe
from wattprint.sources.counters import CEILING_MARGIN


@dataclass(frozen=True)
class Gap:
    """What a device used while the exporter was down, and whether that is an estimate."""

    energy_uj: int
    estimated: bool


def gap_energy(saved: SavedDevice, now: DeviceReading, elapsed_s: float) -> Gap:
    """What the device used between the save and `now`; Unsafe if it cannot be told."""
    where = f"{saved.component} {saved.device}".strip()
    if saved.uuid and now.uuid and saved.uuid != now.uuid:
        raise Unsafe(f"{where} was {saved.uuid} and is now {now.uuid}")
    if elapsed_s < 0:
        raise Unsafe("the monotonic clock went back since the state was saved")
    power = saved.power_w if saved.power_w is not None else now.power_w
    estimate = round(max(power or 0.0, 0.0) * elapsed_s * 1e6)
    if saved.raw_uj is None or now.raw_uj is None:
        return Gap(estimate, estimated=True)
    delta = now.raw_uj - saved.raw_uj
    wrap = now.raw_wrap_uj or saved.raw_wrap_uj
    if delta < 0:
        if not wrap:
            raise Unsafe(f"{where}: its energy counter is behind the saved one (driver reloaded?)")
        delta += wrap
    ceiling = now.max_power_w
    if ceiling is not None and delta > ceiling * max(elapsed_s, 1.0) * CEILING_MARGIN * 1e6:
        raise Unsafe(f"{where}: its energy counter rose more than the device can draw")
    if wrap and ceiling is not None and ceiling * elapsed_s * 1e6 >= wrap:
        # It may have wrapped several times: take the count of wraps that brings the
        # known remainder closest to the power before the gap.
        wraps = max(round((estimate - delta) / wrap), 0)
        return Gap(delta + wraps * wrap, estimated=True)
    return Gap(delta, estimated=False)


def placeholder(saved: SavedDevice) -> DeviceReading:
    """A device saved but not readable since the restart: its counter, no power."""
    return fields_from(DeviceReading, saved, energy_uj=0, power_w=None)
