"""The node's input energy from its BMC's Redfish API (out of band).

A BMC answers in seconds, or not at all, so it is asked on a thread of its own and a
sample only takes its latest answer: no sample and no scrape ever waits on it. Where
the chassis' EnvironmentMetrics has `EnergykWh` (an energy counter) that is read like
any counter (measured); else `PowerWatts`, or `Power.PowerControl[].PowerConsumedWatts`,
is integrated over the sampler's own intervals (estimated); where PowerWatts links its
Sensor (DataSourceUri) and that gives a ReadingTime, between the BMC's reading times
instead, a reading whose time has not moved being the one counted already. No answer for
STALE_AFTER_S: the reading is stale, said in collector_success and held out of the
platform split; a power gap longer than MAX_BRIDGE_S is not bridged at all.

Credentials come from the environment only (WATTPRINT_REDFISH_USERNAME and
WATTPRINT_REDFISH_PASSWORD, or their _FILE forms naming files read at each use, as the
carbon providers' tokens are); https checks the BMC against --platform.redfish-ca-file,
or the system's CAs, unless --platform.redfish-insecure says not to.
"""

from __future__ import annotations

import base64
import datetime
import errno
import logging
import os
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from wattprint.core.background import Poller
from wattprint.core.model import DeviceReading, SourceResult
from wattprint.core.safeio import BadDocument, Refused, http_get, loads_json, number, read_regular
from wattprint.sources.counters import MonotonicCounter, PowerIntegrator, StampedPower
from wattprint.sources.pm_counters import NODE_MAX_POWER_W
from wattprint.sources.registry import METHOD_REDFISH_COUNTER, METHOD_REDFISH_INTEGRATED

log = logging.getLogger(__name__)

USERNAME_ENV = "WATTPRINT_REDFISH_USERNAME"
PASSWORD_ENV = "WATTPRINT_REDFISH_PASSWORD"
REQUEST_DEADLINE_S = 5.0  # one answer, whole
POLL_INTERVAL_S = 1.0  # between the end of one poll and the start of the next
STALE_AFTER_S = 15.0  # no good answer for this long: the reading is stale
MAX_BRIDGE_S = 60.0  # power is integrated across no longer gap than this
MAX_BODY = 1 << 20
UJ_PER_KWH = 3.6e12
# The BMC's and this node's clocks may disagree on an interval by the polling and the
# BMC's latency; beyond that the BMC's clock was set and this node's interval is used.
STAMP_SLACK_S = 2.0


class RedfishError(ValueError):
    """A setting that cannot work (a missing credential file); one line."""


def credential(environ: Mapping[str, str], name: str) -> Callable[[], str] | None:
    """NAME's value, or a reader of the file NAME_FILE names (read again at each use, so a
    rotated Secret is picked up); None where neither is set."""
    value, path = environ.get(name, ""), environ.get(name + "_FILE", "")
    if value and path:
        raise RedfishError(f"set only one of {name} and {name}_FILE")
    if value:
        return lambda: value.strip()
    if not path:
        return None

    def read() -> str:
        try:
            # Resolved first: a Kubernetes Secret volume's key is a link into ..data/,
            # swapped whole at a rotation; the file it names must be regular.
            text = read_regular(os.path.realpath(path), 4096).decode().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise RedfishError(f"cannot read {name}_FILE {path}: {err}") from None
        if not text:
            raise RedfishError(f"{name}_FILE {path} is empty")
        return text

    read()  # a missing file is a configuration error at start, not a failing collector
    return read


def tls_context(ca_file: str, insecure: bool) -> ssl.SSLContext:
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as err:
        raise RedfishError(f"bad value for --platform.redfish-ca-file: {err}") from None


@dataclass(frozen=True)
class Answer:
    """One good answer of the BMC: an energy counter (kWh) or a power (W), and when."""

    energy_kwh: float | None
    power_w: float | None
    at: float  # the source's clock when it came
    stamp: float | None = None  # the BMC's: when its sensor took the power reading


