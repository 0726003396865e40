"""The carbon providers' registry: each provider declares itself once (carbon/catalog.py), and
--carbon.provider, --help, doctor, the chart's secrets and the GHG export's citations follow."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProviderContext:
    """What a provider factory may use: the resolved zone, the region, the environment, HTTP."""

    name: str
    zone: str  # the embedded default's zone, resolved
    zone_key: str  # its dataset key (GBR, gcp:europe-west2)
    region: str  # --carbon.provider-region, stripped
    api_url: str
    environ: Mapping[str, str]
    http: Any  # carbon.base.HttpClient


# The intensity signals a provider may serve (carbon.base re-exports them).
SIGNAL_AVERAGE = "average"
SIGNAL_MARGINAL = "marginal"


@dataclass(frozen=True)
class ProviderSpec:
    """One carbon provider's declaration: its factory, secrets, zones, signals and citation."""

    name: str  # the value of --carbon.provider
    factory: Callable[[ProviderContext], Any]  # a carbon.base.Provider, or None (static)
    help: str
    secrets: tuple[str, ...] = ()  # environment variables (each also as NAME_FILE)
    # Its own zone, used when --carbon.zone is empty; "" = the zone is required.
    default_zone: str = ""
    region: str = "none"  # none | optional | required
    signals: tuple[str, ...] = (SIGNAL_AVERAGE,)
    live: bool = True  # asks an API (static does not)
    citation: str = ""  # where its numbers come from, for the GHG export


_PROVIDERS: dict[str, ProviderSpec] = {}


def register_provider(spec: ProviderSpec) -> ProviderSpec:
    if spec.name in _PROVIDERS:
        raise ValueError(f"carbon provider {spec.name!r} is already registered")
    _PROVIDERS[spec.name] = spec
    return spec


def unregister_provider(name: str) -> None:
    _PROVIDERS.pop(name, None)


def providers() -> list[ProviderSpec]:
    return list(_PROVIDERS.values())


def provider(name: str) -> ProviderSpec:
    return _PROVIDERS[name]


def citation(name: str) -> str:
    spec = _PROVIDERS.get(name)
    return spec.citation if spec is not None else ""


def provider_names() -> tuple[str, ...]:
    return tuple(p.name for p in providers())


def provider_secrets() -> tuple[str, ...]:
    """Every environment variable a provider reads a secret from, in registration order."""
    return tuple(dict.fromkeys(env for p in providers() for env in p.secrets))


def explain() -> list[str]:
    """Doctor's lines: each registered provider with what it needs."""
    lines = []
    for p in providers():
        needs = [*p.secrets, *(["a provider region"] if p.region == "required" else [])]
        lines.append(
            f"carbon {p.name}: {p.help}" + (f"; needs {', '.join(needs)}" if needs else "")
        )
    return lines
