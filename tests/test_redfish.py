"""The node's input from a real Redfish server on loopback: sushy-tools' static emulator
(sushy-static, from PyPI) serving a mockup this test writes and changes over time (the
few resources of DMTF's public-rackmount1 that are read: the chassis collection, one
chassis, its EnvironmentMetrics and its Power). A BMC that answers in 5 s or not at all
is a socket that never answers."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clock_fakes import NodeClocks
from test_platform import J, Scripted, collector, devices, diff, platform_parts
from test_web_security import Pki, pki  # noqa: F401 (the fixture)
from wattprint.config.options import ConfigError, build_config
from wattprint.core.model import GpuProcess, Workload
from wattprint.parts import build_sources
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources import registry
from wattprint.sources.redfish import STALE_AFTER_S, RedfishError, RedfishSource, tls_context

A = Workload("slurm", "7")
CHASSIS = "1U"


def sushy_static() -> str:
    found = shutil.which("sushy-static") or shutil.which(
        "sushy-static", path=str(Path(sys.executable).parent)
    )
    if found is None:
        message = "sushy-static is not installed (pip install sushy-tools: the [test] extra)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mockup:
    """The BMC's resources as files, served by sushy-static as they stand at each GET."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.put("", {"@odata.id": "/redfish/v1", "Chassis": {"@odata.id": "/redfish/v1/Chassis"}})
        self.put(
            "Chassis",
            {
                "Members": [{"@odata.id": f"/redfish/v1/Chassis/{CHASSIS}"}],
                "Members@odata.count": 1,
            },
        )
        self.put(f"Chassis/{CHASSIS}", {"Id": CHASSIS, "ChassisType": "RackMount"})

    def put(self, path: str, document: dict[str, Any]) -> None:
        directory = self.root / path
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / "index.json.tmp"
        tmp.write_text(json.dumps(document))
        tmp.replace(directory / "index.json")  # whole, never half-written under a GET

    def environment(self, energy_kwh: float | None = None, power_w: float | None = None) -> None:
        doc: dict[str, Any] = {"Id": "EnvironmentMetrics"}
        if energy_kwh is not None:
            doc["EnergykWh"] = {"Reading": energy_kwh}
        if power_w is not None:
            doc["PowerWatts"] = {"Reading": power_w}
        self.put(f"Chassis/{CHASSIS}/EnvironmentMetrics", doc)

    def power_control(self, watts: float) -> None:
        control = {"MemberId": "0", "Name": "System Input Power", "PowerConsumedWatts": watts}
        self.put(f"Chassis/{CHASSIS}/Power", {"Id": "Power", "PowerControl": [control]})


@contextlib.contextmanager
def serving(mockup: Mockup, tmp_path: Path, tls: Pki | None = None) -> Iterator[str]:
    port = free_port()
    args = [sushy_static(), "-i", "127.0.0.1", "-p", str(port), "-m", str(mockup.root)]
    if tls is not None:
        args += ["-c", str(tls.server_cert), "-k", str(tls.server_key)]
    log = (tmp_path / f"sushy-{port}.log").open("w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its request log, whole at a kill
    server = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert server.poll() is None, (tmp_path / f"sushy-{port}.log").read_text()
            assert time.monotonic() < deadline, "sushy-static did not start"
            time.sleep(0.05)
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)
        log.close()


def wait_for(source: RedfishSource, check: Callable[[Any], bool]) -> None:
    """Until the poller's latest answer passes `check` (it polls every 10 ms)."""
    deadline = time.monotonic() + 10
    while True:
        with source._lock:
            answer = source._answer
        if answer is not None and check(answer):
            return
        assert time.monotonic() < deadline, f"no such answer; last failure: {source.failure}"
        time.sleep(0.01)


class BmcNode:
    """One GPU held by A, and the node's input from the BMC, on a fake clock."""

    def __init__(self, url: str, **source: Any) -> None:
        self.clocks = NodeClocks(mono=100.0)
        self.gpu = Scripted("nvml", "gpu", {"0": 0})
        self.gpu.holders = {"0": (GpuProcess(1, sm_util=90, identity=A),)}
        self.cpu = Scripted("rapl", "cpu", {"0": 0})
        self.bmc = RedfishSource(url, clock=self.clocks.monotonic, poll_s=0.01, **source)
        self.sampler = Sampler(SamplerParts(sources=[self.gpu, self.cpu, self.bmc]))
        self.clocks.install(self.sampler)

    def close(self) -> None:
        self.bmc.close()


