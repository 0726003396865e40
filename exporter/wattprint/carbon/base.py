"""What the carbon subsystem's parts share: the values, the settings, the errors, the
provider interface, and one careful HTTP GET that every live provider goes through.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from wattprint._version import __version__
from wattprint.carbon.registry import SIGNAL_AVERAGE as SIGNAL_AVERAGE
from wattprint.carbon.registry import SIGNAL_MARGINAL as SIGNAL_MARGINAL
from wattprint.core.model import Intensity
from wattprint.core.safeio import Refused, read_regular

if TYPE_CHECKING:
    import requests  # imported when a live provider makes its first request

PROVIDER_STATIC = "static"

# No grid on record comes near this (coal-only grids are ~1000-1300 g/kWh lifecycle);
# anything above is a unit mix-up (kg vs g, lbs/MWh unconverted) or garbage.
MAX_GRAMS_PER_KWH = 2000.0
# An API token is tens of bytes; a file far over that is not one.
MAX_SECRET_BYTES = 64 * 1024
# Responses are a few hundred bytes; anything much bigger is not the API we expect.
MAX_BODY_BYTES = 256 * 1024


@dataclass(frozen=True)
class CarbonSettings:
    """The carbon options the service is built from: provider, zone, refresh, fallback, PUE."""

    provider: str = "static"
    # Zone of the embedded default (ISO alpha-2/alpha-3, gcp:<region>, WORLD) and the
    # Electricity Maps zone. "" means the provider's own zone (GB for uk-grid).
    zone: str = "WORLD"
    provider_region: str = ""  # WattTime region (CAISO_NORTH) or UK region id ("" = national)
    api_url: str = ""  # replaces the provider's base URL (proxies, tests)
    refresh_interval_s: float = 300.0
    fallback_after_s: float = 3600.0
    timeout_s: float = 10.0
    accounting_signal: str = SIGNAL_AVERAGE  # "marginal" only on explicit request (WattTime)
    pue: float = 1.0


class UnknownZoneError(ValueError):
    """The zone has no embedded value; the message names it and suggests close matches."""


class CarbonConfigError(ValueError):
    """Carbon settings that cannot work (missing token, bad provider); one clear line."""


class ProviderError(Exception):
    """A failed fetch. The message must never contain a credential.

    reason is a small fixed word for an error counter's label (timeout, connection,
    http_status, rate_limited, unauthorized, truncated, invalid_response,
    invalid_value); retry_after is the server's Retry-After in seconds, if it sent one.
    """

    def __init__(
        self, message: str, reason: str = "invalid_value", retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class Provider(Protocol):
    """A live source of carbon intensity."""

    name: str  # provider label: electricitymaps | watttime | uk-grid
    zone: str  # zone label of the values it returns
    signals: tuple[str, ...]  # signals fetch() returns

    def fetch(self) -> list[Intensity]:
        """One validated answer (one Intensity per signal). Raises ProviderError."""
        ...

    def describe(self) -> str:
        """One line for `wattprint doctor`: what is asked of whom (no secrets)."""
        ...

    def secrets(self) -> list[str]:
        """Current credential values, so that error text can be scrubbed of them."""
        ...


class Secret:
    """A credential from an environment variable or from a file named by NAME_FILE.

    A file is read again at every use, so a rotated Kubernetes secret is picked up
    without a restart. repr() never shows the value.
    """

    def __init__(self, env_name: str, value: str | None = None, path: str | None = None):
        self.env_name = env_name
        self._value = value
        self._path = path
        # Every value handed out, so that error text can be scrubbed of old ones too.
        self.seen: set[str] = set()

    @classmethod
    def from_env(cls, environ: Mapping[str, str], env_name: str) -> Secret | None:
        value = environ.get(env_name, "")
        path = environ.get(env_name + "_FILE", "")
        if value and path:
            raise CarbonConfigError(f"set only one of {env_name} and {env_name}_FILE")
        if value:
            return cls(env_name, value=value.strip())
        if path:
            secret = cls(env_name, path=path)
            try:
                secret.get()
            except ProviderError as exc:
                raise CarbonConfigError(str(exc)) from None
            return secret
        return None

    def get(self) -> str:
        value = self._read()
        self.seen.add(value)
        return value

    def _read(self) -> str:
        if self._path is None:
            return self._value or ""
        try:
            # A regular file, bounded, opened without blocking: a FIFO or /dev/zero
            # named here must not hang the sampler or fill its memory.
            value = read_regular(self._path, MAX_SECRET_BYTES).decode().strip()
        except Refused as exc:
            raise ProviderError(f"cannot read {self.env_name}_FILE: {exc.strerror}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ProviderError(
                f"cannot read {self.env_name}_FILE {self._path}: {type(exc).__name__}"
            ) from None
        if not value:
            raise ProviderError(f"{self.env_name}_FILE {self._path} is empty")
        return value

    def __repr__(self) -> str:
        source = f"file {self._path}" if self._path else "env"
        return f"Secret({self.env_name}, {source}, <redacted>)"


def safe_url(url: str) -> str:
    """The URL without user info or query, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def base_url(api_url: str, default: str) -> str:
    """The provider root: --carbon.api-url if given, with a trailing /v3 tolerated."""
    url = (api_url or default).rstrip("/")
    return url[: -len("/v3")] if url.endswith("/v3") else url


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Retry-After in seconds: either delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime  # costly to import, for a rare header

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - now)


