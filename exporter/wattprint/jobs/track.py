"""`wattprint.track()`: a job's energy from Python, one tracker per rank, like
codecarbon's EmissionsTracker, but each tracker reports only its own process tree's
share of each device, so the ranks' files add up to the job.

    with wattprint.track(output_dir="runs"):
        train()

A tracker never samples hardware itself: it reads the node's one sampler (a running
exporter, found by the node lock, or --exporter.url). Where none runs, the first
tracker starts one (`python -m wattprint.jobs.track serve`, the exporter's own code with
the same flags), which the others then find; it exits once no tracker is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from wattprint.config.options import build_config
from wattprint.host.identity.tracked import Registration, register, registry_dir
from wattprint.host.procfs import read_proc
from wattprint.jobs.discovery import find_sampler
from wattprint.jobs.meter import (
    ExporterReader,
    MeterError,
    Reading,
    job_report,
    node_name,
    sampler_url,
    save_job,
)
from wattprint.report.jobs import JobReport

SAMPLER_WAIT_S = 30.0
IDLE_EXIT_S = 5.0


def _job_name(environ: Mapping[str, str]) -> str:
    for name in ("WATTPRINT_WORKLOAD", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        if environ.get(name):
            return environ[name]
    return f"job-{os.getppid()}"  # ranks started by one launcher share it


class Tracker:
    """One rank's tracker: registers its process with the node's sampler and writes its job file."""

    def __init__(
        self,
        workload: str | None = None,
        output_dir: str = ".",
        exporter_url: str | None = None,
        flags: Mapping[str, str] | None = None,
    ) -> None:
        environ = dict(os.environ)
        self.flags = dict(flags or {})
        self.config = build_config(self.flags, environ)
        self.workload = workload or _job_name(environ)
        rank = environ.get("RANK") or environ.get("SLURM_PROCID")
        self.id = f"rank{rank}-{os.getpid()}" if rank else f"pid{os.getpid()}"
        self.output_dir = output_dir
        self.exporter_url = exporter_url or environ.get("WATTPRINT_EXPORTER_URL")
        self._reader: ExporterReader | None = None
        self._start: Reading | None = None
        self._registration: str | None = None
        self.files: list[str] = []
        self._rows = 0

    # -- codecarbon's shape ---------------------------------------------------------

    def __enter__(self) -> Tracker:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self.exporter_url:
            self._reader = ExporterReader(self.exporter_url)
        else:
            lock, url = self._find_or_start_sampler()
            info = read_proc(os.getpid())
            ticks = info.start_ticks if info is not None else 0
            self._registration = register(
                registry_dir(lock), Registration(os.getpid(), ticks, self.workload, self.id)
            )
            self._reader = ExporterReader(url)
        # The first sample after registering already books this process under its id.
        first = self._reader.read()
        self._start = self._reader.read_after(time.time(), first.interval)

    def flush(self) -> JobReport:
        """Write what the process tree used since start(); keeps tracking.

        As codecarbon's flush() with its default on_csv_write="append": every flush()
        and the stop() add one row to the CSV, each the total since start(), so the
        file's last row is the run's total (never add up one file's rows). The JSON
        holds the latest row, with "final": false until stop()."""
        return self._report(final=False)

    def stop(self) -> JobReport:
        try:
            return self._report(final=True)
        finally:
            if self._registration is not None:
                Path(self._registration).unlink(missing_ok=True)
                self._registration = None

    # -- inside ----------------------------------------------------------------------

    def _report(self, final: bool) -> JobReport:
        if self._reader is None or self._start is None:
            raise MeterError("the tracker was not started")
        end = self._reader.read_after(time.time(), self._start.interval)
        pod = None if self.exporter_url and not self._registration else self.id
        job = job_report(self._start, end, self.workload, pod=pod)
        job.workload = self.workload
        self.files = save_job(
            job,
            self._start,
            end,
            self.output_dir,
            f"track {self._reader.url}",
            node_name(),
            {"tracker": self.id, "final": final},
            tracker=self.id,
            append_csv=self._rows > 0,  # a file of this tracker's rows only
        )
        self._rows += 1
        return job

    def _find_or_start_sampler(self) -> tuple[str, str]:
        state_file = self.config.state_file
        if not state_file:
            raise MeterError(
                "track() needs a node lock to find the node's sampler: set --state.file "
                "(WATTPRINT_STATE_FILE) or exporter_url"
            )
        found = find_sampler(state_file)
        if found is None:
            flags = [f"--{k}={v}" for k, v in self.flags.items()]
            subprocess.Popen(
                [sys.executable, "-m", "wattprint.jobs.track", "serve", *flags],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # outlives this rank if it ends first
            )
        deadline = time.monotonic() + SAMPLER_WAIT_S
        while True:
            running = sampler_url(state_file)
            if running is not None:
                return running
            if time.monotonic() > deadline:
                raise MeterError(f"no sampler came up on this node within {SAMPLER_WAIT_S:.0f} s")
            time.sleep(0.05)


def track(
    workload: str | None = None,
    output_dir: str = ".",
    exporter_url: str | None = None,
    **flags: str,
) -> Tracker:
    """A tracker for this process tree. Keyword flags are the exporter's, with '_' for
    '.' and '-' (carbon_zone="DE", pue="1.2", state_file=...)."""
    names = {k: v for k, v in flags.items()}
    from wattprint.config.options import OPTIONS

    by_field = {option.field: option.flag for option in OPTIONS}
    by_flag = {option.flag.replace(".", "_").replace("-", "_"): option.flag for option in OPTIONS}
    mapped = {}
    for key, value in names.items():
        flag = by_field.get(key) or by_flag.get(key)
        if flag is None:
            raise TypeError(f"track() got an unknown flag {key!r}")
        mapped[flag] = str(value)
    return Tracker(workload, output_dir, exporter_url, mapped)


def serve(argv: list[str]) -> int:
    """The node's sampler for trackers: exits once no tracker is registered."""
    import argparse

    from wattprint.config.flags import exporter_flags, load
    from wattprint.jobs.run import start_local_sampler

    parser = argparse.ArgumentParser(prog="wattprint.jobs.track serve")
    exporter_flags(parser)
    args = parser.parse_args(argv)
    config = load(args)
    try:
        started = start_local_sampler(config, "127.0.0.1:0")
    except MeterError:
        return 0
    if isinstance(started, str) or started.lock is None:
        if not isinstance(started, str):
            started.stop()
        return 0  # another one won the race, or no lock: trackers would not find us
    directory = Path(registry_dir(started.lock.path))
    idle_since = time.monotonic()
    try:
        while True:
            time.sleep(0.5)
            alive = any(_alive(p.name) for p in directory.glob("*.json"))
            if alive:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_EXIT_S:
                return 0
    finally:
        started.stop()


def _alive(name: str) -> bool:
    try:
        pid, ticks = (int(x) for x in name[:-5].split("-", 1))
    except ValueError:
        return False
    info = read_proc(pid)
    return info is not None and info.start_ticks == ticks


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve(sys.argv[2:]))
    sys.exit("usage: python -m wattprint.jobs.track serve [exporter flags]")
