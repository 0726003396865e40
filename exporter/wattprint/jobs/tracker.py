"""`wattprint.track()`: a job's energy from Python, one tracker per rank, like
codecarbon's EmissionsTracker, but each tracker reports only its own process tree's
share of each device, so the ranks' files add up to the job.

    with wattprint.track(output_dir="runs"):
        train()

A tracker never samples hardware itself: it reads the node's one sampler (a running
exporter, found by the node lock, or --exporter.url; else one that the first tracker
starts, jobs/nodesampler.py). flush() and stop() ask the sampler for a sample taken
for them (/metrics?fresh: one for all the ranks that ask at once) and write their row
from it before they return, so a row runs to the moment of the call; an exporter that
cannot take one on request gives its next sample. A thread of the tracker follows the
sampler meanwhile, so that a sampler that dies leaves the rows at its last sample. At
exit (also after an uncaught exception or SIGTERM) every running tracker is stopped.
After its constructor a tracker never raises: a failure is one log line and a note in
its rows, and energy it could not count makes its JSON say "final": false.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from types import TracebackType

from wattprint.config.options import build_config
from wattprint.host.identity.tracked import _REFRESH_S as RESOLVER_REFRESH_S
from wattprint.host.identity.tracked import REGISTRATIONS, Registration, registry_dir
from wattprint.host.procfs import read_proc
from wattprint.jobs import notes
from wattprint.jobs.ccconfig import first_local_rank
from wattprint.jobs.identity import identify
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
from wattprint.jobs.reading import behind, only_gpus
from wattprint.jobs.trackexits import EXITS as _exits
from wattprint.jobs.trackexits import one_line as _one_line
from wattprint.jobs.trackexits import say_by_default as say_by_default
from wattprint.jobs.trackfiles import energy_text, mass_text, wall_text
from wattprint.report.jobdoc import job_document
from wattprint.report.jobs import JobReport

log = logging.getLogger("wattprint.tracker")
HELD = "serves its counters held at its last save (its state file cannot be written)"


# Writes one row: (job, start, end, final) -> the files written.
Writer = Callable[[JobReport, Reading, Reading, bool], list[str]]


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
        self.notes: list[str] = []
        self._standing: list[str] = []  # notes of every run of this tracker
        self.flags = dict(flags or {})
        self.config = build_config(self.flags, environ)
        self.identity = identify(workload, project, environ, node_name())
        self.workload = self.identity.id
        if self.identity.note:  # a name over a label's length, hashed: said in every row
            self.notes.append(self.identity.note)
            self._standing.append(self.identity.note)
        rank = environ.get("RANK") or environ.get("SLURM_PROCID")
        self.id = f"rank{rank}-{os.getpid()}" if rank else f"pid{os.getpid()}"
        _exits.made += 1
        if _exits.made > 1:  # a second tracker of this process: files of its own
            self.id += f"-{_exits.made}"
        self.output_dir = output_dir
        self.exporter_url = exporter_url or environ.get("WATTPRINT_EXPORTER_URL")
        self.gpu_ids = None if gpu_ids is None else {str(g) for g in gpu_ids}
        self.asked = dict(asked or {})  # flags as the user spelled them, for messages
        self.files: list[str] = []
        self.final: JobReport | None = None
        self._writer = writer or self._wattprint_files
        self._reader: ExporterReader | None = None
        self._start: Reading | None = None
        self._latest: Reading | None = None
        self._sampled = math.nan  # the sampler's time of _latest's sample (its clock)
        self._registration: str | None = None
        self._by_pod = False  # registered: its series are those with its id as pod
        self._done = threading.Event()
        self._write_lock = threading.RLock()  # SIGTERM's handler may write mid-flush()
        self._rows = 0
        self._pid = os.getpid()
        self._lost = False  # the sampler did not answer the last sample()
        # The rows' times: this clock's, from the monotonic clock (durations ignore steps).
        self._anchor = (time.time(), time.monotonic())
        self._checked = False
        self._said_stale = False
        # Called (on the tracker's thread) with each sample it follows.
        self.on_sample: Callable[[Reading], None] | None = None
        self.own_carbon = False  # its rows' emissions at its own intensity, not the sampler's
        # What to call at exit instead of stop() (the codecarbon layer's own stop).
        self.at_exit: list[Callable[[], object]] = []

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

    def start(self) -> bool:
        """Register with the node's sampler and take the first sample. Never raises: a
        tracker that cannot start logs one line and tracks nothing (False)."""
        if self._start is not None:
            return True
        if self.final is not None:  # a new run of this tracker: files of its own
            _exits.made += 1
            self.id = f"{self.id.rsplit('~', 1)[0]}~{_exits.made}"
            self.final, self.files, self._rows, self._lost = None, [], 0, False
            self.notes = [n for n in self.notes if n in self._standing]
        try:
            self._begin()
        except Exception as err:  # never into the user's code
            self._unregister()
            self._start = None
            log.error("not tracking: %s", _one_line(err))
            return False
        return True

    def _begin(self) -> None:
        lock: str | None = None
        if self.exporter_url:
            url = self.exporter_url
            found = sampler_url(self.config.state_file)
            if found is not None and same_endpoint(found[1], url):
                lock = found[0]  # this node's sampler: it books this process to our id
            elif not self._standing:
                note = (
                    f"{url} is not this node's sampler (no node lock names it): the tracker "
                    f"cannot register its process there and counts the series of workload "
                    f"{self.workload!r} by that name"
                )
                self.notes.append(note)
                self._standing.append(note)
                log.warning("%s", note)
        else:
            lock, url = find_or_start(self.config.state_file, self.flags)
        running = sorted(t.id for t in _exits.active if t is not self)
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
            # The sampler reads registrations at most this often, when the directory's
            # mtime moved: touched again (a read in the rename's clock tick saw it), so
            # the first sample after it books this process under our id.
            time.sleep(RESOLVER_REFRESH_S * 0.75)
            with contextlib.suppress(OSError):
                os.utime(self._registration)
            time.sleep(RESOLVER_REFRESH_S * 1.5)
        self._reader = ExporterReader(url)
        self._reader.read()  # a sampler just started: its first sample
        # A sample begun after registering: it books this process under our id.
        first = self._reader.read_fresh()
        self._sampled = first.time
        self._start = self._latest = self._local(first, fresh=True)
        if not self._checked:
            self._checked = True
            self._check_sampler(self._start)
        # What a row needs loaded (the renderers, the zone's embedded data), loaded now:
        # the first flush() would take 0.1 s more.
        empty = self._job(self._start, self._start)
        render(empty, "", "codecarbon-csv")
        job_document(empty, "", {})
        self._done = threading.Event()
        threading.Thread(
            target=self._follow, args=(self._done,), name="wattprint-tracker", daemon=True
        ).start()
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

    @property
    def started(self) -> bool:
        return self._start is not None

    def sample(self) -> Reading | None:
        """A reading of a sample the node's sampler took for this call (flush, stop, a
        task); where it cannot answer, its last one, said once and noted. None if not
        started."""
        if self._reader is None or self._start is None:
            return None
        try:
            # Never waiting for an exporter that takes no sample on request (an older
            # version): its latest sample then, said once.
            reading = self._reader.read_fresh(wait=False)
            fresh = self._reader.fresh
            if self._latest is not None and behind(self._latest, reading):
                # Held at the exporter's last save: no row runs back to it.
                raise MeterError(f"the node's exporter {self._reader.url} {HELD}")
            if not fresh and not self._said_stale:
                self._said_stale = True
                note = (
                    f"the node's exporter {self._reader.url} takes no sample on request (an "
                    "older version): rows run to its latest sample, up to one of its "
                    "intervals before each flush() and stop()"
                )
                self.notes.append(note)
                self._standing.append(note)
                log.warning("%s", note)
            sampled, reading = reading.time, self._local(reading, fresh=fresh)
        except MeterError as err:
            if not self._lost:  # once, not at every try
                self._lost = True
                note = f"{err}; rows stay at its last sample until it answers"
                self.notes.append(note)
                log.warning("%s", note)
            return self._latest
        if self._lost:
            log.warning("the node's sampler answers again; counting on")
        self._lost = False
        self._latest, self._sampled = reading, sampled
        return reading

    @property
    def first(self) -> Reading | None:
        """The run's first reading (None when not running)."""
        return self._start

    def flush(self, end: Reading | None = None) -> JobReport | None:
        """Write what the process tree used from start() to a sample taken now; keeps
        tracking. None if not started; never raises.

        As codecarbon's flush() with its default on_csv_write="append": every flush()
        and the stop() add one row to the CSV, each the total since start(), so the
        file's last row is the run's total (never add up one file's rows). The JSON
        holds the latest row, with "final": false until stop()."""
        end = end or self.sample()
        if end is None or self._start is None:
            return self.final
        return self._write(end, final=False)

    def stop(self, end: Reading | None = None) -> JobReport | None:
        """End tracking: the final row, from a sample taken now (or `end`), is written
        before this returns; the JobReport it holds. Never raises; None if never started."""
        if self._start is None:
            return self.final
        end = end or self.sample() or self._start
        self._done.set()
        try:
            counted = self._job(self._start, end)
            samples = round((end.time - self._start.time) / max(self._start.interval, 1e-3))
            if counted.energy_j == 0 and samples >= 1 and not self._lost:
                note = (
                    f"{self.workload} {self.id} counted 0 J over {samples} sample(s) of "
                    f"{self._reader.url if self._reader else 'the sampler'}: it booked no "
                    "energy to this process tree"
                )
                self.notes.append(note)
                counted.notes.append(note)
                log.warning("%s", note)
            # Energy after the last sample that answered is missing: not final.
            job = self._write(end, not self._lost, counted)
            self.final = job
            self._log_stop(job, end)
        except Exception as err:  # never into the user's code
            log.error("stop: %s", _one_line(err))
        finally:
            self._unregister()
            _exits.discard(self)
            self._start = None
        return self.final

    def wait(self, timeout: float | None = None) -> JobReport | None:
        """The final row (stop() writes it before it returns): kept for older callers."""
        del timeout
        return self.final

    def _local(self, reading: Reading, fresh: bool) -> Reading:
        """The reading timed by this tracker's monotonic clock, so that a step of the
        wall clock changes no duration (the sampler's /metrics stamps are wall-clock
        times): a sample taken for the call, as received; another, as old as the
        sampler says (at most three of its intervals)."""
        wall, mono = self._anchor
        now = wall + (time.monotonic() - mono)
        if not fresh and reading.time == reading.time:  # not NaN
            now -= min(max(time.time() - reading.time, 0.0), 3 * reading.interval)
        return replace(reading, time=now)

    def report(self, start: Reading, end: Reading) -> JobReport:
        """This process tree's share between two readings (a task's, a run's)."""
        return self._job(start, end)

    # -- inside ----------------------------------------------------------------------

    def _job(
        self, start: Reading, end: Reading, pod: str | None = "", workload: str | None = None
    ) -> JobReport:
        if self.gpu_ids is not None:
            start, end = only_gpus(start, self.gpu_ids), only_gpus(end, self.gpu_ids)
        if pod == "":
            pod = self.id if self._by_pod else None
        job = job_report(start, end, workload or self.workload, pod=pod)
        job.workload = self.workload
        job.notes.extend(self.notes)
        full = notes.cap_note(end, self._by_pod, job.energy_j > 0)
        if full is not None:
            job.notes.append(full.replace("this run", "this tracker"))
        return job

    def _write(self, end: Reading, final: bool, job: JobReport | None = None) -> JobReport:
        assert self._start is not None
        with self._write_lock:
            job = job or self._job(self._start, end)
            try:
                self.files = self._writer(job, self._start, end, final)
                self._rows += 1
            except Exception as err:  # a full disk never stops the job
                note = f"cannot write to {self.output_dir}: {_one_line(err)}"
                if note not in self.notes:
                    self.notes.append(note)
                    log.error("%s", note)
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

    def _follow(self, done: threading.Event) -> None:
        """Keep the latest sample (a sampler that dies leaves the rows at it), and tell
        on_sample of each: seldom enough that eight ranks cost the sampler little."""
        assert self._reader is not None and self._start is not None
        period = min(max(self._start.interval, 0.5), 2.0)
        # A reader of its own: its plain reads must not reset what flush() is told of
        # its fresh one (ExporterReader.fresh), read on the caller's thread meanwhile.
        reader = ExporterReader(self._reader.url, self._reader.timeout)
        while not done.wait(period):
            try:
                latest = reader.read(patience=period)
            except MeterError:
                continue  # said by the next flush() or stop(), which tries again
            # A sample older than the last one read (a save before flush()'s fresh
            # sample) that lacks some of its series is no newer reading, though not
            # behind in any series (a wall clock stepped back alone skips nothing).
            older = latest.time < self._sampled and not (
                self._latest is None or self._latest.series.keys() <= latest.series.keys()
            )
            if not done.is_set() and not older and not behind(self._latest or latest, latest):
                self._sampled = latest.time
                self._latest = latest = self._local(latest, fresh=False)
                if self.on_sample is not None:
                    with contextlib.suppress(Exception):
                        self.on_sample(latest)

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
            "%s %s stopped: %s, %s in %.1f s (this process tree); %s; the job on %s "
            "meanwhile: %s, %s; wrote %s",
            self.workload,
            self.id,
            energy_text(job.energy_j),
            mass_text(job.emissions_g),
            job.duration,
            wall_text(job),
            node_name(),
            energy_text(whole.energy_j),
            mass_text(whole.emissions_g),
            ", ".join(self.files) or "no file",
        )

    def _check_sampler(self, reading: Reading) -> None:
        """Say where the node's sampler accounts otherwise than this tracker asked."""
        differ = notes.tracker_overridden(self.config, self.flags, reading)
        zones, zone = reading.zones, self.config.carbon_zone
        if differ:
            asked = ", ".join(f"{k}={v!r}" for k, v in self.asked.items()) or "its flags"
            note = (
                f"the node's sampler ({self._reader.url if self._reader else '?'}) was "
                f"already running: it accounts with {' and '.join(differ)}; {asked} "
                "cannot change it (stop it, or start the job where none runs)"
            )
            self.notes.append(note)
            if first_local_rank():  # every rank's rows say it; the log, once a node
                log.warning("%s", note)
        world = zones == {"WORLD"} or (not zones and zone.upper() in ("", "WORLD"))
        if world and not self.own_carbon:
            log.warning(
                "no carbon zone: accounting with the world average (zone WORLD); set "
                "your grid zone, e.g. country_iso_code='DEU' or WATTPRINT_CARBON_ZONE=DE"
            )


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
