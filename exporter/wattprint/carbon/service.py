"""The carbon service: which intensity emissions are accounted with, right now.

A background thread asks the live provider at the refresh interval (with jittered
backoff after failures and the server's Retry-After on 429) and keeps the last good
answer. accounting() only reads what the thread left behind, under a lock, so a slow
or dead provider never delays a sample. When no answer has come for fallback_after_s,
accounting uses the embedded default for the zone (provider "static") until the
provider answers again.

WattTime's marginal signal is exported but feeds accounting only with
accounting_signal="marginal"; even then the fallback is the embedded (average) default.
poll_once() is not meant to run while the thread does (WattTime keeps token state).
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from wattprint.carbon import embedded, forecast
from wattprint.carbon import registry as carbon_registry
from wattprint.carbon.base import (
    PROVIDER_STATIC,
    CarbonConfigError,
    CarbonSettings,
    HttpClient,
    Provider,
    ProviderError,
)
from wattprint.carbon.registry import SIGNAL_AVERAGE, SIGNAL_MARGINAL
from wattprint.core.background import DaemonLoop
from wattprint.core.model import CarbonStatus, Intensity
from wattprint.core.units import check_pue, format_duration

if TYPE_CHECKING:
    import requests

log = logging.getLogger("wattprint.carbon")

# A value refers to the current hour or half-hour; one from more than a day ago (or
# from the future) means a stuck upstream or a wrong clock, not the grid now.
MAX_VALUE_AGE_S = 24 * 3600.0
MAX_VALUE_AHEAD_S = 3600.0
# Honour Retry-After, but not a value that would park the thread for days, nor past
# --carbon.fallback-after: live data would stop for all of it (one 429 asking for 6 h
# did), and the service asks again no later than it would fall back.
MAX_RETRY_AFTER_S = 6 * 3600.0
# The UK API republishes its forecast every half hour; asking more often gains nothing.
FORECAST_REFRESH_S = 1800.0
RETRY_BASE_S = 10.0
_REDACTED = "<redacted>"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class CarbonService(DaemonLoop):
    """Validates settings eagerly and never does network I/O outside its thread
    (or an explicit poll_once())."""

    thread_name = "wattprint-carbon"

    def __init__(
        self,
        settings: CarbonSettings,
        environ: Mapping[str, str] = os.environ,
        clock: Callable[[], float] = time.time,
        *,
        session: requests.Session | None = None,
        rng: random.Random | None = None,
        retry_base_s: float = RETRY_BASE_S,
    ) -> None:
        _check_settings(settings)
        self.settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._retry_base_s = retry_base_s
        spec = carbon_registry.provider(settings.provider)
        zone = settings.zone.strip() or spec.default_zone
        if not zone:
            if not spec.live:
                raise CarbonConfigError("carbon zone is empty: set it (DE, DEU, gcp:europe-west3)")
            raise CarbonConfigError(
                f"carbon provider {settings.provider} needs --carbon.zone too: its embedded "
                "yearly average stands in when the provider fails (e.g. US, DE, gcp:us-west1)"
            )
        self._entry = embedded.dataset().lookup(zone)  # UnknownZoneError for a bad zone
        self._default = embedded.lookup(zone)
        http = HttpClient(settings.timeout_s, session=session)
        self._provider: Provider | None = spec.factory(
            carbon_registry.ProviderContext(
                settings.provider,
                self._default.zone,
                self._entry.key,
                settings.provider_region.strip(),
                settings.api_url,
                environ,
                http,
            )
        )
        # Which live signal, if any, feeds accounting.
        self._live_signal: str | None = None
        if self._provider is not None and settings.accounting_signal in self._provider.signals:
            self._live_signal = settings.accounting_signal

        self._lock = threading.Lock()
        self._live: dict[str, Intensity] = {}
        self._last_success: float | None = None
        self._last_error: str | None = None
        self._last_error_time: float | None = None
        self._errors_total = 0
        self._errors_by_reason: dict[str, int] = {}
        self._fetches_total = 0
        self._failures = 0  # consecutive, drives the backoff
        self._failing_reason = ""  # of the current outage, so that it is logged once
        self._in_fallback = False  # only for logging the transitions once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._forecast: forecast.Forecast | None = None
        self._forecast_due = 0.0  # clock time of the next forecast fetch
        self._forecast_errors = 0
        self._forecast_error: str | None = None

    # -- reading (any thread, never blocks on the network) --------------------------

    @property
    def pue(self) -> float:
        return self.settings.pue

    @property
    def default(self) -> Intensity:
        """The embedded default for the configured zone."""
        return self._default

    def accounting(self) -> Intensity:
        with self._lock:
            intensity = self._accounting_locked(self._clock())
            # The switch happens here too, between polls (a long Retry-After): said once.
            falling_back = (
                intensity is self._default
                and self._live_signal is not None
                and self._last_success is not None
                and not self._in_fallback
            )
            if falling_back:
                self._in_fallback = True
        if falling_back:
            self._say_fallback()
        return intensity

    def _accounting_locked(self, now: float) -> Intensity:
        if self._live_signal is not None and self._last_success is not None:
            live = self._live.get(self._live_signal)
            if live is not None and now - self._last_success <= self.settings.fallback_after_s:
                return live
        return self._default

    def status(self) -> CarbonStatus:
        with self._lock:
            accounting = self._accounting_locked(self._clock())
            live = [self._live[s] for s in sorted(self._live)]
            return CarbonStatus(
                accounting=accounting,
                signals=[*live, self._default],
                fallback_active=self._live_signal is not None and accounting is self._default,
                errors_total=self._errors_total,
                last_success=self._last_success,
                last_error=self._last_error,
                provider=self.settings.provider,
                last_error_time=self._last_error_time,
                fetches_total=self._fetches_total,
                errors_by_reason=dict(self._errors_by_reason),
                forecast=self._forecast,
                forecast_errors_total=self._forecast_errors,
                forecast_last_error=self._forecast_error,
            )

    def explain(self) -> list[str]:
        """Lines for `wattprint doctor`."""
        s = self.settings
        st = self.status()
        now = self._clock()
        d = self._default
        lines = [
            f"carbon zone {d.zone}: embedded default {d.grams_per_kwh:.2f} gCO2e/kWh "
            f"({self._entry.describe()})",
        ]
        if self._provider is None:
            lines.append("carbon provider static: the embedded default, no network")
        else:
            lines.append(
                f"carbon provider {self._provider.name}: {self._provider.describe()}; "
                f"refresh every {format_duration(s.refresh_interval_s)}, timeout "
                f"{format_duration(s.timeout_s)}, embedded default after "
                f"{format_duration(s.fallback_after_s)} without an answer"
            )
            live = [i for i in st.signals if i.provider != PROVIDER_STATIC]
            for value in live:
                fetched = (
                    f", fetched {format_duration(now - st.last_success)} ago"
                    if st.last_success is not None
                    else ""
                )
                lines.append(
                    f"live {value.signal} intensity for {value.zone}: "
                    f"{value.grams_per_kwh:.2f} gCO2e/kWh for {_iso(value.timestamp)} "
                    f"({format_duration(now - value.timestamp)} old){fetched}"
                )
            if not live:
                lines.append(f"no answer from {self._provider.name} yet")
            if st.forecast is not None:
                lines.append(forecast.describe(st.forecast, now))
            elif hasattr(self._provider, "fetch_forecast"):
                lines.append(f"no forecast from {self._provider.name} yet")
            if st.forecast_errors_total:
                lines.append(
                    f"{st.forecast_errors_total} forecast fetches failed; last: "
                    f"{st.forecast_last_error}"
                )
            if self._live_signal is None:
                lines.append(
                    f"{self._provider.name} gives the {'/'.join(self._provider.signals)} "
                    f"signal: exported, not used for accounting (accounting signal is "
                    f"{s.accounting_signal})"
                )
        acc = st.accounting
        # A yearly average holds for its whole year: no age from an instant in it.
        when = (
            f"{acc.year} yearly average"
            if acc.year is not None
            else f"{format_duration(now - acc.timestamp)} old"
        )
        line = (
            f"emissions use {acc.provider} {acc.signal} {acc.grams_per_kwh:.2f} gCO2e/kWh "
            f"({when}) x PUE {s.pue:g}"
        )
        if st.fallback_active:
            line += f"; FALLBACK to the embedded default: no good answer from {s.provider}"
            if st.last_success is not None:
                line += f" for {format_duration(now - st.last_success)}"
        lines.append(line)
        if st.errors_total:
            when = (
                f" {format_duration(now - st.last_error_time)} ago"
                if st.last_error_time is not None
                else ""
            )
            lines.append(
                f"{st.errors_total} of {st.fetches_total} fetches failed; "
                f"last error{when}: {st.last_error}"
            )
        return lines

    # -- fetching ------------------------------------------------------------------

    def _startable(self) -> bool:
        return self._provider is not None  # a static provider has nothing to fetch

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            delay = self.poll_once()

    def poll_once(self) -> float:
        """Ask the provider once, record the outcome, and return the seconds to wait
        before the next try. Blocking; the thread's loop, or `doctor` for a live check."""
        if self._provider is None:
            return self.settings.refresh_interval_s
        try:
            values = self._provider.fetch()
            now = self._clock()
            for value in values:
                _check_time(value, now)
        except ProviderError as exc:
            return self._failed(self._redact(str(exc)), exc.reason, exc.retry_after)
        except Exception as exc:  # a provider bug must not end the thread
            message = self._redact(f"{type(exc).__name__}: {exc}")
            return self._failed(message, "internal", None)
        with self._lock:
            self._fetches_total += 1
            self._live.update({v.signal: v for v in values})
            self._last_success = now
            failures, self._failures = self._failures, 0
            self._failing_reason = ""
            recovered = self._in_fallback
            self._in_fallback = False
        if recovered:
            log.warning("carbon intensity from %s is back; fallback ended", self._provider.name)
        elif failures:
            log.info("carbon intensity from %s is back", self._provider.name)
        if now >= self._forecast_due:
            self._poll_forecast(now)
        # A little jitter keeps a fleet of exporters from asking the API in lockstep.
        return self.settings.refresh_interval_s * self._rng.uniform(0.9, 1.1)

    def _poll_forecast(self, now: float) -> None:
        """Fetch the forecast through the same HTTP client. A failure is counted apart
        and logged, but neither backs off nor touches accounting: the next good poll
        tries again, and an old forecast ages out of the exported series."""
        fetch = getattr(self._provider, "fetch_forecast", None)
        if fetch is None:
            return
        try:
            got = fetch(now)
        except ProviderError as exc:
            self._forecast_failed(f"forecast: {self._redact(str(exc))}", exc.reason)
            return
        except Exception as exc:  # a provider bug must not end the thread
            message = self._redact(f"forecast: {type(exc).__name__}: {exc}")
            self._forecast_failed(message, "internal")
            return
        with self._lock:
            self._forecast = got
            self._forecast_due = now + max(FORECAST_REFRESH_S, self.settings.refresh_interval_s)

    def _forecast_failed(self, message: str, reason: str) -> None:
        assert self._provider is not None
        with self._lock:
            self._forecast_errors += 1
            loud = self._forecast_error is None or reason not in self._forecast_error
            self._forecast_error = f"{message} ({reason})"
        (log.warning if loud else log.debug)(
            "carbon forecast from %s failed: %s", self._provider.name, message
        )

    def _failed(self, message: str, reason: str, retry_after: float | None) -> float:
        assert self._provider is not None
        now = self._clock()
        with self._lock:
            self._fetches_total += 1
            self._errors_total += 1
            self._errors_by_reason[reason] = self._errors_by_reason.get(reason, 0) + 1
            self._last_error = message
            self._last_error_time = now
            self._failures += 1
            failures = self._failures
            # Once per outage, and again if what goes wrong changes; not at every retry.
            loud = reason != self._failing_reason
            self._failing_reason = reason
            falling_back = (
                self._live_signal is not None
                and not self._in_fallback
                and self._accounting_locked(now) is self._default
            )
            if falling_back:
                self._in_fallback = True
        (log.warning if loud else log.debug)(
            "carbon intensity from %s failed: %s", self._provider.name, message
        )
        if falling_back:
            self._say_fallback()
        # Exponential backoff with equal jitter, never slower than the refresh interval.
        ceiling = min(self.settings.refresh_interval_s, self._retry_base_s * 2 ** (failures - 1))
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if retry_after is not None:
            longest = min(MAX_RETRY_AFTER_S, self.settings.fallback_after_s)
            if retry_after > longest and loud:
                log.warning(
                    "%s asks to wait %s (Retry-After); asking again in %s "
                    "(--carbon.fallback-after)",
                    self._provider.name,
                    format_duration(retry_after),
                    format_duration(longest),
                )
            delay = max(delay, min(retry_after, longest))
        return delay

    def _say_fallback(self) -> None:
        assert self._provider is not None
        log.warning(
            "carbon accounting uses the embedded default for %s (%.2f gCO2e/kWh) until "
            "%s answers again",
            self._default.zone,
            self._default.grams_per_kwh,
            self._provider.name,
        )

    def _redact(self, text: str) -> str:
        assert self._provider is not None
        # Longest first, so that a secret containing another is removed whole.
        for secret in sorted(self._provider.secrets(), key=len, reverse=True):
            if len(secret) >= 3:
                text = text.replace(secret, _REDACTED)
        return text


def _check_time(value: Intensity, now: float) -> None:
    if value.timestamp < now - MAX_VALUE_AGE_S:
        raise ProviderError(
            f"value refers to {_iso(value.timestamp)}, more than "
            f"{format_duration(MAX_VALUE_AGE_S)} before this host's clock"
        )
    if value.timestamp > now + MAX_VALUE_AHEAD_S:
        raise ProviderError(f"value refers to {_iso(value.timestamp)}, in the future")


def _positive(value: float, name: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise CarbonConfigError(f"carbon {name} must be a positive duration, got {value!r}")


def _check_settings(s: CarbonSettings) -> None:
    names = carbon_registry.provider_names()
    if s.provider not in names:
        raise CarbonConfigError(
            f"unknown carbon provider {s.provider!r}: use one of {', '.join(names)}"
        )
    spec = carbon_registry.provider(s.provider)
    _positive(s.refresh_interval_s, "refresh interval")
    _positive(s.fallback_after_s, "fallback-after")
    _positive(s.timeout_s, "timeout")
    if s.fallback_after_s < s.refresh_interval_s:
        raise CarbonConfigError(
            f"carbon fallback-after ({format_duration(s.fallback_after_s)}) must not be "
            f"shorter than the refresh interval ({format_duration(s.refresh_interval_s)})"
        )
    try:
        check_pue(s.pue)
    except ValueError as err:
        raise CarbonConfigError(f"PUE: {err}") from None
    if s.accounting_signal not in (SIGNAL_AVERAGE, SIGNAL_MARGINAL):
        raise CarbonConfigError(
            f"carbon accounting signal {s.accounting_signal!r}: use average or marginal"
        )
    if s.accounting_signal not in spec.signals:
        able = " or ".join(
            p.name for p in carbon_registry.providers() if s.accounting_signal in p.signals
        )
        raise CarbonConfigError(
            f"carbon accounting signal {s.accounting_signal} needs the {able} provider "
            f"(provider is {s.provider})"
        )
    if s.api_url:
        parts = urlsplit(s.api_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CarbonConfigError("carbon api-url must be an http:// or https:// URL")
        if not spec.live:
            raise CarbonConfigError(f"carbon api-url is set but the provider is {s.provider}")
    if s.provider_region and spec.region == "none":
        raise CarbonConfigError(f"carbon provider-region is set but the provider is {s.provider}")
