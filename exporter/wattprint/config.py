"""Settings: defaults, then --config.file, then WATTPRINT_* environment variables, then flags.

Every setting has one flag name (node_exporter style, e.g. ``sample.interval``); the
config file uses the same names as keys, the environment the upper-case form with
``.`` and ``-`` turned into ``_``. Any bad value raises ConfigError with one line that
names it, and the CLI turns that into exit status 2.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from . import registry
from .embodied import parse_gpu_figures, parse_lifetime
from .units import check_pue, format_duration, parse_duration


class ConfigError(ValueError):
    """A bad flag, environment variable or config file value; str() is one line."""


_HOSTNAME_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _listen_address(text: str) -> str:
    """[HOST]:PORT as Go's net.Listen takes it: no scheme, no spaces, a real address."""
    bad = (
        f"not a listen address: {text!r} (use [HOST]:PORT, e.g. :9950, 127.0.0.1:9950, [::1]:9950)"
    )
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(bad)
    try:
        if host.startswith("[") and host.endswith("]"):
            ipaddress.IPv6Address(host[1:-1])
        elif re.fullmatch(r"[0-9.]+", host):
            ipaddress.IPv4Address(host)
        elif host and (len(host) > 253 or not _HOSTNAME_RE.fullmatch(host)):
            raise ValueError(host)
    except ValueError:
        raise ValueError(bad) from None
    return text


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return text

    parse.metavar = "|".join(choices)  # type: ignore[attr-defined]
    return parse


class _Registered:
    """A choice among what registry.py lists, read when parsing and for --help, so a
    source or provider registered later is a choice too."""

    def __init__(self, choices: Callable[[], tuple[str, ...]]) -> None:
        self._choices = choices

    @property
    def metavar(self) -> str:
        return "|".join(self._choices())

    def __call__(self, text: str) -> str:
        return _choice(*self._choices())(text)


def _source_choice(component: str) -> _Registered:
    return _Registered(lambda: registry.source_choices(component))


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None


def _positive_float(text: str) -> float:
    value = _number(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} must be a positive number")
    return value


def _non_negative_float(text: str) -> float:
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} must be zero or a positive number")
    return value


def _workload_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 100_000:
        raise ValueError(f"{text!r} must be between 1 and 100000")
    return value


def _pue(text: str) -> float:
    return check_pue(_number(text), text)


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"{text!r} must be longer than 0")
    return value


def _sample_interval(text: str) -> float:
    value = parse_duration(text)
    if not 0.05 <= value <= 300:
        raise ValueError(f"{text!r} must be between 50ms and 5m")
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def _name_list(text: str) -> tuple[str, ...]:
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    if not items:
        raise ValueError("must name at least one item")
    return items


def _text(text: str) -> str:
    return text


def _url(text: str) -> str:
    if text and not re.match(r"^https?://[^\s/]+", text):
        raise ValueError(f"{text!r} is not an http(s) URL")
    return text.rstrip("/")


def _log_level(text: str) -> str:
    return _choice("debug", "info", "warn", "error")(text.lower())


_METAVARS: dict[Callable[[str], Any], str] = {
    _listen_address: "[HOST]:PORT",
    _positive_float: "NUMBER",
    _non_negative_float: "NUMBER",
    _pue: "NUMBER",
    _positive_duration: "DURATION",
    _sample_interval: "DURATION",
    _bool: "true|false",
    _name_list: "NAME,...",
    _url: "URL",
    _log_level: "debug|info|warn|error",
}


def metavar(option: Option) -> str:
    """What --help shows for the option's value: its choices, or what kind of value."""
    known = _METAVARS.get(option.parse) or getattr(option.parse, "metavar", None)
    if known:
        return str(known)
    if option.flag.startswith("path.") or option.flag.endswith("file"):
        return "PATH"
    return re.split(r"[.-]", option.flag)[-1].upper()


@dataclass(frozen=True)
class Option:
    flag: str  # without the leading "--"
    field: str
    parse: Callable[[str], Any]
    default: str
    help: str

    @property
    def env(self) -> str:
        return "WATTPRINT_" + re.sub(r"[.-]", "_", self.flag).upper()


OPTIONS: tuple[Option, ...] = (
    Option(
        "web.listen-address",
        "listen_address",
        _listen_address,
        ":9950",
        "address to serve /metrics, /healthz and / on",
    ),
    Option(
        "web.config.file",
        "web_config_file",
        _text,
        "",
        "TLS and basic auth for /metrics (Prometheus exporter-toolkit format)",
    ),
    Option(
        "gpu.source",
        "gpu_source",
        _source_choice("gpu"),
        "auto",
        "where GPU energy comes from",
    ),
    Option(
        "gpu.replay-file",
        "gpu_replay_file",
        _text,
        "",
        "GPU trace (wattprint-gpu-trace/v1 JSON Lines) for --gpu.source=replay",
    ),
    Option(
        "replay.speed",
        "replay_speed",
        _positive_float,
        "1.0",
        "trace seconds played per wall-clock second",
    ),
    Option(
        "cpu.source",
        "cpu_source",
        _source_choice("cpu"),
        "auto",
        "where CPU energy comes from (auto: RAPL if readable, else the model)",
    ),
    Option(
        "memory.source",
        "memory_source",
        _source_choice("memory"),
        "auto",
        "where memory energy comes from (auto: RAPL dram if readable, else the model)",
    ),
    Option(
        "cpu.tdp-watts",
        "cpu_tdp_watts",
        _non_negative_float,
        "0",
        "CPU TDP per package for the CPU model (0: look it up by CPU model)",
    ),
    Option(
        "memory.watts-per-gib",
        "memory_watts_per_gib",
        _non_negative_float,
        "0",
        "memory model: watts per GiB installed (0: 0.375, see docs/power-models.md)",
    ),
    Option("path.sysfs", "sysfs_root", _text, "/sys", "sysfs mount point"),
    Option("path.procfs", "procfs_root", _text, "/proc", "procfs mount point"),
    Option(
        "carbon.provider",
        "carbon_provider",
        _Registered(registry.provider_names),
        "static",
        "grid carbon intensity source (static: the embedded yearly dataset, offline)",
    ),
    Option(
        "carbon.zone",
        "carbon_zone",
        _text,
        "",
        "grid zone: ISO country (DE, DEU), gcp:<region>, or WORLD (OWID world average); "
        "empty: the provider's own zone, WORLD for static",
    ),
    Option(
        "carbon.provider-region",
        "carbon_provider_region",
        _text,
        "",
        "the provider's own region id (WattTime region, UK region id)",
    ),
    Option(
        "carbon.api-url",
        "carbon_api_url",
        _url,
        "",
        "override the carbon provider's base URL (proxies, tests)",
    ),
    Option(
        "carbon.refresh-interval",
        "carbon_refresh_interval",
        _positive_duration,
        "5m",
        "how often to fetch the live carbon intensity",
    ),
    Option(
        "carbon.fallback-after",
        "carbon_fallback_after",
        _positive_duration,
        "1h",
        "after this long without a good live value, account with the embedded default",
    ),
    Option(
        "carbon.accounting-signal",
        "carbon_accounting_signal",
        _choice("average", "marginal"),
        "average",
        "signal used for emissions accounting (marginal only on explicit request)",
    ),
    Option("pue", "pue", _pue, "1.0", "power usage effectiveness applied to emissions"),
    Option(
        "embodied.lifetime",
        "embodied_lifetime",
        parse_lifetime,
        "4",
        "service life in years over which the hardware's embodied emissions are amortized",
    ),
    Option(
        "embodied.gpu-kgco2e",
        "embodied_gpu_kgco2e",
        parse_gpu_figures,
        "",
        "embodied kgCO2e per GPU by model as NVML names it, comma-separated MODEL=KG "
        "(e.g. 'NVIDIA H200=164'); adds to or overrides the cited table",
    ),
    Option(
        "embodied.node-kgco2e",
        "embodied_node_kgco2e",
        _non_negative_float,
        "0",
        "embodied kgCO2e of the rest of the server, GPUs excluded (0: unknown, counts nothing)",
    ),
    Option(
        "sample.interval", "sample_interval", _sample_interval, "1s", "how often devices are read"
    ),
    Option(
        "sample.timestamps",
        "sample_timestamps",
        _bool,
        "true",
        "stamp energy and power samples with the time the devices were read (false: "
        "Prometheus uses the scrape time, up to one sample interval late)",
    ),
    Option(
        "workload.retention",
        "workload_retention",
        _positive_duration,
        "10m",
        "keep a workload's series this long after its last process ends",
    ),
    Option(
        "workload.env-vars",
        "workload_env_vars",
        _name_list,
        "WATTPRINT_WORKLOAD",
        "environment variables that name a process's workload (comma-separated)",
    ),
    Option(
        "workload.max-series",
        "workload_max_series",
        _workload_count,
        "500",
        "most workloads with series of their own on this node; the energy of any more "
        'is counted as workload="other"',
    ),
    Option(
        "kubernetes.node-name",
        "kubernetes_node_name",
        _text,
        "",
        "this node's name, for listing its pods (default: $NODE_NAME)",
    ),
    Option(
        "kubernetes.job-labels",
        "kubernetes_job_labels",
        _name_list,
        "batch.kubernetes.io/job-name,job-name,training.kubeflow.org/job-name,"
        "app.kubernetes.io/instance",
        "pod labels that name the job, first present wins",
    ),
    Option(
        "state.file",
        "state_file",
        _text,
        "/var/lib/wattprint/state.json",
        "where counters are kept across restarts, locked so that one exporter runs per "
        "node (empty: neither)",
    ),
    Option("log.level", "log_level", _log_level, "info", "debug, info, warn or error"),
)

