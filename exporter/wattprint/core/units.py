"""Value formats shared by the flags, the carbon service and the report: Prometheus-style
durations both ways, and the range a PUE may take."""

from __future__ import annotations

import math
import re

# Energy is kept in integer micro-joules, so that its split among workloads is exact.
UJ_PER_J = 1_000_000
# A Julian year: the amortization the SCI guidance uses (4 years = 4 x 8,766 h).
SECONDS_PER_YEAR = 8766 * 3600.0

_DURATION_UNITS = {
    "y": 31536000.0,
    "w": 604800.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
# Prometheus's own grammar (common/model ParseDuration): whole numbers, each unit at
# most once, largest first. "1.5s", "5s1m" and "1m1m" are not durations there either.
_DURATION_RE = re.compile("".join(f"(?:(\\d+){unit})?" for unit in _DURATION_UNITS))


def parse_duration(text: str) -> float:
    """Prometheus-style duration ("100ms", "1m30s") to seconds."""
    match = _DURATION_RE.fullmatch(text)
    if text == "0":
        return 0.0
    if not text or match is None:
        raise ValueError(
            f"not a duration: {text!r} (Prometheus style: whole numbers with units from "
            "y, w, d, h, m, s, ms, largest first, each once: 500ms, 1m30s, 5m, 1h)"
        )
    return sum(
        int(count) * size
        for count, size in zip(match.groups(), _DURATION_UNITS.values())
        if count is not None
    )


def format_duration(seconds: float) -> str:
    """Prometheus-style duration for humans, two units at most: 500ms, 45s, 5m, 1h30m, 2d3h."""
    seconds = max(0.0, seconds)
    if 0 < seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts[:2])


PUE_MIN, PUE_MAX = 1.0, 5.0  # a data centre's PUE: no overhead up to a very poor one


def check_pue(value: float, text: str | None = None) -> float:
    """The PUE limits, for the flag and for a CarbonSettings built in code alike."""
    if not (math.isfinite(value) and PUE_MIN <= value <= PUE_MAX):
        shown = repr(value if text is None else text)
        raise ValueError(f"{shown} is not a plausible PUE ({PUE_MIN} to {PUE_MAX})")
    return value
