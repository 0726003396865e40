"""Flag values as the Prometheus ecosystem writes them: durations exactly as Prometheus
parses them (checked against promtool), listen addresses as Go's net.Listen takes them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import require_tool
from wattprint.config.options import ConfigError, build_config
from wattprint.core.units import format_duration, parse_duration

DURATIONS = [
    ("0", 0.0),
    ("500ms", 0.5),
    ("1s", 1.0),
    ("1m30s", 90.0),
    ("1h5m", 3900.0),
    ("2d12h", 216000.0),
    ("1y2w3d4h5m6s7ms", 31536000 + 2 * 604800 + 3 * 86400 + 4 * 3600 + 5 * 60 + 6.007),
    ("5s1m", None),  # units out of order
    ("1m1m", None),  # a unit twice
    ("1.5s", None),  # fractions
    ("1ms1s", None),
    ("5", None),  # no unit
    ("", None),
    (" 5s", None),
    ("-1s", None),
    ("1sec", None),
]


@pytest.mark.parametrize(("text", "seconds"), DURATIONS)
def test_durations_parse_as_prometheus_parses_them(text: str, seconds: float | None) -> None:
    if seconds is None:
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(text)
    else:
        assert parse_duration(text) == pytest.approx(seconds)


def test_promtool_agrees_on_every_duration(tmp_path: Path) -> None:
    """The same strings through Prometheus's own parser: an alert's `for:`."""
    promtool = require_tool("promtool")
    for text, seconds in DURATIONS:
        if text.strip() != text or not text:
            continue  # YAML would trim or null these before Prometheus saw them
        rules = tmp_path / "rules.yml"
        rules.write_text(
            f"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: vector(1)\n    for: '{text}'\n"
        )
        result = subprocess.run(
            [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
        )
        assert (result.returncode == 0) == (seconds is not None), (text, result.stdout)


@pytest.mark.parametrize(
    "flag", ["--sample.interval", "--workload.retention", "--carbon.refresh-interval"]
)
def test_duration_flags_reject_what_prometheus_rejects(flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({flag[2:]: "5s1m"}, environ={})
    assert str(err.value).startswith(f"bad value for {flag}: not a duration: '5s1m'")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "address", [":9950", "127.0.0.1:9950", "[::1]:9950", "[::]:0", "localhost:9950", "node-1.lan:1"]
)
def test_listen_addresses_go_accepts(address: str) -> None:
    assert build_config({"web.listen-address": address}, environ={}).listen_address == address


@pytest.mark.parametrize(
    "address",
    [
        "http://127.0.0.1:9950",
        " 127.0.0.1:9950",
        "127.0.0.1:9950 ",
        "999.1.1.1:9950",
        "1.2.3:9950",
        "::1:9950",
        "[::g]:9950",
        "[::1:9950",
        "127.0.0.1:99999",
        "127.0.0.1",
        "9950",
        "my_host:9950",
        "-node:9950",
    ],
)
def test_listen_addresses_go_rejects_fail_at_validation(address: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"web.listen-address": address}, environ={})
    message = str(err.value)
    assert message.startswith(
        f"bad value for --web.listen-address: not a listen address: {address!r}"
    )
    assert "\n" not in message


@pytest.mark.parametrize("flag", ["pue", "replay.speed", "cpu.tdp-watts"])
def test_a_number_that_is_not_one_is_named_plainly(flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({flag: "abc"}, environ={})
    assert str(err.value) == f"bad value for --{flag}: 'abc' is not a number"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (0.05, "50ms"),
        (0.5, "500ms"),
        (1.5, "1.5s"),
        (45, "45s"),
        (60, "1m"),
        (90, "1m30s"),
        (3600, "1h"),
        (5400, "1h30m"),
        (86400 * 2 + 3 * 3600 + 59, "2d3h"),  # two units at most
    ],
)
def test_durations_are_shown_prometheus_style(seconds: float, shown: str) -> None:
    # The one formatter doctor, flag errors and the carbon service all print with.
    assert format_duration(seconds) == shown


@pytest.mark.parametrize("seconds", [0.25, 1, 59, 300, 5400, 86400])
def test_a_shown_whole_duration_parses_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)