def parse_time(value: object, what: str) -> float:
    """An ISO 8601 time from an API answer as unix seconds (UTC if no offset)."""
    if not isinstance(value, str) or not value:
        raise ProviderError(f"{what} is missing or not a time")
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ProviderError(f"{what} {value!r} is not an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def checked_intensity(value: object, what: str) -> float:
    """A g/kWh value from an answer, rejected when null, not a number or absurd."""
    if value is None:
        raise ProviderError(f"{what} is null")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProviderError(f"{what} is not a number: {type(value).__name__}")
    grams = float(value)
    if not math.isfinite(grams) or grams < 0 or grams > MAX_GRAMS_PER_KWH:
        raise ProviderError(
            f"{what} {grams:g} g/kWh is outside 0..{MAX_GRAMS_PER_KWH:g} (wrong unit?)"
        )
    return grams


def shown(value: object) -> str:
    """A value from an answer, for an error message: short strings whole (so that the
    service can scrub a credential echoed back), never a cut-off piece of a long one."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"<text of {len(value)} chars>"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return f"<{type(value).__name__}>"


def json_object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProviderError(f"{what} is not a JSON object")
    return value


def first_item(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, list) or not value:
        raise ProviderError(f"{what} is missing or empty")
    return json_object(value[0], what + "[0]")


def unauthorized(url: str, why: str = "") -> ProviderError:
    """The error for an HTTP 401 from url; `why` says what to check."""
    return ProviderError(f"GET {safe_url(url)}: HTTP 401{why}", "unauthorized")


class LiveProvider:
    """What the live providers share: the HTTP client, the API root (their default_url,
    or --carbon.api-url), the data URL they name in `describe`, and answers checked
    alike: a refused credential, a JSON object, a value in g/kWh at a time."""

    name: str
    zone: str
    signals: tuple[str, ...]
    default_url: str

    def __init__(self, http: HttpClient, api_url: str = "") -> None:
        self._http = http
        self._root = base_url(api_url, self.default_url)
        self._url = self._root

    @property
    def shown_url(self) -> str:
        return safe_url(self._url)

    def _get_object(
        self, url: str, what: str = "answer", refused: str = "", **request: Any
    ) -> dict[str, Any]:
        """The JSON object at url; an HTTP 401 is an error that says `refused`."""
        status, body = self._http.get_json(url, **request)
        if status == 401:
            raise unauthorized(url, refused)
        return json_object(body, what)

    def _intensity(
        self, signal: str, grams: object, when: object, fields: tuple[str, str]
    ) -> Intensity:
        """The answer's value (g/kWh) and its time, checked; `fields` name them."""
        value = checked_intensity(grams, fields[0])
        return Intensity(self.zone, self.name, signal, value, parse_time(when, fields[1]))


_ERRNO_REASON = re.compile(r"\[Errno -?\d+\] ([A-Za-z][A-Za-z ,'-]*)")


def _connection_reason(exc: Exception) -> str:
    # requests' own text repeats the whole URL and pool; the errno reason is what helps.
    match = _ERRNO_REASON.search(str(exc))
    return match.group(1).strip() if match else type(exc).__name__


class HttpClient:
    """GET a small JSON document with a hard bound on the whole exchange.

    connect and read timeouts bound each socket wait; a total deadline bounds a body
    that trickles in byte by byte, and the body size is capped. Redirects are refused:
    requests would forward a custom auth header (Electricity Maps' auth-token) to
    whatever host a redirect names.
    """

    def __init__(
        self,
        timeout_s: float,
        session: requests.Session | None = None,
        max_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._session = session

    @property
    def session(self) -> requests.Session:
        # requests (megabytes and tens of ms to import) only once a live provider asks for it:
        # the static provider never does.
        if self._session is None:
            import requests

            self._session = requests.Session()
        if "wattprint" not in str(self._session.headers.get("User-Agent", "")):
            self._session.headers.update(
                {
                    "User-Agent": f"wattprint/{__version__}",
                    "Accept": "application/json",
                    # A compressed body could stall inside the decoder, past our deadline.
                    "Accept-Encoding": "identity",
                }
            )
        return self._session

    def get_json(
        self,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: tuple[str, str] | None = None,
    ) -> tuple[int, Any]:
        """(status, parsed JSON) for 2xx and 401; ProviderError for anything else."""
        import requests

        where = safe_url(url)
        deadline = time.monotonic() + self.timeout_s
        session = self.session
        try:
            resp = session.get(
                url,
                params=params,
                headers=dict(headers or {}),
                auth=auth,
                timeout=(self.timeout_s, self.timeout_s),
                stream=True,
                allow_redirects=False,
            )
        except requests.Timeout:
            raise ProviderError(
                f"GET {where}: timed out after {self.timeout_s:g}s", "timeout"
            ) from None
        except (requests.RequestException, OSError) as exc:
            message = f"GET {where}: connection failed: {_connection_reason(exc)}"
            raise ProviderError(message, "connection") from None
        with resp:
            status = resp.status_code
            if status == 401:
                return status, None
            if not 200 <= status < 300:
                retry_after = parse_retry_after(resp.headers.get("Retry-After"), time.time())
                reason = "rate_limited" if status == 429 else "http_status"
                raise ProviderError(f"GET {where}: HTTP {status}", reason, retry_after)
            body = self._read_body(resp, where, deadline)
        try:
            return status, json.loads(body)
        except ValueError:
            message = f"GET {where}: invalid JSON ({len(body)} bytes)"
            raise ProviderError(message, "invalid_response") from None

    def _read_body(self, resp: requests.Response, where: str, deadline: float) -> bytes:
        raw = resp.raw
        # read1 returns what one recv gives, so the deadline is checked between
        # arrivals; read(n) would wait for n bytes however slowly they come.
        read1 = getattr(raw, "read1", None)
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                if time.monotonic() > deadline:
                    message = f"GET {where}: body not complete after {self.timeout_s:g}s"
                    raise ProviderError(message, "timeout")
                chunk = read1(65536) if read1 is not None else raw.read(1)
                if not chunk:
                    break
                size += len(chunk)
                if size > self.max_bytes:
                    message = f"GET {where}: body larger than {self.max_bytes} bytes"
                    raise ProviderError(message, "invalid_response")
                chunks.append(chunk)
        except ProviderError:
            raise
        except Exception as exc:  # urllib3 raises several types for a cut connection
            kind = type(exc).__name__
            if "Timeout" in kind:
                message = f"GET {where}: timed out reading the body"
                raise ProviderError(message, "timeout") from None
            message = f"GET {where}: body cut short after {size} bytes ({kind})"
            raise ProviderError(message, "truncated") from None
        return b"".join(chunks)
