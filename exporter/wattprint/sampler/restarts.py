"""The sampler's restarts: whether a restarted exporter may continue from its saved
state (durability/gap.py says what the devices used while it was down), booking that
gap, and writing the state after every sample.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from wattprint.core.model import Source, Workload
from wattprint.durability.document import (
    DocumentText,
    Restored,
    SavedDevice,
    Unsafe,
    check_consistent,
    finite,
    restore,
    saved_devices,
)
from wattprint.durability.gap import gap_energy
from wattprint.durability.statefile import StateError, StateErrorReason, StateFile
from wattprint.sampler.devices import DeviceKey, DeviceLedger
from wattprint.sampler.embodied import EmbodiedAccrual
from wattprint.sampler.once import LogOnce
from wattprint.sampler.series import SeriesBook
from wattprint.sampler.usage import UsageTracker

log = logging.getLogger("wattprint.sampler")

# The state is written after every sample (to the page cache) and flushed to disk this
# often: a process kill loses nothing, a power cut at most this much of the state.
STATE_SYNC_S = 10.0

# While the state cannot be saved, what is served holds still: a restart resumes from
# the last save, and a counter served above it would go down then.
_HELD = "counters served as of the last save until one succeeds"


@runtime_checkable
class Resumable(Protocol):
    """A source with state of its own to carry across restarts (the replay's position)."""

    name: str

    def save_state(self) -> dict[str, object]: ...
    def restore_state(self, data: dict[str, object]) -> None: ...


class Restarts:
    """Loads the state file, goes on from it once the devices are read, books each
    device's gap, and saves; each part of the sampler restores its own share."""

    def __init__(
        self,
        state: StateFile | None,
        boot_id: str,
        sources: Sequence[Source],
        parts: tuple[DeviceLedger, SeriesBook, UsageTracker, EmbodiedAccrual],
        once: LogOnce,
    ) -> None:
        self.state = state  # None: nothing survives a restart
        self.gap_uj: dict[tuple[str, bool], int] = {}  # (component, estimated) -> booked
        self.restarts: dict[str, int] = {}  # resumed | fresh -> count
        self.state_errors: dict[str, int] = {}  # reason -> count
        self.held_before: dict[str, set[Workload]] = {}  # GPU -> its holders at the save
        self._boot_id = boot_id  # raw counters compare only within one boot
        self._resumable = [s for s in sources if isinstance(s, Resumable)]
        self._devices, self._book, self._usage, self._embodied = parts
        self._once = once
        self._writable = state is not None
        self.resumed = False  # went on from the state file, in this process
        self._resume: dict[str, Any] | None = None  # loaded, waiting for the first reads
        self._rebase_from: tuple[float, float] | None = None  # (saved time, its monotonic)
        self._pending: dict[DeviceKey, SavedDevice] = {}  # gaps not yet booked
        # A modelled device saved before its first power reading (killed in its first
        # sample) and read once since: when that read was. Its gap waits for the
        # model's power, the next sample.
        self._awaiting_power: dict[DeviceKey, float] = {}
        self._last_sync = -math.inf
        self._document = DocumentText()  # the state file's text, row by row

    @property
    def writes(self) -> bool:
        """Whether a save writes a file (else a restart starts from 0 anyway)."""
        return self.state is not None and self._writable

    def _count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1

    def _error(self, reason: StateErrorReason) -> None:
        self._count(self.state_errors, reason)

    def _fresh(self, message: str, error: StateErrorReason | None = None) -> None:
        log.warning("%s; energy counters start again from 0", message)
        self._count(self.restarts, "fresh")
        if error is not None:
            self._error(error)

    def load(self) -> None:
        """Read the state file; what it holds is applied once the devices are read."""
        state = self.state
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
        if not self._boot_id:
            self._fresh(f"not resuming from state file {state.path}: this boot's id is unknown")
            return
        if not data.get("boot_id"):
            self._fresh(f"state file {state.path} has no boot id", "corrupt")
            return
        if data.get("boot_id") != self._boot_id:
            # Raw counters restart with the machine: a saved position means nothing.
            self._fresh(f"state file {state.path} is from another boot")
            return
        sources = data.get("sources")
        for source in self._resumable:
            saved = sources.get(source.name) if isinstance(sources, dict) else None
            if isinstance(saved, dict):
                try:
                    source.restore_state(saved)
                except (KeyError, TypeError, ValueError, AttributeError) as err:
                    self._fresh(f"state file {state.path} is malformed ({err})", "corrupt")
                    return
        self._resume = data

    def resume(self, deltas: dict[DeviceKey, int], read_monotonic: float) -> set[str]:
        """Go on from the loaded state if it is safe, and book the gaps of the devices
        read now; return the GPUs whose reading this time is such a gap."""
        if self._resume is not None:
            self._apply(deltas, read_monotonic)
        return self._book_gaps(deltas) if self._pending else set()

    def _apply(self, deltas: dict[DeviceKey, int], read_monotonic: float) -> None:
        """Continue from the saved state if that is safe: counters go on from their
        saved values, and each device's gap is booked once it is read (now, or when a
        device unreadable at the restart comes back)."""
        data, self._resume = self._resume, None
        assert data is not None and self.state is not None
        path = self.state.path
        devices = self._devices
        try:
            saved = saved_devices(data)
            for key, device in saved.items():
                if key in deltas:  # the ones read now must be safe to go on from
                    gap_energy(device, devices.readings[key], devices.read_at[key] - device.read_at)
            restored = restore(data)
            check_consistent(saved, restored)
            saved_monotonic = finite(data["monotonic"])
            if saved_monotonic > read_monotonic:
                raise Unsafe("it was saved later than now by the monotonic clock")
        except Unsafe as err:
            self._fresh(f"not resuming from state file {path}: {err}")
            return
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            self._fresh(f"state file {path} is malformed ({err})", "corrupt")
            return
        self._book.restore(restored)
        self._usage.restore(restored)
        self._embodied.restore(restored)
        devices.resume(saved, deltas.keys())
        self._rebase_from = (restored.time, saved_monotonic)
        self.gap_uj = dict(restored.gap)
        self.restarts = dict(restored.restarts)
        self.state_errors = dict(restored.state_errors)
        self.held_before = restored.holders
        self._pending.update(saved)
        self._count(self.restarts, "resumed")
        self.resumed = True
        log.info(
            "resumed from state file %s, saved %.1f s ago",
            path,
            read_monotonic - saved_monotonic,
        )

    def rebase(self, now: float, read_monotonic: float) -> None:
        """Carry the saved times into this process's: sampler time is the wall clock
        at start plus monotonic time since, so a wall clock moved while the exporter was
        down (or stepped when it started) would otherwise age every series at once, and
        a workload expired in the very sample that booked its gap would take that energy
        with it. The monotonic clock spans the restart (same boot) and says how long ago
        the saved sample really was."""
        if self._rebase_from is None:
            return
        saved_time, saved_monotonic = self._rebase_from
        self._rebase_from = None
        shift = now - (read_monotonic - saved_monotonic) - saved_time
        if abs(shift) < 1.0:
            return  # clock reads a little apart: nothing to carry
        log.info("the saved state's times move by %+.1f s into this run's clock", shift)
        self._book.shift(shift)

    def _book_gaps(self, deltas: dict[DeviceKey, int]) -> set[str]:
        """Book what each device resumed from used while the exporter was down; return
        the GPUs whose reading this time is that gap."""
        devices = self._devices
        gpus = set()
        for key in [k for k in self._pending if k in deltas]:
            saved = self._pending[key]
            reading = devices.readings[key]
            if saved.raw_uj is None and saved.power_w is None and reading.power_w is None:
                self._awaiting_power.setdefault(key, devices.read_at[key])
                continue
            del self._pending[key]
            where = " ".join(key).strip()
            until = self._awaiting_power.pop(key, devices.read_at[key])
            try:
                gap = gap_energy(saved, reading, until - saved.read_at)
            except Unsafe as err:
                # Only a device unreadable at the restart gets here: the others were
                # checked then. Its counter goes on; the gap is unknown and said so.
                log.warning(
                    "%s: the energy it used while the exporter was down is unknown (%s)", where, err
                )
                self._error("gap_unknown")
                continue
            devices.total[key] += gap.energy_uj
            deltas[key] += gap.energy_uj  # (0 but where the gap waited for a power)
            gap_key = (key[0], gap.estimated)
            self.gap_uj[gap_key] = self.gap_uj.get(gap_key, 0) + gap.energy_uj
            log.info(
                "%s used %.1f J while the exporter was down%s",
                where,
                gap.energy_uj / 1e6,
                " (estimated)" if gap.estimated else "",
            )
            if key[0] == "gpu":
                gpus.add(key[1])
        return gpus

    def save(
        self,
        read_monotonic: float,
        holders: tuple[tuple[Workload, str, str], ...],
        sync: bool = False,
    ) -> bool:
        """Write the state (flushed to disk every STATE_SYNC_S, or when asked); True
        where a restart goes on from what was just sampled, or keeps nothing of it."""
        state = self.state
        if state is None or not self._writable:
            return True  # a restart starts from 0: a reset, never a decrease
        sync = sync or read_monotonic - self._last_sync >= STATE_SYNC_S
        book, usage, embodied = self._book, self._usage, self._embodied
        saved = self._document.encode(
            Restored(
                energy={k: (a.energy_uj, a.grams, a.born) for k, a in book.energy.items()},
                last_seen=book.last_seen,
                holders={},
                ticks=usage.prev_ticks,
                cpu_total=usage.prev_cpu_total,
                time=book.previous_time or 0.0,
                gap=self.gap_uj,
                restarts=self.restarts,
                state_errors=self.state_errors,
                embodied={k: a.embodied_ug for k, a in book.energy.items() if a.embodied_ug},
                embodied_devices={
                    k: (ug, embodied.carry.get(k, 0.0)) for k, ug in embodied.ug.items()
                },
                cgroups=usage.prev_cgroup,
            ),
            devices=self._devices.saved(self._pending, read_monotonic),
            held=holders,
            boot_id=self._boot_id,
            monotonic=read_monotonic,
            sources={source.name: source.save_state() for source in self._resumable},
        )
        try:
            state.save(saved, sync=sync)
        except OSError as err:
            self._error("write")
            self._once.warn("state", f"cannot write state file {state.path}: {err}; {_HELD}")
            return False
        except StateError as err:
            self._error(err.reason)
            self._once.warn("state", f"cannot write state file {state.path}: {err}; {_HELD}")
            return False
        self._once.clear("state")
        if sync:
            self._last_sync = read_monotonic
        return True
