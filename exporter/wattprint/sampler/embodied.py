"""The sampler's embodied accrual: each device's embodied emissions, split like its energy."""

from __future__ import annotations

from collections.abc import Mapping

from wattprint.attribution import split
from wattprint.attribution.embodied import EmbodiedSettings, accrue
from wattprint.core.model import EmbodiedDevice, Figure, Workload
from wattprint.durability.document import Restored
from wattprint.sampler.devices import DeviceKey, DeviceLedger
from wattprint.sampler.series import SeriesBook

NODE: DeviceKey = ("node", "")  # the rest of the server, one figure for all of it


class EmbodiedAccrual:
    """Each device's embodied emissions per sample, to whoever held it by its energy's policy."""

    def __init__(
        self, settings: EmbodiedSettings | None, devices: DeviceLedger, book: SeriesBook
    ) -> None:
        self.settings = settings  # None: no embodied accrual
        self.ug: dict[DeviceKey, int] = {}  # micro-grams accrued so far, per device
        self.carry: dict[DeviceKey, float] = {}  # the fraction of a micro-gram carried
        self._devices = devices
        self._book = book

    def accrue(
        self,
        now: float,
        resolve: split.Resolve,
        held_before: Mapping[str, set[Workload]],
        cpu_usage: Mapping[Workload, int],
        node_ticks: int,
    ) -> None:
        """Each device's embodied emissions since the last sample, to whoever held it by
        the policy of its energy: a GPU's holders (a free GPU: unattributed), the rest
        of the server by CPU share (series component=cpu), like idle energy."""
        settings = self.settings
        previous = self._book.previous_time
        if settings is None or previous is None:
            return
        elapsed = now - previous
        for key, reading in self._devices.readings.items():
            if reading.component != "gpu":
                continue
            figure = settings.gpu_figure(reading.model)
            if figure is None:
                continue
            ug = self._accrue_device(key, figure, settings.lifetime_s, elapsed)
            processes = reading.processes
            if reading.device in held_before:
                processes = tuple(p for p in processes if resolve(p) in held_before[reading.device])
            mig = dict(reading.mig_slices)
            self._book.add_embodied(
                "gpu", reading.device, split.attribute_gpu(ug, processes, resolve, mig), now
            )
        figure = settings.node_figure()
        if figure is not None:
            ug = self._accrue_device(NODE, figure, settings.lifetime_s, elapsed)
            self._book.add_embodied(
                "cpu", "", split.attribute_by_share(ug, cpu_usage, node_ticks), now
            )

    def _accrue_device(
        self, key: DeviceKey, figure: Figure, lifetime: float, elapsed: float
    ) -> int:
        ug, carry = accrue(figure.kgco2e, lifetime, elapsed, self.carry.get(key, 0.0))
        self.carry[key] = carry
        self.ug[key] = self.ug.get(key, 0) + ug
        return ug

    def snapshot(self) -> tuple[EmbodiedDevice, ...]:
        settings = self.settings
        if settings is None:
            return ()
        out = [
            EmbodiedDevice(
                "gpu", r.device, r.model, settings.gpu_figure(r.model), self.ug.get(key, 0)
            )
            for key, r in sorted(self._devices.readings.items())
            if r.component == "gpu"
        ]
        out.append(EmbodiedDevice("node", "", "", settings.node_figure(), self.ug.get(NODE, 0)))
        return tuple(out)

    def restore(self, restored: Restored) -> None:
        self.ug = {k: ug for k, (ug, _) in restored.embodied_devices.items()}
        self.carry = {k: carry for k, (_, carry) in restored.embodied_devices.items()}
