"""Wiring: puts the parts (parts.py) a Config describes together with the HTTP server."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from wattprint import parts
from wattprint.carbon.service import CarbonService
from wattprint.config.options import Config
from wattprint.core.model import Source
from wattprint.durability.nodelock import lock_path
from wattprint.export.collector import SnapshotCollector
from wattprint.export.server import ExporterApp, ExporterServer
from wattprint.host.identity.kubernetes import KubernetesPods
from wattprint.sampler.loop import Sampler

log = logging.getLogger(__name__)


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
    carbon = parts.build_carbon(config)  # first: a bad zone fails before any hardware is opened
    sources, notes = parts.build_sources(config)
    resolver, kubernetes = parts.build_identity(config)
    # Trackers inside jobs (wattprint.track()) name their processes beside the lock.
    trackers_of = lock_path(config.state_file) if config.state_file else None
    sampler, close_reader = parts.build_sampler(
        config, sources, carbon, resolver, kubernetes, trackers_of
    )
    collector = SnapshotCollector(lambda: sampler.latest, config.sample_timestamps)
    server = None
    if serve:
        app = ExporterApp(collector.render, sampler.healthy, authorize, headers)
        server = ExporterServer(config.listen_address, app, tls)  # type: ignore[arg-type]
    return Exporter(
        config, sources, sampler, carbon, kubernetes, collector, server, notes, [close_reader]
    )
