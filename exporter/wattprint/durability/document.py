"""What a state file vouches for: the devices and counters it saved, parsed and
written, and what each device used while the exporter was down. Pure: no I/O, no clocks.

A device with a hardware counter (NVML, RAPL, a replayed trace) says exactly what it
used in the gap: the counter outlives the exporter. The gap is exact unless a RAPL
counter could have wrapped more than once meanwhile; then, and for devices without a
counter (models, integrated power), it is estimated from the power before the gap.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from wattprint.core.model import Workload
from wattprint.durability.statefile import STATE_FORMAT


class Unsafe(Exception):
    """Resuming would count energy that cannot be vouched for; str() says why."""


@dataclass(frozen=True)
class SavedDevice:
    """One device as the state file saved it: its exported total, raw counter and power."""

    component: str
    device: str
    uuid: str
    total_uj: int  # the exported cumulative when saved
    raw_uj: int | None
    raw_wrap_uj: int | None
    power_w: float | None
    read_at: float  # monotonic time of the read that gave raw_uj
    method: str = ""
    model: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.component, self.device)


def workload_to_json(workload: Workload | None) -> list[str] | None:
    if workload is None:
        return None
    return [workload.scheduler, workload.workload, workload.namespace, workload.pod]


def workload_from_json(raw: Any) -> Workload | None:
    if raw is None:
        return None
    scheduler, workload, namespace, pod = (str(part) for part in raw)
    return _one_workload(scheduler, workload, namespace, pod)


# One object per workload, however many rows name it (its series, when it was last seen,
# the GPUs it held): the sampler's dicts then find each other's keys by identity.
@functools.lru_cache(maxsize=4096)
def _one_workload(scheduler: str, workload: str, namespace: str, pod: str) -> Workload:
    return Workload(scheduler, workload, namespace, pod)


def saved_devices(data: dict[str, Any]) -> dict[tuple[str, str], SavedDevice]:
    """Parse the devices of a state document (TypeError/ValueError/KeyError if bad)."""
    devices = {}
    for raw in data["devices"]:
        device = SavedDevice(
            component=str(raw["component"]),
            device=str(raw["device"]),
            uuid=str(raw.get("uuid") or ""),
            total_uj=count(raw["total_uj"]),
            raw_uj=_optional_count(raw.get("raw_uj")),
            raw_wrap_uj=_optional_count(raw.get("raw_wrap_uj")),
            power_w=None if raw.get("power_w") is None else float(raw["power_w"]),
            read_at=finite(raw["read_at"]),
            method=str(raw.get("method") or ""),
            model=str(raw.get("model") or ""),
        )
        devices[device.key] = device
    return devices


def count(raw: Any) -> int:
    """A non-negative integer from the state document (ValueError otherwise)."""
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ValueError(f"not a count: {raw!r}")
    return raw


def _optional_count(raw: Any) -> int | None:
    return None if raw is None else count(raw)


EnergyKey = tuple[str, str, Workload | None]  # (component, gpu, workload or unattributed)


@dataclass
class Restored:
    """The sampler's accumulated state as the state file carries it."""

    energy: dict[EnergyKey, tuple[int, float, float]]  # (uJ, grams, born)
    last_seen: dict[Workload, float]
    holders: dict[str, set[Workload]]  # GPU index -> who held it at the save
    ticks: dict[tuple[int, int], int]  # (pid, start ticks) -> CPU ticks
    cpu_total: int | None
    time: float  # the last sample's time
    gap: dict[tuple[str, bool], int]  # (component, estimated) -> uJ booked for gaps
    restarts: dict[str, int]
    state_errors: dict[str, int]
    # Embodied micro-grams per series, and per device (accrued total, carried fraction).
    embodied: dict[EnergyKey, int] = field(default_factory=dict)
    embodied_devices: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    # job cgroup (its CPU-time file) -> CPU microseconds: the job cgroups' ticks
    cgroups: dict[str, int] = field(default_factory=dict)


