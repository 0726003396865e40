"""The entry point of `wattprint report`: Prometheus, --from-files, SCI --per, GHG."""

from __future__ import annotations

import argparse
import os
import sys
import time

from wattprint.report import ghg, sci
from wattprint.report.arguments import make_client
from wattprint.report.common import ReportError, UsageError
from wattprint.report.jobs import build_reports
from wattprint.report.progress import Progress
from wattprint.report.promapi import PrometheusError
from wattprint.report.queries import resolve_range
from wattprint.report.render import RENDERERS

# -- entry point -----------------------------------------------------------------------


def _fail(message: str, status: int) -> int:
    print(f"wattprint: {message}", file=sys.stderr)
    return status


def run_report(args: argparse.Namespace) -> int:
    if args.from_files is not None:
        from wattprint.report.from_files import report_from_files

        return report_from_files(args)
    if not args.prometheus_url:
        return _fail("--prometheus.url (env WATTPRINT_PROMETHEUS_URL) or --from-files is needed", 2)
    try:
        client = make_client(args)
        unit = sci.pick_unit(args)
    except (UsageError, sci.UnitError) as err:
        return _fail(str(err), 2)
    try:
        with Progress(sys.stderr, sys.stderr.isatty()) as progress:
            window = resolve_range(args, client, time.time())
            jobs = build_reports(client, window, args.workload, args.namespace, progress)
            if unit is not None:
                progress.say(f"reading {unit.metric}")
                per = sci.rows(client, unit, jobs, window.since, window.until)
            if args.format.startswith("ghg-"):
                progress.say("reading emission factors")
                factors = ghg.read_factors(client, window.since, window.until)
    except UsageError as err:
        return _fail(str(err), 2)
    except (PrometheusError, ReportError) as err:
        return _fail(str(err), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    finally:
        client.close()
    if args.format.startswith("ghg-"):
        rows = ghg.emission_rows(jobs, window.since, window.until) + factors
        text = ghg.render(rows, args.format, client.url)
    else:
        text = RENDERERS[args.format](jobs, window, client.url)
    if unit is not None:
        text = sci.render_rows(unit, per, args.format)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `wattprint report | head`: the reader has what it wanted.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0
