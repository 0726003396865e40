"""Metric families from a Snapshot: what /metrics shows (exposition.py writes it).

collect() never touches hardware; it serializes whatever the sampler published last.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from wattprint._version import __version__
from wattprint.core.units import UJ_PER_J
from wattprint.export.exposition import LABEL_CACHE, Family, counter, encode, gauge, label_text
from wattprint.export.scraper import SCRAPER
from wattprint.export.selfmetrics import status_families

if TYPE_CHECKING:  # the HTTP layer serves with this module before the model is loaded
    from wattprint.core.model import EnergySeries, Snapshot, Workload

WORKLOAD_LABELS = ("component", "gpu", "scheduler", "namespace", "workload", "pod")
# Prometheus 2.x drops samples older than about an hour before its newest ("out of
# bounds") and logs a warning each time. A series first scraped that long after its
# birth (a Prometheus added later) gets no stamped 0; its value starts it instead.
MAX_ZERO_AGE_S = 50 * 60
# Scrapers remembered, the least recent forgotten first: an HA pair, and some room.
MAX_SCRAPERS = 16

SeriesKey = tuple[str, str, "Workload | None"]


@dataclass
class _Served:
    keys: Set[SeriesKey] = frozenset()
    time: float = 0.0


class SnapshotCollector:
    """Serializes the latest Snapshot.

    Each workload and unattributed series is served at 0 the first time a scraper sees
    it and with its value from then on. PromQL's increase() and rate() ignore the value
    a counter is born with, so a job's first seconds of energy would otherwise be lost
    to every rule and dashboard (docs/report.md measures it on the replayed H200 job). The
    snapshot itself, and so the exporter's accounting, is unaffected. Only scrapers
    take that 0: a person's curl must not take it from Prometheus.

    With timestamps, each energy and power sample carries the time its devices were
    read, as cAdvisor does, whenever the clock is trusted (sampler/clock.py). Without,
    Prometheus stamps it with the scrape time, up to one sample interval after the value was true,
    so each end of a window is up to P x interval off (docs/accuracy.md measures it on
    the replayed H200 trace). A new series' 0 is then stamped with the time it
    really was 0. Info series carry no timestamp, so staleness still ends them.

    Stamped, every scraper (each replica of an HA pair) gets each new series' 0; a
    second one would otherwise see the series only with its value and lose its first
    interval. A 0 sent again to a scraper that already has the series (one forgotten
    and back) is an old sample Prometheus drops. With timestamps off (--sample.timestamps
    =false) the 0 alone is stamped so, whenever the clock is trusted, and the values
    after it go without: any client sending the scrape header would otherwise take the
    one 0 there is (issue 39). Only where the clock is not trusted is a 0 served
    unstamped; that 0 would read as a counter reset and count the job twice, so it goes
    to the first scraper that sees the series and to no other.
    """

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        timestamps: bool = False,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._latest = latest
        self._timestamps = timestamps
        self._wall = wall
        self._scrapers: OrderedDict[str, _Served] = OrderedDict()
        # The series of the snapshot last served, to whichever scraper: an unstamped 0
        # is for none of them (a scraper that has not seen one of them yet was served
        # it while it was already in this set, or forgot it: both get its value).
        self._shown: Set[SeriesKey] = frozenset()
        self._lock = threading.Lock()

    def _newborn(self, snapshot: Snapshot, stamped: bool) -> Set[SeriesKey]:
        scraper = SCRAPER.get()
        if scraper is None:
            return frozenset()
        keys = snapshot.series_keys
        if keys is None:
            keys = frozenset((s.component, s.gpu, s.workload) for s in snapshot.energy)
        # Each scraper's series are kept whether or not the clock is trusted now: keyed
        # otherwise while it is not, every series would be new to its scraper again when
        # the clock comes back, and served at 0 (a decrease to a client that does not
        # read timestamps, a second start to a store that takes old samples).
        with self._lock:
            served = self._scrapers.pop(scraper, None) or _Served()
            self._scrapers[scraper] = served  # now the most recent
            while len(self._scrapers) > MAX_SCRAPERS:
                self._scrapers.popitem(last=False)
            shown, self._shown = self._shown, keys
            if snapshot.time < served.time:
                # A scrape that took an older snapshot than one already served: its
                # series were all served (or have expired since); serve none at 0.
                return frozenset()
            served.time = snapshot.time
            if keys is served.keys:
                # The sampler's set of series, unchanged since this scraper's last
                # scrape (the common case): none is new, and none need be hashed.
                return frozenset()
            born = keys - served.keys
            if not stamped:
                born -= shown  # one unstamped 0 per series in all: a second reads as a reset
            # Expired series leave the sets, so one that comes back starts at 0 again.
            served.keys = keys
        return born

    def render(self, openmetrics: bool = False) -> bytes:
        """The exposition for the scraper in SCRAPER (scraper.py), in either format."""
        return encode(self.collect(), openmetrics)

    def collect(self) -> Iterator[Family]:
        info = gauge("wattprint_build_info", "Wattprint build information.", ["version"])
        info.add([__version__], 1)
        yield info
        snapshot = self._latest()
        if snapshot is None:
            return
        stamp: float | None = None
        # A new series' 0 is stamped whenever the clock is trusted, with timestamps off
        # too: then every scraper gets it, and a client sending the scrape header cannot
        # take it from Prometheus (an unstamped 0 goes to one scraper only).
        zero_stamp = snapshot.clock.stamp if snapshot.clock is not None else None
        if self._timestamps:
            stamp = snapshot.time if snapshot.clock is None else snapshot.clock.stamp
            zero_stamp = stamp
        yield from _devices(snapshot, stamp)
        born = self._newborn(snapshot, zero_stamp is not None)
        yield from _workloads(snapshot, born, stamp, zero_stamp)
        yield from status_families(snapshot, self._wall(), stamp is not None)


def _devices(snapshot: Snapshot, stamp: float | None) -> Iterator[Family]:
    from wattprint.sources.registry import is_estimated  # only once there are devices (see above)

    gpu_power = gauge(
        "wattprint_gpu_power_watts",
        "GPU power draw as reported by the device (NVML: 1 s average on Ampere and newer).",
        ["gpu", "uuid", "model"],
    )
    gpu_energy = counter(
        "wattprint_gpu_energy_joules_total",
        "GPU energy since the exporter started, from the device's energy counter.",
        ["gpu", "uuid", "model"],
    )
    families = {
        "cpu": (
            gauge(
                "wattprint_cpu_power_watts",
                "CPU package power over the last sample interval.",
                ["package"],
            ),
            counter(
                "wattprint_cpu_energy_joules_total",
                "CPU package energy since the exporter started.",
                ["package"],
            ),
        ),
        "memory": (
            gauge(
                "wattprint_memory_power_watts",
                "Memory power over the last sample interval.",
                ["package"],
            ),
            counter(
                "wattprint_memory_energy_joules_total",
                "Memory energy since the exporter started.",
                ["package"],
            ),
        ),
    }
    # Only where a platform source reads the node's input (else nothing, as before).
    node = {
        "node": (
            gauge(
                "wattprint_node_power_watts",
                "The node's input power (the BMC's or the platform's reading).",
            ),
            counter(
                "wattprint_node_energy_joules_total",
                "The node's input energy since the exporter started.",
            ),
        ),
        "platform": (
            gauge(
                "wattprint_platform_power_watts",
                "The rest of the server's power: the node's less its GPUs, CPUs and memory.",
            ),
            counter(
                "wattprint_platform_energy_joules_total",
                "The rest of the server's energy: the node's less its GPUs, CPUs and memory.",
            ),
        ),
    }
    measurement = gauge(
        "wattprint_measurement_info",
        "How each device's energy is obtained: a hardware counter, integrated power, "
        "or a model (estimated).",
        ["component", "device", "method", "estimated"],
    )
    for device in snapshot.devices:
        joules = device.energy_uj / UJ_PER_J
        estimated = "true" if is_estimated(device.method) else "false"
        measurement.add([device.component, device.device, device.method, estimated], 1)
        if device.component == "gpu":
            labels = [device.device, device.uuid, device.model]
            if device.power_w is not None:
                gpu_power.add(labels, device.power_w, timestamp=stamp)
            gpu_energy.add(labels, joules, timestamp=stamp)
        elif device.component in node:
            power, energy = node[device.component]
            if device.power_w is not None:
                power.add([], device.power_w, timestamp=stamp)
            energy.add([], joules, timestamp=stamp)
        else:
            power, energy = families[device.component]
            if device.power_w is not None:
                power.add([device.device], device.power_w, timestamp=stamp)
            energy.add([device.device], joules, timestamp=stamp)
    yield gpu_power
    yield gpu_energy
    for power, energy in families.values():
        yield power
        yield energy
    for power, energy in node.values():
        if energy.samples:
            yield power
            yield energy
    yield measurement


def _workloads(
    snapshot: Snapshot, born: Set[SeriesKey], stamp: float | None, zero_stamp: float | None
) -> Iterator[Family]:
    energy = counter(
        "wattprint_workload_energy_joules_total",
        "Energy attributed to a workload since the exporter started (gpu: the GPU index "
        "for component=gpu).",
        WORKLOAD_LABELS,
    )
    emissions = counter(
        "wattprint_workload_emissions_grams_total",
        "Emissions attributed to a workload: energy x grid intensity in force when it "
        "was used x PUE.",
        WORKLOAD_LABELS,
    )
    idle_energy = counter(
        "wattprint_unattributed_energy_joules_total",
        "Device energy not attributed to any workload (idle, system, unknown processes).",
        ["component", "gpu"],
    )
    idle_emissions = counter(
        "wattprint_unattributed_emissions_grams_total",
        "Emissions of the unattributed energy.",
        ["component", "gpu"],
    )
    # Embodied (Scope 3) emissions accrue on the same series keys (sampler/embodied.py), so they
    # are born and stamped with them.
    embodied = counter(
        "wattprint_workload_embodied_grams_total",
        "Embodied (Scope 3, cradle to gate) emissions of the hardware a workload held, "
        "amortized over its service life (component=cpu: the rest of the server, by CPU "
        "share).",
        WORKLOAD_LABELS,
    )
    idle_embodied = counter(
        "wattprint_unattributed_embodied_grams_total",
        "Embodied emissions of hardware no workload held (a free GPU, idle CPU share).",
        ["component", "gpu"],
    )
    # Once per series and scrape, hundreds on a node of a hundred jobs: the samples go
    # straight onto their families' lists (Family.add_labelled's, without the call).
    named_energy, named_emissions = energy.samples.append, emissions.samples.append
    idle_energy_add, idle_emissions_add = idle_energy.samples.append, idle_emissions.samples.append
    for series in snapshot.energy:
        key = series[:3]  # (component, gpu, workload)
        if born and key in born:
            zero, at = _first_zero(series, snapshot.time, zero_stamp)
            at = at if zero else stamp
        else:  # every scrape but a series' first
            zero, at = False, stamp
        named = series.workload is not None
        labels = _series_labels(key)
        joules = 0.0 if zero else series.energy_uj / UJ_PER_J
        grams = 0.0 if zero else series.grams
        if named:
            named_energy((labels, joules, at))
            named_emissions((labels, grams, at))
        else:
            idle_energy_add((labels, joules, at))
            idle_emissions_add((labels, grams, at))
        if snapshot.embodied and (series.embodied_ug or zero):
            grams = 0.0 if zero else series.embodied_ug / 1e6
            (embodied if named else idle_embodied).add_labelled(labels, grams, at)
    holders = gauge(
        "wattprint_workload_gpu_info",
        "1 for each GPU a workload holds now.",
        ["scheduler", "namespace", "workload", "pod", "gpu", "uuid"],
    )
    for w, gpu, uuid in snapshot.gpu_holders:
        holders.add([w.scheduler, w.namespace, w.workload, w.pod, gpu, uuid], 1)
    yield from (energy, emissions, idle_energy, idle_emissions, holders)
    if snapshot.embodied:
        yield from (embodied, idle_embodied)
        yield from _embodied_devices(snapshot, stamp)


def _first_zero(series: EnergySeries, now: float, stamp: float | None) -> tuple[bool, float | None]:
    """For a series new to the scraper: whether it is served its first 0 now, and the
    time its sample is stamped with: the 0 as long before this sample as the series'
    birth really was (monotonic time), right across any re-base of the stamps after a
    clock step."""
    zero = not series.resumed
    age = now - series.born
    if stamp is not None and age > MAX_ZERO_AGE_S:
        zero = False
    return zero, (stamp - age if stamp is not None and zero else stamp)


@lru_cache(maxsize=LABEL_CACHE)
def _series_labels(key: SeriesKey) -> str:
    """The label text of a workload's series (WORKLOAD_LABELS), or of the unattributed
    one of its component: made once per series, not once per family and scrape."""
    component, gpu, w = key
    if w is None:
        return label_text(("component", "gpu"), (component, gpu))
    values = (component, gpu, w.scheduler, w.namespace, w.workload, w.pod)
    return label_text(WORKLOAD_LABELS, values)


def _embodied_devices(snapshot: Snapshot, stamp: float | None) -> Iterator[Family]:
    device = counter(
        "wattprint_device_embodied_grams_total",
        "Embodied emissions accrued by each device with a known figure (the sum of its "
        "workload and unattributed shares).",
        ["component", "device", "model"],
    )
    figure = gauge(
        "wattprint_embodied_figure_kgco2e",
        "The embodied emissions figure each device accrues by, and its source.",
        ["component", "device", "model", "source"],
    )
    unknown = gauge(
        "wattprint_embodied_unknown",
        "1 for each device with no embodied figure: it accrues nothing (give one by flag).",
        ["component", "device", "model"],
    )
    for d in snapshot.embodied:
        if d.figure is None:
            unknown.add([d.component, d.device, d.model], 1)
            continue
        figure.add([d.component, d.device, d.model, d.figure.source], d.figure.kgco2e)
        device.add([d.component, d.device, d.model], d.embodied_ug / 1e6, timestamp=stamp)
    yield from (device, figure, unknown)
