"""The node's input from the BMC's DCMI power reading, in band, through ipmitool.

OpenIPMI's simulator (Debian's `openipmi`, ipmi_sim 1.0.13) does not serve DCMI: asked
`ipmitool raw 0x2c 0x02 0xdc 0x01 0x00 0x00` over its LAN interface it answers completion
code 0xc1 (checked by hand; FAIL_SIM below is what ipmitool printed). So the hardware
boundary here is a fake `ipmitool` on PATH that replays what ipmitool prints for a real
BMC's answer, and can be made slow, hang, fail or say the measurement is not active.
The recorded answer (RECORDED) is a Dell server's BMC reading as decoded in
wdes/ipmitool-dcmi-power-reading's README (214 W now, 2 W min, 468 W max, 184 W average,
IPMI timestamp 2024-05-05 13:06:44 UTC, 1000 ms period, activated), laid out as DCMI 1.5
table 6-16 and printed as `ipmitool raw` prints a response: " %02x" a byte, 16 a line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clock_fakes import NodeClocks
from test_platform import J, Scripted, collector, devices, diff, platform_parts
from wattprint.config.options import ConfigError, build_config
from wattprint.core.model import GpuProcess, Workload
from wattprint.parts import build_sources
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources import registry
from wattprint.sources.ipmi import (
    POWER_READING,
    IpmiError,
    IpmiSource,
    PowerReading,
    parse_power_reading,
)
from wattprint.sources.redfish import STALE_AFTER_S

A = Workload("slurm", "9")
RECORDED = " dc d6 00 02 00 d4 01 b8 00 64 84 37 66 e8 03 00\n 00 40\n"
RECORDED_AT = 1714914404  # 2024-05-05 13:06:44 UTC
FAIL_SIM = (
    "Unable to send RAW command (channel=0x0 netfn=0x2c lun=0x0 cmd=0x2 rsp=0xc1): "
    "Invalid command\n"
)
NO_DEVICE = (  # this machine's ipmitool 1.8.19, without /dev/ipmi0
    "Could not open device at /dev/ipmi0 or /dev/ipmi/0 or /dev/ipmidev/0: "
    "No such file or directory\n"
)


def raw_bytes(watts: int, stamp: int, active: bool = True) -> str:
    """What `ipmitool raw` prints for a power reading of `watts` at the BMC's `stamp`."""
    data = bytes([0xDC]) + watts.to_bytes(2, "little") + (2).to_bytes(2, "little")
    data += (watts + 40).to_bytes(2, "little") + watts.to_bytes(2, "little")
    data += stamp.to_bytes(4, "little") + (1000).to_bytes(4, "little")
    data += bytes([0x40 if active else 0x00])
    return (
        "".join(("\n" if i and i % 16 == 0 else "") + f" {b:02x}" for i, b in enumerate(data))
        + "\n"
    )


def test_the_recorded_answer_is_decoded_as_the_bmc_said() -> None:
    assert parse_power_reading(RECORDED) == PowerReading(214, 2, 468, 184, RECORDED_AT, 1000, True)
    assert raw_bytes(214, RECORDED_AT).split()[:3] == RECORDED.split()[:3]
    assert parse_power_reading(raw_bytes(700, 5, active=False)).active is False
    for bad, why in [
        ("", "not hex"),
        (" dc 01 02\n", "3 bytes"),
        (RECORDED.replace("dc", "00", 1), "group extension 0x00"),
        ("Instantaneous power reading: 214 Watts", "not hex"),
    ]:
        with pytest.raises(IpmiError, match=why):
            parse_power_reading(bad)


class FakeIpmitool:
    """An `ipmitool` executable on PATH answering as the state file says, each call
    logged (argv, pid) for the test to check."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.state, self.log, self.path = root / "state.json", root / "calls", root / "ipmitool"
        self.path.write_text(
            f"#!{sys.executable} -IS\n"
            "import json, os, sys, time\n"
            f"with open({str(self.log)!r}, 'a') as f:\n"
            "    f.write(json.dumps([os.getpid(), sys.argv[1:]]) + '\\n')\n"
            f"s = json.load(open({str(self.state)!r}))\n"
            "time.sleep(s['delay'])\n"
            "sys.stdout.write(s['stdout']); sys.stderr.write(s['stderr']); sys.exit(s['rc'])\n"
        )
        self.path.chmod(0o755)
        self.answer(RECORDED)

    def answer(self, stdout: str, stderr: str = "", rc: int = 0, delay: float = 0.0) -> None:
        doc = {"stdout": stdout, "stderr": stderr, "rc": rc, "delay": delay}
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.state)  # whole, never half-written under a call

    def reading(self, watts: int, stamp: int, active: bool = True) -> None:
        self.answer(raw_bytes(watts, stamp, active))

    def calls(self) -> list[tuple[int, list[str]]]:
        if not self.log.exists():
            return []
        return [tuple(json.loads(line)) for line in self.log.read_text().splitlines()]  # type: ignore[misc]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIpmitool]:
    tool = FakeIpmitool(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tool.path.parent}{os.pathsep}{os.environ['PATH']}")
    yield tool


def wait_for(source: IpmiSource, check: Callable[[Any], bool], what: str = "") -> None:
    deadline = time.monotonic() + 15
    while True:
        with source._lock:
            answer, failure = source._answer, source.failure
        if check((answer, failure)):
            return
        assert time.monotonic() < deadline, f"no {what}; last failure: {failure}"
        time.sleep(0.01)


def power(snapshot: Any) -> dict[str, float | None]:
    return {d.component: d.power_w for d in snapshot.devices if d.component != "gpu"}


def stamped(stamp: int) -> Callable[[Any], bool]:
    return lambda af: af[0] is not None and af[0].reading.timestamp == stamp and not af[1]


class IpmiNode:
    """One GPU held by A, a CPU, and the node's input from the BMC, on a fake clock."""

    def __init__(self, fake: FakeIpmitool, **source: Any) -> None:
        self.clocks = NodeClocks(mono=100.0)
        self.gpu = Scripted("nvml", "gpu", {"0": 0})
        self.gpu.holders = {"0": (GpuProcess(1, sm_util=90, identity=A),)}
        self.cpu = Scripted("rapl", "cpu", {"0": 0})
        source.setdefault("poll_s", 0.01)
        self.bmc = IpmiSource(str(fake.path), clock=self.clocks.monotonic, **source)
        self.sampler = Sampler(SamplerParts(sources=[self.gpu, self.cpu, self.bmc]))
        self.clocks.install(self.sampler)

    def step(self, gpu_w: int, cpu_w: int, seconds: float = 1.0) -> Any:
        self.clocks.advance(seconds)
        self.gpu.energy["0"] += gpu_w * J
        self.cpu.energy["0"] += cpu_w * J
        return self.sampler.sample_once()

    def close(self) -> None:
        self.bmc.close()


# A node's second-by-second input over a job: (GPU W, CPU W, node W).
TRACE = [(640, 180, 1310), (700, 190, 1420), (120, 90, 610), (655, 200, 1390), (690, 185, 1405)]


def test_the_bmc_power_is_integrated_over_its_own_intervals_and_conserved(
    fake: FakeIpmitool,
) -> None:
    stamp = RECORDED_AT
    fake.reading(1405, stamp)
    node = IpmiNode(fake)
    try:
        wait_for(node.bmc, stamped(stamp))
        before = node.sampler.sample_once()
        wall_total = rest_total = 0
        for gpu_w, cpu_w, node_w in TRACE * 4:
            stamp += 1
            wall_total += node_w
            rest_total += node_w - gpu_w - cpu_w
            fake.reading(node_w, stamp)
            wait_for(node.bmc, stamped(stamp))
            after = node.step(gpu_w, cpu_w)
            d = diff(devices(after), devices(before))
            parts = diff(platform_parts(after), platform_parts(before))
            assert sum(parts.values()) == d["platform"]  # workloads + unattributed, exactly
            assert d["gpu"] + d["cpu"] + d["platform"] == d["node"]
            assert collector(after, "ipmi")[0] and collector(after, "platform")[0]
            before = after
        exported = next(x.energy_uj for x in after.devices if x.component == "node")
        assert abs(exported / J - wall_total) <= 0.01 * wall_total
        platform = next(x.energy_uj for x in after.devices if x.component == "platform")
        assert abs(platform / J - rest_total) <= 0.01 * rest_total
        method = next(x.method for x in after.devices if x.component == "platform")
        assert method == "ipmi_dcmi_power_integrated" and registry.is_estimated(method)
    finally:
        node.close()
    _, argv = fake.calls()[0]
    assert argv == ["-I", "open", "-d", "0", *POWER_READING]


