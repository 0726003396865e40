"""The report's command line: flags, the Prometheus client they describe, points in time."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from typing import Any

from wattprint.config import parsers
from wattprint.core.units import parse_duration
from wattprint.report import sci
from wattprint.report.common import FORMATS, UsageError
from wattprint.report.promapi import PrometheusClient

# -- command line ------------------------------------------------------------------------


def _arg_type(parse: Any) -> Any:
    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    wrapped.__name__ = getattr(parse, "__name__", "value")
    return wrapped


def parse_time(text: str, now: float | None = None) -> float:
    """A point in time: now, Unix seconds, RFC 3339 / ISO 8601 (UTC unless it says
    otherwise), or a duration meaning that long ago (6h)."""
    now = time.time() if now is None else now
    value = text.strip()
    if value == "now":
        return now
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return now - parse_duration(value)
    except ValueError:
        pass
    iso = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        moment = dt.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (use 2024-05-01T12:00:00Z, Unix seconds, now, "
            "or 6h for 6 hours ago)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp()


def _time(text: str) -> float:
    return parse_time(text)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Energy (kWh per component and per GPU), emissions (kg CO2e), intensity, PUE and "
        "the estimated share of each job, from the Prometheus server that scrapes the "
        "exporters. How each number is computed: docs/report.md."
    )
    env = os.environ
    url = env.get("WATTPRINT_PROMETHEUS_URL")
    server = parser.add_argument_group("Prometheus server")
    server.add_argument(
        "--prometheus.url",
        dest="prometheus_url",
        type=_arg_type(parsers.url),
        default=url,
        metavar="URL",
        help="base URL of the Prometheus (or compatible) server (env WATTPRINT_PROMETHEUS_URL)",
    )
    for flag, dest, metavar, text in (
        (
            "prometheus.bearer-token-file",
            "bearer_token_file",
            "PATH",
            "send the token in this file as 'Authorization: Bearer'",
        ),
        (
            "prometheus.username",
            "username",
            "NAME",
            "basic auth user; the password comes from env WATTPRINT_PROMETHEUS_PASSWORD",
        ),
        ("prometheus.ca-file", "ca_file", "PATH", "CA certificate(s) to verify the server with"),
    ):
        name = "WATTPRINT_" + flag.upper().replace(".", "_").replace("-", "_")
        server.add_argument(
            f"--{flag}",
            dest=dest,
            default=env.get(name),
            metavar=metavar,
            help=f"{text} (env {name})",
        )
    server.add_argument(
        "--prometheus.insecure-skip-verify",
        dest="insecure_skip_verify",
        action="store_true",
        default=env.get("WATTPRINT_PROMETHEUS_INSECURE_SKIP_VERIFY", "").lower()
        in ("1", "true", "yes"),
        help="do not verify the server's TLS certificate",
    )
    server.add_argument(
        "--prometheus.timeout",
        dest="timeout",
        type=_arg_type(parsers.positive_duration),
        default=env.get("WATTPRINT_PROMETHEUS_TIMEOUT", "2m"),
        metavar="DURATION",
        help="give up on a request after this long (default 2m)",
    )
    what = parser.add_argument_group("what to report")
    what.add_argument("--workload", metavar="NAME", help="one workload (default: all)")
    what.add_argument("--namespace", metavar="NS", help="only workloads in this namespace")
    what.add_argument(
        "--range",
        dest="range",
        type=_arg_type(parsers.positive_duration),
        metavar="DURATION",
        help="this long before --until (e.g. 24h); default: each job's whole life",
    )
    what.add_argument(
        "--since",
        type=_arg_type(_time),
        metavar="TIME",
        help="start: 2024-05-01T12:00:00Z, Unix seconds, or 6h (ago)",
    )
    what.add_argument("--until", type=_arg_type(_time), metavar="TIME", help="end (default now)")
    parser.add_argument(
        "--from-files",
        dest="from_files",
        metavar="DIR",
        help="no Prometheus: add up the files `wattprint run` and wattprint.track() wrote "
        "under DIR (one per node or rank), per node and for the job",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        metavar="|".join(FORMATS),
        default="table",
        help="table (default), csv, json, codecarbon-csv (codecarbon's emissions.csv columns), "
        "or ghg-csv / ghg-json (Scope 2 location-based and Scope 3 embodied, with factors)",
    )
    sci.add_arguments(parser)


def make_client(args: argparse.Namespace) -> PrometheusClient:
    token: str | None = None
    if args.bearer_token_file:
        if args.username:
            raise UsageError(
                "use either --prometheus.bearer-token-file or --prometheus.username, not both"
            )
        try:
            with open(args.bearer_token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError as err:
            raise UsageError(
                f"cannot read --prometheus.bearer-token-file={args.bearer_token_file}: "
                f"{err.strerror}"
            ) from None
        if not token:
            raise UsageError(f"--prometheus.bearer-token-file={args.bearer_token_file} is empty")
    basic: tuple[str, str] | None = None
    if args.username:
        password = os.environ.get("WATTPRINT_PROMETHEUS_PASSWORD")
        if password is None:
            raise UsageError(
                "--prometheus.username needs the password in env WATTPRINT_PROMETHEUS_PASSWORD"
            )
        basic = (args.username, password)
    verify: bool | str = True
    if args.insecure_skip_verify:
        verify = False
        import urllib3

        # The user asked for it; one warning per request would bury the report.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    elif args.ca_file:
        if not os.path.isfile(args.ca_file):
            raise UsageError(f"--prometheus.ca-file={args.ca_file}: no such file")
        verify = args.ca_file
    return PrometheusClient(
        args.prometheus_url,
        bearer_token=token,
        basic_auth=basic,
        verify=verify,
        timeout=args.timeout,
    )
