"""`wattprint.EmissionsTracker`, `OfflineEmissionsTracker`, `@track_emissions` and
`@track_task_emissions`: codecarbon 3.x's tracker contract over a Wattprint tracker, so
that a codecarbon user's script changes by its import only.

Every codecarbon argument is accepted by name (the constructor's in codecarbon's order,
and from CODECARBON_* and .codecarbon.config, jobs/ccconfig.py). flush(), stop() and
stop_task() take a sample of their own and write their row before they return; stop()
returns its kg CO2e. The rows go to output_dir/output_file as codecarbon writes them,
tasks to emissions_<experiment_name>_<run_id>.csv, and to output_handlers (codecarbon's
BaseOutput: out(total, delta), live_out(total, delta), task_out) as codecarbon calls
them; a wattprint-job/v1 JSON beside them is for `wattprint report --from-files`.
Unlike codecarbon, each tracker counts only its own process tree's share of each
device, so the ranks' files add up to the job (docs/codecarbon.md).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from wattprint.config.options import ConfigError
from wattprint.jobs import ccconfig
from wattprint.jobs.ccconfig import IGNORED, LOCATION, POSITIONAL, warn_once
from wattprint.jobs.ccdata import (
    EmissionsData,
    OutputMethod,
    TaskEmissionsData,
    cpu_ticks,
    csv_row,
    delta,
    emissions_data,
    machine,
    own_carbon,
    task_data,
    utilization,
    write_task_file,
)
from wattprint.jobs.meter import Reading, node_name
from wattprint.jobs.tracker import Tracker, say_by_default
from wattprint.jobs.trackfiles import append_row, write_document
from wattprint.report.jobs import JobReport

__all__ = [
    "LOCATION",
    "POSITIONAL",
    "EmissionsData",
    "EmissionsTracker",
    "OfflineEmissionsTracker",
    "OutputMethod",
    "TaskEmissionsData",
    "track_emissions",
    "track_task_emissions",
]

log = logging.getLogger("wattprint.tracker")
_warned = ccconfig._warned  # tests clear it


class Task:
    """One start_task()..stop_task(): its first reading, and its row once stopped."""

    def __init__(self, name: str, start: Reading, ticks: tuple[int, int]) -> None:
        self.task_name = name
        self.start = start
        self.ticks = ticks
        self.is_active = True
        self.emissions_data: Any = None


def _methods(options: dict[str, Any]) -> list[str]:
    """codecarbon's output methods: output_methods if given, else the save_to_* flags."""
    given = options.get("output_methods")
    if isinstance(given, str):
        given = [m.strip() for m in given.split(",") if m.strip()]
    if given is not None:
        return [str(getattr(m, "value", m)).lower() for m in given]
    methods = ["csv"] if options.get("save_to_file") is not False else []
    return methods + (["logger"] if options.get("save_to_logger") else [])


def check(caller: str, options: dict[str, Any]) -> dict[str, str]:
    """The sampler's flags; ConfigError (a ValueError, one line naming the argument) for a
    bad value, as codecarbon's constructor raises."""
    ccconfig.log_level(caller, options.get("log_level"))
    ccconfig.gpu_ids(caller, options.get("gpu_ids"))
    ccconfig.pue(caller, options)
    return ccconfig.sampler_flags(caller, options)


