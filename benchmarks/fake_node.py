"""Runs the real wattprint CLI with pynvml replaced by the recorded-trace fake.

    python benchmarks/fake_node.py --gpus 8 --energy-latency-ms 3 -- --web.listen-address=...

The fake GPUs play tests/fixtures/h200/phased-load.jsonl in real time, looping (the
counter keeps rising across loops), and each energy read sleeps for the latency measured
on a real H200 (~3 ms), each process-utilization read ~2.2 ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "exporter"))

from fake_nvml import FakeNvml  # noqa: E402


class LoopingNvml(FakeNvml):
    """Trace position follows wall time at 10 samples/s and wraps around."""

    def _sync(self) -> None:
        samples = len(self.gpus[0].samples)
        elapsed = int((time.monotonic() - self.started) * 10)
        loops, self.position = divmod(elapsed, samples)
        span = self.gpus[0].samples[-1]["energy_mj"] - self.gpus[0].samples[0]["energy_mj"]
        for gpu in self.gpus:
            gpu.energy_offset_mj = loops * span

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._sync()
        return super().nvmlDeviceGetPowerUsage(handle)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--energy-latency-ms", type=float, default=3.0)
    parser.add_argument("--util-latency-ms", type=float, default=2.2)
    args, rest = parser.parse_known_args()
    fake = LoopingNvml.from_trace(
        copies=args.gpus,
        energy_latency_s=args.energy_latency_ms / 1000,
        util_latency_s=args.util_latency_ms / 1000,
    )
    fake.started = time.monotonic()  # type: ignore[attr-defined]
    sys.modules["pynvml"] = fake  # type: ignore[assignment]
    from wattprint.cli.main import main as wattprint_main

    return wattprint_main([a for a in rest if a != "--"])


if __name__ == "__main__":
    sys.exit(main())