_BY_FLAG = {option.flag: option for option in OPTIONS}


@dataclass(frozen=True)
class Config:
    listen_address: str
    web_config_file: str
    gpu_source: str
    gpu_replay_file: str
    replay_speed: float
    cpu_source: str
    memory_source: str
    cpu_tdp_watts: float
    memory_watts_per_gib: float
    sysfs_root: str
    procfs_root: str
    carbon_provider: str
    carbon_zone: str
    carbon_provider_region: str
    carbon_api_url: str
    carbon_refresh_interval: float
    carbon_fallback_after: float
    carbon_accounting_signal: str
    pue: float
    embodied_lifetime: float
    embodied_gpu_kgco2e: tuple[tuple[str, float], ...]
    embodied_node_kgco2e: float
    sample_interval: float
    sample_timestamps: bool
    workload_retention: float
    workload_env_vars: tuple[str, ...]
    workload_max_series: int
    kubernetes_node_name: str
    kubernetes_job_labels: tuple[str, ...]
    state_file: str
    log_level: str


assert {f.name for f in fields(Config)} == {o.field for o in OPTIONS}


def _parse_one(option: Option, raw: str, where: str) -> Any:
    try:
        return option.parse(raw)
    except ValueError as err:
        raise ConfigError(f"bad value for {where}: {err}") from None


def load_config_file(path: str) -> dict[str, str]:
    """Read a YAML mapping of flag names to values; reject unknown keys."""
    import yaml  # only with a config file: 3 MB and 12 ms at every start otherwise

    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as err:
        raise ConfigError(f"cannot read --config.file {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"--config.file {path} is not valid YAML{at}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config.file {path} must be a mapping of flag names to values")
    values: dict[str, str] = {}
    for key, value in data.items():
        if key not in _BY_FLAG:
            raise ConfigError(f"unknown key {key!r} in --config.file {path}")
        if isinstance(value, (list, tuple)):
            value = ",".join(str(item) for item in value)
        elif isinstance(value, bool) and _BY_FLAG[key].parse is _bool:
            value = "true" if value else "false"
        elif isinstance(value, bool) or value is None or isinstance(value, dict):
            raise ConfigError(f"bad value for {key} in --config.file {path}: {value!r}")
        values[key] = str(value)
    return values


def build_config(
    flags: Mapping[str, str],
    environ: Mapping[str, str] = os.environ,
    config_file: str = "",
) -> Config:
    """Merge the layers; later wins: defaults, config file, environment, flags."""
    file_values = load_config_file(config_file) if config_file else {}
    parsed: dict[str, Any] = {}
    for option in OPTIONS:
        raw, where = option.default, f"--{option.flag} (default)"
        if option.flag in file_values:
            raw, where = file_values[option.flag], f"{option.flag} in --config.file"
        if option.env in environ:
            raw, where = environ[option.env], option.env
        if option.flag in flags:
            raw, where = flags[option.flag], f"--{option.flag}"
        parsed[option.field] = _parse_one(option, raw, where)
    config = Config(**parsed)
    if not config.kubernetes_node_name and environ.get("NODE_NAME"):
        config = _replace(config, kubernetes_node_name=environ["NODE_NAME"])
    _check_consistency(config)
    return config


def _replace(config: Config, **changes: Any) -> Config:
    from dataclasses import replace

    return replace(config, **changes)


def _check_consistency(config: Config) -> None:
    # A stamped sample is as old as the sampler's last read: past about a minute,
    # Prometheus's 5m lookback and the rules' 5m rate windows would see too few.
    if config.sample_timestamps and config.sample_interval > 60:
        raise ConfigError(
            f"--sample.interval={format_duration(config.sample_interval)} is over 1m: "
            "set --sample.timestamps=false, or sample more often"
        )
    if config.gpu_source == "replay" and not config.gpu_replay_file:
        raise ConfigError("--gpu.source=replay needs --gpu.replay-file")
    if config.gpu_replay_file and config.gpu_source not in ("replay", "auto"):
        raise ConfigError(
            f"--gpu.replay-file is set but --gpu.source={config.gpu_source} does not replay"
        )
    if config.gpu_replay_file and not os.path.isfile(config.gpu_replay_file):
        raise ConfigError(f"bad value for --gpu.replay-file: {config.gpu_replay_file} not found")
    if config.web_config_file and not os.path.isfile(config.web_config_file):
        raise ConfigError(f"bad value for --web.config.file: {config.web_config_file} not found")
