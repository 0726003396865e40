"""Electricity Maps v3: the latest hourly average (lifecycle) intensity of one zone.

GET {base}/v3/carbon-intensity/latest?zone=DE with header auth-token: <token>.
"""

from __future__ import annotations

from wattprint.carbon.base import (
    SIGNAL_AVERAGE,
    HttpClient,
    Intensity,
    ProviderError,
    Secret,
    base_url,
    checked_intensity,
    json_object,
    parse_time,
    safe_url,
    shown,
)

DEFAULT_URL = "https://api.electricitymaps.com"
UNITS = ("gCO2eq/kWh", "gCO2e/kWh", "g/kWh")


class ElectricityMaps:
    name = "electricitymaps"
    signals: tuple[str, ...] = (SIGNAL_AVERAGE,)

    def __init__(self, zone: str, token: Secret, http: HttpClient, api_url: str = "") -> None:
        self.zone = zone
        self._token = token
        self._http = http
        self._url = base_url(api_url, DEFAULT_URL) + "/v3/carbon-intensity/latest"

    def fetch(self) -> list[Intensity]:
        status, body = self._http.get_json(
            self._url, params={"zone": self.zone}, headers={"auth-token": self._token.get()}
        )
        if status == 401:
            raise ProviderError(
                f"GET {safe_url(self._url)}: HTTP 401, the token was refused "
                f"(check {self._token.env_name})",
                "unauthorized",
            )
        doc = json_object(body, "answer")
        zone = doc.get("zone")
        # Without a zone match the API may answer for the caller's location instead.
        if not isinstance(zone, str) or zone.upper() != self.zone.upper():
            raise ProviderError(f"answer is for zone {shown(zone)}, not {self.zone!r}")
        unit = doc.get("unit")
        if unit is not None and unit not in UNITS:
            raise ProviderError(f"unit {shown(unit)} is not gCO2eq/kWh")
        grams = checked_intensity(doc.get("carbonIntensity"), "carbonIntensity")
        when = parse_time(doc.get("datetime"), "datetime")
        return [Intensity(self.zone, self.name, SIGNAL_AVERAGE, grams, when)]

    def describe(self) -> str:
        return f"Electricity Maps zone {self.zone} at {safe_url(self._url)}"

    def secrets(self) -> list[str]:
        return sorted(self._token.seen)
