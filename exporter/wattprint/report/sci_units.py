"""Functional units as data (rules/sci-units.example.yaml, rules/inference-units.yaml).

A unit is one or more counters a job exports and how their labels map to Wattprint's:

    units:
      - name: tokens                       # --per=tokens; part of the rule names
        metric: vllm:generation_tokens_total
        matchers: 'model_name!=""'         # optional, PromQL label matchers
        labels: {namespace: namespace, workload: app}

or, for several engines' counters summed into one unit:

      - name: tokens
        counters:
          - metric: [vllm:prompt_tokens_total, vllm:generation_tokens_total]
            labels: {namespace: namespace, pod: pod, model: model_name}
            engine: vLLM 0.10                # free text: where the names come from
            source: vllm-project/vllm vllm/v1/metrics/loggers.py
            fallback: vllm:prompt_tokens_total  # optional: a target without metric

A unit joins Wattprint's energy either per workload (`workload` mapped: a training
job's step counter) or per serving engine (`namespace` and `pod` mapped: an engine
scraped with its pod's labels). A serving engine may also map `workload`: a series
that carries one joins the energy of every pod or process of that workload (a
multi-pod engine, an engine outside Kubernetes), one without joins its own pod's.
`model` names the engine's model label, kept on the series. `fallback` names the
counter an older engine serves instead of `metric`; it counts for a scrape target
that serves no `metric` series.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wattprint.config import yamlfile

WORKLOAD_LABELS = ("namespace", "workload", "pod", "model")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_COUNTER_FIELDS = {"metric", "matchers", "labels", "engine", "source", "fallback"}
_FIELDS = _COUNTER_FIELDS | {"name", "description", "counters"}


class UnitError(ValueError):
    """The unit data is invalid; the message names the entry and the bad value."""


@dataclass(frozen=True)
class Counter:
    """One counter of the job (or several names with one label mapping)."""

    metrics: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]  # (Wattprint label, the job metric's label)
    matchers: str = ""
    engine: str = ""
    source: str = ""
    fallback: str = ""  # what a scrape target without any `metric` series serves instead

    def selectors(self) -> tuple[str, ...]:
        return tuple(f"{m}{{{self.matchers}}}" if self.matchers else m for m in self.metrics)

    def mapped(self, labels: Mapping[str, str]) -> dict[str, str]:
        """Wattprint's labels of a series of this counter ("" where not mapped)."""
        return {ours: labels.get(theirs, "") for ours, theirs in self.labels}


@dataclass(frozen=True)
class Unit:
    """A functional unit: its name and the counters whose sum it is."""

    name: str
    counters: tuple[Counter, ...]
    description: str = ""

    @property
    def per_pod(self) -> bool:
        """Joined per (namespace, pod) rather than per (namespace, workload)."""
        return "pod" in dict(self.counters[0].labels)

    @property
    def metric(self) -> str:
        return ", ".join(m for c in self.counters for m in c.metrics)

    # The single-counter form, as the workload rules and older callers read it.
    @property
    def labels(self) -> tuple[tuple[str, str], ...]:
        return self.counters[0].labels

    def selector(self) -> str:
        return self.counters[0].selectors()[0]

    def mapped(self, labels: Mapping[str, str]) -> tuple[str, str]:
        """(namespace, workload) of a series of a workload-joined unit's counter."""
        got = self.counters[0].mapped(labels)
        return got.get("namespace", ""), got.get("workload", "")


def _counter(entry: Mapping[str, object], where: str) -> Counter:
    unknown = set(entry) - _COUNTER_FIELDS
    if unknown:
        raise UnitError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    raw = entry.get("metric")
    names = raw if isinstance(raw, list) and raw else [raw]
    for metric in names:
        if not isinstance(metric, str) or not _METRIC.match(metric):
            raise UnitError(f"{where}: metric {metric!r} is not a Prometheus metric name")
    matchers = entry.get("matchers", "")
    if not isinstance(matchers, str) or any(c in matchers for c in "{}"):
        raise UnitError(f"{where}: matchers must be label matchers without braces")
    labels = entry.get("labels")
    if not isinstance(labels, dict) or not ("workload" in labels or "pod" in labels):
        raise UnitError(f"{where}: labels must map at least workload (or namespace and pod)")
    for ours, theirs in labels.items():
        if ours not in WORKLOAD_LABELS:
            raise UnitError(f"{where}: labels: {ours!r} is not namespace, workload, pod or model")
        if not isinstance(theirs, str) or not _LABEL.match(theirs):
            raise UnitError(f"{where}: labels.{ours}: {theirs!r} is not a label name")
    if "pod" in labels and "namespace" not in labels:
        raise UnitError(f"{where}: a pod join maps namespace and pod (and workload, if any)")
    if "model" in labels and "pod" not in labels:
        raise UnitError(f"{where}: model is kept on per-pod units only (map namespace and pod)")
    fallback = entry.get("fallback", "")
    if fallback and (not isinstance(fallback, str) or not _METRIC.match(fallback)):
        raise UnitError(f"{where}: fallback {fallback!r} is not a Prometheus metric name")
    if fallback and len(names) > 1:
        raise UnitError(f"{where}: a fallback stands in for one metric, not a list")
    pairs = tuple((k, labels[k]) for k in WORKLOAD_LABELS if k in labels)
    return Counter(
        tuple(names),  # type: ignore[arg-type]
        pairs,
        matchers,
        str(entry.get("engine", "")),
        str(entry.get("source", "")),
        str(fallback),
    )


def parse_units(data: object) -> list[Unit]:
    if not isinstance(data, dict) or not isinstance(data.get("units"), list):
        raise UnitError("expected a mapping with a list under 'units'")
    units: list[Unit] = []
    for i, entry in enumerate(data["units"]):
        where = f"units[{i}]"
        if not isinstance(entry, dict):
            raise UnitError(f"{where}: expected a mapping")
        unknown = set(entry) - _FIELDS
        if unknown:
            raise UnitError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise UnitError(f"{where}: name {name!r} must be lower case, digits, _ (e.g. tokens)")
        where = f"unit {name}"
        own = {k: v for k, v in entry.items() if k in _COUNTER_FIELDS}
        if "counters" in entry:
            if own:
                raise UnitError(f"{where}: give either counters or {', '.join(sorted(own))}")
            listed = entry["counters"]
            if not isinstance(listed, list) or not listed:
                raise UnitError(f"{where}: counters must be a non-empty list")
            if not all(isinstance(c, dict) for c in listed):
                raise UnitError(f"{where}: each counter is a mapping")
            counters = tuple(_counter(c, f"{where} counter {j}") for j, c in enumerate(listed))
        else:
            counters = (_counter(own, where),)
        if len({"pod" in dict(c.labels) for c in counters}) > 1:
            raise UnitError(f"{where}: its counters must all join per pod or all per workload")
        if name in {u.name for u in units}:
            raise UnitError(f"{where}: declared twice")
        units.append(Unit(name, counters, str(entry.get("description", ""))))
    return units


def load_units(path: str | Path) -> list[Unit]:
    """The units of a file, read as strictly as --config.file (a key given twice, an
    alias: refused); UnitError, one line, for a file that cannot be read or is wrong."""
    try:
        data = yamlfile.load(str(path))
    except OSError as exc:
        raise UnitError(f"cannot read {path}: {exc.strerror or exc}") from None
    except yamlfile.YamlFileError as exc:
        raise UnitError(f"{path} {exc}") from None
    try:
        return parse_units(data)
    except UnitError as exc:
        raise UnitError(f"{path}: {exc}") from None
