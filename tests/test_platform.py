"""The platform component: the node's input energy (HPE Cray pm_counters here) less what
the GPUs, CPUs and memory used, conserved per sample and split among the workloads by
their share of the components' energy, the idle share unattributed."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from clock_fakes import NodeClocks
from conftest import require_tool
from wattprint.attribution.platform import SHORT_PATIENCE, PlatformBook, remainder, share
from wattprint.core.model import DeviceReading, GpuProcess, Snapshot, SourceResult, Workload
from wattprint.durability.statefile import StateFile
from wattprint.export.collector import SnapshotCollector
from wattprint.sampler.loop import Sampler, SamplerParts
from wattprint.sources.pm_counters import PmCountersSource

FIXTURE = Path(__file__).parent / "fixtures" / "sys" / "cray-ex"
A = Workload("slurm", "101")
B = Workload("slurm", "102")
J = 1_000_000  # uJ


# -- the arithmetic -------------------------------------------------------------------


def test_the_remainder_is_never_negative() -> None:
    assert remainder(10 * J, 7 * J) == 3 * J
    assert remainder(7 * J, 7 * J) == 0
    assert remainder(6 * J, 7 * J) is None  # an error: the caller counts 0


@given(
    st.integers(0, 10**12),
    st.dictionaries(st.sampled_from([A, B, Workload("env", "x"), None]), st.integers(0, 10**9)),
)
def test_the_split_adds_up_to_the_remainder_exactly(
    platform_uj: int, used: dict[Workload | None, int]
) -> None:
    parts = share(platform_uj, used)
    assert sum(parts.values()) == platform_uj
    assert all(v >= 0 for v in parts.values())


def test_the_split_follows_the_components_shares_idle_unattributed() -> None:
    assert share(1000, {A: 600, B: 200, None: 200}) == {A: 600, B: 200, None: 200}
    assert share(1000, {}) == {None: 1000}  # nothing used the components: all idle


def test_a_stale_node_holds_the_components_until_its_next_reading() -> None:
    book = PlatformBook()
    assert book.close(None, 5 * J) is None
    assert book.attribute(None, {A: 5 * J}) == {}
    # The next reading covers both intervals: node 14 J, components 5 + 4 J.
    assert book.close(14 * J, 4 * J) == 5 * J
    assert book.attribute(5 * J, {B: 4 * J}) == {A: 5 * J * 5 // 9 + 1, B: 5 * J * 4 // 9}
    assert book.errors_total == 0
    # Below its parts: a lag, carried; the next reading covers the rest, nothing invented
    # (node 3 + 9 J against components 4 + 5 J: 3 J of platform, not 3 + 4 J).
    assert book.close(3 * J, 4 * J) is None
    assert book.close(9 * J, 5 * J) == 3 * J
    assert book.errors_total == 0


def test_a_lagging_node_invents_no_platform_energy() -> None:
    # A cached BMC answer: the node moves every third sample only.
    book = PlatformBook()
    platform = sum(book.close(node * J, 10 * J) or 0 for node in [0, 0, 33, 0, 0, 33, 0, 0, 33])
    assert platform == 9 * J and book.errors_total == 0


def test_a_node_short_of_its_components_for_long_is_an_error_and_counts_0() -> None:
    book = PlatformBook()
    closed = [book.close(1 * J, 4 * J) for _ in range(SHORT_PATIENCE)]
    assert closed[:-1] == [None] * (SHORT_PATIENCE - 1) and closed[-1] == 0
    assert book.errors_total == 1 and "in a row" in book.last_error
    assert book.close(14 * J, 4 * J) == 10 * J  # starts afresh


# -- the sampler, with pm_counters ----------------------------------------------------


@dataclass
class Scripted:
    """A component source whose cumulative energy the test sets (already monotonic)."""

    name: str
    component: str
    energy: dict[str, int] = field(default_factory=dict)
    holders: dict[str, tuple[GpuProcess, ...]] = field(default_factory=dict)

    def read(self) -> SourceResult:
        return SourceResult(
            devices=[
                DeviceReading(
                    self.component,
                    device,
                    uj,
                    None,
                    "rapl" if self.component != "gpu" else "nvml_energy_counter",
                    processes=self.holders.get(device, ()),
                )
                for device, uj in sorted(self.energy.items())
            ]
        )

    def explain(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class CrayNode:
    """A node: two GPUs (A on 0, B on 1), a CPU nobody's processes are seen on, and its
    pm_counters tree, all driven by the test."""

    def __init__(self, tmp_path: Path, state: StateFile | None = None) -> None:
        self.sysfs = tmp_path / "sys"
        if not self.sysfs.exists():
            shutil.copytree(FIXTURE, self.sysfs)
        self.dir = self.sysfs / "cray" / "pm_counters"
        self.stamp_us = int((self.dir / "energy").read_text().split()[2])
        self.clocks = NodeClocks(mono=100.0)
        self.gpus = Scripted("nvml", "gpu", {"0": 0, "1": 0})
        self.gpus.holders = {
            "0": (GpuProcess(1, sm_util=80, identity=A),),
            "1": (GpuProcess(2, sm_util=80, identity=B),),
        }
        self.cpu = Scripted("rapl", "cpu", {"0": 0})
        self.pm = PmCountersSource(self.sysfs, clock=self.clocks.monotonic)
        self.sampler = Sampler(
            SamplerParts(sources=[self.gpus, self.cpu, self.pm], state=state, boot_id="boot-1")
        )
        self.clocks.install(self.sampler)

    def tick(self) -> None:
        self.clocks.advance(1.0)

    def write(self, name: str, value: int, unit: str = "", stamped: bool = True) -> None:
        """A counter as the controller writes it: with a unit, its timestamp (us) after."""
        self.stamp_us += 100_000  # each write is a new update
        stamp = f" {self.stamp_us} us" if unit and stamped else ""
        (self.dir / name).write_text(f"{value}{' ' + unit if unit else ''}{stamp}\n")

    def number(self, name: str) -> int:
        return int((self.dir / name).read_text().split()[0])

    def step(
        self, gpu0_j: int, gpu1_j: int, cpu_j: int, node_j: int, fresh: bool = True
    ) -> Snapshot:
        """One second in which the devices used these joules and the node `node_j`."""
        self.tick()
        self.gpus.energy["0"] += gpu0_j * J
        self.gpus.energy["1"] += gpu1_j * J
        self.cpu.energy["0"] += cpu_j * J
        if fresh:
            self.write("energy", self.number("energy") + node_j, "J")
            self.write("power", node_j, "W")
            self.write("freshness", self.number("freshness") + 10)
        return self.sampler.sample_once()


def devices(snapshot: Snapshot) -> dict[str, int]:
    return {d.component: d.energy_uj for d in snapshot.devices if d.device in ("node", "0")}


def platform_parts(snapshot: Snapshot) -> dict[Workload | None, int]:
    return {s.workload: s.energy_uj for s in snapshot.energy if s.component == "platform"}


def collector(snapshot: Snapshot, name: str) -> tuple[bool, int]:
    status = next(c for c in snapshot.collectors if c.name == name)
    return status.success, status.errors_total


def diff(after: dict, before: dict) -> dict:  # type: ignore[type-arg]
    return {k: after.get(k, 0) - before.get(k, 0) for k in after.keys() | before.keys()}


def test_node_energy_is_components_plus_platform_and_platform_is_split_exactly(
    tmp_path: Path,
) -> None:
    node = CrayNode(tmp_path)
    before = node.sampler.sample_once()
    # (gpu0, gpu1, cpu, node) joules per second: a busy node, an idle one, a spike.
    for gpu0, gpu1, cpu, wall in [(600, 200, 200, 1400), (70, 70, 100, 560), (700, 90, 310, 1900)]:
        after = node.step(gpu0, gpu1, cpu, wall)
        d = diff(devices(after), devices(before))
        assert d["node"] == wall * J
        assert d["platform"] == (wall - gpu0 - gpu1 - cpu) * J
        assert d["node"] == d["gpu"] + d["cpu"] + d["platform"] + diff_gpu1(after, before)
        parts = diff(platform_parts(after), platform_parts(before))
        assert sum(parts.values()) == d["platform"]  # workloads + unattributed, exactly
        total = gpu0 + gpu1 + cpu
        assert abs(parts[A] - d["platform"] * gpu0 / total) <= 1
        assert abs(parts[B] - d["platform"] * gpu1 / total) <= 1
        assert abs(parts[None] - d["platform"] * cpu / total) <= 1  # the CPU's: no one's
        assert collector(after, "platform") == (True, 0)
        power = next(x.power_w for x in after.devices if x.component == "platform")
        assert power == wall - total
        before = after


def diff_gpu1(after: Snapshot, before: Snapshot) -> int:
    def gpu1(s: Snapshot) -> int:
        return next(d.energy_uj for d in s.devices if d.key == ("gpu", "1"))

    return gpu1(after) - gpu1(before)


def test_a_node_reading_below_its_components_is_carried_not_invented(tmp_path: Path) -> None:
    node = CrayNode(tmp_path)
    before = node.step(500, 500, 100, 1500)
    after = node.step(500, 500, 100, 1000)  # 100 J short: a BMC lagging
    assert diff(devices(after), devices(before))["platform"] == 0
    assert not any(diff(platform_parts(after), platform_parts(before)).values())
    assert collector(after, "platform") == (True, 0)
    again = node.step(500, 500, 100, 1600)
    # Node 2600 J over both intervals, components 2200 J: 400 J, not 500.
    assert diff(devices(again), devices(before))["platform"] == 400 * J
    assert collector(again, "platform") == (True, 0)


def test_a_stale_node_reading_is_held_out_then_the_next_covers_it(tmp_path: Path) -> None:
    node = CrayNode(tmp_path)
    before = node.step(400, 0, 100, 800)
    late = node.step(400, 0, 100, 0, fresh=False)  # an update late: held, nothing wrong
    assert collector(late, "pm_counters") == (True, 0)
    assert diff(devices(late), devices(before)).get("node", 0) == 0
    node.tick()
    node.tick()
    stale = node.step(400, 0, 100, 0, fresh=False)  # no update for 4 s: stale
    assert collector(stale, "pm_counters")[0] is False
    assert "has not moved for 4 s" in node.pm.failure
    assert diff(devices(stale), devices(before))["platform"] == 0
    assert not any(diff(platform_parts(stale), platform_parts(before)).values())
    # Fresh again: 3200 J over the four seconds, 1500 J of them the components'.
    after = node.step(400, 0, 100, 3200)
    d = diff(devices(after), devices(before))
    assert d["node"] == 3200 * J and d["platform"] == 1700 * J
    parts = diff(platform_parts(after), platform_parts(before))
    assert parts == {A: 1360 * J, None: 340 * J}  # by the components' use over them
    assert collector(after, "pm_counters")[0] is True


def test_an_energy_not_refreshed_is_held_not_read_as_0_w_then_a_burst(tmp_path: Path) -> None:
    """`freshness` moves, but `energy`'s own timestamp does not (its value is the one
    counted already): each sample is held, no platform error piles up, and the next
    refreshed value covers them all."""
    node = CrayNode(tmp_path)
    before = node.step(400, 0, 100, 500)
    for _ in range(SHORT_PATIENCE + 2):
        node.clocks.advance(0.2)
        node.gpus.energy["0"] += 80 * J
        node.cpu.energy["0"] += 20 * J
        node.write("freshness", node.number("freshness") + 2)
        held = node.sampler.sample_once()
        assert diff(devices(held), devices(before)).get("node", 0) == 0
        assert collector(held, "platform") == (True, 0)
        assert collector(held, "pm_counters") == (True, 0)
    after = node.step(400, 0, 100, 1920)  # 2.4 s + 1 s of a node drawing 600 W
    d = diff(devices(after), devices(before))
    assert d["node"] == 1920 * J and d["platform"] == (1920 - 1200 - 500) * J
    assert collector(after, "platform") == (True, 0)


def test_counters_without_a_timestamp_go_by_freshness(tmp_path: Path) -> None:
    node = CrayNode(tmp_path)
    node.write("energy", 1000, "J", stamped=False)
    before = node.step(400, 0, 100, 0, fresh=False)
    node.tick()
    node.write("energy", 1500, "J", stamped=False)  # a new value, freshness unmoved
    held = node.sampler.sample_once()
    assert diff(devices(held), devices(before)).get("node", 0) == 0
    node.write("freshness", node.number("freshness") + 10)
    node.tick()
    after = node.sampler.sample_once()
    assert diff(devices(after), devices(before))["node"] == 500 * J


def test_a_controller_reset_keeps_the_node_counter_going(tmp_path: Path) -> None:
    node = CrayNode(tmp_path)
    before = node.step(300, 300, 100, 1000)
    # The power controller restarts: a new `startup`, its energy counting from 0.
    node.tick()
    node.gpus.energy["0"] += 300 * J
    node.gpus.energy["1"] += 300 * J
    node.cpu.energy["0"] += 100 * J
    node.write("startup", node.number("startup") + 5_000_000)
    node.write("energy", 1000, "J")
    node.write("freshness", 12)
    after = node.sampler.sample_once()
    d = diff(devices(after), devices(before))
    assert d["node"] == 1000 * J and d["platform"] == 300 * J
    assert collector(after, "pm_counters") == (True, 0)
    later = node.step(300, 300, 100, 1000)
    assert diff(devices(later), devices(after))["node"] == 1000 * J


def test_a_glitch_of_the_counter_invents_nothing(tmp_path: Path) -> None:
    """A value back below the last with the same `startup` is held, as RAPL's would be."""
    node = CrayNode(tmp_path)
    before = node.step(300, 300, 100, 1000)
    energy = node.number("energy")
    node.write("energy", 5, "J")
    node.write("freshness", node.number("freshness") + 10)
    node.tick()
    glitch = node.sampler.sample_once()
    assert diff(devices(glitch), devices(before))["node"] == 0
    node.write("energy", energy + 2000, "J")
    node.write("freshness", node.number("freshness") + 10)
    node.tick()
    after = node.sampler.sample_once()
    assert diff(devices(after), devices(before))["node"] == 2000 * J


