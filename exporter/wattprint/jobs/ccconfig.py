"""An EmissionsTracker's arguments as codecarbon 3.x takes them: by name (the
constructor's also in its order), then from CODECARBON_* variables, ./.codecarbon.config
and ~/.codecarbon.config, in codecarbon's precedence; each checked with one line naming
it, or accepted with one warning saying why it does not apply here."""

from __future__ import annotations

import configparser
import logging
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any

from wattprint.config.options import ConfigError

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
CONFIG_FILE = ".codecarbon.config"
# A value of codecarbon's configuration, and the Wattprint variable that wins over it.
WATTPRINT_WINS = {"measure_power_secs": "WATTPRINT_SAMPLE_INTERVAL"}
WATTPRINT_WINS["force_cpu_power"] = "WATTPRINT_CPU_TDP_WATTS"

_NO_API = "Wattprint sends nothing to an API: rows go to output_dir/output_file"
_NO_PUSH = (
    "Wattprint pushes nothing: the node's Wattprint exporter serves the same counters to "
    "Prometheus; rows go to output_dir/output_file and output_handlers"
)
_SAMPLER_MEASURES = (
    "CPU and memory are the node's sampler's (RAPL counters, else its model), "
    "split by each process's use, not a tracker's setting"
)
IGNORED = {
    **dict.fromkeys(
        ("api_endpoint", "api_key", "save_to_api", "emissions_endpoint"),
        _NO_API,
    ),
    **dict.fromkeys(("save_to_prometheus", "save_to_logfire", "prometheus_url"), _NO_PUSH),
    **dict.fromkeys(
        ("electricitymaps_api_token", "co2_signal_api_token"),
        "a live intensity is the sampler's: WATTPRINT_CARBON_PROVIDER=electricitymaps and "
        "its token in the environment (docs/codecarbon.md)",
    ),
    **dict.fromkeys(
        ("force_ram_power", "force_mode_cpu_load", "rapl_include_dram", "rapl_prefer_psys"),
        _SAMPLER_MEASURES,
    ),
    "wue": "Wattprint has no water figure: water_consumed is 0",
    "metadata": "Wattprint writes no metadata section",
    "logger_preamble": "Wattprint's log lines are the `wattprint.tracker` logger's",
}
_warned: set[str] = set()


def first_local_rank() -> bool:
    """Whether this process is its node's first rank (or no rank at all)."""
    local = (
        os.environ.get("LOCAL_RANK")
        or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
        or os.environ.get("SLURM_LOCALID")
    )
    return local in (None, "", "0")


def warn_once(key: str, message: str) -> None:
    """Once per node: every rank has the same arguments, so only its first rank says it."""
    if key not in _warned and first_local_rank():
        _warned.add(key)
        log.warning("%s", message)


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


def external(environ: Mapping[str, str]) -> dict[str, str]:
    """codecarbon's configuration outside the code: ~/.codecarbon.config, then
    ./.codecarbon.config, then CODECARBON_* variables, the last that names a key wins."""
    found: dict[str, str] = {}
    for directory in (os.path.expanduser("~"), os.getcwd()):
        found.update(_config_file(os.path.join(directory, CONFIG_FILE)))
    for key, value in environ.items():
        if key.lower().startswith("codecarbon_"):
            found[key.lower().replace("codecarbon_", "", 1)] = value
    return found


def _config_file(path: str) -> dict[str, str]:
    """The [codecarbon] section of a regular file (never a FIFO or a device); a file
    that cannot be read or parsed is one line, and ignored, as codecarbon ignores it."""
    try:
        # Opened before it is checked, without waiting on a FIFO: a file swapped between a
        # check by name and the open must not block the constructor. A link is followed
        # (dotfiles are often links): it is only read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                log.warning("%s is not a regular file: not read", path)
                return {}
            text = handle.read(1 << 20).decode("utf-8", "replace")
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(text, source=path)
    except OSError:
        return {}
    except configparser.Error as err:
        log.warning("%s: not read: %s", path, " ".join(str(err).split())[:200])
        return {}
    return dict(parser["codecarbon"]) if parser.has_section("codecarbon") else {}


def resolve(options: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The arguments given, then codecarbon's configuration for those not given (where
    Wattprint's own variable is not set for the same thing)."""
    merged = dict(options)
    for key, value in external(environ).items():
        if key in merged or (key not in POSITIONAL and key not in LOCATION):
            continue
        if environ.get(WATTPRINT_WINS.get(key, "")):
            continue
        merged[key] = _from_text(key, value)
    return merged


def _from_text(key: str, value: str) -> Any:
    if key in ("save_to_file", "save_to_api", "save_to_logger", "allow_multiple_runs"):
        return value.strip().lower() == "true"
    return value


def api_call_interval(value: object) -> int:
    """How many measurements between two live_out() calls of the output handlers (-1:
    none), codecarbon's default 8; a value that is no whole number is one warning."""
    if value is None:
        return 8
    try:
        return int(str(value))
    except ValueError:
        warn_once("api_call_interval", f"api_call_interval={value!r} is no whole number: 8")
        return 8


def number(
    caller: str, options: Mapping[str, Any], name: str, check: Callable[[float], str | None]
) -> float | None:
    """codecarbon's number `name`, or None; ConfigError (one line naming it) for a value
    that is none or that `check` refuses."""
    value = options.get(name)
    if value is None:
        return None
    where = f"{caller}({name}={value!r})"
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {str(value)!r} is not a number") from None
    why = check(result)
    if why:
        raise ConfigError(f"{where}: {str(value)!r} {why}")
    return result


def log_level(caller: str, value: object) -> int | None:
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


def gpu_ids(caller: str, value: object) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        items: list[object] = list(value.split(","))
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ConfigError(f"{caller}(gpu_ids={value!r}): not a list of GPU indices")
    return [str(item).strip() for item in items if str(item).strip()]


def forced_intensity(value: object) -> float | None:
    """force_carbon_intensity_g_co2e_kwh as codecarbon takes it: a negative or non-number
    value is one warning, and not used."""
    if value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        log.warning(
            "Invalid value for force_carbon_intensity_g_co2e_kwh: %r. It must be a numeric "
            "value: the intensity is the zone's",
            value,
        )
        return None
    if number < 0 or number != number:
        log.warning(
            "Invalid value for force_carbon_intensity_g_co2e_kwh: %r. It must be a "
            "non-negative number: the intensity is the zone's",
            value,
        )
        return None
    return number


def sampler_flags(caller: str, options: Mapping[str, Any]) -> dict[str, str]:
    """The sampler's flags from codecarbon's arguments: they apply to a sampler this
    tracker starts (one already running keeps its own, said once)."""
    from wattprint.config.parsers import tdp_watts

    flags: dict[str, str] = {}
    seconds = number(caller, options, "measure_power_secs", _positive)
    if seconds is not None:
        # Any positive interval is taken; the sampler's range holds it (a stamped sample
        # is at most a minute old), and rows are
        # exact whatever it is: flush() and stop() take a sample of their own).
        kept = min(max(seconds, 0.05), 60.0)
        if kept != seconds:
            warn_once(
                "measure_power_secs",
                f"measure_power_secs={seconds:g}: the node's sampler reads the devices every "
                f"{kept:g} s (its range is 0.05 to 60); each flush() and stop() takes a "
                "sample of its own",
            )
        flags["sample.interval"] = f"{kept * 1000:.0f}ms"
    watts = options.get("force_cpu_power")
    if watts is not None:
        text = str(watts)
        try:
            tdp_watts(text)
        except ValueError as err:
            where = f"{caller}(force_cpu_power={watts!r})"
            raise ConfigError(f"{where}: {err}") from None
        flags["cpu.tdp-watts"] = str(float(text))
    return flags


def _positive(value: float) -> str | None:
    return None if 0 < value < float("inf") else "must be a positive number of seconds"


def pue(caller: str, options: Mapping[str, Any]) -> float:
    def plausible(value: float) -> str | None:
        return None if 1.0 <= value <= 5.0 else "is not a plausible PUE (1.0 to 5.0)"

    found = number(caller, options, "pue", plausible)
    return 1.0 if found is None else found