class EmissionsTracker:
    """codecarbon's EmissionsTracker, counting this process tree's share of each device.

    A bad argument value raises ConfigError (a ValueError) here, one line naming the
    argument, as codecarbon's constructor raises; nothing after it ever raises."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        say_by_default()
        caller = type(self).__name__
        options = ccconfig.resolve(ccconfig.bind(caller, args, kwargs), os.environ)
        flags = check(caller, options)
        self._warn(options)
        level = ccconfig.log_level(caller, options.get("log_level"))
        if level is not None:
            log.setLevel(level)
        forced = ccconfig.forced_intensity(options.get("force_carbon_intensity_g_co2e_kwh"))
        self.force_carbon_intensity_g_co2e_kwh = forced
        carbon_options = {**options, "force_carbon_intensity_g_co2e_kwh": forced}
        self._carbon = own_carbon(carbon_options, ccconfig.pue(caller, options))
        self._project = str(options.get("project_name") or "codecarbon")
        self._experiment = str(options.get("experiment_id") or "")
        self._experiment_name = str(options.get("experiment_name") or "base")
        self._output_dir = str(options.get("output_dir") or ".")
        self._output_file = str(options.get("output_file") or "emissions.csv")
        self._measure_secs = float(options.get("measure_power_secs") or 15)
        self._api_call_interval = ccconfig.api_call_interval(options.get("api_call_interval"))
        methods = _methods(options)
        self._output_methods = methods
        self._save = "csv" in methods
        self._handlers: list[Any] = list(options.get("output_handlers") or [])
        if "logger" in methods:
            if options.get("logging_logger") is not None:
                self._handlers.append(options["logging_logger"])
            else:
                warn_once("logging_logger", "save_to_logger without logging_logger: no logger")
        for method in sorted(set(methods) - {"csv", "logger"}):
            warn_once(f"method {method}", f"output method {method!r} ignored: {_NO_METHOD}")
        self._tracker = Tracker(
            # The job is named by the project where it is given, else by its script.
            project=str(options["project_name"]) if options.get("project_name") else None,
            output_dir=self._output_dir,
            flags=flags,
            writer=self._write,
            gpu_ids=ccconfig.gpu_ids(caller, options.get("gpu_ids")),
            asked={k: v for k, v in options.items() if k == "measure_power_secs"},
        )
        self._tracker.on_sample = self._on_sample
        self._tracker.at_exit = [self.stop]
        self._tracker.own_carbon = self._carbon.grams_per_kwh is not None
        self._lock = threading.RLock()
        self._system = machine()
        self._runs = 0
        self._tasks: dict[str, Task] = {}
        self._active: str | None = None
        self._ticks = cpu_ticks()
        self._previous: Any = None
        self._occurrence = 0
        self._measured_at = time.monotonic()
        self._last: Any = None
        self.run_id = uuid.uuid4()
        self.final_emissions: float | None = None
        self.final_emissions_data: Any = None

    @staticmethod
    def _warn(options: dict[str, Any]) -> None:
        for name, why in IGNORED.items():
            if options.get(name) is not None and options[name] is not False:
                warn_once(name, f"{name} ignored: {why}")
        if options.get("region"):
            warn_once(
                "region",
                f"region={options['region']!r}: Wattprint's embedded data has one intensity "
                "per country; the country's is used",
            )
        provider = options.get("cloud_provider")
        if provider and str(provider).lower() != "gcp":
            warn_once(
                "cloud_provider",
                f"cloud_provider={provider!r}: Wattprint's embedded data has cloud regions of "
                "gcp only; the country's intensity is used (country_iso_code=), else the "
                "node's sampler's",
            )
        if options.get("allow_multiple_runs") is False:
            warn_once(
                "allow_multiple_runs",
                "allow_multiple_runs=False ignored: every tracker reads the node's one "
                "sampler, so several on one machine count nothing twice",
            )
        if options.get("on_csv_write", "append") not in (None, "append"):
            warn_once(
                "on_csv_write",
                f"on_csv_write={options['on_csv_write']!r} ignored: rows are appended, one "
                "per flush() and stop(), the last the run's total",
            )
        if options.get("tracking_mode") == "machine":
            warn_once(
                "tracking_mode",
                "tracking_mode='machine': each tracker reports its own process tree's share "
                "of every GPU, CPU and memory (tracking_mode column: process), so the ranks' "
                "files add up to the job instead of counting the machine once per rank",
            )

    @property
    def job_id(self) -> str:
        """The job the rows belong to: one for all ranks of one launch (in the JSON)."""
        return self._tracker.workload

    def start(self) -> None:
        """Start tracking (a new run, with a new run_id, after a stop()); as codecarbon's,
        a failure is logged, never raised."""
        try:
            with self._lock:
                if self._tracker.started:
                    log.warning("Already started tracking")
                    return
                self._begin()
        except Exception as err:  # never into the user's code
            log.error("start: %s", _line(err))

    def _begin(self) -> bool:
        if self._runs:
            self.run_id = uuid.uuid4()
            self._tasks, self._active, self._previous = {}, None, None
        if not self._tracker.start():
            return False
        self._runs += 1
        self._ticks = cpu_ticks()
        self._occurrence = 0
        first = self._tracker.first
        if first is not None:
            self._measured(first)  # as codecarbon measures at start
        return True

    def flush(self) -> float | None:
        """Append a row (the total since start(), to a sample taken now); its kg CO2e."""
        try:
            with self._lock:
                if not self._tracker.started:
                    log.error("You first need to start the tracker.")
                    return None
                end = self._tracker.sample()
                if end is not None:
                    self._measured(end)
                self._tracker.flush(end)
                return None if self._last is None else float(self._last.emissions)
        except Exception as err:  # never into the user's code
            log.error("flush: %s", _line(err))
            return None

    def stop(self) -> float | None:
        """Stop: the final row, to a sample taken now, is written before this returns;
        its kg CO2e (final_emissions, final_emissions_data)."""
        try:
            with self._lock:
                if not self._tracker.started:
                    log.warning("Tracker already stopped or never started.")
                    return self.final_emissions
                for name in [n for n, t in self._tasks.items() if t.is_active]:
                    self.stop_task(name)
                end = self._tracker.sample()
                if end is not None:
                    self._measured(end)
                self._last = None
                self._tracker.stop(end)
                if self._last is not None:
                    self.final_emissions_data = self._last
                    self.final_emissions = float(self._last.emissions)
                for handler in self._handlers:
                    _call(handler, "exit")
                return self.final_emissions
        except Exception as err:  # never into the user's code
            log.error("stop: %s", _line(err))
            return None

    def start_task(self, task_name: str | None = None) -> None:
        """Measure a task on its own (model loading, one inference): its energy is in the
        tracker's total too, counted once. Without start(), the tracker starts for it."""
        try:
            with self._lock:
                if not self._tracker.started and not self._begin():
                    log.error("Tracker not initialized. Please check the logs.")
                    return
                if self._active:
                    log.warning("A task is already under measure")
                    return
                name = task_name or str(uuid.uuid4())
                if name in self._tasks:
                    name += "_" + str(uuid.uuid4())
                start = self._tracker.sample()
                assert start is not None
                self._tasks[name] = Task(name, start, cpu_ticks())
                self._active = name
        except Exception as err:  # never into the user's code
            log.error("start_task: %s", _line(err))

    def stop_task(self, task_name: str | None = None) -> Any:
        """The task's EmissionsData (its energy from start_task() to a sample taken now)."""
        try:
            with self._lock:
                task = self._tasks.get(task_name or self._active or "")
                if task is None or not task.is_active:
                    log.warning("stop_task : No active task to stop.")
                    return None
                end = self._tracker.sample() or task.start
                self._measured(end)
                task.emissions_data = self._data(self._tracker.report(task.start, end), task.ticks)
                task.is_active = False
                self._active = None
                return task.emissions_data
        except Exception as err:  # never into the user's code
            log.error("stop_task: %s", _line(err))
            return None

    def get_detected_hardware(self) -> dict[str, Any]:
        """codecarbon's hardware summary: this machine's CPUs and memory, the node's GPUs
        as its sampler sees them (those of gpu_ids only, where given)."""
        from wattprint.jobs.ccdata import physical_cpus

        reading = self._tracker._latest
        models = dict(reading.gpu_models) if reading is not None else {}
        wanted = self._tracker.gpu_ids
        if wanted is not None:
            models = {g: m for g, m in models.items() if g in wanted}
        names = sorted(set(models.values()))
        return {
            "ram_total_size": self._system["ram_total_size"],
            "cpu_count": self._system["cpu_count"],
            "cpu_physical_count": physical_cpus(),
            "cpu_model": self._system["cpu_model"],
            "gpu_count": len(models),
            "gpu_model": ", ".join(names),
            "gpu_ids": sorted(wanted) if wanted is not None else None,
        }

    def __enter__(self) -> EmissionsTracker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inside ----------------------------------------------------------------------

    def _data(self, job: JobReport, ticks: tuple[int, int]) -> Any:
        fields = {
            "project_name": self._project,
            "run_id": str(self.run_id),
            "experiment_id": self._experiment,
            "tracking_mode": "process",
            **utilization(ticks),
        }
        return emissions_data(job, self._carbon, fields, self._system)

    def _measured(self, reading: Reading) -> None:
        """codecarbon's measurement count: every api_call_interval-th, the handlers'
        live_out(total, delta)."""
        self._measured_at = time.monotonic()
        self._occurrence += 1
        every = self._api_call_interval
        first = self._tracker.first
        if every == -1 or not self._handlers or self._occurrence < every or first is None:
            return
        self._occurrence = 0
        total = self._data(self._tracker.report(first, reading), self._ticks)
        change, self._previous = delta(total, self._previous), total
        for handler in self._handlers:
            _call(handler, "live_out", total, change)

    def _on_sample(self, reading: Reading) -> None:
        """The tracker's thread: codecarbon's measurement every measure_power_secs."""
        if time.monotonic() - self._measured_at >= self._measure_secs:
            with self._lock:
                if self._tracker.started:
                    self._measured(reading)

    def _write(self, job: JobReport, start: Reading, end: Reading, final: bool) -> list[str]:
        """The row to each output, each on its own: one that fails (a full disk, a CSV
        that cannot be read) is one line and a note, and the others still get it."""
        total = self._data(job, self._ticks)
        change, self._previous = delta(total, self._previous), total
        self._last = total
        done = [task_data(t.task_name, t.emissions_data) for t in self._tasks.values()]
        done = [t for t in done if t.run_id]
        written: list[str] = []
        if self._save:
            host, tracker = node_name(), self._tracker
            extra = {
                "host": host,
                "tracker": tracker.id,
                "final": final,
                **tracker.launch_field(),
                "codecarbon_file": self._output_file,
                "project_name": self._project,
                "run_id": str(self.run_id),
            }
            source = f"EmissionsTracker {tracker._reader.url if tracker._reader else ''}"
            names = [job.workload, host, tracker.id]
            csv_path = Path(self._output_dir) / self._output_file
            for write in (
                lambda: append_row(csv_path, csv_row(total)),
                lambda: write_document(job, start, end, self._output_dir, names, source, extra),
                lambda: (
                    write_task_file(self._output_dir, self._experiment_name, done) if done else None
                ),
            ):
                try:
                    path = write()
                except Exception as err:  # never into the user's code
                    self._failed(f"cannot write to {self._output_dir}: {_line(err)}")
                else:
                    written += [os.path.abspath(path)] if path else []
        for handler in self._handlers:
            _call(handler, "out", total, change)
            if done:
                _call(handler, "task_out", done, self._experiment_name)
        return written

    def _failed(self, note: str) -> None:
        """One line and a note in the rows, once per kind of failure."""
        notes = self._tracker.notes
        if note not in notes:
            notes.append(note)
            log.error("%s", note)


