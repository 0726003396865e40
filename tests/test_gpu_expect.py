"""--gpu.expect=N: a node that should have N GPUs and measures fewer says so, in its
metrics (for the GpusNotMeasured alert), its log, /healthz's note and `doctor`; the
node's energy is otherwise only smaller, without a sound."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_cli import wattprint
from wattprint.app import SamplerSlot
from wattprint.core.model import DeviceReading, SourceResult
from wattprint.export.collector import SnapshotCollector
from wattprint.export.server import ExporterApp, _Connection
from wattprint.sampler.loop import Sampler, SamplerParts


class Gpus:
    """`present` GPUs, each drawing 1 J per read."""

    name = "nvml"

    def __init__(self, present: int) -> None:
        self.present = present
        self.reads = 0

    def read(self) -> SourceResult:
        self.reads += 1
        return SourceResult(
            devices=[
                DeviceReading("gpu", str(i), self.reads * 1_000_000, 100.0, "nvml-energy")
                for i in range(self.present)
            ]
        )

    def explain(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def _values(sampler: Sampler) -> dict[str, float]:
    text = SnapshotCollector(lambda: sampler.latest, False).render().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("wattprint_gpu_") and not s.labels
    }


def _healthz(slot: SamplerSlot) -> str:
    app = ExporterApp(lambda _: b"", slot.healthy, note=slot.note)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(b"GET /healthz HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n")
        server = threading.Thread(target=_Connection(theirs, ("127.0.0.1", 1), app).serve)
        server.start()
        server.join(10)
        return ours.recv(65536).decode()


def test_a_node_measuring_fewer_gpus_than_expected_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpus = Gpus(present=8)
    sampler = Sampler(SamplerParts(sources=[gpus], gpu_expected=8))
    slot = SamplerSlot()
    slot.fill(sampler)
    sampler.sample_once()
    assert _values(sampler) == {"wattprint_gpu_expected": 8, "wattprint_gpu_measured": 8}
    assert _healthz(slot).endswith("\r\n\r\nok\n")

    gpus.present = 6  # two fell off the bus, or the driver lost them
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            sampler.sample_once()
    assert _values(sampler) == {"wattprint_gpu_expected": 8, "wattprint_gpu_measured": 6}
    said = [r.message for r in caplog.records if "expected GPUs" in r.message]
    assert said == ["6 of 8 expected GPUs measured (--gpu.expect)"]  # once, not per sample
    # Still 200: the exporter measures what it can, and a failing probe would restart
    # it (no GPU comes back so) or take its target out of the scrape (and the alert's
    # series with it). The note says why.
    answer = _healthz(slot)
    assert answer.startswith("HTTP/1.1 200")
    assert answer.endswith("ok; 6 of 8 expected GPUs measured (--gpu.expect)\n")

    gpus.present = 8
    sampler.sample_once()
    assert _values(sampler)["wattprint_gpu_measured"] == 8
    assert _healthz(slot).endswith("\r\n\r\nok\n")


def test_without_an_expectation_nothing_is_missing() -> None:
    sampler = Sampler(SamplerParts(sources=[Gpus(present=0)]))
    sampler.sample_once()
    assert _values(sampler) == {"wattprint_gpu_expected": 0, "wattprint_gpu_measured": 0}
    assert sampler.note() == ""


def test_doctor_says_which_gpus_are_missing(tmp_path: Path) -> None:
    (tmp_path / "sys" / "class").mkdir(parents=True)
    result = wattprint(
        "doctor",
        f"--path.sysfs={tmp_path}/sys",
        "--carbon.zone=DE",
        "--gpu.expect=4",
        env={"WATTPRINT_GPU_SOURCE": "auto"},  # no NVML on this machine: none read
    )
    assert result.returncode == 0, result.stderr
    assert "MISSING: 4 GPUs expected (--gpu.expect), 0 read" in result.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--gpu.expect=-1"], "--gpu.expect"),
        (["--gpu.expect=eight"], "--gpu.expect"),
        (["--gpu.expect=2", "--gpu.source=none"], "--gpu.source=none reads no GPU"),
    ],
)
def test_a_bad_expectation_is_one_line(args: list[str], said: str) -> None:
    result = wattprint(*args, "doctor")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and said in result.stderr


def test_the_chart_passes_the_expectation_on() -> None:
    from test_helm import render

    def args(values: dict[str, object]) -> list[str]:
        docs, _ = render(values)
        daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
        return daemonset["spec"]["template"]["spec"]["containers"][0]["args"]

    assert "--gpu.expect=8" in args({"exporter": {"gpu": {"expect": 8}}})
    assert not any(a.startswith("--gpu.expect") for a in args({}))
