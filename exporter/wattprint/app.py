"""The composition root: build_exporter turns a Config into an exporter, ready to start.

`wattprint` (cli.main.run), `wattprint run` and a tracker's sampler (both through
jobs.run.start_local_sampler) all build with it, in start-up order: the node lock, the
HTTP server (serving at once if asked), carbon, sources, identity, state and sampler.
What it returns is complete: start() runs it, stop() ends it and gives back the lock.

This module imports only what the HTTP server needs: it listens before it loads the
parts (parts.py), which are most of the start-up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from wattprint.config.options import Config, ConfigError
from wattprint.durability.nodelock import NodeLock, lock_path
from wattprint.export.collector import SnapshotCollector
from wattprint.export.scraper import LIVE
from wattprint.export.server import ExporterApp, ExporterServer

if TYPE_CHECKING:
    import ssl

    from wattprint.carbon.service import CarbonService
    from wattprint.core.model import Snapshot, Source
    from wattprint.export.webconfig import WebConfig
    from wattprint.host.identity.kubernetes import KubernetesPods
    from wattprint.sampler.loop import Sampler

# The logger cli and jobs log under: the node lock's warnings keep their source=wattprint.
log = logging.getLogger("wattprint")


@dataclass(frozen=True)
class LockPlan:
    """Which node lock to take: the first of `paths` that can be written."""

    paths: tuple[str, ...]
    # A job's sampler (`wattprint run`, a tracker's) names the address it bound (port 0
    # picks one) once it serves, and none before, so that no reader tries port 0; the
    # node's exporter names its configured address at once.
    job: bool = False

    @classmethod
    def exporter(cls, config: Config) -> LockPlan | None:
        """One exporter per node: a second would count every device and job again."""
        return cls((lock_path(config.state_file),)) if config.state_file else None

    @classmethod
    def for_job(cls, paths: Sequence[str]) -> LockPlan | None:
        """One sampler per node for `wattprint run` and trackers, where no exporter runs."""
        return cls(tuple(paths), job=True) if paths else None


class SamplerSlot:
    """The sampler, as the HTTP layer sees it: until build_exporter fills the slot (once),
    /metrics has the build info and /healthz says 503, as while the first sample is read."""

    def __init__(self) -> None:
        self._sampler: Sampler | None = None

    def fill(self, sampler: Sampler) -> None:
        assert self._sampler is None, "filled once, by build_exporter"
        self._sampler = sampler

    def latest(self) -> Snapshot | None:
        sampler = self._sampler
        if sampler is None:
            return None
        return sampler.live if LIVE.get() else sampler.latest

    def healthy(self) -> bool:
        sampler = self._sampler
        return sampler is not None and sampler.healthy()

    def note(self) -> str:
        """Why the counters served are held still, GPUs expected and not measured."""
        sampler = self._sampler
        return "" if sampler is None else sampler.note()

    def fresh(self) -> bool:
        """A sample begun after this call, taken (or joined): /metrics?fresh."""
        sampler = self._sampler
        return sampler is not None and sampler.sample_fresh()


@dataclass
class Exporter:
    """A built exporter: start() runs it; stop() ends it and gives back what it holds."""

    config: Config
    sources: list[Source]
    sampler: Sampler
    carbon: CarbonService
    kubernetes: KubernetesPods | None
    collector: SnapshotCollector
    server: ExporterServer | None = None
    notes: list[str] = field(default_factory=list)
    # Files held across samples (procfs.ProcReader, job cgroups), given back at stop.
    closers: list[Callable[[], None]] = field(default_factory=list)
    lock: NodeLock | None = None
    listening: bool = False  # the server already serves (listen_early)
    name_bound: bool = False  # start() names the bound address in the lock (a job's)

    @property
    def address(self) -> str:
        """host:port it listens on, with the port it bound where 0 was asked for."""
        assert self.server is not None
        host = self.config.listen_address.rpartition(":")[0] or "127.0.0.1"
        return f"{host}:{self.server.port}"

    def start(self) -> None:
        # Listening first: the first sample reads and resolves every process on the node
        # (seconds with thousands), and meanwhile /healthz says 503 and /metrics serves
        # what exists (build info), as a scrape during any sample would, instead of a
        # refused connection.
        if self.server is not None and not self.listening:
            self.server.start()
        if self.lock is not None and self.name_bound:
            self.lock.announce(self.address)
        self.carbon.start()
        if self.kubernetes is not None:
            self.kubernetes.start()
        self.sampler.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.sampler.stop()  # saves the state
        self.carbon.stop()
        if self.kubernetes is not None:
            self.kubernetes.stop()
        for source in self.sources:
            source.close()
        for close in self.closers:
            close()
        if self.lock is not None:
            self.lock.release()  # last: the state saved, another exporter may take over


def build_exporter(
    config: Config,
    *,
    lock: LockPlan | None = None,
    serve: bool = True,
    listen_early: bool = False,
    web_config: bool = False,
) -> Exporter:
    """The exporter `config` describes, built in start-up order; nothing runs until start().

    lock: the node lock to take first; None takes none.
    serve: build the HTTP server on config.listen_address (tests may sample without).
    listen_early: serve while the rest is built (cli: a scrape during a slow start gets
        the build info and /healthz 503, not a refused connection).
    web_config: serve with --web.config.file's TLS, basic auth and headers.

    Raises ConfigError (one line for the user), NodeLockHeld, or the OSError of a part
    that cannot be opened; what was taken by then is given back first.
    """
    authorize, tls, headers = _web_access(config) if web_config else (None, None, {})
    with contextlib.ExitStack() as undo:
        node_lock = _take_node_lock(lock, config.listen_address) if lock else None
        if node_lock is not None:
            undo.callback(node_lock.release)
        slot = SamplerSlot()
        collector = SnapshotCollector(slot.latest, config.sample_timestamps)
        server = None
        if serve:
            app = ExporterApp(
                collector.render, slot.healthy, authorize, headers, slot.note, slot.fresh
            )
            server = _bind(config.listen_address, app, tls)
            undo.callback(server.stop)
            if listen_early:
                server.start()

        # Only now, listening: loading the parts is most of the start-up.
        from wattprint import parts

        carbon = parts.build_carbon(config)  # first: a bad zone fails before any hardware is opened
        sources, notes = parts.build_sources(config)
        undo.callback(_close_all, sources)
        resolver, kubernetes = parts.build_identity(config)
        sampler, close_reader = parts.build_sampler(
            config, sources, carbon, resolver, kubernetes, _trackers_of(node_lock, config)
        )
        if node_lock is not None:
            sampler.parts.owns_state = node_lock.check
        slot.fill(sampler)
        undo.pop_all()
    return Exporter(
        config,
        sources,
        sampler,
        carbon,
        kubernetes,
        collector,
        server,
        notes,
        closers=[close_reader],
        lock=node_lock,
        listening=listen_early and server is not None,
        name_bound=node_lock is not None and lock is not None and lock.job,
    )


def world_average_warning(config: Config) -> str | None:
    """The warning for a sampler that accounts with the world average, None otherwise."""
    from wattprint.carbon import registry

    if config.carbon_zone or registry.provider(config.carbon_provider).live:
        return None
    # The world average can be several times off for a given grid.
    return (
        "no --carbon.zone: accounting with the world average (zone WORLD); "
        "set your grid zone, e.g. --carbon.zone=DE"
    )


def _web_access(config: Config) -> WebConfig | tuple[None, None, dict[str, str]]:
    if not config.web_config_file:
        return None, None, {}
    # Only then: it loads bcrypt, YAML and (for TLS) ssl, a third of the start-up.
    from wattprint.export.webconfig import WebConfigError, load_web_config

    try:
        return load_web_config(config.web_config_file)
    except WebConfigError as err:
        raise ConfigError(str(err)) from None


def _take_node_lock(plan: LockPlan, address: str) -> NodeLock | None:
    """The first lock of the plan that can be written, or None, said in a warning.

    Raises NodeLockHeld where another exporter or sampler holds it."""
    errors: list[str | None] = []
    for path in plan.paths:
        try:
            return NodeLock.acquire(path, "" if plan.job else address)
        except OSError as err:
            errors.append(err.strerror)
    if plan.job:
        log.warning(
            "cannot take the node lock (%s): a second tracker on this node would sample again",
            ", ".join(plan.paths),
        )
    else:
        log.warning(
            "cannot take the node lock %s (%s): a second exporter on this node would "
            "go unnoticed, and restarts lose energy unless --state.file is writable",
            plan.paths[0],
            errors[0],
        )
    return None


def _bind(address: str, app: ExporterApp, tls: ssl.SSLContext | None) -> ExporterServer:
    try:
        return ExporterServer(address, app, tls)
    except OSError as err:
        raise ConfigError(
            f"cannot listen on --web.listen-address={address}: {err.strerror}"
        ) from None


def _trackers_of(node_lock: NodeLock | None, config: Config) -> str | None:
    # Trackers register beside the node lock: the one taken, else the one the state file
    # names (where it could not be taken, or none was asked for).
    if node_lock is not None:
        return node_lock.path
    return lock_path(config.state_file) if config.state_file else None


def _close_all(sources: list[Source]) -> None:
    for source in sources:
        source.close()
