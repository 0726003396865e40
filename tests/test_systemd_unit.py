"""deploy/wattprint.service, read as systemd reads it: what the clock rules need."""

from __future__ import annotations

import configparser
from pathlib import Path

UNIT = Path(__file__).resolve().parents[1] / "deploy" / "wattprint.service"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # case-sensitive keys
    parser.read_string(UNIT.read_text())
    return parser


def test_the_exporter_starts_after_the_clock_is_set_and_may_read_its_status() -> None:
    """Ordered after time-sync.target. No ProtectClock=: its filter refuses adjtimex
    even read-only, and without the kernel's word samples are never stamped. The clock
    stays out of the exporter's reach by the capability bounding set."""
    parsed = unit()
    assert "time-sync.target" in parsed["Unit"]["After"].split()
    assert "time-sync.target" not in parsed["Unit"].get("Wants", "").split()
    assert parsed["Service"].get("ProtectClock", "no") == "no"
    assert "@clock" not in parsed["Service"].get("SystemCallFilter", "")
    assert "CAP_SYS_TIME" not in parsed["Service"]["CapabilityBoundingSet"].split()