def test_a_reading_whose_timestamp_did_not_move_is_not_new_power(fake: FakeIpmitool) -> None:
    fake.reading(1000, 500)
    node = IpmiNode(fake)
    try:
        wait_for(node.bmc, stamped(500))
        before = node.sampler.sample_once()
        # The BMC keeps answering its cached reading (same timestamp) for 3 s, at a new
        # power even: held, said as nothing wrong yet, no platform share invented.
        fake.reading(1600, 500)
        wait_for(node.bmc, lambda af: af[0] is not None and af[0].reading.current_w == 1600)
        for _ in range(3):
            held = node.step(400, 100)
            assert diff(devices(held), devices(before)).get("node", 0) == 0
            assert diff(devices(held), devices(before)).get("platform", 0) == 0
            assert not any(diff(platform_parts(held), platform_parts(before)).values())
            assert collector(held, "ipmi") == (True, 0)
            assert power(held)["node"] == power(before)["node"] is not None  # still served
        # Its next reading, 4 s later by its clock: 1000 -> 1200 W over 4 s.
        fake.reading(1200, 504)
        wait_for(node.bmc, stamped(504))
        after = node.step(400, 100)
        d = diff(devices(after), devices(before))
        assert d["node"] == 4400 * J
        assert d["platform"] == (4400 - 4 * 500) * J
        parts = diff(platform_parts(after), platform_parts(before))
        assert parts == {A: 1920 * J, None: 480 * J}  # by the components' use over 4 s
        # Between the BMC's refreshes the node's and the platform's power stand: a gauge
        # that came and went would leave gaps in every panel.
        standing = node.step(400, 100)
        assert power(standing) == power(after) and power(after)["platform"] is not None
        # Quiet past STALE_AFTER_S: stale, said, still nothing invented.
        stale = node.step(400, 100, STALE_AFTER_S + 1)
        assert collector(stale, "ipmi")[0] is False
        assert "stale" in node.bmc.read().errors[0]
        assert diff(devices(stale), devices(after)).get("node", 0) == 0
        assert power(stale)["node"] is None and power(stale)["platform"] is None
    finally:
        node.close()


def test_after_a_bmc_silent_for_minutes_the_platform_starts_over_not_at_0(
    fake: FakeIpmitool,
) -> None:
    # A gap longer than MAX_BRIDGE_S is not bridged: the platform of the gap is not
    # known. The chips' energy of the gap must not then be set against the readings
    # that follow (before: the platform counted 0 for 10 readings, and an error).
    fake.reading(1000, 500)
    node = IpmiNode(fake)
    try:
        wait_for(node.bmc, stamped(500))
        node.sampler.sample_once()
        for _ in range(70):  # 70 s without a new reading: stale, then not bridged
            node.step(400, 100)
        stamp = 600
        fake.reading(1000, stamp)
        wait_for(node.bmc, stamped(stamp))
        before = node.step(400, 100)  # the reading after the gap: a baseline
        for _ in range(12):
            stamp += 1
            fake.reading(1000, stamp)
            wait_for(node.bmc, stamped(stamp))
            after = node.step(400, 100)
            d = diff(devices(after), devices(before))
            assert d["node"] == 1000 * J and d["platform"] == 500 * J
            assert sum(diff(platform_parts(after), platform_parts(before)).values()) == 500 * J
            assert collector(after, "platform")[0]
            before = after
    finally:
        node.close()


def test_a_bmc_clock_set_meanwhile_falls_back_to_this_nodes_interval(fake: FakeIpmitool) -> None:
    fake.reading(1000, 500)
    node = IpmiNode(fake)
    try:
        wait_for(node.bmc, stamped(500))
        before = node.sampler.sample_once()
        fake.reading(1000, 500 + 86_400)  # the BMC's clock set a day ahead
        wait_for(node.bmc, stamped(500 + 86_400))
        node.clocks.advance(1.0)
        after = node.sampler.sample_once()
        assert diff(devices(after), devices(before))["node"] == 1000 * J
    finally:
        node.close()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"stdout": raw_bytes(900, 600, active=False)}, "not active"),
        ({"stdout": "", "stderr": FAIL_SIM, "rc": 1}, "rsp=0xc1): Invalid command"),
        ({"stdout": "", "stderr": NO_DEVICE, "rc": 1}, "Could not open device"),
    ],
)
def test_a_reading_not_active_or_failing_is_said_and_held_out(
    fake: FakeIpmitool, answer: dict[str, Any], said: str
) -> None:
    fake.reading(900, 599)
    node = IpmiNode(fake)
    try:
        wait_for(node.bmc, stamped(599))
        before = node.sampler.sample_once()
        fake.answer(**answer)
        wait_for(
            node.bmc,
            lambda af: bool(af[1]) or (af[0] is not None and not af[0].reading.active),
        )
        bad = node.step(400, 100)
        assert collector(bad, "ipmi")[0] is False
        assert said in node.bmc.read().errors[0]
        assert diff(devices(bad), devices(before)).get("platform", 0) == 0
        assert not any(diff(platform_parts(bad), platform_parts(before)).values())
        fake.reading(900, 601)  # back, 2 s after the last good reading by its clock
        wait_for(node.bmc, stamped(601))
        good = node.step(400, 100)
        d = diff(devices(good), devices(before))
        assert d["node"] == 1800 * J and d["platform"] == 800 * J
        assert collector(good, "ipmi")[0] is True
    finally:
        node.close()


def test_a_bmc_that_answers_in_5_s_or_never_delays_no_sample(fake: FakeIpmitool) -> None:
    fake.reading(800, 700, active=True)
    fake.answer(raw_bytes(800, 700), delay=5.0)
    slow = IpmiNode(fake)
    try:
        slow.sampler.sample_once()
        for _ in range(3):
            began = time.perf_counter()
            slow.step(300, 100)
            took = time.perf_counter() - began
            assert took < 1.0, f"a sample waited {took:.1f} s on the BMC"
        wait_for(slow.bmc, stamped(700), "answer after 5 s")  # it did answer, late
        assert any(d.component == "node" for d in slow.step(300, 100).devices)
    finally:
        slow.close()
    fake.answer("", delay=3600)  # never answers: each call killed at its deadline
    quiet = IpmiNode(fake, deadline_s=1.0)
    try:
        quiet.sampler.sample_once()
        for _ in range(3):
            began = time.perf_counter()
            snapshot = quiet.step(300, 100)
            assert time.perf_counter() - began < 1.0
            assert not any(d.component in ("node", "platform") for d in snapshot.devices)
        wait_for(quiet.bmc, lambda af: "no answer in 1 s" in af[1], "deadline")
        assert collector(quiet.step(300, 100), "ipmi")[0] is False
    finally:
        quiet.close()


def test_a_call_under_way_is_killed_when_the_source_closes(fake: FakeIpmitool) -> None:
    fake.answer("", delay=3600)
    hung = IpmiSource(str(fake.path), deadline_s=600.0, poll_s=0.01)
    deadline = time.monotonic() + 10
    while not fake.calls():
        assert time.monotonic() < deadline, "ipmitool was never called"
        time.sleep(0.01)
    hung.close()
    deadline = time.monotonic() + 3  # well before the call's own deadline
    while any(Path(f"/proc/{pid}").exists() for pid, _ in fake.calls()):
        assert time.monotonic() < deadline, "a hung ipmitool was left running"
        time.sleep(0.05)


def test_the_flags_reach_the_source_and_a_bad_setting_is_one_line(
    fake: FakeIpmitool, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = {
        "platform.source": "ipmi",
        "platform.ipmi-device": "/dev/ipmi1",
        "gpu.source": "none",
        "cpu.source": "none",
        "memory.source": "none",
        "state.file": "",
    }
    sources, _ = build_sources(build_config(flags, environ={}))
    try:
        (bmc,) = sources
        assert isinstance(bmc, IpmiSource)
        assert bmc.explain() == [
            "node: ipmi (DCMI power reading through /dev/ipmi1): 214 W now, 184 W average "
            "over 1000 ms, measurement active, integrated (ipmi_dcmi_power_integrated, "
            "estimated)"
        ]
    finally:
        bmc.close()
    assert fake.calls()[0][1][:4] == ["-I", "open", "-d", "1"]
    with pytest.raises(ConfigError, match=r"^bad value for --platform.ipmi-device: 'eth0' is"):
        build_sources(build_config({**flags, "platform.ipmi-device": "eth0"}, environ={}))
    # Under auto, a node without the device has no platform source, and says why.
    auto = {**flags, "platform.source": "auto", "platform.ipmi-device": "/dev/ipmi97"}
    sources, notes = build_sources(build_config(auto, environ={}))
    assert sources == [] and any("no /dev/ipmi97" in note for note in notes), notes
    monkeypatch.setenv("PATH", str(fake.path.parent / "nowhere"))
    with pytest.raises(ConfigError, match=r"^--platform.source=ipmi: no ipmitool on PATH"):
        build_sources(build_config(flags, environ={}))


def test_doctor_shows_the_bmcs_first_answer_or_why_not(fake: FakeIpmitool) -> None:
    from wattprint.cli.doctor import diagnose

    flags = {
        "platform.source": "ipmi",
        "gpu.source": "none",
        "cpu.source": "none",
        "memory.source": "none",
        "state.file": "",
    }
    text = diagnose(build_config(flags, environ={}))
    assert "  node: ipmi (DCMI power reading through /dev/ipmi0): 214 W now" in text
    fake.answer("", stderr=FAIL_SIM, rc=1)
    text = diagnose(build_config(flags, environ={}))
    assert (
        "  node: ipmi (DCMI power reading through /dev/ipmi0); last call failed: Unable to "
        "send RAW command (channel=0x0 netfn=0x2c lun=0x0 cmd=0x2 rsp=0xc1): Invalid command"
    ) in text
    auto = {**flags, "platform.source": "auto", "platform.ipmi-device": "/dev/ipmi97"}
    text = diagnose(build_config(auto, environ={}))
    assert "no --platform.redfish-url; no /dev/ipmi97" in text