def test_a_node_reboot_starts_the_counter_again_from_0(tmp_path: Path) -> None:
    """After a reboot the exporter starts again: the counter's new value is its baseline."""
    node = CrayNode(tmp_path)
    node.step(300, 300, 100, 1000)
    node.write("energy", 40, "J")  # the controller came up with the node
    node.write("startup", node.number("startup") + 600_000_000)
    node.write("freshness", 3)
    rebooted = PmCountersSource(node.sysfs, clock=node.clocks.monotonic)
    first = rebooted.read()
    assert first.errors == [] and first.devices[0].energy_uj == 0
    node.write("energy", 1040, "J")
    node.write("freshness", 13)
    assert rebooted.read().devices[0].energy_uj == 1000 * J


def test_a_restarted_exporter_goes_on_from_the_saved_platform(tmp_path: Path) -> None:
    """The platform's counter and series are saved and resumed like any device's; its
    share of the gap is estimated from its last power, the node's measured."""
    state = StateFile(str(tmp_path / "state.json"))
    node = CrayNode(tmp_path, state)
    node.step(300, 300, 100, 1000)
    saved = node.step(300, 300, 100, 1000)
    node.sampler.stop()
    again = CrayNode(tmp_path, state)
    again.clocks = node.clocks
    again.clocks.install(again.sampler)
    again.pm._clock = node.clocks.monotonic
    again.gpus.energy, again.cpu.energy = node.gpus.energy, node.cpu.energy
    again.clocks.advance(10.0)  # down for 10 s: 10 kJ at the wall, 3 kJ of it the platform's
    again.write("energy", again.number("energy") + 10_000, "J")
    again.write("freshness", again.number("freshness") + 10)
    resumed = again.sampler.sample_once()
    assert dict(resumed.restarts) == {"resumed": 1}
    assert not resumed.state_errors or set(dict(resumed.state_errors).values()) == {0}
    d = diff(devices(resumed), devices(saved))
    assert d["node"] == 10_000 * J  # the counter's own gap
    assert d["platform"] == 3_000 * J  # 300 W x 10 s: estimated
    gap = {(c, e): uj for c, e, uj in resumed.restart_gap}
    assert gap[("platform", True)] == 3_000 * J and gap[("node", False)] == 10_000 * J
    parts = diff(platform_parts(resumed), platform_parts(saved))
    assert sum(parts.values()) == d["platform"]
    after = again.step(300, 300, 100, 1000)
    assert diff(devices(after), devices(resumed))["platform"] == 300 * J