# A node's second-by-second input over a job: (GPU W, CPU W, node W).
TRACE = [(640, 180, 1310), (700, 190, 1420), (120, 90, 610), (655, 200, 1390), (690, 185, 1405)]


def test_the_bmc_energy_counter_is_the_nodes_and_conserved_per_sample(tmp_path: Path) -> None:
    mockup = Mockup(tmp_path / "mockup")
    kwh = 812.25
    mockup.environment(energy_kwh=kwh, power_w=1300)
    with serving(mockup, tmp_path) as url:
        node = BmcNode(url)
        try:
            wait_for(node.bmc, lambda a: a.energy_kwh == kwh)
            before = node.sampler.sample_once()
            wall_total = 0
            for gpu_w, cpu_w, node_w in TRACE * 4:
                kwh += node_w / 3.6e6
                wall_total += node_w
                mockup.environment(energy_kwh=kwh, power_w=node_w)
                wait_for(node.bmc, lambda a, k=kwh: a.energy_kwh == k)  # type: ignore[misc]
                node.clocks.advance(1.0)
                node.gpu.energy["0"] += gpu_w * J
                node.cpu.energy["0"] += cpu_w * J
                after = node.sampler.sample_once()
                d = diff(devices(after), devices(before))
                parts = diff(platform_parts(after), platform_parts(before))
                assert sum(parts.values()) == d["platform"]  # exactly, per sample
                assert d["gpu"] + d["cpu"] + d["platform"] == d["node"]
                assert collector(after, "redfish")[0] and collector(after, "platform")[0]
                before = after
            exported = next(x.energy_uj for x in after.devices if x.component == "node")
            assert abs(exported / J - wall_total) <= 0.01 * wall_total
            method = next(x.method for x in after.devices if x.component == "platform")
            assert method == "redfish_energy_counter" and not registry.is_estimated(method)
        finally:
            node.close()


def test_bmc_power_is_integrated_over_the_samplers_intervals(tmp_path: Path) -> None:
    mockup = Mockup(tmp_path / "mockup")
    mockup.environment(power_w=1000)
    with serving(mockup, tmp_path) as url:
        node = BmcNode(url)
        try:
            wait_for(node.bmc, lambda a: a.power_w == 1000)
            node.sampler.sample_once()
            expected, last = 0.0, 1000.0
            for _, _, node_w in TRACE * 4:
                mockup.environment(power_w=node_w)
                wait_for(node.bmc, lambda a, w=node_w: a.power_w == w)  # type: ignore[misc]
                node.clocks.advance(1.0)
                snapshot = node.sampler.sample_once()
                expected += (last + node_w) / 2
                last = node_w
            exported = next(x.energy_uj for x in snapshot.devices if x.component == "node")
            assert abs(exported / J - expected) <= 0.01 * expected
            method = next(x.method for x in snapshot.devices if x.component == "node")
            assert method == "redfish_power_integrated" and registry.is_estimated(method)
        finally:
            node.close()


def test_an_older_bmc_is_read_through_its_power_resource(tmp_path: Path) -> None:
    """No EnvironmentMetrics (404): Power.PowerControl[].PowerConsumedWatts."""
    mockup = Mockup(tmp_path / "mockup")
    mockup.power_control(344)
    with serving(mockup, tmp_path) as url:
        bmc = RedfishSource(url, poll_s=0.01)
        try:
            wait_for(bmc, lambda a: a.power_w == 344)
            assert bmc.chassis == CHASSIS  # the first the collection lists
            assert bmc.explain() == [
                f"node: redfish ({url}/redfish/v1/Chassis/1U): input power 344.0 W, "
                "integrated (redfish_power_integrated, estimated)"
            ]
        finally:
            bmc.close()


def test_credentials_come_from_files_and_are_sent(tmp_path: Path) -> None:
    mockup = Mockup(tmp_path / "mockup")
    mockup.environment(power_w=500)
    secret = tmp_path / "password"
    secret.write_text("bmc-pass\n")
    env = {
        "WATTPRINT_REDFISH_USERNAME": "wattprint",
        "WATTPRINT_REDFISH_PASSWORD_FILE": str(secret),
    }
    with serving(mockup, tmp_path) as url:
        bmc = RedfishSource(url, environ=env, poll_s=0.01)
        try:
            wait_for(bmc, lambda a: a.power_w == 500)
        finally:
            bmc.close()
    token = base64.b64encode(b"wattprint:bmc-pass").decode()
    logged = "".join(p.read_text() for p in tmp_path.glob("sushy-*.log"))
    assert f"Authorization: Basic {token}" in logged  # sushy-static prints each request's headers
    assert "bmc-pass" not in repr(bmc.__dict__)


def test_credentials_that_cannot_work_are_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(RedfishError, match="has a password in it"):
        RedfishSource("https://admin:hunter2@bmc.example")
    with pytest.raises(RedfishError, match="set both"):
        RedfishSource("https://bmc.example", environ={"WATTPRINT_REDFISH_USERNAME": "x"})
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # must not hang the start
    env = {"WATTPRINT_REDFISH_USERNAME": "x", "WATTPRINT_REDFISH_PASSWORD_FILE": str(fifo)}
    with pytest.raises(RedfishError, match="WATTPRINT_REDFISH_PASSWORD_FILE"):
        RedfishSource("https://bmc.example", environ=env)


def test_https_checks_the_bmc_against_the_ca_unless_told_not_to(
    tmp_path: Path,
    pki: Pki,  # noqa: F811
) -> None:
    mockup = Mockup(tmp_path / "mockup")
    mockup.environment(power_w=700)
    with serving(mockup, tmp_path, tls=pki) as url:
        checked = RedfishSource(url, tls=tls_context(str(pki.ca), False), poll_s=0.01)
        unchecked = RedfishSource(url, tls=tls_context("", True), poll_s=0.01)
        untrusted = RedfishSource(url, tls=tls_context("", False), poll_s=0.01)
        try:
            wait_for(checked, lambda a: a.power_w == 700)
            wait_for(unchecked, lambda a: a.power_w == 700)
            deadline = time.monotonic() + 10
            while "CERTIFICATE_VERIFY_FAILED" not in untrusted.failure:
                assert time.monotonic() < deadline, untrusted.failure
                time.sleep(0.01)
            assert untrusted._answer is None
        finally:
            for source in (checked, unchecked, untrusted):
                source.close()


def test_a_bmc_that_never_answers_delays_no_sample_and_is_held_out(tmp_path: Path) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections are taken into the backlog and never answered
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        node = BmcNode(url)
        try:
            node.sampler.sample_once()
            for _ in range(3):
                node.clocks.advance(1.0)
                node.gpu.energy["0"] += 500 * J
                began = time.perf_counter()
                snapshot = node.sampler.sample_once()
                took = time.perf_counter() - began
                assert took < 1.0, f"a sample waited {took:.1f} s on the BMC"  # it takes 5 s
                assert collector(snapshot, "redfish")[0] is False
                assert not any(d.component in ("node", "platform") for d in snapshot.devices)
                assert not any(s.component == "platform" for s in snapshot.energy)
            assert "stale" in node.bmc.read().errors[0]
        finally:
            node.close()


def test_a_bmc_gone_quiet_is_stale_not_invented(tmp_path: Path) -> None:
    mockup = Mockup(tmp_path / "mockup")
    mockup.environment(energy_kwh=10.0)
    with serving(mockup, tmp_path) as url:
        node = BmcNode(url)
        wait_for(node.bmc, lambda a: a.energy_kwh == 10.0)
        node.sampler.sample_once()
        node.clocks.advance(1.0)
        node.gpu.energy["0"] += 500 * J
        before = node.sampler.sample_once()
    # The server is gone: the answer of 10 kWh ages past STALE_AFTER_S on the node's clock.
    try:
        node.clocks.advance(STALE_AFTER_S + 1)
        node.gpu.energy["0"] += 500 * J
        stale = node.sampler.sample_once()
        assert collector(stale, "redfish")[0] is False
        assert diff(devices(stale), devices(before)).get("platform", 0) == 0
        assert not any(diff(platform_parts(stale), platform_parts(before)).values())
    finally:
        node.close()