def document(
    state: Restored,
    devices: list[SavedDevice],
    held: tuple[tuple[Workload, str, str], ...],
    boot_id: str,
    monotonic: float,
    sources: dict[str, dict[str, object]],
) -> dict[str, Any]:
    return {
        "format": STATE_FORMAT,
        "boot_id": boot_id,
        "monotonic": monotonic,
        "time": state.time,
        "devices": [
            {
                "component": d.component,
                "device": d.device,
                "uuid": d.uuid,
                "total_uj": d.total_uj,
                "raw_uj": d.raw_uj,
                "raw_wrap_uj": d.raw_wrap_uj,
                "power_w": d.power_w,
                "read_at": d.read_at,
                "method": d.method,
                "model": d.model,
            }
            for d in devices
        ],
        "energy": [
            [component, gpu, workload_to_json(workload), uj, grams, born]
            for (component, gpu, workload), (uj, grams, born) in state.energy.items()
        ],
        "last_seen": [[workload_to_json(w), t] for w, t in state.last_seen.items()],
        "holders": [[workload_to_json(w), gpu, uuid] for w, gpu, uuid in held],
        "ticks": [[pid, start, ticks] for (pid, start), ticks in state.ticks.items()],
        "cpu_total": state.cpu_total,
        "cgroups": [[key, usec] for key, usec in state.cgroups.items()],
        "gap": [[component, estimated, uj] for (component, estimated), uj in state.gap.items()],
        "restarts": state.restarts,
        "state_errors": state.state_errors,
        "embodied": [
            [component, gpu, workload_to_json(workload), ug]
            for (component, gpu, workload), ug in state.embodied.items()
        ],
        "embodied_devices": [
            [component, device, ug, carry]
            for (component, device), (ug, carry) in state.embodied_devices.items()
        ],
        "sources": sources,
    }


class DocumentText:
    """The state document as JSON, as json.dumps(document(...)) with compact separators
    writes it, but for the rows of every series and workload: the sampler saves each
    sample, hundreds of rows on a node of a hundred jobs, and most of their text (a
    series' names and birth, a workload) is the same from one save to the next. It is
    kept and only the numbers that move are written. The rows come after the rest of the
    document: a JSON object's order means nothing."""

    def __init__(self) -> None:
        # A series' row as last written: its birth, the text around its numbers, the
        # numbers and the whole row. An idle job's CPU series keeps its numbers from one
        # save to the next: its row is written again as it was.
        self._rows: dict[EnergyKey, tuple[float, str, str, int, float, str]] = {}
        self._workload: dict[Workload, str] = {}
        self._cgroups: tuple[dict[str, int], str] = ({}, "[]")

    def encode(
        self,
        state: Restored,
        devices: list[SavedDevice],
        held: tuple[tuple[Workload, str, str], ...],
        boot_id: str,
        monotonic: float,
        sources: dict[str, dict[str, object]],
    ) -> bytes:
        rest = document(
            replace(state, energy={}, last_seen={}, cgroups={}),
            devices,
            held,
            boot_id,
            monotonic,
            sources,
        )
        del rest["energy"], rest["last_seen"], rest["cgroups"]
        head = json.dumps(rest, separators=(",", ":"))
        if len(self._rows) > 2 * len(state.energy) + 64:  # series expired meanwhile
            self._rows = {k: v for k, v in self._rows.items() if k in state.energy}
        if len(self._workload) > 2 * len(state.last_seen) + 64:
            self._workload = {w: v for w, v in self._workload.items() if w in state.last_seen}
        energy = []
        rows = self._rows
        inf = math.inf
        for key, (uj, grams, born) in state.energy.items():
            row = rows.get(key)
            if row is None or row[0] != born:
                component, gpu, workload = key
                before = f"[{json.dumps(component)},{json.dumps(gpu)},{self._text(workload)},"
                row = (born, before, f",{_number(born)}]", -1, math.nan, "")
            elif row[3] == uj and row[4] == grams and grams:
                # (NaN is equal to nothing, and 0.0 equal to -0.0: both written again.)
                energy.append(row[5])
                continue
            number = repr(grams) if -inf < grams < inf else _number(grams)
            written = f"{row[1]}{uj},{number}{row[2]}"
            rows[key] = (born, row[1], row[2], uj, grams, written)
            energy.append(written)
        times: dict[float, str] = {}  # most were seen at the same sample
        seen = []
        known = self._workload
        for workload, t in state.last_seen.items():
            text = times.get(t)
            if text is None:
                text = times[t] = _number(t)
            name = known.get(workload)
            if name is None:
                name = self._text(workload)
            seen.append(f"[{name},{text}]")
        # Its text is made again only when a job's CPU time moved, or a job came or
        # went: a node whose jobs are all still saves the same list every second.
        if state.cgroups != self._cgroups[0]:
            listed = [[key, usec] for key, usec in state.cgroups.items()]
            self._cgroups = (dict(state.cgroups), json.dumps(listed, separators=(",", ":")))
        energy_text, seen_text = ",".join(energy), ",".join(seen)
        return (
            f'{head[:-1]},"energy":[{energy_text}],"last_seen":[{seen_text}],'
            f'"cgroups":{self._cgroups[1]}}}'
        ).encode()

    def _text(self, workload: Workload | None) -> str:
        if workload is None:
            return "null"
        text = self._workload.get(workload)
        if text is None:
            text = self._workload[workload] = json.dumps(
                workload_to_json(workload), separators=(",", ":")
            )
        return text


