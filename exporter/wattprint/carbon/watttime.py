"""WattTime v3: the marginal operating emissions rate (MOER) of a grid region.

GET {base}/login with HTTP basic auth gives a bearer token valid 30 minutes; a 401 on a
data call means log in again. GET {base}/v3/forecast?region=R&signal_type=co2_moer&
horizon_hours=0 gives the current value in lbs CO2/MWh. Marginal is for deciding when
to run, not for attributing emissions: the service uses it for accounting only when
asked to explicitly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from wattprint.carbon.base import (
    HttpClient,
    LiveProvider,
    ProviderError,
    Secret,
    first_item,
    json_object,
    shown,
    unauthorized,
)
from wattprint.carbon.registry import SIGNAL_MARGINAL
from wattprint.core.model import Intensity

DEFAULT_URL = "https://api.watttime.org"
# lbs/MWh -> g/kWh: 453.59237 g per lb, 1000 kWh per MWh.
G_PER_KWH_PER_LBS_PER_MWH = 0.45359237
UNITS = "lbs_co2_per_mwh"
SIGNAL_TYPE = "co2_moer"
# Tokens last 30 minutes; renewing a little early avoids a 401 round trip each time.
TOKEN_RENEW_S = 25 * 60


class WattTime(LiveProvider):
    """A region's marginal emissions rate from WattTime, logged in with a username and password."""

    name = "watttime"
    signals: tuple[str, ...] = (SIGNAL_MARGINAL,)
    default_url = DEFAULT_URL

    def __init__(
        self,
        region: str,
        username: Secret,
        password: Secret,
        http: HttpClient,
        api_url: str = "",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(http, api_url)
        self.zone = region
        self._username = username
        self._password = password
        self._monotonic = monotonic
        self._login_url = self._root + "/login"
        self._url = self._root + "/v3/forecast"
        self._token: str | None = None
        self._token_at = 0.0
        self._tokens: set[str] = set()
        self.logins = 0

    def fetch(self) -> list[Intensity]:
        if self._token is None or self._monotonic() - self._token_at > TOKEN_RENEW_S:
            self._login()
        status, body = self._get()
        if status == 401:
            self._login()
            status, body = self._get()
            if status == 401:
                raise unauthorized(self._url, " even after a new login")
        return [self._parse(body)]

    def _login(self) -> None:
        self._token = None
        self.logins += 1
        refused = f", login refused (check {self._username.env_name} and {self._password.env_name})"
        answer = self._get_object(
            self._login_url,
            "login answer",
            refused,
            auth=(self._username.get(), self._password.get()),
        )
        token = answer.get("token")
        if not isinstance(token, str) or not token:
            raise ProviderError("login answer has no token")
        self._tokens.add(token)
        self._token = token
        self._token_at = self._monotonic()

    def _get(self) -> tuple[int, Any]:
        params = {"region": self.zone, "signal_type": SIGNAL_TYPE, "horizon_hours": "0"}
        headers = {"Authorization": f"Bearer {self._token}"}
        return self._http.get_json(self._url, params=params, headers=headers)

    def _parse(self, body: object) -> Intensity:
        doc = json_object(body, "answer")
        meta = json_object(doc.get("meta"), "meta")
        units = meta.get("units")
        if units != UNITS:
            raise ProviderError(f"units {shown(units)}, expected {UNITS}")
        region = meta.get("region")
        if not isinstance(region, str) or region.upper() != self.zone.upper():
            raise ProviderError(f"answer is for region {shown(region)}, not {self.zone!r}")
        signal_type = meta.get("signal_type", SIGNAL_TYPE)
        if signal_type != SIGNAL_TYPE:
            raise ProviderError(f"signal_type {shown(signal_type)}, expected {SIGNAL_TYPE}")
        point = first_item(doc.get("data"), "data")
        grams = lbs = point.get("value")
        if isinstance(lbs, (int, float)) and not isinstance(lbs, bool):
            grams = lbs * G_PER_KWH_PER_LBS_PER_MWH  # anything else is an error, unconverted
        return self._intensity(
            SIGNAL_MARGINAL, grams, point.get("point_time"), ("value", "point_time")
        )

    def describe(self) -> str:
        return f"WattTime region {self.zone} ({SIGNAL_TYPE}) at {self.shown_url}"

    def secrets(self) -> list[str]:
        return sorted(self._username.seen | self._password.seen | self._tokens)
