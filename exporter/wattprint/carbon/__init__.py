"""Grid carbon intensity: the embedded default, live providers, and the service that
picks the intensity emissions are accounted with."""

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
