"""The exporter's parts, each built from a Config: sources, carbon, identity, sampler.

app.build_exporter puts them together; it imports this module only once it listens,
as these imports are most of the start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from wattprint.attribution.embodied import EmbodiedSettings
from wattprint.carbon import registry as carbon_registry
from wattprint.carbon.base import CarbonConfigError, CarbonSettings, UnknownZoneError
from wattprint.carbon.service import CarbonService
from wattprint.config.options import Config, ConfigError
from wattprint.core.model import CollectorStatus, Source, fields_from
from wattprint.durability.statefile import StateFile, read_boot_id
from wattprint.host.cgroupfs import CgroupAccounting, CgroupFs
from wattprint.host.identity.kubernetes import KubernetesPods
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import ProcReader, ProcTable
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources.registry import COMPONENTS, SourceContext, SourceUnavailable
from wattprint.sources.select import choose_all

if TYPE_CHECKING:  # build_sampler loads it only for a sampler with trackers
    from wattprint.host.identity.tracked import TrackedResolver


def source_context(config: Config, component: str) -> SourceContext:
    # The paths and the model and replay settings are the config's fields of the same name.
    return fields_from(SourceContext, config, component=component, explicit=False)


def build_sources(config: Config) -> tuple[list[Source], list[str]]:
    """The sources to read, and doctor lines for the components that have none."""
    sources: list[Source] = []
    notes: list[str] = []
    modes = {
        "gpu": config.gpu_source,
        "cpu": config.cpu_source,
        "memory": config.memory_source,
        "platform": config.platform_source,
    }
    try:
        for component in COMPONENTS:
            chosen, why = choose_all(modes[component], source_context(config, component))
            notes.extend(why)
            sources.extend(source for source in chosen if source not in sources)
    except SourceUnavailable as err:
        for source in sources:
            source.close()
        raise ConfigError(str(err)) from None
    return sources, notes


def build_carbon(config: Config) -> CarbonService:
    zone = config.carbon_zone
    if not zone and not carbon_registry.provider(config.carbon_provider).live:
        zone = "WORLD"  # works offline; cli.run says so out loud once all else is valid
    settings = CarbonSettings(
        provider=config.carbon_provider,
        zone=zone,
        provider_region=config.carbon_provider_region,
        api_url=config.carbon_api_url,
        refresh_interval_s=config.carbon_refresh_interval,
        fallback_after_s=config.carbon_fallback_after,
        accounting_signal=config.carbon_accounting_signal,
        pue=config.pue,
    )
    try:
        return CarbonService(settings)
    except (UnknownZoneError, CarbonConfigError) as err:
        raise ConfigError(str(err)) from None


def embodied_settings(config: Config) -> EmbodiedSettings:
    return EmbodiedSettings(
        lifetime_s=config.embodied_lifetime,
        gpu_overrides=config.embodied_gpu_kgco2e,
        node_kgco2e=config.embodied_node_kgco2e,
    )


def build_identity(config: Config) -> tuple[IdentityResolver, KubernetesPods | None]:
    kubernetes = None
    if config.kubernetes_node_name:
        kubernetes = KubernetesPods.from_environment(
            config.kubernetes_node_name, job_labels=config.kubernetes_job_labels
        )
    resolver = IdentityResolver(
        procfs_root=config.procfs_root,
        env_vars=config.workload_env_vars,
        kubernetes=kubernetes,
    )
    return resolver, kubernetes


def build_sampler(
    config: Config,
    sources: list[Source],
    carbon: CarbonService,
    resolver: IdentityResolver,
    kubernetes: KubernetesPods | None,
    trackers_of: str | None,
) -> tuple[Sampler, Callable[[], None]]:
    """The sampler, and what gives back the files it holds across samples.

    trackers_of: the node lock beside which trackers inside jobs (wattprint.track())
    register their processes; None for none."""
    procfs_root = config.procfs_root
    named: IdentityResolver | TrackedResolver = resolver
    if trackers_of is not None:
        from wattprint.host.identity.tracked import TrackedResolver, registry_dir

        named = TrackedResolver(resolver, registry_dir(trackers_of), procfs_root)
    cgroup_fs = CgroupFs(f"{config.sysfs_root}/fs/cgroup")
    cgroups = None
    if cgroup_fs.usable:
        cgroups = CgroupAccounting(cgroup_fs, procfs_root, kubernetes=kubernetes is not None)

    # Its own reader: on a real /proc it reports the PIDs new since its last call,
    # which this exporter's job cgroups must all see.
    reader = ProcReader(procfs_root)

    def read_procs() -> ProcTable:
        return reader.table(cgroups)

    def extra_status() -> list[CollectorStatus]:
        statuses = [CollectorStatus("identity", True, 0.0, resolver.errors_total)]
        if kubernetes is not None:
            ok = kubernetes.last_success is not None and not kubernetes.last_error
            statuses.append(CollectorStatus("kubernetes", ok, 0.0, kubernetes.errors_total))
        return statuses

    sampler = Sampler(
        SamplerParts(
            sources=sources,
            read_procs=read_procs,
            resolver=named,
            carbon=carbon,
            extra_status=extra_status,
            pue=config.pue,
            interval=config.sample_interval,
            retention=config.workload_retention,
            state=StateFile(config.state_file) if config.state_file else None,
            boot_id=read_boot_id(config.procfs_root),
            embodied=embodied_settings(config),
            max_workloads=config.workload_max_series,
            gpu_expected=config.gpu_expect,
        )
    )
    return sampler, lambda: reader.close(cgroups)