def _number(value: float) -> str:
    """A number as json.dumps writes it (NaN and the infinities as it does too)."""
    if value != value or value in (math.inf, -math.inf):
        return json.dumps(value)
    return repr(value)


def restore(data: dict[str, Any]) -> Restored:
    """Parse a state document (KeyError/TypeError/ValueError if it is malformed)."""
    energy: dict[EnergyKey, tuple[int, float, float]] = {}
    for component, gpu, workload, uj, grams, born in data["energy"]:
        key = (str(component), str(gpu), workload_from_json(workload))
        energy[key] = (count(uj), finite(grams), finite(born))
    holders: dict[str, set[Workload]] = {}
    for workload, gpu, _uuid in data["holders"]:
        holder = workload_from_json(workload)
        if holder is not None:
            holders.setdefault(str(gpu), set()).add(holder)
    cpu_total = data["cpu_total"]
    return Restored(
        energy=energy,
        last_seen={_workload(w): finite(t) for w, t in data["last_seen"]},
        holders=holders,
        ticks={(count(pid), count(start)): count(t) for pid, start, t in data["ticks"]},
        cpu_total=None if cpu_total is None else count(cpu_total),
        time=finite(data["time"]),
        gap={(str(c), bool(e)): count(uj) for c, e, uj in data["gap"]},
        restarts={str(k): count(v) for k, v in data["restarts"].items()},
        state_errors={str(k): count(v) for k, v in data["state_errors"].items()},
        # Absent from state files written before embodied accrual: nothing to continue.
        embodied={
            (str(c), str(g), workload_from_json(w)): count(ug)
            for c, g, w, ug in data.get("embodied", [])
        },
        embodied_devices={
            (str(c), str(d)): (count(ug), finite(carry))
            for c, d, ug, carry in data.get("embodied_devices", [])
        },
        # Absent from files written before job cgroups were read.
        cgroups={str(key): count(usec) for key, usec in data.get("cgroups", [])},
    )


def check_consistent(devices: dict[tuple[str, str], SavedDevice], state: Restored) -> None:
    """ValueError if the document contradicts itself: the parts of a device (its
    workload and unattributed series) add up to at most its counter, as they do in
    every state the exporter writes (series that expired took their share with them),
    and every series' device has a row."""
    device_uj: dict[tuple[str, str], int] = {}
    for (component, device), saved in devices.items():
        key = (component, device if component == "gpu" else "")
        device_uj[key] = device_uj.get(key, 0) + saved.total_uj
    parts_uj: dict[tuple[str, str], int] = {}
    for (component, gpu, _), (uj, _, _) in state.energy.items():
        parts_uj[(component, gpu)] = parts_uj.get((component, gpu), 0) + uj
    for key, uj in parts_uj.items():
        if uj > device_uj.get(key, 0):
            where = " ".join(key).strip()
            raise ValueError(
                f"its {where} series hold {uj / 1e6:.1f} J, more than the device's "
                f"{device_uj.get(key, 0) / 1e6:.1f} J"
                + ("" if key in device_uj else " (the device has no row)")
            )
    # Embodied the same way: a GPU's to its series, the rest of the server's (device
    # "node") to the CPU series.
    embodied: dict[tuple[str, str], int] = {}
    for (component, gpu, _), ug in state.embodied.items():
        key = ("gpu", gpu) if component == "gpu" else ("node", "")
        embodied[key] = embodied.get(key, 0) + ug
    for key, ug in embodied.items():
        accrued = state.embodied_devices.get(key, (0, 0.0))[0]
        if ug > accrued:
            raise ValueError(
                f"its {' '.join(key).strip()} embodied series hold {ug} ug, more than "
                f"the {accrued} ug accrued"
            )


def _workload(raw: Any) -> Workload:
    workload = workload_from_json(raw)
    if workload is None:
        raise ValueError("a workload is null")
    return workload


def finite(raw: Any) -> float:
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"not a finite number: {raw!r}")
    return value