_NO_METHOD = "Wattprint writes the CSV (csv) and to a logging_logger (logger) only"


def _call(handler: Any, method: str, *args: Any) -> None:
    """A user's output handler, as codecarbon calls it; its failure is one line."""
    function = getattr(handler, method, None)
    if function is None:
        return
    try:
        function(*args)
    except Exception as err:  # a handler's bug never stops the job
        log.error("output handler %s.%s: %s", type(handler).__name__, method, _line(err))


def _line(err: BaseException) -> str:
    text = " ".join(str(err).split())[:300]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class OfflineEmissionsTracker(EmissionsTracker):
    """codecarbon's OfflineEmissionsTracker: Wattprint never needs to be online, the
    same tracker (country_iso_code= gives its carbon zone)."""


F = TypeVar("F", bound=Callable[..., Any])


def track_emissions(fn: F | None = None, **kwargs: object) -> Any:
    """codecarbon's @track_emissions / @track_emissions(...): the call, tracked; its row
    is written before the call returns."""
    offline = kwargs.pop("offline", None)
    # A TypeError or a bad value now, not at the first call.
    check("track_emissions", ccconfig.bind("track_emissions", (), kwargs))

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapped(*args: object, **inner: object) -> object:
            if offline and not (kwargs.get("country_iso_code") or kwargs.get("cloud_provider")):
                raise ConfigError("Needs ISO Code of the Country for Offline mode")
            tracker = EmissionsTracker(**kwargs)
            tracker.start()
            try:
                return function(*args, **inner)
            finally:
                tracker.stop()

        return wrapped  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


def track_task_emissions(
    fn: F | None = None, tracker: EmissionsTracker | None = None, task_name: str = ""
) -> Any:
    """codecarbon's @track_task_emissions: the call as a task of `tracker` (else of a
    tracker of its own, stopped after the call)."""
    own = tracker is None
    chosen = tracker if tracker is not None else EmissionsTracker()

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapped(*args: object, **inner: object) -> object:
            chosen.start_task(task_name=task_name)
            try:
                return function(*args, **inner)
            finally:
                chosen.stop_task()
                if own:
                    chosen.stop()

        return wrapped  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate
