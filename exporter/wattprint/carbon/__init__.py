"""Grid carbon intensity: the embedded default, live providers, and the service that
picks the intensity emissions are accounted with.

The names below load with their modules on first use (PEP 562): the flags' choices
import carbon.catalog at start-up, which must not bring the whole service with it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wattprint.carbon.base import (
        SIGNAL_AVERAGE,
        SIGNAL_MARGINAL,
        CarbonConfigError,
        CarbonSettings,
        Intensity,
        UnknownZoneError,
    )
    from wattprint.carbon.embedded import lookup
    from wattprint.carbon.service import CarbonService, CarbonStatus, format_duration

_HOMES = {
    "SIGNAL_AVERAGE": "base",
    "SIGNAL_MARGINAL": "base",
    "CarbonConfigError": "base",
    "CarbonSettings": "base",
    "Intensity": "base",
    "UnknownZoneError": "base",
    "lookup": "embedded",
    "CarbonService": "service",
    "CarbonStatus": "service",
    "format_duration": "service",
}

__all__ = [
    "SIGNAL_AVERAGE",
    "SIGNAL_MARGINAL",
    "CarbonConfigError",
    "CarbonService",
    "CarbonSettings",
    "CarbonStatus",
    "Intensity",
    "UnknownZoneError",
    "format_duration",
    "lookup",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
