"""The exporter loads only what it uses: no HTTP client library without a live carbon
provider or Kubernetes, no report code, no YAML parser without a config file, and no
prometheus_client (exposition.py writes the formats; only `wattprint run` parses them)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "requests",
    "urllib3",
    "wattprint.report",
    "wattprint.report.promapi",
    "yaml",
    "prometheus_client",
)

PROBE = """
import json, sys
import wattprint.cli.main as cli
args = cli.make_parser().parse_args(sys.argv[1:])
from wattprint.app import build_exporter
exporter = build_exporter(cli.load(args, environ={}), serve=False)
exporter.sampler.sample_once()
print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
""".replace("HEAVY", repr(HEAVY))


def loaded(*flags: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "--gpu.source=none", "--state.file=", *flags],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return list(json.loads(out.splitlines()[-1]))


def test_the_exporter_with_the_static_provider_loads_no_http_client_report_or_yaml() -> None:
    assert loaded("--carbon.zone=DE") == []


def test_a_live_provider_loads_requests_at_its_first_fetch_not_at_start() -> None:
    # Built and sampled, its thread not started: nothing fetched, nothing loaded.
    assert "requests" not in loaded("--carbon.zone=GB", "--carbon.provider=uk-grid")


def test_the_report_subcommand_still_has_its_flags() -> None:
    import wattprint.cli.main as cli

    args = cli.make_parser().parse_args(
        ["report", "--prometheus.url=http://127.0.0.1:9", "--workload=j"]
    )
    assert args.command == "report"


def test_the_http_layer_loads_no_collector() -> None:
    # server.py knows who scrapes (scraper.py), nothing of how the collector uses it.
    probe = "import sys, wattprint.export.server\n"
    probe += "print('wattprint.export.collector' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "False"


def test_the_http_layer_loads_no_http_library_email_ssl_or_prometheus_client() -> None:
    # http.server and prometheus_client (whose exposition pulls http.server in) cost
    # most of the time to the first scrape; ssl is loaded only when TLS is configured.
    banned = ("http.server", "http.client", "email", "urllib", "html", "mimetypes", "ssl")
    banned += ("prometheus_client",)
    probe = (
        "import json, sys, wattprint.export.server; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {banned!r} "
        f"or m in {banned!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert json.loads(out) == []
