"""The sampler's restarts: whether a restarted exporter may continue from its saved
state (saved.py says what the devices used while it was down), booking that gap, and
writing the state after every sample.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from wattprint.core.model import DeviceReading, Workload
from wattprint.durability.document import (
    DocumentText,
    Restored,
    SavedDevice,
    Unsafe,
    restore,
    saved_devices,
)
from wattprint.durability.gap import gap_energy, placeholder
from wattprint.durability.statefile import StateError

if TYPE_CHECKING:
    from wattprint.sampler.loop import SamplerParts
from wattprint.sampler.series import Accumulator

log = logging.getLogger("wattprint.sampler")

# The state is written after every sample (to the page cache) and flushed to disk this
# often: a process kill loses nothing, a power cut at most this much of the state.
STATE_SYNC_S = 10.0


class RestartMixin:
    """The sampler's restarts: loading the state file, going on from it once the devices
    are read, booking each device's gap, and saving. Sampler owns the fields below."""

    parts: SamplerParts
    _devices: dict[tuple[str, str], DeviceReading]
    _device_total: dict[tuple[str, str], int]
    _read_at: dict[tuple[str, str], float]
    _energy: dict[tuple[str, str, Workload | None], Accumulator]
    _embodied_ug: dict[tuple[str, str], int]
    _embodied_carry: dict[tuple[str, str], float]
    _last_seen: dict[Workload, float]
    _prev_ticks: dict[tuple[int, int], int]
    _prev_cpu_total: int | None
    _prev_cgroup: dict[str, int]
    _cgroups_resumed: bool
    _previous_time: float | None
    _resume: dict[str, Any] | None
    _rebase_from: tuple[float, float] | None  # (saved sample time, its monotonic time)
    _writable: bool
    _read_monotonic: float
    _last_sync: float
    _gap_uj: dict[tuple[str, bool], int]
    _restarts: dict[str, int]
    _state_errors: dict[str, int]
    _holders: tuple[tuple[Workload, str, str], ...]
    _pending: dict[tuple[str, str], SavedDevice]
    _held_before: dict[str, set[Workload]]
    _document: DocumentText

    def _count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1

    def _fresh(self, message: str, error: str = "") -> None:
        log.warning("%s; energy counters start again from 0", message)
        self._count(self._restarts, "fresh")
        if error:
            self._count(self._state_errors, error)

    def _load_state(self) -> None:
        state = self.parts.state
        if state is None:
            return
        try:
            data = state.load()
        except StateError as err:
            if err.reason == "foreign":
                self._writable = False  # someone else's file: never overwrite it
            self._fresh(str(err), err.reason)
            return
        if data is None:
            return
        if not self.parts.boot_id:
            self._fresh(f"not resuming from state file {state.path}: this boot's id is unknown")
            return
        if data.get("boot_id") != self.parts.boot_id:
            # Raw counters restart with the machine: a saved position means nothing.
            self._fresh(f"state file {state.path} is from another boot")
            return
        sources = data.get("sources")
        for source in self.parts.sources:
            saved = sources.get(source.name) if isinstance(sources, dict) else None
            if isinstance(saved, dict) and hasattr(source, "restore_state"):
                source.restore_state(saved)
        self._resume = data

    def _apply_resume(self, deltas: dict[tuple[str, str], int]) -> None:
        """Continue from the saved state if that is safe: counters go on from their
        saved values, and each device's gap is booked once it is read (now, or when a
        device unreadable at the restart comes back)."""
        data, self._resume = self._resume, None
        assert data is not None and self.parts.state is not None
        path = self.parts.state.path
        try:
            saved = saved_devices(data)
            for key, device in saved.items():
                if key in deltas:  # the ones read now must be safe to go on from
                    gap_energy(device, self._devices[key], self._read_at[key] - device.read_at)
            restored = restore(data)
        except Unsafe as err:
            self._fresh(f"not resuming from state file {path}: {err}")
            return
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            self._fresh(f"state file {path} is malformed ({err})", "corrupt")
            return
        self._energy = {
            key: Accumulator(born, energy, grams, resumed=True)
            for key, (energy, grams, born) in restored.energy.items()
        }
        for series, ug in restored.embodied.items():
            acc = self._energy.get(series)
            if acc is None:
                acc = self._energy[series] = Accumulator(restored.time, resumed=True)
            acc.embodied_ug = ug
        self._embodied_ug = {k: ug for k, (ug, _) in restored.embodied_devices.items()}
        self._embodied_carry = {k: carry for k, (_, carry) in restored.embodied_devices.items()}
        self._last_seen = dict(restored.last_seen)
        self._prev_ticks = dict(restored.ticks)
        self._prev_cpu_total = restored.cpu_total
        self._prev_cgroup = dict(restored.cgroups)
        self._cgroups_resumed = True
        self._previous_time = restored.time
        self._rebase_from = (restored.time, float(data["monotonic"]))
        self._gap_uj = dict(restored.gap)
        self._restarts = dict(restored.restarts)
        self._state_errors = dict(restored.state_errors)
        self._held_before = restored.holders
        for key, device in saved.items():
            self._device_total[key] = device.total_uj
            self._pending[key] = device
            if key not in deltas:
                # Unreadable now (a lost GPU): it keeps its counter until it comes back.
                self._devices[key] = placeholder(device)
                self._read_at[key] = device.read_at
        self._count(self._restarts, "resumed")
        log.info(
            "resumed from state file %s, saved %.1f s ago",
            path,
            self._read_monotonic - float(data["monotonic"]),
        )

    def _rebase(self, now: float) -> None:
        """Carry the saved times into this process's: sampler time is the wall clock
        at start plus monotonic time since, so a wall clock moved while the exporter was
        down (or stepped when it started) would otherwise age every series at once, and
        a workload expired in the very sample that booked its gap would take that energy
        with it. The monotonic clock spans the restart (same boot) and says how long ago
        the saved sample really was."""
        assert self._rebase_from is not None
        saved_time, saved_monotonic = self._rebase_from
        self._rebase_from = None
        shift = now - (self._read_monotonic - saved_monotonic) - saved_time
        if abs(shift) < 1.0:
            return  # clock reads a little apart: nothing to carry
        log.info("the saved state's times move by %+.1f s into this run's clock", shift)
        if self._previous_time is not None:
            self._previous_time += shift
        for acc in self._energy.values():
            acc.born += shift
        self._last_seen = {workload: seen + shift for workload, seen in self._last_seen.items()}

    def _book_gaps(self, deltas: dict[tuple[str, str], int]) -> set[str]:
        """Book what each device resumed from used while the exporter was down; return
        the GPUs whose reading this time is that gap."""
        gpus = set()
        for key in [k for k in self._pending if k in deltas]:
            saved = self._pending.pop(key)
            where = " ".join(key).strip()
            try:
                gap = gap_energy(saved, self._devices[key], self._read_at[key] - saved.read_at)
            except Unsafe as err:
                # Only a device unreadable at the restart gets here: the others were
                # checked then. Its counter goes on; the gap is unknown and said so.
                log.warning(
                    "%s: the energy it used while the exporter was down is unknown (%s)", where, err
                )
                self._count(self._state_errors, "gap_unknown")
                continue
            self._device_total[key] += gap.energy_uj
            deltas[key] = gap.energy_uj
            gap_key = (key[0], gap.estimated)
            self._gap_uj[gap_key] = self._gap_uj.get(gap_key, 0) + gap.energy_uj
            log.info(
                "%s used %.1f J while the exporter was down%s",
                where,
                gap.energy_uj / 1e6,
                " (estimated)" if gap.estimated else "",
            )
            if key[0] == "gpu":
                gpus.add(key[1])
        return gpus

    def _save_state(self, sync: bool = False) -> None:
        state = self.parts.state
        if state is None or not self._writable:
            return
        sync = sync or self._read_monotonic - self._last_sync >= STATE_SYNC_S
        saved = self._document.encode(
            Restored(
                energy={k: (a.energy_uj, a.grams, a.born) for k, a in self._energy.items()},
                last_seen=self._last_seen,
                holders={},
                ticks=self._prev_ticks,
                cpu_total=self._prev_cpu_total,
                time=self._previous_time or 0.0,
                gap=self._gap_uj,
                restarts=self._restarts,
                state_errors=self._state_errors,
                embodied={k: a.embodied_ug for k, a in self._energy.items() if a.embodied_ug},
                embodied_devices={
                    k: (ug, self._embodied_carry.get(k, 0.0)) for k, ug in self._embodied_ug.items()
                },
                cgroups=self._prev_cgroup,
            ),
            devices=[
                self._pending.get(key)
                or SavedDevice(
                    key[0],
                    key[1],
                    reading.uuid,
                    self._device_total[key],
                    reading.raw_uj,
                    reading.raw_wrap_uj,
                    reading.power_w,
                    self._read_at.get(key, self._read_monotonic),
                    reading.method,
                    reading.model,
                )
                for key, reading in self._devices.items()
            ],
            held=self._holders,
            boot_id=self.parts.boot_id,
            monotonic=self._read_monotonic,
            sources={
                source.name: source.save_state()
                for source in self.parts.sources
                if hasattr(source, "save_state")
            },
        )
        try:
            state.save(saved, sync=sync)
        except OSError as err:
            self._count(self._state_errors, "write")
            self._log_once("state", f"cannot write state file {state.path}: {err}")
            return
        self.parts.log_once.pop("state", None)
        if sync:
            self._last_sync = self._read_monotonic

    def _log_once(self, key: str, message: str) -> None:
        if self.parts.log_once.get(key) != message:
            log.warning("%s", message)
            self.parts.log_once[key] = message
