"""A fake NVML shared by the processes of one test, driven by the wall clock.

GPU energy follows the recorded H200 trace (its counter, interpolated between samples),
but a GPU draws only while one of its holders holds it: a holder is a file
`hold-<pid>.json` {"gpu", "sm", "from", "until"} in $WATTPRINT_TEST_NVML_DIR, written by
the process itself. A holder stays in the process list until its process exits, after
`until`, so every sampler books all of a GPU's energy to whoever held it whatever its
sampling instants: the exact expectation is energy(gpu, from, until) x the holder's share.
Every nvmlInit is logged (pid per line) in `inits`, to count the samplers.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fake_nvml import FakeNvml, load_trace_samples

GPUS = 4  # $WATTPRINT_TEST_NVML_GPUS for another count


class Trace:
    def __init__(self) -> None:
        samples = load_trace_samples()
        t0 = samples[0]["t"]
        self.times = [s["t"] - t0 for s in samples]
        self.energy_j = [
            (s["gpus"][0]["energy_mj"] - samples[0]["gpus"][0]["energy_mj"]) / 1000 for s in samples
        ]
        self.span = self.times[-1]

    def cumulative(self, tau: float) -> float:
        """Joules drawn from the trace's start to tau seconds into it (looping)."""
        loops, rest = divmod(max(tau, 0.0), self.span)
        i = bisect.bisect_right(self.times, rest) - 1
        i = min(max(i, 0), len(self.times) - 2)
        t0, t1 = self.times[i], self.times[i + 1]
        e0, e1 = self.energy_j[i], self.energy_j[i + 1]
        return loops * self.energy_j[-1] + e0 + (e1 - e0) * (rest - t0) / (t1 - t0)


def holds(directory: Path) -> list[dict[str, Any]]:
    found = []
    for path in directory.glob("hold-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        data["pid"] = int(path.stem.split("-")[1])
        found.append(data)
    return found


def windows(directory: Path, gpu: int) -> list[tuple[float, float | None]]:
    spans = sorted((h["from"], h.get("until")) for h in holds(directory) if h["gpu"] == gpu)
    merged: list[tuple[float, float | None]] = []
    for a, b in spans:
        if merged and (merged[-1][1] is None or a <= merged[-1][1]):  # type: ignore[operator]
            last = merged[-1]
            end = None if last[1] is None or b is None else max(last[1], b)
            merged[-1] = (last[0], end)
        else:
            merged.append((a, b))
    return merged


def gpu_energy_j(trace: Trace, t0: float, directory: Path, gpu: int, at: float) -> float:
    total = 0.0
    for a, b in windows(directory, gpu):
        end = at if b is None else min(b, at)
        if end > a:
            total += trace.cumulative(end - t0) - trace.cumulative(a - t0)
    return total


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


class LiveNvml(FakeNvml):
    directory: Path
    t0: float
    trace: Trace

    def nvmlInit(self) -> None:
        with open(self.directory / "inits", "a") as f:
            f.write(f"{os.getpid()}\n")
        super().nvmlInit()

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self._count("nvmlDeviceGetTotalEnergyConsumption")
        return round(1000 * gpu_energy_j(self.trace, self.t0, self.directory, handle, time.time()))

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 100_000

    def _holders(self, handle: int) -> list[dict[str, Any]]:
        return [h for h in holds(self.directory) if h["gpu"] == handle and _alive(h["pid"])]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(
                pid=h["pid"],
                usedGpuMemory=None,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for h in self._holders(handle)
        ]

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen: int) -> list[Any]:
        return [
            SimpleNamespace(
                pid=h["pid"],
                timeStamp=int(time.time() * 1e6),
                smUtil=h["sm"],
                memUtil=0,
                encUtil=0,
                decUtil=0,
            )
            for h in self._holders(handle)
        ]


def make(directory: Path, t0: float) -> LiveNvml:
    base = FakeNvml.from_trace(copies=int(os.environ.get("WATTPRINT_TEST_NVML_GPUS", GPUS)))
    fake = LiveNvml(gpus=base.gpus)
    fake.directory, fake.t0, fake.trace = directory, t0, Trace()
    return fake


def install() -> None:
    directory = Path(os.environ["WATTPRINT_TEST_NVML_DIR"])
    sys.modules["pynvml"] = make(directory, float(os.environ["WATTPRINT_TEST_NVML_T0"]))  # type: ignore[assignment]


def hold(directory: Path, gpu: int, sm: int) -> Path:
    path = directory / f"hold-{os.getpid()}.json"
    path.write_text(json.dumps({"gpu": gpu, "sm": sm, "from": time.time(), "until": None}))
    return path


def release(path: Path) -> None:
    data = json.loads(path.read_text())
    data["until"] = time.time()
    data["sm"] = 0  # done: it keeps the GPU, but no longer uses it
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
