"""Wiring: turns a Config into sources, identity, carbon, sampler and HTTP server."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from wattprint.attribution.embodied import EmbodiedSettings
from wattprint.carbon import registry as carbon_registry
from wattprint.carbon.base import CarbonConfigError, CarbonSettings, UnknownZoneError
from wattprint.carbon.service import CarbonService
from wattprint.config.options import Config, ConfigError
from wattprint.core.model import CollectorStatus, Source, fields_from
from wattprint.durability.statefile import StateFile, read_boot_id
from wattprint.export.collector import SnapshotCollector
from wattprint.export.server import ExporterApp, ExporterServer
from wattprint.host.cgroupfs import CgroupAccounting, CgroupFs
from wattprint.host.identity.kubernetes import KubernetesPods
from wattprint.host.identity.resolver import IdentityResolver
from wattprint.host.procfs import ProcReader, ProcTable
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources.registry import COMPONENTS, SourceContext, SourceUnavailable
from wattprint.sources.select import choose

log = logging.getLogger(__name__)


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
    }
    try:
        for component in COMPONENTS:
            source, why = choose(modes[component], source_context(config, component))
            if source is None:
                notes.append(why)
            elif source not in sources:
                sources.append(source)
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


@dataclass
class Exporter:
    config: Config
    sources: list[Source]
    sampler: Sampler
    carbon: CarbonService
    kubernetes: KubernetesPods | None
    collector: SnapshotCollector
    server: ExporterServer | None = None
    notes: list[str] = field(default_factory=list)
    # Files held across samples (procs.ProcReader, job cgroups), given back at stop.
    closers: list[Callable[[], None]] = field(default_factory=list)

    def start(self, serve: bool = True) -> None:
        # Listening first: the first sample reads and resolves every process on the node
        # (seconds with thousands), and meanwhile /healthz says 503 and /metrics serves
        # what exists (build info), as a scrape during any sample would, instead of a
        # refused connection.
        if serve and self.server is not None:
            self.server.start()
        self.carbon.start()
        if self.kubernetes is not None:
            self.kubernetes.start()
        self.sampler.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.sampler.stop()
        self.carbon.stop()
        if self.kubernetes is not None:
            self.kubernetes.stop()
        for source in self.sources:
            source.close()
        for close in self.closers:
            close()


def build_exporter(
    config: Config,
    authorize: Callable[[str | None], bool] | None = None,
    tls: object | None = None,
    serve: bool = True,
    headers: Mapping[str, str] | None = None,
) -> Exporter:
    carbon = build_carbon(config)  # first: a bad zone fails before any hardware is opened
    sources, notes = build_sources(config)
    resolver, kubernetes = build_identity(config)
    procfs_root = config.procfs_root
    tracked = None
    if config.state_file:
        # Trackers inside jobs (wattprint.track()) name their processes beside the lock.
        from wattprint.durability.nodelock import lock_path
        from wattprint.host.identity.tracked import TrackedResolver, registry_dir

        tracked = TrackedResolver(resolver, registry_dir(lock_path(config.state_file)), procfs_root)
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
            resolver=tracked or resolver,
            carbon=carbon,
            extra_status=extra_status,
            pue=config.pue,
            interval=config.sample_interval,
            retention=config.workload_retention,
            state=StateFile(config.state_file) if config.state_file else None,
            boot_id=read_boot_id(config.procfs_root),
            embodied=embodied_settings(config),
            max_workloads=config.workload_max_series,
        )
    )
    collector = SnapshotCollector(lambda: sampler.latest, config.sample_timestamps)
    server = None
    if serve:
        app = ExporterApp(collector.render, sampler.healthy, authorize, headers)
        server = ExporterServer(config.listen_address, app, tls)  # type: ignore[arg-type]
    closers = [lambda: reader.close(cgroups)]
    return Exporter(config, sources, sampler, carbon, kubernetes, collector, server, notes, closers)