def reading_time(value: object) -> float:
    """A Sensor's ReadingTime (ISO 8601) in seconds since the epoch; UTC where unsaid."""
    if not isinstance(value, str):
        raise BadDocument(f"ReadingTime {value!r} is not a date-time")
    try:
        when = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadDocument(f"ReadingTime {value!r} is not an ISO 8601 date-time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


class RedfishSource(Poller[Answer]):
    """The node's input (component "node") from a Redfish chassis, polled on a thread."""

    name = "redfish"
    thread_name = "wattprint-redfish"

    def __init__(
        self,
        url: str,
        chassis: str = "",
        environ: Mapping[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
        deadline_s: float = REQUEST_DEADLINE_S,
        poll_s: float = POLL_INTERVAL_S,
    ) -> None:
        env = os.environ if environ is None else environ
        if urllib.parse.urlsplit(url).password is not None:
            # It would be in every error line and log: the environment keeps it apart.
            raise RedfishError(
                f"--platform.redfish-url has a password in it: give it in {PASSWORD_ENV}"
            )
        self.base = url.rstrip("/")
        self.chassis = chassis
        self._user = credential(env, USERNAME_ENV)
        self._password = credential(env, PASSWORD_ENV)
        if (self._user is None) != (self._password is None):
            raise RedfishError(f"set both {USERNAME_ENV} and {PASSWORD_ENV} (or neither)")
        self._tls = tls
        self._clock = clock
        self._deadline = deadline_s
        super().__init__(poll_s)
        self._counter = MonotonicCounter(max_power_w=NODE_MAX_POWER_W)
        self._integrator = PowerIntegrator()
        self._last_power_at: float | None = None
        self._sensor_usable = True  # PowerWatts' DataSourceUri gives a ReadingTime
        self._stamped = StampedPower(STAMP_SLACK_S + poll_s + 2 * deadline_s, MAX_BRIDGE_S)
        self.start()

    # -- the poller's thread -----------------------------------------------------------

    def _get(self, path: str) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if self._user is not None and self._password is not None:
            pair = f"{self._user()}:{self._password()}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        body = http_get(self.base + path, self._deadline, MAX_BODY, headers, self._tls)
        data = loads_json(body, path)
        if not isinstance(data, dict):
            raise BadDocument(f"{path} is not a JSON object")
        return data

    def _chassis_path(self) -> str:
        if not self.chassis:
            members = self._get("/redfish/v1/Chassis").get("Members")
            if not isinstance(members, list) or not members or not isinstance(members[0], dict):
                raise BadDocument("/redfish/v1/Chassis lists no chassis")
            self.chassis = str(members[0].get("@odata.id", "")).rstrip("/").rsplit("/", 1)[-1]
        return f"/redfish/v1/Chassis/{self.chassis}"

    def _sensor(self, uri: object) -> Answer | None:
        """The power and its ReadingTime from the Sensor that PowerWatts excerpts, where
        the BMC links one that has both (Sensor v1.1+); None where it does not."""
        if not self._sensor_usable or not isinstance(uri, str) or not uri.startswith("/"):
            return None
        try:
            sensor = self._get(uri)
        except Refused as err:
            if err.errno != errno.EPROTO:
                raise  # no answer: the poll failed
            self._sensor_usable = False  # an HTTP error: the excerpt's reading, unstamped
            return None
        if sensor.get("Reading") is None or sensor.get("ReadingTime") is None:
            self._sensor_usable = False
            return None
        watts = number(sensor["Reading"], f"{uri} Reading", 0, NODE_MAX_POWER_W)
        return Answer(None, watts, self._clock(), reading_time(sensor["ReadingTime"]))

    def poll_once(self) -> Answer:
        """Ask the BMC once: EnergykWh where it has it, else the chassis' input power."""
        chassis = self._chassis_path()
        try:
            metrics: dict[str, Any] = self._get(chassis + "/EnvironmentMetrics")
        except Refused:
            metrics = {}  # an older BMC: the Power resource below
        energy = metrics.get("EnergykWh")
        if isinstance(energy, dict) and energy.get("Reading") is not None:
            kwh = number(energy["Reading"], "EnergykWh.Reading", minimum=0)
            return Answer(kwh, None, self._clock())
        power = metrics.get("PowerWatts")
        if isinstance(power, dict) and power.get("Reading") is not None:
            stamped = self._sensor(power.get("DataSourceUri"))
            if stamped is not None:
                return stamped
            watts = number(power["Reading"], "PowerWatts.Reading", 0, NODE_MAX_POWER_W)
            return Answer(None, watts, self._clock())
        controls = self._get(chassis + "/Power").get("PowerControl")
        for control in controls if isinstance(controls, list) else []:
            if isinstance(control, dict) and control.get("PowerConsumedWatts") is not None:
                watts = number(control["PowerConsumedWatts"], "PowerConsumedWatts", 0)
                return Answer(None, min(watts, NODE_MAX_POWER_W), self._clock())
        raise BadDocument(f"{chassis} has neither EnergykWh nor PowerWatts nor PowerControl")

    # -- the sampler's thread ----------------------------------------------------------

    def read(self) -> SourceResult:
        result = SourceResult()
        now = self._clock()
        answer, failure = self.latest()
        if answer is None or now - answer.at > STALE_AFTER_S:
            age = "never" if answer is None else f"{now - answer.at:.0f} s ago"
            result.errors.append(f"redfish {self.base}: stale (last answer {age}): {failure}")
            return result
        if failure:
            result.errors.append(f"redfish {self.base}: {failure} (using the answer of before)")
        if answer.energy_kwh is not None:
            errors = self._counter.errors
            self._counter.update(round(answer.energy_kwh * UJ_PER_KWH), answer.at)
            if self._counter.errors != errors:
                result.errors.append(f"redfish: EnergykWh {self._counter.last_error}")
            energy, method = self._counter.total, METHOD_REDFISH_COUNTER
        elif answer.stamp is not None:
            assert answer.power_w is not None
            counted, gap = self._stamped.stamp is not None, now - self._stamped.counted_at
            outcome = self._stamped.update(answer.power_w, answer.stamp, now)
            if outcome == "held":  # the reading counted already: not new power
                if gap > STALE_AFTER_S:
                    result.errors.append(
                        f"redfish {self.base}: stale: the sensor's ReadingTime has not moved "
                        f"for {gap:.0f} s"
                    )
                elif not result.errors:
                    result.held.append(("node", "node"))
                return result
            if outcome == "restarted" and counted:
                result.errors.append(f"redfish: no new reading for {gap:.0f} s: not bridged")
                result.rebased.append(("node", "node"))
            energy, method = self._stamped.total, METHOD_REDFISH_INTEGRATED
        else:
            assert answer.power_w is not None
            if self._last_power_at is not None and now - self._last_power_at > MAX_BRIDGE_S:
                self._integrator.restart()  # too long a gap to bridge
                result.rebased.append(("node", "node"))
            self._integrator.update(now, answer.power_w)
            self._last_power_at = now
            energy, method = self._integrator.total, METHOD_REDFISH_INTEGRATED
        result.devices.append(
            DeviceReading(
                component="node",
                device="node",
                energy_uj=energy,
                power_w=answer.power_w,
                method=method,
                max_power_w=NODE_MAX_POWER_W,
            )
        )
        return result

    def explain(self) -> list[str]:
        """Doctor's line, once the first poll is over: what the BMC gives, or why not."""
        self._polled.wait(2 * self._deadline + 1)  # EnvironmentMetrics, then Power
        answer, failure = self.latest()
        line = f"node: redfish ({self.base}/redfish/v1/Chassis/{self.chassis or '<first>'})"
        if failure:
            return [f"{line}; last poll failed: {failure}"]
        if answer is not None and answer.energy_kwh is not None:
            return [f"{line}: EnergykWh {answer.energy_kwh:g} ({METHOD_REDFISH_COUNTER})"]
        return [
            f"{line}: input power {answer.power_w if answer else '?'} W, integrated "
            f"({METHOD_REDFISH_INTEGRATED}, estimated)"
        ]

    def close(self) -> None:
        self.stop(timeout_s=0.1)
