"""`wattprint.EmissionsTracker`, `OfflineEmissionsTracker` and `@track_emissions`:
codecarbon 3.x's API over a Wattprint tracker, so that a codecarbon user's script
changes by its import only.

Every codecarbon argument is accepted by name (and the constructor's in codecarbon's
order): each one has its meaning here, or is accepted with one warning saying why it
does not apply. The rows go to output_dir/output_file as codecarbon writes them
(appended, its columns in its order), and a wattprint-job/v1 JSON beside them for
`wattprint report --from-files`. Unlike codecarbon, each tracker counts only its own
process tree's share of each device, tracking_mode="machine" included, so the ranks'
files add up to the job.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from wattprint.config.options import ConfigError
from wattprint.jobs.meter import MeterError, Reading, node_name
from wattprint.jobs.tracker import Tracker, say_by_default
from wattprint.jobs.trackfiles import append_row, codecarbon_row, write_document
from wattprint.report.common import CODECARBON_COLUMNS
from wattprint.report.jobs import JobReport

log = logging.getLogger("wattprint.tracker")

# codecarbon 3.3's BaseEmissionsTracker.__init__, in its order (positional arguments too).
POSITIONAL = (
    "project_name",
    "measure_power_secs",
    "api_call_interval",
    "api_endpoint",
    "api_key",
    "output_dir",
    "output_file",
    "output_methods",
    "save_to_file",
    "save_to_api",
    "save_to_logger",
    "logging_logger",
    "save_to_prometheus",
    "save_to_logfire",
    "prometheus_url",
    "output_handlers",
    "gpu_ids",
    "emissions_endpoint",
    "experiment_id",
    "experiment_name",
    "electricitymaps_api_token",
    "co2_signal_api_token",
    "tracking_mode",
    "log_level",
    "on_csv_write",
    "logger_preamble",
    "force_cpu_power",
    "force_ram_power",
    "pue",
    "wue",
    "force_carbon_intensity_g_co2e_kwh",
    "force_mode_cpu_load",
    "allow_multiple_runs",
    "rapl_include_dram",
    "rapl_prefer_psys",
    "metadata",
)
# OfflineEmissionsTracker's and track_emissions' own.
LOCATION = (
    "country_iso_code",
    "region",
    "cloud_provider",
    "cloud_region",
    "country_2letter_iso_code",
)

_NO_API = "Wattprint sends nothing to an API: rows go to output_dir/output_file"
_NO_HANDLERS = (
    "Wattprint has no output handlers: the rows go to output_dir/output_file, and the "
    "node's Wattprint exporter serves the same counters to Prometheus"
)
_SAMPLER_MEASURES = (
    "CPU and memory are the node's sampler's (RAPL counters, else its model), "
    "split by each process's use, not a tracker's setting"
)
IGNORED = {
    **dict.fromkeys(
        ("api_call_interval", "api_endpoint", "api_key", "save_to_api", "emissions_endpoint"),
        _NO_API,
    ),
    "experiment_name": _NO_API + " (experiment_id is written)",
    **dict.fromkeys(
        (
            "output_methods",
            "save_to_logger",
            "logging_logger",
            "save_to_prometheus",
            "save_to_logfire",
            "prometheus_url",
            "output_handlers",
        ),
        _NO_HANDLERS,
    ),
    **dict.fromkeys(
        ("electricitymaps_api_token", "co2_signal_api_token"),
        "a live intensity is the sampler's: WATTPRINT_CARBON_PROVIDER=electricitymaps and "
        "its token in the environment (docs/codecarbon.md)",
    ),
    **dict.fromkeys(
        ("force_ram_power", "force_mode_cpu_load", "rapl_include_dram", "rapl_prefer_psys"),
        _SAMPLER_MEASURES,
    ),
    "force_carbon_intensity_g_co2e_kwh": "the intensity is the carbon zone's "
    "(country_iso_code=, or WATTPRINT_CARBON_ZONE)",
    "wue": "Wattprint has no water figure: water_consumed is 0",
    "metadata": "Wattprint writes no metadata section",
    "logger_preamble": "Wattprint's log lines are the `wattprint.tracker` logger's",
}
_warned: set[str] = set()

EmissionsData: Any = dataclasses.make_dataclass(
    "EmissionsData", [(column, Any) for column in CODECARBON_COLUMNS]
)


def _warn_once(key: str, message: str) -> None:
    """Once per node: every rank has the same arguments, so only its first rank says it."""
    local = (
        os.environ.get("LOCAL_RANK")
        or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
        or os.environ.get("SLURM_LOCALID")
    )
    if key not in _warned and local in (None, "", "0"):
        _warned.add(key)
        log.warning("%s", message)


def _given(value: object) -> bool:
    return value is not None


def bind(caller: str, args: tuple[object, ...], kwargs: Mapping[str, object]) -> dict[str, Any]:
    """codecarbon's arguments by name; TypeError only for what codecarbon has not either."""
    if len(args) > len(POSITIONAL):
        raise TypeError(f"{caller}() takes at most {len(POSITIONAL)} positional arguments")
    options: dict[str, Any] = dict(zip(POSITIONAL, args))
    for name, value in kwargs.items():
        if name not in POSITIONAL and name not in LOCATION:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
        if name in options:
            raise TypeError(f"{caller}() got multiple values for argument {name!r}")
        options[name] = value
    return options


