"""The value parsers of the settings: each takes the text of a flag, an environment
variable or a config-file value and returns the value, or raises ValueError with a
message that names what is wrong. options.py's table names one per setting; the
report's flags use them too.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from typing import Any

from wattprint.core.units import SECONDS_PER_YEAR, check_pue, parse_duration
from wattprint.sources import registry

_HOSTNAME_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def listen_address(text: str) -> str:
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


def choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return text

    parse.metavar = "|".join(choices)  # type: ignore[attr-defined]
    return parse


class Registered:
    """A choice among what the registries list, read when parsing and for --help, so a
    source or provider registered later is a choice too."""

    def __init__(self, choices: Callable[[], tuple[str, ...]]) -> None:
        self._choices = choices

    @property
    def metavar(self) -> str:
        return "|".join(self._choices())

    def __call__(self, text: str) -> str:
        return choice(*self._choices())(text)


def source_choice(component: str) -> Registered:
    return Registered(lambda: registry.source_choices(component))


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    value = number(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} must be a positive number")
    return value


def non_negative_float(text: str) -> float:
    value = number(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} must be zero or a positive number")
    return value


def up_to(limit: float, unit: str) -> Callable[[str], float]:
    """Zero or a positive number no larger than `limit`: a figure past it is no real
    hardware's, and would overflow the energy and emissions arithmetic (1e308 kg
    stopped every sample; 1e308 W silently turned a model off)."""

    def parse(text: str) -> float:
        value = non_negative_float(text)
        if value > limit:
            raise ValueError(f"{text!r} is over {limit:g} {unit}, more than any real hardware")
        return value

    parse.metavar = "NUMBER"  # type: ignore[attr-defined]
    return parse


# The largest figures taken: an order of magnitude past the largest real one.
MAX_TDP_W = 5_000.0  # per CPU package (the largest are 500 W)
MAX_WATTS_PER_GIB = 10.0  # (DRAM is about 0.4 W/GiB)
MAX_GPU_KGCO2E = 10_000.0  # per GPU (an H200 is 164 kg)
MAX_NODE_KGCO2E = 100_000.0  # per server, GPUs excluded (a few tonnes at most)

tdp_watts = up_to(MAX_TDP_W, "W per package")
watts_per_gib = up_to(MAX_WATTS_PER_GIB, "W/GiB")
node_kgco2e = up_to(MAX_NODE_KGCO2E, "kgCO2e")


def workload_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 100_000:
        raise ValueError(f"{text!r} must be between 1 and 100000")
    return value


def gpu_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= 1024:
        raise ValueError(f"{text!r} must be between 0 and 1024")
    return value


def pue(text: str) -> float:
    return check_pue(number(text), text)


def positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"{text!r} must be longer than 0")
    return value


def sample_interval(text: str) -> float:
    value = parse_duration(text)
    if not 0.05 <= value <= 300:
        raise ValueError(f"{text!r} must be between 50ms and 5m")
    return value


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def name_list(text: str) -> tuple[str, ...]:
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    if not items:
        raise ValueError("must name at least one item")
    return items


def any_text(text: str) -> str:
    return text


def url(text: str) -> str:
    if text and not re.match(r"^https?://[^\s/]+", text):
        raise ValueError(f"{text!r} is not an http(s) URL")
    return text.rstrip("/")


def log_level(text: str) -> str:
    return choice("debug", "info", "warn", "error")(text.lower())


METAVARS: dict[Callable[[str], Any], str] = {
    listen_address: "[HOST]:PORT",
    positive_float: "NUMBER",
    non_negative_float: "NUMBER",
    pue: "NUMBER",
    positive_duration: "DURATION",
    sample_interval: "DURATION",
    boolean: "true|false",
    name_list: "NAME,...",
    url: "URL",
    log_level: "debug|info|warn|error",
    gpu_count: "N",
}


def parse_gpu_figures(text: str) -> tuple[tuple[str, float], ...]:
    """`MODEL=KG,MODEL=KG` (model as NVML names it); ValueError with one clear line."""
    pairs: list[tuple[str, float]] = []
    for item in text.split(","):
        if not item.strip():
            continue
        model, sep, kg = item.rpartition("=")
        model = model.strip()
        if not sep or not model:
            raise ValueError(f"{item.strip()!r} is not MODEL=KG (e.g. 'NVIDIA H200=164')")
        try:
            value = float(kg)
        except ValueError:
            raise ValueError(f"{kg.strip()!r} for {model!r} is not a number of kg") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{value:g} kg for {model!r} must be zero or more")
        if value > MAX_GPU_KGCO2E:
            raise ValueError(
                f"{value:g} kg for {model!r} is over {MAX_GPU_KGCO2E:g} kgCO2e, "
                "more than any real GPU"
            )
        pairs.append((model, value))
    return tuple(pairs)


def parse_lifetime(text: str) -> float:
    """Service life in seconds from a number of years ("4", "5.5") or "4y"."""
    raw = text.strip().removesuffix("y")
    try:
        years = float(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of years (e.g. 4)") from None
    if not math.isfinite(years) or not 0.25 <= years <= 30:
        raise ValueError(f"{text!r} is not a plausible service life (0.25 to 30 years)")
    return years * SECONDS_PER_YEAR
