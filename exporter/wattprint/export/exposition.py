"""The Prometheus text formats (0.0.4 and OpenMetrics 1.0.0), written from plain values.

Byte for byte what prometheus_client writes for the same families (tests/golden and
tests/test_exposition.py hold it to that), without importing it: prometheus_client pulls
in http.server, email and ssl, most of the exporter's start-up time, and builds a dict and
a named tuple for every sample, most of a scrape's time when a node has hundreds of jobs.
Here a series' label text is formatted once and kept while the series lives, so a scrape
of an unchanged node formats only numbers.

Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

# Label strings kept: a node's series (the workload cap bounds them) with room to spare;
# beyond it the least recently used are formatted again.
LABEL_CACHE = 16384
_INF = math.inf
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")  # RFC 9110 12.4.2


def accepts_openmetrics(accept: str) -> bool:
    """Whether to answer in OpenMetrics, as prometheus_client decides: the first entry
    of Accept that it can serve wins, OpenMetrics (no version, or 1.0.0 and later) or
    the text format (version 1.0.0 and later); with neither, the text format."""
    for part in accept.split(","):
        media, *params = (token.strip() for token in part.split(";"))
        if media not in ("application/openmetrics-text", "text/plain"):
            continue
        versions = [p[len("version=") :] for p in params if p.startswith("version=")]
        major = versions[0].split(".")[0] if versions else ""
        newer = major.isascii() and major.isdigit() and int(major) >= 1
        if media == "application/openmetrics-text" and (not versions or newer):
            return True
        if media == "text/plain" and newer:
            return False
    return False


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether the client takes gzip, as RFC 9110 12.5.3 says: gzip's weight if it is
    listed (x-gzip is gzip), else that of `*`, else none; a weight of 0 refuses it, and
    so does one that is not a qvalue. Parameters other than q are ignored."""
    weights: dict[str, float] = {}
    for coding in accept_encoding.split(","):
        name, *params = (token.strip() for token in coding.split(";"))
        name = "gzip" if name.lower() == "x-gzip" else name.lower()
        weight = 1.0
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip().lower() == "q":
                weight = float(raw.strip()) if _QVALUE.fullmatch(raw.strip()) else 0.0
        weights[name] = max(weight, weights.get(name, 0.0))
    return weights.get("gzip", weights.get("*", 0.0)) > 0


def go_float(value: float) -> str:
    """A float as Go's strconv writes it (and Prometheus's clients after it)."""
    value = float(value)
    if -math.inf < value < 1e6:  # finite, short of an exponent: as Python writes it
        return repr(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value != value:
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    # Go switches to an exponent from 1e21 on small fractions too, but for the values
    # an exporter writes only large ones differ: 1234567.0 is 1.234567e+06 in Go.
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@lru_cache(maxsize=LABEL_CACHE)
def label_text(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """'{a="1",b="2"}' with the labels in name order, as the clients write them."""
    if not names:
        return ""
    pairs = sorted(zip(names, values, strict=True))
    return "{" + ",".join(f'{n}="{_escape_value(v)}"' for n, v in pairs) + "}"


class Family:
    """One metric family: its samples share a name, a type, a help text and label names.

    A counter's name ends in _total, as its samples are named; OpenMetrics names the
    family without it.
    """

    __slots__ = ("help", "kind", "labels", "name", "samples")

    def __init__(self, kind: str, name: str, help: str, labels: Sequence[str] = ()) -> None:
        if kind not in ("counter", "gauge"):
            raise ValueError(f"unsupported metric type {kind!r}")
        if kind == "counter" and not name.endswith("_total"):
            name += "_total"
        self.kind = kind
        self.name = name
        self.help = help
        self.labels = tuple(labels)
        self.samples: list[tuple[str, float, float | None]] = []

    def add(self, values: Sequence[str], value: float, timestamp: float | None = None) -> None:
        self.samples.append((label_text(self.labels, tuple(values)), value, timestamp))

    def add_labelled(self, labels: str, value: float, timestamp: float | None = None) -> None:
        """A sample whose label text (label_text of this family's names) is at hand."""
        self.samples.append((labels, value, timestamp))


def counter(name: str, help: str, labels: Sequence[str] = ()) -> Family:
    return Family("counter", name, help, labels)


def gauge(name: str, help: str, labels: Sequence[str] = ()) -> Family:
    return Family("gauge", name, help, labels)


def single(kind: str, name: str, help: str, value: float) -> Family:
    """A family of one unlabelled sample."""
    family = Family(kind, name, help)
    family.add((), value)
    return family


def _stamp(stamp: float, millis: bool) -> str:
    """A sample's timestamp: milliseconds in the text format, seconds in OpenMetrics."""
    return f" {int(float(stamp) * 1000)}" if millis else f" {stamp}"


def encode(families: Iterable[Family], openmetrics: bool = False) -> bytes:
    """The exposition of the families, in text 0.0.4 or OpenMetrics 1.0.0."""
    out: list[str] = []
    append = out.append
    for f in families:
        if openmetrics:
            name = f.name[: -len("_total")] if f.kind == "counter" else f.name
            append(f"# HELP {name} {_escape_value(f.help)}\n# TYPE {name} {f.kind}\n")
        else:
            help = f.help.replace("\\", r"\\").replace("\n", r"\n")
            append(f"# HELP {f.name} {help}\n# TYPE {f.name} {f.kind}\n")
        prefix, millis = f.name, not openmetrics
        # One line per sample, hundreds a scrape on a node of a hundred jobs: written in
        # one comprehension, with go_float's first case (a plain float) inline.
        out += [
            f"{prefix}{labels} "
            f"{repr(value) if type(value) is float and -_INF < value < 1e6 else go_float(value)}"
            f"{'' if stamp is None else _stamp(stamp, millis)}\n"
            for labels, value, stamp in f.samples
        ]
    if openmetrics:
        append("# EOF\n")
    return "".join(out).encode()