def test_the_flags_reach_the_source_and_a_bad_setting_is_one_line(tmp_path: Path) -> None:
    mockup = Mockup(tmp_path / "mockup")
    mockup.environment(power_w=900)
    with serving(mockup, tmp_path) as url:
        flags = {
            "platform.source": "redfish",
            "platform.redfish-url": url,
            "platform.redfish-chassis": CHASSIS,
            "gpu.source": "none",
            "cpu.source": "none",
            "memory.source": "none",
            "state.file": "",
        }
        sources, _ = build_sources(build_config(flags, environ={}))
        try:
            (bmc,) = sources
            assert isinstance(bmc, RedfishSource) and bmc.chassis == CHASSIS
            wait_for(bmc, lambda a: a.power_w == 900)
        finally:
            for source in sources:
                source.close()
    del flags["platform.redfish-url"]
    with pytest.raises(
        ConfigError, match=r"^--platform.source=redfish: no --platform.redfish-url$"
    ):
        build_sources(build_config(flags, environ={}))
    flags["platform.redfish-url"] = url
    flags["platform.redfish-ca-file"] = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match=r"^bad value for --platform\.redfish-ca-file: "):
        build_sources(build_config(flags, environ={}))


def test_a_sensors_reading_time_is_the_bmcs_clock_and_a_same_time_is_held(
    tmp_path: Path,
) -> None:
    """PowerWatts links its Sensor (DataSourceUri), whose ReadingTime (Sensor v1.1+)
    says when the BMC took the reading: one that has not moved is not new power."""
    mockup = Mockup(tmp_path / "mockup")
    uri = f"/redfish/v1/Chassis/{CHASSIS}/Sensors/PowerIn"

    def sensor(watts: float, at: str) -> None:
        doc = {"Id": "PowerIn", "Reading": watts, "ReadingUnits": "W", "ReadingTime": at}
        mockup.put(f"Chassis/{CHASSIS}/Sensors/PowerIn", doc)
        metrics = {"Id": "EnvironmentMetrics", "PowerWatts": {"DataSourceUri": uri, "Reading": 1}}
        mockup.put(f"Chassis/{CHASSIS}/EnvironmentMetrics", metrics)

    sensor(1000, "2026-12-04T10:00:00Z")
    with serving(mockup, tmp_path) as url:
        node = BmcNode(url)
        try:
            wait_for(node.bmc, lambda a: a.stamp is not None and a.power_w == 1000)
            before = node.sampler.sample_once()
            sensor(1600, "2026-12-04T10:00:00Z")  # the BMC's cached reading, time unmoved
            wait_for(node.bmc, lambda a: a.power_w == 1600)
            for _ in range(3):
                node.clocks.advance(1.0)
                node.gpu.energy["0"] += 500 * J
                held = node.sampler.sample_once()
                assert diff(devices(held), devices(before)).get("node", 0) == 0
                assert not any(diff(platform_parts(held), platform_parts(before)).values())
                assert collector(held, "redfish") == (True, 0)
            sensor(1200, "2026-12-04T10:00:04+00:00")  # 4 s on by the BMC's clock
            wait_for(node.bmc, lambda a: a.power_w == 1200)
            node.clocks.advance(1.0)
            node.gpu.energy["0"] += 500 * J
            after = node.sampler.sample_once()
            d = diff(devices(after), devices(before))
            assert d["node"] == 4400 * J  # (1000 + 1200) / 2 W over the BMC's 4 s
            assert d["platform"] == 2400 * J
            assert sum(diff(platform_parts(after), platform_parts(before)).values()) == 2400 * J
            node.clocks.advance(STALE_AFTER_S + 1)  # the BMC answers, its time unmoved
            wait_for(node.bmc, lambda a: a.at == node.clocks.mono)
            stale = node.sampler.sample_once()
            assert collector(stale, "redfish")[0] is False
            assert "ReadingTime has not moved" in node.bmc.read().errors[0]
        finally:
            node.close()


def test_credentials_from_a_secret_volume_follow_its_rotation(tmp_path: Path) -> None:
    """A Kubernetes Secret volume: each key a link into ..data, itself a link to the
    current version's directory, swapped whole when the Secret changes."""
    from wattprint.sources.redfish import credential

    volume = tmp_path / "redfish"
    volume.mkdir()
    (volume / "..v1").mkdir()
    (volume / "..v1" / "redfish-password").write_text("first")
    (volume / "..data").symlink_to("..v1")
    (volume / "redfish-password").symlink_to("..data/redfish-password")
    env = {"WATTPRINT_REDFISH_PASSWORD_FILE": str(volume / "redfish-password")}
    read = credential(env, "WATTPRINT_REDFISH_PASSWORD")
    assert read is not None and read() == "first"
    (volume / "..v2").mkdir()
    (volume / "..v2" / "redfish-password").write_text("second\n")
    (volume / "..data_tmp").symlink_to("..v2")
    (volume / "..data_tmp").replace(volume / "..data")
    assert read() == "second"
