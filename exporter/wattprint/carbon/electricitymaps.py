"""Electricity Maps v3: the latest hourly average (lifecycle) intensity of one zone.

GET {base}/v3/carbon-intensity/latest?zone=DE with header auth-token: <token>.
"""

from __future__ import annotations

from wattprint.carbon.base import HttpClient, LiveProvider, ProviderError, Secret, shown
from wattprint.carbon.registry import SIGNAL_AVERAGE
from wattprint.core.model import Intensity

DEFAULT_URL = "https://api.electricitymaps.com"
UNITS = ("gCO2eq/kWh", "gCO2e/kWh", "g/kWh")


class ElectricityMaps(LiveProvider):
    """A zone's latest average intensity from the Electricity Maps API (token required)."""

    name = "electricitymaps"
    signals: tuple[str, ...] = (SIGNAL_AVERAGE,)
    default_url = DEFAULT_URL

    def __init__(self, zone: str, token: Secret, http: HttpClient, api_url: str = "") -> None:
        super().__init__(http, api_url)
        self.zone = zone
        self._token = token
        self._url = self._root + "/v3/carbon-intensity/latest"

    def fetch(self) -> list[Intensity]:
        doc = self._get_object(
            self._url,
            refused=f", the token was refused (check {self._token.env_name})",
            params={"zone": self.zone},
            headers={"auth-token": self._token.get()},
        )
        zone = doc.get("zone")
        # Without a zone match the API may answer for the caller's location instead.
        if not isinstance(zone, str) or zone.upper() != self.zone.upper():
            raise ProviderError(f"answer is for zone {shown(zone)}, not {self.zone!r}")
        unit = doc.get("unit")
        if unit is not None and unit not in UNITS:
            raise ProviderError(f"unit {shown(unit)} is not gCO2eq/kWh")
        grams, when = doc.get("carbonIntensity"), doc.get("datetime")
        return [self._intensity(SIGNAL_AVERAGE, grams, when, ("carbonIntensity", "datetime"))]

    def describe(self) -> str:
        return f"Electricity Maps zone {self.zone} at {self.shown_url}"

    def secrets(self) -> list[str]:
        return sorted(self._token.seen)