def test_unreadable_or_torn_pm_counters_say_so(tmp_path: Path) -> None:
    node = CrayNode(tmp_path)
    (node.dir / "energy").write_text("garbage\n")
    result = node.pm.read()
    assert result.devices == [] and "garbage" in result.errors[0]
    (node.dir / "energy").unlink()
    result = node.pm.read()
    assert result.devices == [] and "pm_counters" in result.errors[0]


def test_without_a_node_reading_nothing_changes(tmp_path: Path) -> None:
    node = CrayNode(tmp_path)
    node.sampler.parts.sources = [node.gpus, node.cpu]
    node.step(300, 300, 100, 1000)
    after = node.step(300, 300, 100, 1000)
    assert {d.component for d in after.devices} == {"gpu", "cpu"}
    assert not any(s.component == "platform" for s in after.energy)
    assert all(c.name != "platform" for c in after.collectors)
    assert node.sampler.book.tally is None


# -- what /metrics shows ---------------------------------------------------------------

CONDITIONAL = re.compile(
    r"^\| `(wattprint_\w+)` \| (gauge|counter) \| ([^|]*) \| a `--platform.source`", re.M
)


def test_the_node_and_the_platform_are_exported_as_documented(tmp_path: Path) -> None:
    node = CrayNode(tmp_path)
    node.step(300, 300, 100, 1000)
    node.step(300, 300, 100, 1000)
    collector = SnapshotCollector(lambda: node.sampler.latest)
    collector.render()  # new series are first served at 0
    text = collector.render().decode()
    promtool = require_tool("promtool")
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, text=True, capture_output=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values[("wattprint_node_energy_joules_total", ())] == 1000
    assert values[("wattprint_platform_energy_joules_total", ())] == 300
    assert values[("wattprint_platform_power_watts", ())] == 300
    info = ("component", "platform"), ("device", "node"), ("estimated", "false")
    assert values[("wattprint_measurement_info", (*info, ("method", "pm_counters")))] == 1
    platform = {
        dict(labels).get("workload"): value
        for (name, labels), value in values.items()
        if name == "wattprint_workload_energy_joules_total" and ("component", "platform") in labels
    }
    (unattributed,) = (
        value
        for (name, labels), value in values.items()
        if name == "wattprint_unattributed_energy_joules_total"
        and ("component", "platform") in labels
    )
    assert sum(platform.values()) + unattributed == 300
    assert values[("wattprint_collector_success", (("collector", "platform"),))] == 1
    # docs/metrics.md lists each family served only with a platform source, and its labels.
    documented = CONDITIONAL.findall(
        (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    )
    names = {name for name, _, _ in documented}
    served = {name for name, _ in values} | {
        f.name + "_total" for f in text_string_to_metric_families(text) if f.type == "counter"
    }
    assert names == {
        "wattprint_node_power_watts",
        "wattprint_node_energy_joules_total",
        "wattprint_platform_power_watts",
        "wattprint_platform_energy_joules_total",
    }
    assert names <= served
    assert {labels.strip() for _, _, labels in documented} == {"—"}


def test_doctor_shows_the_controllers_counters_of_the_parts(tmp_path: Path) -> None:
    node = CrayNode(tmp_path)
    node.write("cpu0_energy", 3_200_000, "J")
    node.write("memory_energy", 910_000, "J")
    (node.dir / "accel1_energy").write_text("garbage\n")
    node.pm.read()
    lines = node.pm.explain()
    assert lines[0] == f"node: pm_counters ({node.dir}/energy)"
    assert lines[1] == (
        "  beside it (not read: the components' sources measure them): accel0_energy "
        "22106012 J, accel1_energy unreadable (accel1_energy is not a number: 'garbage'), "
        "cpu0_energy 3200000 J, memory_energy 910000 J"
    )
