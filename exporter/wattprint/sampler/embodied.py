"""The sampler's embodied accrual: each device's embodied emissions, split like its energy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from wattprint.attribution import split as attribution
from wattprint.core.model import DeviceReading, EmbodiedDevice, Workload
from wattprint.sampler.series import Accumulator

if TYPE_CHECKING:
    from wattprint.sampler.loop import SamplerParts
from wattprint.attribution.embodied import accrue
from wattprint.core.model import Figure


class EmbodiedMixin:
    """The sampler's embodied accrual: each device's share of its embodied emissions per
    sample, split like its energy. Sampler owns the fields below."""

    parts: SamplerParts
    _devices: dict[tuple[str, str], DeviceReading]
    _energy: dict[tuple[str, str, Workload | None], Accumulator]
    _embodied_ug: dict[tuple[str, str], int]
    _embodied_carry: dict[tuple[str, str], float]
    _last_seen: dict[Workload, float]
    _previous_time: float | None

    def _accrue_embodied(
        self,
        now: float,
        resolve: attribution.Resolve,
        held_before: Mapping[str, set[Workload]],
        cpu_usage: Mapping[Workload, int],
        node_ticks: int,
    ) -> None:
        """Each device's embodied emissions since the last sample, to whoever held it by
        the policy of its energy: a GPU's holders (a free GPU: unattributed), the rest
        of the server by CPU share (series component=cpu), like idle energy."""
        settings = self.parts.embodied
        if settings is None or self._previous_time is None:
            return
        elapsed = now - self._previous_time
        for key, reading in self._devices.items():
            if reading.component != "gpu":
                continue
            figure = settings.gpu_figure(reading.model)
            if figure is None:
                continue
            ug = self._accrue_device(key, figure, elapsed)
            processes = reading.processes
            if reading.device in held_before:
                processes = tuple(p for p in processes if resolve(p) in held_before[reading.device])
            mig = dict(reading.mig_slices)
            self._add_embodied(
                "gpu", reading.device, attribution.attribute_gpu(ug, processes, resolve, mig), now
            )
        figure = settings.node_figure()
        if figure is not None:
            ug = self._accrue_device(("node", ""), figure, elapsed)
            self._add_embodied(
                "cpu", "", attribution.attribute_by_share(ug, cpu_usage, node_ticks), now
            )

    def _accrue_device(self, key: tuple[str, str], figure: Figure, elapsed: float) -> int:
        settings = self.parts.embodied
        assert settings is not None  # only called while accruing
        lifetime = settings.lifetime_s
        ug, carry = accrue(figure.kgco2e, lifetime, elapsed, self._embodied_carry.get(key, 0.0))
        self._embodied_carry[key] = carry
        self._embodied_ug[key] = self._embodied_ug.get(key, 0) + ug
        return ug

    def _add_embodied(self, component: str, gpu: str, parts: attribution.Parts, now: float) -> None:
        for workload, ug in parts.items():
            self._series(component, gpu, workload, now).embodied_ug += ug

    def _series(
        self, component: str, gpu: str, workload: Workload | None, now: float
    ) -> Accumulator:
        """The series that is paid now (energy or embodied), created if new, and its
        workload seen now."""
        key = (component, gpu, workload)
        acc = self._energy.get(key)
        if acc is None:
            # What is added now was drawn after the previous sample, so the series' true
            # zero is at that sample's time.
            born = now if self._previous_time is None else self._previous_time
            acc = self._energy[key] = Accumulator(born)
        if workload is not None:
            # A workload paid only through replay segments (it held a GPU between two
            # reads) is in no process list: without this its series would never expire.
            self._last_seen[workload] = now
        return acc

    def _embodied_devices(self) -> tuple[EmbodiedDevice, ...]:
        settings = self.parts.embodied
        if settings is None:
            return ()
        out = [
            EmbodiedDevice(
                "gpu",
                r.device,
                r.model,
                settings.gpu_figure(r.model),
                self._embodied_ug.get(key, 0),
            )
            for key, r in sorted(self._devices.items())
            if r.component == "gpu"
        ]
        node = settings.node_figure()
        out.append(EmbodiedDevice("node", "", "", node, self._embodied_ug.get(("node", ""), 0)))
        return tuple(out)