def _zone(options: Mapping[str, Any]) -> str | None:
    provider, cloud_region = options.get("cloud_provider"), options.get("cloud_region")
    if provider and cloud_region:
        if str(provider).lower() == "gcp":
            return f"gcp:{cloud_region}"
        _warn_once(
            "cloud_provider",
            f"cloud_provider={provider!r} ignored: Wattprint's embedded data has cloud "
            "regions of gcp only; the country's zone is used (country_iso_code=)",
        )
    country = options.get("country_iso_code") or options.get("country_2letter_iso_code")
    if options.get("region"):
        _warn_once(
            "region",
            f"region={options['region']!r} ignored: Wattprint's embedded data has one "
            "intensity per country; the country's is used",
        )
    return str(country) if country else None


def _flags(options: Mapping[str, Any], caller: str) -> dict[str, str]:
    """The sampler's flags from codecarbon's arguments (they apply to a sampler this
    tracker starts; one already running is checked against them). ConfigError, one line
    naming the argument, for a value that is none."""
    flags: dict[str, str] = {}
    zone = _zone(options)
    if zone:
        flags["carbon.zone"] = zone
    if _given(options.get("pue")):
        flags["pue"] = _checked(caller, options, "pue", "pue", str)
    if _given(options.get("measure_power_secs")):
        flags["sample.interval"] = _checked(
            caller, options, "measure_power_secs", "sample.interval", lambda s: f"{s * 1000:.0f}ms"
        )
    if _given(options.get("force_cpu_power")):
        flags["cpu.tdp-watts"] = _checked(caller, options, "force_cpu_power", "cpu.tdp-watts", str)
    return flags


def _checked(
    caller: str,
    options: Mapping[str, Any],
    name: str,
    flag: str,
    spell: Callable[[float], str],
) -> str:
    """codecarbon's number `name` as the value of the sampler's `flag`, checked as the
    exporter checks that flag."""
    from wattprint.config.options import OPTIONS

    value = options[name]
    where = f"{caller}({name}={value!r})"
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {str(value)!r} is not a number") from None
    if name == "measure_power_secs" and not 0.05 <= number <= 300:
        raise ConfigError(f"{where}: must be between 0.05 and 300 seconds")
    text = spell(number)
    [option] = [o for o in OPTIONS if o.flag == flag]
    try:
        option.parse(text)
    except ValueError as err:
        raise ConfigError(f"{where}: {str(err).replace(repr(text), repr(str(value)))}") from None
    return text


def _log_level(caller: str, value: object) -> int | None:
    if value is None:
        return None
    levels = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
    if isinstance(value, str) and value.lower() in levels:
        return levels[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(
        f"{caller}(log_level={value!r}): not a log level (debug, info, warning, error, critical)"
    )


def _gpu_ids(caller: str, value: object) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        items: list[object] = list(value.split(","))
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ConfigError(f"{caller}(gpu_ids={value!r}): not a list of GPU indices")
    return [str(item).strip() for item in items if str(item).strip()]


def check(caller: str, options: Mapping[str, Any]) -> tuple[dict[str, str], list[str] | None]:
    """The sampler's flags and the GPUs from codecarbon's arguments; ConfigError (a
    ValueError, one line naming the argument) for a bad value, as codecarbon raises."""
    _log_level(caller, options.get("log_level"))
    return _flags(options, caller), _gpu_ids(caller, options.get("gpu_ids"))


class EmissionsTracker:
    """codecarbon's EmissionsTracker, counting this process tree's share of each device.

    A bad argument value raises ConfigError (a ValueError) here, one line naming the
    argument, as codecarbon's constructor raises; start() never raises."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        say_by_default()
        caller = type(self).__name__
        options = bind(caller, args, kwargs)
        flags, gpu_ids = check(caller, options)
        for name, why in IGNORED.items():
            if _given(options.get(name)) and options[name] is not False:
                _warn_once(name, f"{name} ignored: {why}")
        if options.get("allow_multiple_runs") is False:
            _warn_once(
                "allow_multiple_runs",
                "allow_multiple_runs=False ignored: every tracker reads the node's one "
                "sampler, so several on one machine count nothing twice",
            )
        if options.get("on_csv_write", "append") not in (None, "append"):
            _warn_once(
                "on_csv_write",
                f"on_csv_write={options['on_csv_write']!r} ignored: the ranks of a job share "
                "its run_id, so an update would replace the other ranks' rows; rows are appended",
            )
        if options.get("tracking_mode") == "machine":
            _warn_once(
                "tracking_mode",
                "tracking_mode='machine': each tracker reports its own process tree's share "
                "of every GPU, CPU and memory (tracking_mode column: process), so the ranks' "
                "files add up to the job instead of counting the machine once per rank",
            )
        level = _log_level(caller, options.get("log_level"))
        if level is not None:
            log.setLevel(level)
        self._project = str(options.get("project_name") or "codecarbon")
        self._experiment = str(options.get("experiment_id") or "")
        self._output_dir = str(options.get("output_dir") or ".")
        self._output_file = str(options.get("output_file") or "emissions.csv")
        self._save = options.get("save_to_file") is not False
        self._tracker = Tracker(
            # The job is named by the project where it is given, else by its script.
            project=str(options["project_name"]) if options.get("project_name") else None,
            output_dir=self._output_dir,
            flags=flags,
            writer=self._write,
            gpu_ids=gpu_ids,
            asked={
                k: v for k, v in options.items() if k in (*LOCATION, "pue", "measure_power_secs")
            },
        )
        self._rows: list[dict[str, str]] = []
        self._started = False
        self.final_emissions: float | None = None

    @property
    def job_id(self) -> str:
        """What the rows' run_id holds: one for all ranks of one launch."""
        return self._tracker.workload

    def start(self) -> None:
        """Start tracking; as codecarbon's, a failure is logged, never raised."""
        if self._started:
            log.warning("Already started tracking")
            return
        try:
            self._tracker.start()
        except (MeterError, ConfigError, OSError) as err:
            log.error("not tracking: %s", err)
            return
        self._started = True

    def flush(self) -> float | None:
        """Append a row (the total since start()); the kg CO2e so far. Never waits."""
        if not self._started:
            log.error("You first need to start the tracker.")
            return None
        return self._tracker.flush().emissions_g / 1000

    def stop(self) -> float | None:
        """Stop: kg CO2e up to the sampler's latest sample, at once; the final row (to
        the first sample after this call) follows within a sample, before the process
        exits. final_emissions_data waits for it."""
        if not self._started:
            log.warning("Tracker already stopped or never started.")
            return self.final_emissions
        self._started = False
        provisional = self._tracker.stop().emissions_g / 1000
        self.final_emissions = provisional
        return provisional

    @property
    def final_emissions_data(self) -> Any:
        """The final row as codecarbon's EmissionsData, once written (waits for it)."""
        tracker = self._tracker
        interval = tracker._start.interval if tracker._start else 1.0
        if tracker.wait(max(10.0, 5 * interval) + 1) is None or not self._rows:
            return None
        row = self._rows[-1]
        data = EmissionsData(**{c: _value(row.get(c, "")) for c in CODECARBON_COLUMNS})
        self.final_emissions = data.emissions
        return data

    def __enter__(self) -> EmissionsTracker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write(self, job: JobReport, start: Reading, end: Reading, final: bool) -> list[str]:
        row = codecarbon_row(
            job,
            {
                "project_name": self._project,
                "experiment_id": self._experiment,
                "tracking_mode": "process",
            },
        )
        self._rows.append(row)
        if not self._save:
            return []
        host, tracker = node_name(), self._tracker
        document = write_document(
            job,
            start,
            end,
            self._output_dir,
            [job.workload, host, tracker.id],
            f"EmissionsTracker {tracker._reader.url if tracker._reader else ''}",
            {
                "host": host,
                "tracker": tracker.id,
                "final": final,
                **tracker.launch_field(),
                "codecarbon_file": self._output_file,
                "project_name": self._project,
            },
        )
        csv_path = append_row(Path(self._output_dir) / self._output_file, row)
        return [os.path.abspath(csv_path), os.path.abspath(document)]


class OfflineEmissionsTracker(EmissionsTracker):
    """codecarbon's OfflineEmissionsTracker: Wattprint never needs to be online, the
    same tracker (country_iso_code= gives the carbon zone)."""


def _value(text: str) -> object:
    try:
        return float(text)
    except ValueError:
        return text


F = TypeVar("F", bound=Callable[..., Any])


def track_emissions(fn: F | None = None, **kwargs: object) -> Any:
    """codecarbon's @track_emissions / @track_emissions(...): the call, tracked."""
    kwargs.pop("offline", None)  # always: the intensity data is embedded
    # A TypeError or a bad value now, not at the first call.
    check("track_emissions", bind("track_emissions", (), kwargs))

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapped(*args: object, **inner: object) -> object:
            tracker = EmissionsTracker(**kwargs)
            tracker.start()
            try:
                return function(*args, **inner)
            finally:
                tracker.stop()

        return wrapped  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate
