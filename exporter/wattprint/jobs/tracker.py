"""`wattprint.track()`: a job's energy from Python, one tracker per rank, like
codecarbon's EmissionsTracker, but each tracker reports only its own process tree's
share of each device, so the ranks' files add up to the job.

    with wattprint.track(output_dir="runs"):
        train()

A tracker never samples hardware itself: it reads the node's one sampler (a running
exporter, found by the node lock, or --exporter.url; else one that the first tracker
starts, jobs/nodesampler.py). A thread of the tracker follows the sampler, so that
flush() and stop() never wait for a sample: flush() writes the row of the latest sample
at once; stop() returns at once and the thread writes the final row from the first
sample after it (the process waits for it at exit, also after an uncaught exception
or SIGTERM).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from wattprint.config.options import build_config
from wattprint.host.identity.tracked import REGISTRATIONS, Registration, registry_dir
from wattprint.host.procfs import read_proc
from wattprint.jobs.identity import JobIdentity, Process, job_identity
from wattprint.jobs.meter import (
    ExporterReader,
    MeterError,
    Reading,
    job_report,
    node_name,
    render,
    same_endpoint,
    sampler_url,
    save_job,
)
from wattprint.jobs.nodesampler import find_or_start
from wattprint.jobs.trackfiles import energy_text, mass_text
from wattprint.report.jobdoc import job_document
from wattprint.report.jobs import JobReport

log = logging.getLogger("wattprint.tracker")


def say_by_default() -> None:
    """A tracker's lines reach stderr without any logging set up, as codecarbon's do."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("wattprint: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)


# Writes one row: (job, start, end, final) -> the files written.
Writer = Callable[[JobReport, Reading, Reading, bool], list[str]]


def identify(workload: str | None, project: str | None, environ: Mapping[str, str]) -> JobIdentity:
    """This process's job (jobs/identity.py) from what the kernel says of it."""
    me, parent = read_proc(os.getpid()), read_proc(os.getppid())
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = ""
    return job_identity(
        environ,
        script=sys.argv[0] if sys.argv else "",
        process=Process(os.getpid(), me.start_ticks if me else 0),
        parent=Process(os.getppid(), parent.start_ticks if parent else 0),
        host=node_name(),
        boot_id=boot_id,
        workload=workload,
        project=project,
        spawned=multiprocessing.parent_process() is not None,
    )


class Tracker:
    """One rank's tracker: registers its process with the node's sampler and writes its rows."""

    def __init__(
        self,
        workload: str | None = None,
        output_dir: str = ".",
        exporter_url: str | None = None,
        flags: Mapping[str, str] | None = None,
        *,
        project: str | None = None,
        writer: Writer | None = None,
        gpu_ids: Collection[str] | None = None,
        asked: Mapping[str, str] | None = None,
    ) -> None:
        say_by_default()
        environ = dict(os.environ)
        self.flags = dict(flags or {})
        self.config = build_config(self.flags, environ)
        self.identity = identify(workload, project, environ)
        self.workload = self.identity.id
        rank = environ.get("RANK") or environ.get("SLURM_PROCID")
        self.id = f"rank{rank}-{os.getpid()}" if rank else f"pid{os.getpid()}"
        _exits.made += 1
        if _exits.made > 1:  # a second tracker of this process: files of its own
            self.id += f"-{_exits.made}"
        self.output_dir = output_dir
        self.exporter_url = exporter_url or environ.get("WATTPRINT_EXPORTER_URL")
        self.gpu_ids = None if gpu_ids is None else {str(g) for g in gpu_ids}
        self.asked = dict(asked or {})  # flags as the user spelled them, for messages
        self.notes: list[str] = []
        self.files: list[str] = []
        self.final: JobReport | None = None
        self._writer = writer or self._wattprint_files
        self._reader: ExporterReader | None = None
        self._start: Reading | None = None
        self._latest: Reading | None = None
        self._registration: str | None = None
        self._by_pod = False  # registered: its series are those with its id as pod
        self._stop_at: float | None = None
        self._wake = threading.Event()
        self._done = threading.Event()
        self._write_lock = threading.Lock()
        self._rows = 0
        self._pid = os.getpid()

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
        if self._start is not None:
            return
        # The process's registration names its newest tracker: one still writing its
        # final row (stop() returned, its sample not yet come) keeps it until it is done.
        for earlier in [t for t in _exits.active if t is not self and t._stop_at is not None]:
            earlier.wait(max(10.0, 5 * (earlier._start.interval if earlier._start else 1.0)))
        lock: str | None = None
        if self.exporter_url:
            url = self.exporter_url
            found = sampler_url(self.config.state_file)
            if found is not None and same_endpoint(found[1], url):
                lock = found[0]  # this node's sampler: it books this process to our id
            else:
                note = (
                    f"{url} is not this node's sampler (no node lock names it): the tracker "
                    f"cannot register its process there and counts the series of workload "
                    f"{self.workload!r} by that name"
                )
                self.notes.append(note)
                log.warning("%s", note)
        else:
            lock, url = find_or_start(self.config.state_file, self.flags)
        running = sorted(t.id for t in _exits.active if t is not self and t._stop_at is None)
        if running and lock is not None:
            log.warning(
                "another tracker of this process runs (%s): from now on the process's energy "
                "is booked to %s alone, until it stops; stop one tracker before starting "
                "the next",
                ", ".join(running),
                self.id,
            )
        if lock is not None:
            info = read_proc(os.getpid())
            ticks = info.start_ticks if info is not None else 0
            self._registration = registry_dir(lock)
            REGISTRATIONS.add(
                self._registration, self, Registration(os.getpid(), ticks, self.workload, self.id)
            )
            self._by_pod = True
        self._reader = ExporterReader(url)
        try:
            # The first sample after registering already books this process under its id.
            first = self._reader.read()
            self._start = self._latest = self._reader.read_after(time.time(), first.interval)
        except MeterError:
            self._unregister()
            raise
        self._check_sampler(self._start)
        # What a row needs loaded (the renderers, the zone's embedded data), loaded now:
        # the first flush() would take 0.1 s more.
        empty = self._job(self._start, self._start)
        render(empty, "", "codecarbon-csv")
        job_document(empty, "", {})
        threading.Thread(target=self._follow, name="wattprint-tracker", daemon=True).start()
        _exits.add(self)
        log.info(
            "tracking %s (%s) as %s with the node's sampler %s; writing to %s at each flush() "
            "and stop()",
            self.workload,
            self.identity.launcher,
            self.id,
            self._reader.url,
            os.path.abspath(self.output_dir),
        )

    def flush(self) -> JobReport:
        """Write what the process tree used from start() to the sampler's latest sample;
        keeps tracking. Returns at once (no wait for a sample).

        As codecarbon's flush() with its default on_csv_write="append": every flush()
        and the stop() add one row to the CSV, each the total since start(), so the
        file's last row is the run's total (never add up one file's rows). The JSON
        holds the latest row, with "final": false until stop()."""
        if self._latest is None:
            raise MeterError("the tracker was not started")
        if self.final is not None:
            return self.final
        if self._stop_at is not None:  # stopped: its final row is on its way
            assert self._start is not None
            return self._job(self._start, self._latest)
        return self._write(self._latest, final=False)

    def stop(self) -> JobReport:
        """End tracking: returns at once what the latest sample says; the final row (from
        the first sample after this call) is written by the tracker's thread, which the
        process waits for at exit, and `final` holds it (wait() for it)."""
        if self._latest is None or self._start is None:
            raise MeterError("the tracker was not started")
        if self.final is not None:
            return self.final
        if self._stop_at is None:
            self._stop_at = time.time()
            self._wake.set()
        return self._job(self._start, self._latest)

    def wait(self, timeout: float | None = None) -> JobReport | None:
        """The final row, once the tracker's thread wrote it after stop()."""
        self._done.wait(timeout)
        return self.final

    # -- inside ----------------------------------------------------------------------

    def _job(
        self, start: Reading, end: Reading, pod: str | None = "", workload: str | None = None
    ) -> JobReport:
        if self.gpu_ids is not None:
            start, end = _only_gpus(start, self.gpu_ids), _only_gpus(end, self.gpu_ids)
        if pod == "":
            pod = self.id if self._by_pod else None
        job = job_report(start, end, workload or self.workload, pod=pod)
        job.workload = self.workload
        job.notes.extend(self.notes)
        return job

    def _write(self, end: Reading, final: bool) -> JobReport:
        assert self._start is not None
        with self._write_lock:
            job = self._job(self._start, end)
            self.files = self._writer(job, self._start, end, final)
            self._rows += 1
            return job

    def _wattprint_files(
        self, job: JobReport, start: Reading, end: Reading, final: bool
    ) -> list[str]:
        assert self._reader is not None
        return save_job(
            job,
            start,
            end,
            self.output_dir,
            f"track {self._reader.url}",
            node_name(),
            {"tracker": self.id, "final": final, **self.launch_field()},
            tracker=self.id,
            append_csv=self._rows > 0,  # a file of this tracker's rows only
        )

    def _follow(self) -> None:
        """Keep the latest sample; after stop(), write the final row and leave."""
        assert self._reader is not None and self._start is not None
        interval = self._start.interval
        patience = max(10.0, 5 * interval)
        lost = False
        while True:
            if self._stop_at is None:
                # Often enough for a flush() row to be at most a second old; seldom
                # enough that eight ranks' trackers cost the sampler little.
                self._wake.wait(min(max(interval, 0.5), 2.0))
                self._wake.clear()
            else:
                time.sleep(min(interval / 2, 0.25))
            latest = self._latest
            try:
                latest = self._latest = self._reader.read()
                if lost:
                    log.warning("the node's sampler answers again; counting on")
                lost = False
            except MeterError as err:
                if not lost:  # once, not at every try
                    log.warning("%s; rows stay at its last sample until it answers", err)
                lost = True
                if self._stop_at is None:
                    continue
            stop_at = self._stop_at
            if stop_at is None or latest is None:
                continue
            if latest.time > stop_at:
                self._finish(latest)
                return
            if time.time() - stop_at > patience:
                self.notes.append(
                    f"no sample of the node's sampler came within {patience:.0f} s of "
                    "stop(): counted to its last sample"
                )
                self._finish(latest)
                return

    def _finish(self, end: Reading) -> None:
        assert self._start is not None
        try:
            counted = self._job(self._start, end)
            samples = round((end.time - self._start.time) / max(self._start.interval, 1e-3))
            if counted.energy_j == 0 and samples >= 1:
                note = (
                    f"{self.workload} {self.id} counted 0 J over {samples} sample(s) of "
                    f"{self._reader.url if self._reader else 'the sampler'}: it booked no "
                    "energy to this process tree"
                )
                self.notes.append(note)
                log.warning("%s", note)
            job = self._write(end, final=True)
            self.final = job
            self._log_stop(job, end)
        except OSError as err:
            log.error("cannot write to %s: %s", self.output_dir, err)
        finally:
            self._unregister()
            self._done.set()
            _exits.discard(self)

    def launch_field(self) -> dict[str, str]:
        """The files' "launch": files of two launches are never added up."""
        return {"launch": self.identity.launch} if self.identity.launch else {}

    def _unregister(self) -> None:
        if self._registration is not None:
            REGISTRATIONS.remove(self._registration, self)
            self._registration = None

    def _log_stop(self, job: JobReport, end: Reading) -> None:
        assert self._start is not None
        # The job as the sampler names it (a Slurm job, run's --workload), all its trackers.
        mine = self.id, "/" + self.id
        names = sorted({k[4] for k in end.series if k[5] == mine[0] or k[5].endswith(mine[1])})
        whole = self._job(self._start, end, pod=None, workload=names[0] if names else None)
        log.info(
            "%s %s stopped: %s, %s in %.1f s (this process tree); the job on %s meanwhile: "
            "%s, %s; wrote %s",
            self.workload,
            self.id,
            energy_text(job.energy_j),
            mass_text(job.emissions_g),
            job.duration,
            node_name(),
            energy_text(whole.energy_j),
            mass_text(whole.emissions_g),
            ", ".join(self.files) or "no file",
        )

    def _check_sampler(self, reading: Reading) -> None:
        """Say where the node's sampler accounts otherwise than this tracker asked."""
        differ = []
        zones = reading.zones
        zone = self.config.carbon_zone
        if "carbon.zone" in self.flags and zones and zone.upper() not in {z.upper() for z in zones}:
            differ.append(f"carbon zone {'/'.join(sorted(zones))}, not {zone}")
        if "pue" in self.flags and abs(reading.pue - self.config.pue) > 1e-9:
            differ.append(f"PUE {reading.pue:g}, not {self.config.pue:g}")
        wanted = self.config.sample_interval
        if "sample.interval" in self.flags and abs(reading.interval - wanted) > 1e-6:
            differ.append(f"a sample every {reading.interval:g} s, not {wanted:g} s")
        if differ:
            asked = ", ".join(f"{k}={v!r}" for k, v in self.asked.items()) or "its flags"
            note = (
                f"the node's sampler ({self._reader.url if self._reader else '?'}) was "
                f"already running: it accounts with {' and '.join(differ)}; {asked} "
                "cannot change it (stop it, or start the job where none runs)"
            )
            self.notes.append(note)
            log.warning("%s", note)
        if zones == {"WORLD"} or (not zones and zone.upper() in ("", "WORLD")):
            log.warning(
                "no carbon zone: accounting with the world average (zone WORLD); set "
                "your grid zone, e.g. country_iso_code='DEU' or WATTPRINT_CARBON_ZONE=DE"
            )


def _only_gpus(reading: Reading, gpus: set[str]) -> Reading:
    series = {k: v for k, v in reading.series.items() if k[0] != "gpu" or k[1] in gpus}
    devices = {k: v for k, v in reading.devices.items() if k[0] != "gpu" or k[1] in gpus}
    return replace(reading, series=series, devices=devices)


class _Exits:
    """Every tracker of this process that has not written its final row: at exit (atexit,
    SIGTERM) each is stopped and waited for, so a rank that dies still writes it."""

    def __init__(self) -> None:
        self.active: set[Tracker] = set()
        self.made = 0  # trackers this process made
        self._hooked = False
        self._previous: Any = signal.SIG_DFL

    def add(self, tracker: Tracker) -> None:
        self.active.add(tracker)
        if not self._hooked:
            self._hooked = True
            atexit.register(self.finish)
            if threading.current_thread() is threading.main_thread():
                self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def discard(self, tracker: Tracker) -> None:
        self.active.discard(tracker)

    def finish(self) -> None:
        trackers = [t for t in list(self.active) if t._pid == os.getpid()]
        for tracker in trackers:
            with contextlib.suppress(MeterError):
                tracker.stop()
        for tracker in trackers:
            interval = tracker._start.interval if tracker._start else 1.0
            tracker.wait(max(10.0, 5 * interval) + 1)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.finish()
        previous = self._previous
        if callable(previous):
            previous(signum, frame)  # the launcher's or the framework's own handler
        elif previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)  # dies of SIGTERM, as it would have


_exits = _Exits()


def track(
    workload: str | None = None,
    output_dir: str = ".",
    exporter_url: str | None = None,
    **flags: str,
) -> Tracker:
    """A tracker for this process tree. Keyword flags are the exporter's, with '_' for
    '.' and '-' (carbon_zone="DE", pue="1.2", state_file=...)."""
    return Tracker(workload, output_dir, exporter_url, exporter_flag_names(flags, "track()"))


def exporter_flag_names(flags: Mapping[str, object], caller: str) -> dict[str, str]:
    """{carbon_zone: "DE"} as {"carbon.zone": "DE"}; TypeError for what is no flag."""
    from wattprint.config.options import OPTIONS

    by_field = {option.field: option.flag for option in OPTIONS}
    by_flag = {option.flag.replace(".", "_").replace("-", "_"): option.flag for option in OPTIONS}
    mapped = {}
    for key, value in flags.items():
        flag = by_field.get(key) or by_flag.get(key)
        if flag is None:
            raise TypeError(f"{caller} got an unknown flag {key!r}")
        mapped[flag] = str(value)
    return mapped
