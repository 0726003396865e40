"""The energy sources' registry: each source declares itself once, the way node_exporter
registers collectors: its name, a factory, the methods it may report (each measured or
estimated), what it needs and a line of help. Flag choices, --help, doctor, the
`estimated` label of wattprint_measurement_info and the Helm schema's enums come from
(or are checked in tests against) this table; carbon/registry.py is its twin for
providers. The built-ins register in sources/catalog.py, which the package's __init__
imports; adding one is a new module plus one registered factory there.

Nothing here does I/O or imports a source module: factories import their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from wattprint.core.model import Source

# Each has a --<component>.source flag. platform's sources read the node's input energy
# (readings of component "node"); the platform is that less the other three's.
COMPONENTS = ("gpu", "cpu", "memory", "platform")

# Provenance of a device's energy, exported as wattprint_measurement_info{method}.
METHOD_NVML_COUNTER = "nvml_energy_counter"
METHOD_NVML_INTEGRATED = "nvml_power_integrated"
METHOD_AMDSMI_COUNTER = "amdsmi_energy_counter"
METHOD_AMDSMI_INTEGRATED = "amdsmi_power_integrated"
METHOD_RAPL = "rapl"
METHOD_MODEL = "model"
METHOD_REPLAY = "replay"
METHOD_PM_COUNTERS = "pm_counters"
METHOD_REDFISH_COUNTER = "redfish_energy_counter"
METHOD_REDFISH_INTEGRATED = "redfish_power_integrated"
METHOD_IPMI_INTEGRATED = "ipmi_dcmi_power_integrated"


class SourceUnavailable(ValueError):
    """The source cannot run here; the message is one line for the user.

    Under auto the next source is tried; asked for by name, it is a configuration error.
    """


class SourceError(ValueError):
    """The source cannot run and nothing else may stand in: always a configuration error."""


@dataclass(frozen=True)
class Method:
    """One way a source gets energy (a counter, or an estimate), for labels, doctor and docs."""

    name: str
    estimated: bool  # a model or an integration of power readings, not an energy counter
    help: str


@dataclass(frozen=True)
class SourceContext:
    """What a source factory may use: the options and where the host's files are."""

    component: str
    explicit: bool  # named by --<component>.source rather than chosen by auto
    reason: str = ""  # why the sources tried before this one (under auto) could not run
    sysfs_root: str | Path = "/sys"
    procfs_root: str | Path = "/proc"
    clock: Callable[[], float] = time.monotonic
    cpu_tdp_watts: float = 0.0
    memory_watts_per_gib: float = 0.0
    gpu_replay_file: str = ""
    replay_speed: float = 1.0
    platform_redfish_url: str = ""
    platform_redfish_chassis: str = ""
    platform_redfish_ca_file: str = ""
    platform_redfish_insecure: bool = False
    platform_ipmi_device: str = "/dev/ipmi0"


@dataclass(frozen=True)
class SourceSpec:
    """One energy source's declaration: its components, methods, factory and rank under auto."""

    name: str  # the value of --<component>.source
    components: tuple[str, ...]
    methods: tuple[Method, ...]
    factory: Callable[[SourceContext], Source]
    help: str
    # Tried by auto in ascending order; None: only when named explicitly. Sources of
    # one rank run side by side where each is available (GPU: NVML and AMD SMI).
    auto_rank: int | None = None
    needs: tuple[str, ...] = ()  # options or host files it needs, for docs and doctor
    in_chart: bool = True  # offered by the Helm chart (its values.schema.json enum)
    # Its devices' labels begin with this when it runs beside an earlier-registered
    # source of its component, so two vendors' GPU indices never collide.
    side_prefix: str = ""


_SOURCES: dict[str, SourceSpec] = {}


def register_source(spec: SourceSpec) -> SourceSpec:
    if spec.name in _SOURCES or spec.name in ("auto", "none"):
        raise ValueError(f"source {spec.name!r} is already registered")
    for method in spec.methods:
        known = method_table().get(method.name)
        if known is not None and known.estimated != method.estimated:
            raise ValueError(f"method {method.name!r} registered as both measured and estimated")
    _SOURCES[spec.name] = spec
    return spec


def unregister_source(name: str) -> None:
    _SOURCES.pop(name, None)


def sources(component: str | None = None) -> list[SourceSpec]:
    return [s for s in _SOURCES.values() if component is None or component in s.components]


def source(name: str, component: str) -> SourceSpec:
    for spec in sources(component):
        if spec.name == name:
            return spec
    raise KeyError(name)


def source_choices(component: str) -> tuple[str, ...]:
    return ("auto", *(s.name for s in sources(component)), "none")


def explain() -> list[str]:
    """Doctor's lines: each registered source with its methods."""
    lines = []
    for spec in sources():
        methods = ", ".join(
            f"{m.name} {'estimated' if m.estimated else 'measured'}" for m in spec.methods
        )
        lines.append(f"{spec.name} ({'/'.join(spec.components)}): {spec.help}; {methods}")
    return lines


def method_table() -> dict[str, Method]:
    return {m.name: m for s in _SOURCES.values() for m in s.methods}


def is_estimated(method: str) -> bool:
    """A method no source declares counts as estimated: nothing vouches for it."""
    known = method_table().get(method)
    return known is None or known.estimated


def estimated_methods() -> frozenset[str]:
    return frozenset(name for name, m in method_table().items() if m.estimated)


def measured_methods() -> frozenset[str]:
    return frozenset(name for name, m in method_table().items() if not m.estimated)
