"""Settings: defaults, then --config.file, then WATTPRINT_* environment variables, then flags.

Every setting has one flag name (node_exporter style, e.g. ``sample.interval``); the
config file uses the same names as keys, the environment the upper-case form with
``.`` and ``-`` turned into ``_``. Any bad value raises ConfigError with one line that
names it, and the CLI turns that into exit status 2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from wattprint.carbon import registry as carbon_registry
from wattprint.config.parsers import (
    METAVARS,
    Registered,
    any_text,
    boolean,
    choice,
    gpu_count,
    listen_address,
    log_level,
    name_list,
    node_kgco2e,
    parse_gpu_figures,
    parse_lifetime,
    positive_duration,
    positive_float,
    pue,
    sample_interval,
    source_choice,
    tdp_watts,
    url,
    watts_per_gib,
    workload_count,
)
from wattprint.core.units import format_duration


class ConfigError(ValueError):
    """A bad flag, environment variable or config file value; str() is one line."""


def metavar(option: Option) -> str:
    """What --help shows for the option's value: its choices, or what kind of value."""
    known = METAVARS.get(option.parse) or getattr(option.parse, "metavar", None)
    if known:
        return str(known)
    if option.flag.startswith("path.") or option.flag.endswith("file"):
        return "PATH"
    return re.split(r"[.-]", option.flag)[-1].upper()


@dataclass(frozen=True)
class Option:
    """One setting: its flag, the Config field it fills, its parser, its default and help."""

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
        listen_address,
        ":9950",
        "address to serve /metrics, /healthz and / on",
    ),
    Option(
        "web.config.file",
        "web_config_file",
        any_text,
        "",
        "TLS and basic auth for /metrics (Prometheus exporter-toolkit format)",
    ),
    Option(
        "gpu.source",
        "gpu_source",
        source_choice("gpu"),
        "auto",
        "where GPU energy comes from",
    ),
    Option(
        "gpu.expect",
        "gpu_expect",
        gpu_count,
        "0",
        "GPUs this node should have: fewer measured is said by wattprint_gpu_measured "
        "against wattprint_gpu_expected, the log and /healthz (0: no expectation)",
    ),
    Option(
        "gpu.replay-file",
        "gpu_replay_file",
        any_text,
        "",
        "GPU trace (wattprint-gpu-trace/v1 JSON Lines) for --gpu.source=replay",
    ),
    Option(
        "replay.speed",
        "replay_speed",
        positive_float,
        "1.0",
        "trace seconds played per wall-clock second",
    ),
    Option(
        "cpu.source",
        "cpu_source",
        source_choice("cpu"),
        "auto",
        "where CPU energy comes from (auto: RAPL if readable, else the model)",
    ),
    Option(
        "memory.source",
        "memory_source",
        source_choice("memory"),
        "auto",
        "where memory energy comes from (auto: RAPL dram if readable, else the model)",
    ),
    Option(
        "platform.source",
        "platform_source",
        source_choice("platform"),
        "auto",
        "where the node's input energy comes from, for the rest of the server "
        "(component platform; auto: pm_counters where present, else redfish where "
        "--platform.redfish-url is set, else ipmi where --platform.ipmi-device and ipmitool "
        "give a DCMI power reading, else none)",
    ),
    Option(
        "platform.redfish-url",
        "platform_redfish_url",
        url,
        "",
        "the BMC's base URL (https://bmc.example); credentials from $WATTPRINT_REDFISH_USERNAME "
        "and $WATTPRINT_REDFISH_PASSWORD, or their _FILE forms",
    ),
    Option(
        "platform.redfish-chassis",
        "platform_redfish_chassis",
        any_text,
        "",
        "the Redfish chassis id whose input is the node's (empty: the first listed)",
    ),
    Option(
        "platform.redfish-ca-file",
        "platform_redfish_ca_file",
        any_text,
        "",
        "CA certificates (PEM) the BMC's TLS certificate is checked against (empty: the system's)",
    ),
    Option(
        "platform.redfish-insecure",
        "platform_redfish_insecure",
        boolean,
        "false",
        "do not check the BMC's TLS certificate (self-signed; prefer --platform.redfish-ca-file)",
    ),
    Option(
        "platform.ipmi-device",
        "platform_ipmi_device",
        any_text,
        "/dev/ipmi0",
        "the in-band IPMI device the BMC's DCMI power reading is asked through (ipmitool)",
    ),
    Option(
        "cpu.tdp-watts",
        "cpu_tdp_watts",
        tdp_watts,
        "0",
        "CPU TDP per package for the CPU model (0: look it up by CPU model)",
    ),
    Option(
        "memory.watts-per-gib",
        "memory_watts_per_gib",
        watts_per_gib,
        "0",
        "memory model: watts per GiB installed (0: 0.375, see docs/power-models.md)",
    ),
    Option("path.sysfs", "sysfs_root", any_text, "/sys", "sysfs mount point"),
    Option("path.procfs", "procfs_root", any_text, "/proc", "procfs mount point"),
    Option(
        "carbon.provider",
        "carbon_provider",
        Registered(carbon_registry.provider_names),
        "static",
        "grid carbon intensity source (static: the embedded yearly dataset, offline)",
    ),
    Option(
        "carbon.zone",
        "carbon_zone",
        any_text,
        "",
        "grid zone: ISO country (DE, DEU), gcp:<region>, or WORLD (OWID world average); "
        "empty: the provider's own zone, WORLD for static",
    ),
    Option(
        "carbon.provider-region",
        "carbon_provider_region",
        any_text,
        "",
        "the provider's own region id (WattTime region, UK region id)",
    ),
    Option(
        "carbon.api-url",
        "carbon_api_url",
        url,
        "",
        "override the carbon provider's base URL (proxies, tests)",
    ),
    Option(
        "carbon.refresh-interval",
        "carbon_refresh_interval",
        positive_duration,
        "5m",
        "how often to fetch the live carbon intensity",
    ),
    Option(
        "carbon.fallback-after",
        "carbon_fallback_after",
        positive_duration,
        "1h",
        "after this long without a good live value, account with the embedded default",
    ),
    Option(
        "carbon.accounting-signal",
        "carbon_accounting_signal",
        choice("average", "marginal"),
        "average",
        "signal used for emissions accounting (marginal only on explicit request)",
    ),
    Option("pue", "pue", pue, "1.0", "power usage effectiveness applied to emissions"),
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
        node_kgco2e,
        "0",
        "embodied kgCO2e of the rest of the server, GPUs excluded (0: unknown, counts nothing)",
    ),
    Option(
        "sample.interval", "sample_interval", sample_interval, "1s", "how often devices are read"
    ),
    Option(
        "sample.timestamps",
        "sample_timestamps",
        boolean,
        "true",
        "stamp energy and power samples with the time the devices were read (false: "
        "Prometheus uses the scrape time, up to one sample interval late)",
    ),
    Option(
        "workload.retention",
        "workload_retention",
        positive_duration,
        "10m",
        "keep a workload's series this long after its last process ends",
    ),
    Option(
        "workload.env-vars",
        "workload_env_vars",
        name_list,
        "WATTPRINT_WORKLOAD",
        "environment variables that name a process's workload (comma-separated)",
    ),
    Option(
        "workload.max-series",
        "workload_max_series",
        workload_count,
        "500",
        "most workloads with series of their own on this node; the energy of any more "
        'is counted as workload="other"',
    ),
    Option(
        "kubernetes.node-name",
        "kubernetes_node_name",
        any_text,
        "",
        "this node's name, for listing its pods (default: $NODE_NAME)",
    ),
    Option(
        "kubernetes.job-labels",
        "kubernetes_job_labels",
        name_list,
        "batch.kubernetes.io/job-name,job-name,training.kubeflow.org/job-name,"
        "app.kubernetes.io/instance",
        "pod labels that name the job, first present wins",
    ),
    Option(
        "state.file",
        "state_file",
        any_text,
        "/var/lib/wattprint/state.json",
        "where counters are kept across restarts, locked so that one exporter runs per "
        "node (empty: neither)",
    ),
    Option("log.level", "log_level", log_level, "info", "debug, info, warn or error"),
)

_BY_FLAG = {option.flag: option for option in OPTIONS}


@dataclass(frozen=True)
class Config:
    """Every setting, parsed and checked: what the exporter is built from."""

    listen_address: str
    web_config_file: str
    gpu_source: str
    gpu_expect: int
    gpu_replay_file: str
    replay_speed: float
    cpu_source: str
    memory_source: str
    platform_source: str
    platform_redfish_url: str
    platform_redfish_chassis: str
    platform_redfish_ca_file: str
    platform_redfish_insecure: bool
    platform_ipmi_device: str
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
    from wattprint.config import yamlfile

    try:
        data = yamlfile.load(path)
    except OSError as err:
        raise ConfigError(f"cannot read --config.file {path}: {err.strerror}") from None
    except yamlfile.YamlFileError as err:
        raise ConfigError(f"--config.file {path} {err}") from None
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
        elif isinstance(value, bool) and _BY_FLAG[key].parse is boolean:
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
    if config.gpu_expect and config.gpu_source == "none":
        raise ConfigError(f"--gpu.expect={config.gpu_expect} but --gpu.source=none reads no GPU")
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
