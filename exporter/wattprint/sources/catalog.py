"""The built-in energy sources, registered once each.

A new source is a module under sources/ plus its factory here, registered by the line
above it, its help in HELP: its name becomes a
--<component>.source choice, its methods set the `estimated` label, and --help, doctor
and the Helm schema follow. Sources register in the order they stand here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from wattprint.sources.registry import (
    METHOD_AMDSMI_COUNTER,
    METHOD_AMDSMI_INTEGRATED,
    METHOD_IPMI_INTEGRATED,
    METHOD_MODEL,
    METHOD_NVML_COUNTER,
    METHOD_NVML_INTEGRATED,
    METHOD_PM_COUNTERS,
    METHOD_RAPL,
    METHOD_REDFISH_COUNTER,
    METHOD_REDFISH_INTEGRATED,
    METHOD_REPLAY,
    Method,
    SourceContext,
    SourceError,
    SourceSpec,
    SourceUnavailable,
    register_source,
)

if TYPE_CHECKING:  # the flags' choices read this list at start-up; the model loads later
    from wattprint.core.model import Source

log = logging.getLogger(__name__)

Factory = Callable[[SourceContext], "Source"]

NVML_COUNTER = Method(
    METHOD_NVML_COUNTER, False, "the GPU's total energy counter (Volta and later)"
)
NVML_INTEGRATED = Method(METHOD_NVML_INTEGRATED, True, "NVML power integrated over the interval")
AMDSMI_COUNTER = Method(
    METHOD_AMDSMI_COUNTER, False, "the AMD GPU's energy accumulator (counts x resolution)"
)
AMDSMI_INTEGRATED = Method(
    METHOD_AMDSMI_INTEGRATED, True, "AMD SMI socket power integrated over the interval"
)
REPLAY = Method(METHOD_REPLAY, False, "a recorded GPU trace, played back")
RAPL = Method(METHOD_RAPL, False, "the RAPL energy counters (package, dram)")
MODEL = Method(METHOD_MODEL, True, "a power model of utilisation (CPU) or size (memory)")
PM_COUNTERS = Method(METHOD_PM_COUNTERS, False, "the node's energy counter (HPE Cray)")
REDFISH_COUNTER = Method(METHOD_REDFISH_COUNTER, False, "the BMC's EnergykWh counter (Redfish)")
REDFISH_INTEGRATED = Method(
    METHOD_REDFISH_INTEGRATED, True, "the BMC's input power integrated over the interval"
)
IPMI_INTEGRATED = Method(
    METHOD_IPMI_INTEGRATED, True, "the BMC's DCMI power reading integrated between its timestamps"
)


# Each source's line in --help and doctor.
HELP = {
    "nvml": "NVIDIA GPUs through NVML",
    "amdsmi": "AMD Instinct GPUs through AMD SMI (the amdsmi package of ROCm)",
    "replay": "play back a recorded GPU trace (--gpu.replay-file)",
    "rapl": "Intel/AMD RAPL energy counters in /sys/class/powercap",
    "model": "estimate from CPU utilisation and TDP, or from memory size",
    "pm_counters": "the node's input energy from HPE Cray /sys/cray/pm_counters",
    "redfish": "the node's input from its BMC's Redfish API (--platform.redfish-url)",
    "ipmi": "the node's input power from the BMC's DCMI power reading, in band (ipmitool)",
}


def _source(
    name: str,
    components: tuple[str, ...],
    *methods: Method,
    auto_rank: int | None = None,
    needs: tuple[str, ...] = (),
    in_chart: bool = True,
    side_prefix: str = "",
) -> Callable[[Factory], Factory]:
    """Register the decorated factory as the source `name` (SourceSpec says what the
    rest means), with its help from HELP."""

    def register(factory: Factory) -> Factory:
        spec = SourceSpec(
            name, components, methods, factory, HELP[name], auto_rank, needs, in_chart, side_prefix
        )
        register_source(spec)
        return factory

    return register


def _why(err: Exception) -> str:
    if isinstance(err, OSError) and err.filename:
        return f"cannot read {err.filename}: {err.strerror}"
    return str(err)


@_source("nvml", ("gpu",), NVML_COUNTER, NVML_INTEGRATED, auto_rank=1, needs=("libnvidia-ml",))
def _nvml(ctx: SourceContext) -> Source:
    try:
        from wattprint.sources.nvml import NvmlSource, nvidia_gpus_on_pci

        source = NvmlSource(required=ctx.explicit, pci_gpus=nvidia_gpus_on_pci(ctx.sysfs_root))
    except ImportError as err:
        raise SourceUnavailable(f"pynvml not importable: {err}") from None
    # Asked for explicitly, or on a node whose PCI bus shows NVIDIA GPUs, an unavailable
    # NVML is kept and retried (every 30 s): it may come up once the driver loads, and
    # meanwhile wattprint_collector_success{collector="nvml"} 0 says the GPUs go
    # unmeasured; the source has already said why it failed.
    if source.available or ctx.explicit or source.pci_gpus:
        return source
    raise SourceUnavailable(source.init_error)


# Beside NVML (same rank: auto runs both on a node with both) its GPUs are amd0, amd1...
@_source(
    "amdsmi",
    ("gpu",),
    AMDSMI_COUNTER,
    AMDSMI_INTEGRATED,
    auto_rank=1,
    needs=("libamd_smi (ROCm)", "/dev/kfd", "/dev/dri"),
    side_prefix="amd",
)
def _amdsmi(ctx: SourceContext) -> Source:
    from wattprint.sources.amdsmi import AmdSmiSource, Unmeasured, amd_gpus_on_pci

    on_pci = amd_gpus_on_pci(ctx.sysfs_root)
    try:
        source = AmdSmiSource(clock=ctx.clock, required=ctx.explicit, pci_gpus=on_pci)
    # Importing amdsmi loads libamd_smi: without ROCm (or with a mismatched one) it fails
    # with more than ImportError.
    except (ImportError, OSError, AttributeError, KeyError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        why = f"amdsmi not importable: {first}"
        if on_pci and not ctx.explicit:
            # AMD GPUs nobody can read: a failing collector says so (and alerts).
            log.warning("%s; %d AMD GPU(s) on the PCI bus are not measured", why, on_pci)
            return Unmeasured(f"{why}; {on_pci} AMD GPU(s) on the PCI bus are not measured")
        raise SourceUnavailable(why) from None
    # Asked for by name, or where the PCI bus shows AMD GPUs, an unavailable AMD SMI is
    # kept and retried (every 30 s), like NVML. Under auto a node without AMD GPUs does
    # not run it.
    if ctx.explicit or on_pci or (source.available and source.gpu_count):
        return source
    source.close()
    raise SourceUnavailable(source.init_error or "AMD SMI found no AMD GPU")


# Not offered by the Helm chart: a trace file is a test rig's, not a DaemonSet's.
@_source("replay", ("gpu",), REPLAY, auto_rank=0, needs=("--gpu.replay-file",), in_chart=False)
def _replay(ctx: SourceContext) -> Source:
    from wattprint.sources.replay import ReplaySource, TraceError

    if not ctx.explicit and not ctx.gpu_replay_file:
        raise SourceUnavailable("no --gpu.replay-file")
    try:
        return ReplaySource(ctx.gpu_replay_file, ctx.replay_speed)
    except TraceError as err:
        raise SourceError(f"bad value for --gpu.replay-file: {err}") from None


@_source("rapl", ("cpu", "memory"), RAPL, auto_rank=0, needs=("/sys/class/powercap",))
def _rapl(ctx: SourceContext) -> Source:
    from wattprint.sources import rapl

    zones, reason = rapl.probe(ctx.sysfs_root, ctx.component)
    if zones:
        return rapl.RaplSource(ctx.component, ctx.sysfs_root, ctx.clock, zones=zones)
    if not ctx.explicit:
        # Zones that exist but cannot be read can be fixed by the operator: say it louder.
        level = logging.WARNING if reason.startswith(rapl.NOT_READABLE) else logging.INFO
        log.log(level, "%s: %s; estimating with the model instead", ctx.component, reason)
    raise SourceUnavailable(reason)


@_source("model", ("cpu", "memory"), MODEL, auto_rank=1, needs=("/proc",))
def _model(ctx: SourceContext) -> Source:
    from wattprint.sources.cpu_model import CpuModelSource
    from wattprint.sources.memory_model import WATTS_PER_GIB, MemoryModelSource

    flag = f"--{ctx.component}.source={'model' if ctx.explicit else 'auto'}"
    reason = ctx.reason or f"selected by --{ctx.component}.source=model"
    try:
        if ctx.component == "cpu":
            return CpuModelSource(
                ctx.procfs_root, tdp_watts=ctx.cpu_tdp_watts, clock=ctx.clock, reason=reason
            )
        return MemoryModelSource(
            ctx.procfs_root,
            clock=ctx.clock,
            reason=reason,
            watts_per_gib=ctx.memory_watts_per_gib or WATTS_PER_GIB,
        )
    except (OSError, ValueError) as err:
        what = "CPU model" if ctx.component == "cpu" else "memory model"
        raise SourceError(f"{flag}: {what}: {_why(err)}") from err


# The node's input energy, for the platform component.
@_source(
    "pm_counters",
    ("platform",),
    PM_COUNTERS,
    auto_rank=0,
    needs=("/sys/cray/pm_counters",),
)
def _pm_counters(ctx: SourceContext) -> Source:
    from wattprint.sources.pm_counters import PmCountersSource, pm_counters_dir

    path = pm_counters_dir(ctx.sysfs_root)
    if not (path / "energy").is_file():
        raise SourceUnavailable(f"not an HPE Cray node: no {path}/energy")
    return PmCountersSource(ctx.sysfs_root, ctx.clock)


# Out of band, where a BMC is configured; after pm_counters under auto.
@_source(
    "redfish",
    ("platform",),
    REDFISH_COUNTER,
    REDFISH_INTEGRATED,
    auto_rank=1,
    needs=("--platform.redfish-url", "WATTPRINT_REDFISH_USERNAME/PASSWORD"),
)
def _redfish(ctx: SourceContext) -> Source:
    from wattprint.sources.redfish import RedfishError, RedfishSource, tls_context

    if not ctx.platform_redfish_url:
        tried = f"{ctx.reason}; " if ctx.reason else ""  # why pm_counters could not, under auto
        raise SourceUnavailable(f"{tried}no --platform.redfish-url")
    try:
        tls = tls_context(ctx.platform_redfish_ca_file, ctx.platform_redfish_insecure)
        return RedfishSource(
            ctx.platform_redfish_url, ctx.platform_redfish_chassis, tls=tls, clock=ctx.clock
        )
    except RedfishError as err:
        raise SourceError(str(err)) from None


# In band, last under auto: a node with /dev/ipmi0 and ipmitool whose BMC answers the
# DCMI power reading at start (once, within the request's deadline); asked for by name,
# it is kept and retried whatever the first answer, and its collector says why it fails.
@_source(
    "ipmi",
    ("platform",),
    IPMI_INTEGRATED,
    auto_rank=2,
    needs=("ipmitool", "--platform.ipmi-device (/dev/ipmi0)"),
)
def _ipmi(ctx: SourceContext) -> Source:
    import shutil

    from wattprint.sources.ipmi import (
        IpmiError,
        IpmiSource,
        ask,
        device_number,
        power_reading_argv,
    )

    tried = f"{ctx.reason}; " if ctx.reason else ""  # why the sources before could not
    device = ctx.platform_ipmi_device
    try:
        device_number(device)
    except IpmiError as err:
        raise SourceError(str(err)) from None
    if not ctx.explicit and not os.path.exists(device):
        raise SourceUnavailable(f"{tried}no {device}")
    ipmitool = shutil.which("ipmitool")
    if ipmitool is None:
        raise SourceUnavailable(f"{tried}no ipmitool on PATH (the ipmitool package)")
    if not ctx.explicit:
        try:
            ask(power_reading_argv(ipmitool, device))
        except (OSError, ValueError) as err:
            why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise SourceUnavailable(f"{tried}ipmi: no DCMI power reading: {why}") from None
    return IpmiSource(ipmitool, device, clock=ctx.clock)
