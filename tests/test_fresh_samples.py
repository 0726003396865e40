"""Samples on request (/metrics?fresh, a tracker's flush and stop): who gets them, how
often they are taken however often a client asks, and that they write no state
while scrapers are served only what a restart resumes from."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from wattprint.core.model import DeviceReading, Snapshot, SourceResult
from wattprint.durability.statefile import StateFile
from wattprint.export.scraper import LIVE
from wattprint.export.server import ExporterApp, _Connection
from wattprint.sampler.loop import FRESH_BURST, FRESH_PER_INTERVAL, Sampler, SamplerParts

J = 1_000_000


class Gpu:
    """One GPU drawing 1 J per read, with a hardware counter that outlives the sampler."""

    name = "gpu"

    def __init__(self, delay: float = 0.0) -> None:
        self.reads = 0
        self.delay = delay

    def read(self) -> SourceResult:
        self.reads += 1
        time.sleep(self.delay)
        energy = self.reads * J
        reading = DeviceReading("gpu", "0", energy, 100.0, "nvml-energy", raw_uj=energy)
        return SourceResult(devices=[reading])

    def explain(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def _ask(address: tuple[str, int], header: str = "") -> tuple[str, int, bool]:
    """One GET /metrics?fresh from `address`, served by a real _Connection over a socket
    pair; the answer's head, how many samples the sampler was asked for, and whether
    the latest sample (saved or not) was served."""
    asked, live = [], []

    def fresh() -> bool:
        asked.append(1)
        return True

    def render(_: bool) -> bytes:
        live.append(LIVE.get())
        return b"x 1\n"

    app = ExporterApp(render, lambda: True, fresh=fresh)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(
            f"GET /metrics?fresh HTTP/1.1\r\nHost: n\r\n{header}Connection: close\r\n\r\n".encode()
        )
        connection = _Connection(theirs, address, app)
        server = threading.Thread(target=connection.serve)
        server.start()
        server.join(10)
        head = ours.recv(65536).decode("latin-1").split("\r\n\r\n")[0]
    return head, len(asked), live == [True]


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1", "192.0.2.7", "2001:db8::7"])
def test_a_job_meter_gets_a_sample_taken_for_it_from_the_host_or_a_pod(peer: str) -> None:
    # A tracker in a pod reaches the node's exporter from its own address: its flush()
    # needs a sample too (the sampler's rate cap, not the peer, bounds the cost).
    head, asked, live = _ask((peer, 40000))
    assert asked == 1 and "X-Wattprint-Fresh: 1" in head and live


def test_a_scraper_asking_for_a_sample_gets_the_saved_counters() -> None:
    # Prometheus stores what it is served: never a sample a restart would not resume from.
    head, asked, live = _ask(("127.0.0.1", 40000), "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n")
    assert asked == 0 and not live and "X-Wattprint-Fresh" not in head


def test_asking_in_a_loop_takes_a_bounded_number_of_samples() -> None:
    gpu = Gpu()
    sampler = Sampler(SamplerParts(sources=[gpu], interval=1.0))
    sampler.sample_once()
    before, ends = gpu.reads, time.monotonic() + 1.0
    answered = 0
    while time.monotonic() < ends:
        answered += sampler.sample_fresh(timeout=ends - time.monotonic())
    taken = gpu.reads - before
    # The burst at once, then one per interval / FRESH_PER_INTERVAL: in one interval at
    # most FRESH_BURST + FRESH_PER_INTERVAL, where a sample of microseconds spaced by its
    # own duration alone (the old bound) gave thousands.
    assert 1 <= taken <= FRESH_BURST + FRESH_PER_INTERVAL
    assert answered >= taken  # each caller served, by a sample of its own or a shared one


def test_flushes_in_a_row_on_a_slowly_sampled_node_each_get_a_sample_in_time() -> None:
    # Sampled every 20 s, a job's flush() after the burst waited interval / 4 = 5 s, the
    # tracker's whole deadline: its row was left unfinished. One a second at least.
    sampler = Sampler(SamplerParts(sources=[Gpu()], interval=20.0))
    sampler.sample_once()
    for _ in range(FRESH_BURST + 3):
        asked = time.monotonic()
        assert sampler.sample_fresh(timeout=2.0)
        assert time.monotonic() - asked < 2.0


def _counters(snapshot: Snapshot | None) -> dict[tuple[str, str], int]:
    assert snapshot is not None
    counters = {(d.component, d.device): d.energy_uj for d in snapshot.devices}
    for series in snapshot.energy:
        counters[(series.component, repr(series.workload))] = series.energy_uj
    return counters


def test_fresh_samples_write_no_state_and_no_scraper_sees_them(tmp_path: Path) -> None:
    state = StateFile(str(tmp_path / "state.json"))
    saves = []
    save = state.save
    state.save = lambda data, sync=False: (saves.append(1), save(data, sync))[1]  # type: ignore[method-assign]
    gpu = Gpu()
    parts = SamplerParts(sources=[gpu], interval=1.0, state=state, boot_id="boot")
    sampler = Sampler(parts)
    sampler.sample_once()
    sampler.sample_once()
    saved = sampler.latest
    assert len(saves) == 2
    for _ in range(FRESH_BURST):
        assert sampler.sample_fresh()
    # No write at the caller's rate: the periodic samples keep the file's cadence.
    assert len(saves) == 2
    # The job meter that asked gets its sample; scrapers the one saved, which a
    # restart resumes from.
    assert sampler.live is not None and saved is not None
    assert sampler.live.time > saved.time and sampler.latest is saved
    assert _counters(sampler.live)[("gpu", "0")] > _counters(saved)[("gpu", "0")]

    # Killed now (no stop(), no save): the restart serves no counter below one served.
    restarted = StateFile(state.path)
    again = Sampler(SamplerParts(sources=[gpu], interval=1.0, state=restarted, boot_id="boot"))
    resumed = _counters(again.sample_once())
    assert dict(again.latest.restarts) == {"resumed": 1}  # type: ignore[union-attr]
    for key, value in _counters(saved).items():
        assert resumed[key] >= value, key
    # And every joule once: the device's counter from its first read to the last.
    assert resumed[("gpu", "0")] == (gpu.reads - 1) * J

    # The next periodic sample saves all the fresh ones measured, and is served.
    sampler.sample_once()
    assert len(saves) == 3 and sampler.latest is sampler.live
