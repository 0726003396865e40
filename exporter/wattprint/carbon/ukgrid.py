"""The UK Carbon Intensity API (NESO): half-hourly average intensity of the GB grid,
nationally or for one region. No key. Values are direct (operational) emissions, so
they run lower than the lifecycle figures of OWID and Electricity Maps.

National: GET {base}/intensity -> data[0].intensity.{actual,forecast}; actual is null
until the half-hour is over, and then forecast stands in.
Regional: GET {base}/regional/regionid/{id} -> data[0].data[0].intensity.forecast.
Forecast: GET {base}/intensity/{from}/fw48h (national) or
{base}/regional/intensity/{from}/fw48h/regionid/{id}: 48 h of half-hourly forecasts,
parsed by wattprint.carbon.forecast.parse_uk.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from wattprint.carbon import forecast
from wattprint.carbon.base import (
    HttpClient,
    LiveProvider,
    ProviderError,
    first_item,
    json_object,
    shown,
)
from wattprint.carbon.registry import SIGNAL_AVERAGE
from wattprint.core.model import Intensity

DEFAULT_URL = "https://api.carbonintensity.org.uk"
# 1-14 are the distribution network regions, 15-17 England, Scotland, Wales, 18 GB.
REGION_IDS = range(1, 19)


class UkGrid(LiveProvider):
    """GB's (or one GB region's) half-hourly intensity and forecast from the NESO API, no key."""

    name = "uk-grid"
    signals: tuple[str, ...] = (SIGNAL_AVERAGE,)
    default_url = DEFAULT_URL

    def __init__(self, region_id: int | None, http: HttpClient, api_url: str = "") -> None:
        super().__init__(http, api_url)
        self.region_id = region_id
        root = self._root
        if region_id is None:
            self.zone = "GB"
            self._url = root + "/intensity"
            self._forecast_url = root + "/intensity/{}/fw48h"
        else:
            self.zone = f"GB-region-{region_id}"
            self._url = f"{root}/regional/regionid/{region_id}"
            self._forecast_url = root + "/regional/intensity/{}/fw48h/regionid/" + str(region_id)

    def fetch(self) -> list[Intensity]:
        entry = first_item(self._get_object(self._url).get("data"), "data")
        if self.region_id is not None:
            regionid = entry.get("regionid")
            if regionid != self.region_id:
                raise ProviderError(f"answer is for region {shown(regionid)}, not {self.region_id}")
            if "intensity" not in entry:
                entry = first_item(entry.get("data"), "data[0].data")
        intensity = json_object(entry.get("intensity"), "intensity")
        grams = _actual_or_forecast(intensity)
        return [self._intensity(SIGNAL_AVERAGE, grams, entry.get("from"), ("intensity", "from"))]

    def fetch_forecast(self, now: float) -> forecast.Forecast:
        """The next 48 h from the half-hour that contains now; ProviderError if bad."""
        start = datetime.fromtimestamp(now - now % 1800, tz=timezone.utc)
        url = self._forecast_url.format(start.strftime("%Y-%m-%dT%H:%MZ"))
        points = forecast.parse_uk(self._get_object(url), self.region_id)
        return forecast.Forecast(self.zone, self.name, now, tuple(points))

    def describe(self) -> str:
        where = "national" if self.region_id is None else f"region {self.region_id}"
        return f"UK Carbon Intensity API, {where}, at {self.shown_url}"

    def secrets(self) -> list[str]:
        return []


def _actual_or_forecast(intensity: dict[str, Any]) -> object:
    actual = intensity.get("actual")
    return actual if actual is not None else intensity.get("forecast")
