"""`wattprint report`: per-job energy and emissions from a Prometheus server."""

from __future__ import annotations

import argparse
import sys


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus.url", dest="prometheus_url", required=True)


def run_report(args: argparse.Namespace) -> int:
    print("wattprint: report is not implemented yet", file=sys.stderr)
    return 1
