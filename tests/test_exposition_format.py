"""exposition.py writes what prometheus_client writes, byte for byte, in both formats.

prometheus_client is the reference implementation every Prometheus client follows; the
exporter stopped importing it for start-up time and scrape cost, so any family, label
value or number it could be given must come out the same as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from wattprint.export.exposition import Family, accepts_openmetrics, encode, go_float, label_text

NAMES = st.from_regex(r"\A[a-z][a-z0-9_]{0,20}\Z")
LABEL_NAMES = st.lists(NAMES.filter(lambda n: not n.startswith("__")), max_size=5, unique=True)
# Any text a label value can hold: quotes, backslashes, newlines, non-ASCII.
VALUES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**18), max_value=10**18),
    st.sampled_from([0.0, -0.0, 1e6, 1234567.0, 1e21, 123456789.125, 5e-324, 0.1]),
)
STAMPS = st.one_of(st.none(), st.floats(min_value=0, max_value=4e9, allow_nan=False))


@st.composite
def families(draw: st.DrawFn) -> list[tuple[str, str, str, list[str], list[tuple]]]:
    out = []
    used: set[str] = set()
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["counter", "gauge"]))
        name = "wp_" + draw(NAMES.filter(lambda n: n not in used))
        used.add(name)
        if kind == "counter":
            name += "_total"
        labels = draw(LABEL_NAMES)
        help_text = draw(VALUES)
        samples = draw(
            st.lists(
                st.tuples(
                    st.lists(VALUES, min_size=len(labels), max_size=len(labels)), NUMBERS, STAMPS
                ),
                max_size=4,
            )
        )
        out.append((kind, name, help_text, labels, samples))
    return out


class Reference(Collector):
    def __init__(self, spec: list[tuple[str, str, str, list[str], list[tuple]]]) -> None:
        self.spec = spec

    def collect(self) -> Iterator[Metric]:
        for kind, name, help_text, labels, samples in self.spec:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = cls(name, help_text, labels=labels)
            for values, number, stamp in samples:
                family.add_metric(values, number, timestamp=stamp)
            yield family


def ours(spec: list[tuple[str, str, str, list[str], list[tuple]]]) -> list[Family]:
    out = []
    for kind, name, help_text, labels, samples in spec:
        family = Family(kind, name, help_text, labels)
        for values, number, stamp in samples:
            family.add(values, number, stamp)
        out.append(family)
    return out


@settings(max_examples=300, deadline=None)
@given(families())
def test_both_formats_are_byte_for_byte_prometheus_clients(spec: list) -> None:
    reference = Reference(spec)
    assert encode(ours(spec)) == generate_latest(reference)  # type: ignore[arg-type]
    assert encode(ours(spec), openmetrics=True) == generate_openmetrics(reference)


def test_the_text_reads_back_through_prometheus_clients_parser() -> None:
    family = Family("counter", "wp_energy_joules_total", 'help "quoted" \\ back', ["job", "gpu"])
    family.add(['a "b"\nc\\', "0"], 12.5, 1_700_000_000.25)
    (parsed,) = text_string_to_metric_families(encode([family]).decode())
    assert parsed.name == "wp_energy_joules" and parsed.type == "counter"
    (sample,) = parsed.samples
    assert sample.labels == {"job": 'a "b"\nc\\', "gpu": "0"}
    assert sample.value == 12.5 and sample.timestamp == 1_700_000_000.25


def test_go_float_switches_to_exponents_as_go_does() -> None:
    assert go_float(1234567.0) == "1.234567e+06"
    assert go_float(123456.5) == "123456.5"
    assert go_float(3) == "3.0"
    assert go_float(math.inf) == "+Inf" and go_float(-math.inf) == "-Inf"
    assert go_float(math.nan) == "NaN"


def test_label_text_is_sorted_by_name_and_kept_per_series() -> None:
    assert label_text(("b", "a"), ("2", "1")) == '{a="1",b="2"}'
    assert label_text((), ()) == ""
    before = label_text.cache_info().hits
    label_text(("b", "a"), ("2", "1"))
    assert label_text.cache_info().hits == before + 1


ACCEPTS = [
    "",
    "*/*",
    # Prometheus 2.42
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    # Prometheus 3 with the text format asked for first
    "text/plain;version=1.0.0;escaping=allow-utf-8,application/openmetrics-text;"
    "version=1.0.0;q=0.9,*/*;q=0.1",
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",  # vmagent, and older Prometheus
    "application/openmetrics-text",
    "application/openmetrics-text; version=0.0.1",
    "application/openmetrics-text;version=2.0.0",
    "text/plain;version=0.0.4,application/openmetrics-text;version=1.0.0",
    "text/html,application/xhtml+xml",  # a browser
]


def test_the_format_is_chosen_as_prometheus_client_chooses_it() -> None:
    for accept in ACCEPTS:
        chosen = choose_encoder(accept)[1].startswith("application/openmetrics-text")
        assert accepts_openmetrics(accept) == chosen, accept
