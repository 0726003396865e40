"""The serving engines' units joined to Wattprint's energy: rules and report (docs/inference.md).

Each engine series names what it joins on, and an empty key joins nothing:

- `workload` set (by the engine's scrape): the energy of every pod or process of that
  workload in the namespace (a multi-pod engine whose pods the exporter names by one job
  label; an engine outside Kubernetes started with WATTPRINT_WORKLOAD);
- else `pod` set: the energy of that pod;
- neither: no energy. Its units are recorded as units without energy, never divided
  into the energy of every unlabelled workload.

Wattprint's own series are read through `exported_namespace`/`exported_pod` where a scrape
that adds target labels moved them aside, and an engine's model label through
`exported_<label>` where the scrape's own `model` label moved it aside. Within one scrape
job an engine's series are summed (its engines, finish reasons); across the jobs that
scrape the same engine the highest count is kept, so an engine scraped twice counts once.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence

from wattprint.report.promapi import PrometheusClient, Series, format_ms
from wattprint.report.sci_units import Counter, Unit

ENERGY = "wattprint_workload_energy_joules_total"
EMISSIONS = "wattprint_workload_emissions_grams_total"
EMBODIED = "wattprint_workload_embodied_grams_total"
# Where each counter's samples go when a unit sums several names: a label only
# they carry, so that `or` keeps them all (rate() drops the name that told them apart).
COUNTER_LABEL = "wattprint_counter"
KEY = ("namespace", "pod", "workload", "model")
# The rules keep `cluster` too, as every rule does (docs/rules.md): two clusters never merge.
GROUP = ("cluster", *KEY)
# (window, seconds, ratio suffix). They record increases only: a ratio of two increases
# is the same on every engine, while VictoriaMetrics divides a rate() by the age of a
# series younger than its window.
WINDOWS = (("5m", 300, "rate5m"), ("1h", 3600, "increase1h"))
MODEL = "cluster, namespace, model"
UNITS = "namespace_pod_model:wattprint_functional_units_{}"
RUNBOOK = "https://github.com/wattprint/wattprint/blob/main/docs/inference.md#what-did-not-join"


def selectors(counter: Counter, metric: str) -> list[str]:
    """The metric's selectors: as given, and, where the matchers name the engine's model
    label, the same for that label moved aside to exported_<label> by the scrape."""
    if not counter.matchers:
        return [metric]
    theirs = dict(counter.labels).get("model", "")
    named = re.compile(rf"\b{re.escape(theirs)}\s*(?==~|!~|!=|=)") if theirs else None
    if named is None or not named.search(counter.matchers):
        return [f"{metric}{{{counter.matchers}}}"]
    moved = named.sub(f"exported_{theirs}", counter.matchers)
    return [f'{metric}{{{counter.matchers}, exported_{theirs}=""}}', f"{metric}{{{moved}}}"]


def _vector(counter: Counter, selector: str, window: str, tag: str) -> str:
    inner = f"increase({selector}[{window}])"
    for ours, theirs in counter.labels:
        if ours != theirs:
            inner = f'label_replace({inner}, "{ours}", "$1", "{theirs}", "(.*)")'
        if ours == "model":
            inner = f'label_replace({inner}, "model", "$1", "exported_{theirs}", "(.+)")'
    return f'label_replace({inner}, "{COUNTER_LABEL}", "{tag}", "", "")'


def _engine_vectors(unit: Unit, window: str) -> str:
    """Every counter's increases with Wattprint's label names, each tagged by its metric;
    a fallback counts for the scrape targets that serve none of the counter's metric."""
    parts = []
    for counter in unit.counters:
        for metric in counter.metrics:
            own = [_vector(counter, s, window, metric) for s in selectors(counter, metric)]
            part = " or ".join(own)
            if counter.fallback:
                older = _vector(counter, counter.fallback, window, counter.fallback)
                part = f"({part})\n      or on (cluster, job, instance)\n      {older}"
            parts.append(part)
    return "\n    or\n      ".join(parts)


def units_expr(unit: Unit, window: str) -> str:
    """Units per (namespace, pod, workload, model): summed within a scrape job, the
    highest of the jobs that scrape the same engine."""
    key = ", ".join(GROUP)
    return (
        f"sum by ({key}) (\n  max by ({key}, {COUNTER_LABEL}) (\n"
        f"    sum by ({key}, {COUNTER_LABEL}, job) (\n      {_engine_vectors(unit, window)}\n"
        "    )\n  )\n)\n"
    )


def _wattprint(metric: str, window: str, by: str, matcher: str) -> str:
    """Wattprint's increase by pod or workload. A pod's labels are read back from
    exported_* where a scrape's target labels moved them aside; a workload outside
    Kubernetes has no namespace or pod, whatever target labels the scrape added."""
    extra = f", {matcher}" if matcher else ""
    pods = f'increase({metric}{{scheduler="kubernetes"{extra}}}[{window}])'
    other = f'increase({metric}{{scheduler!="kubernetes"{extra}}}[{window}])'
    for label in ("namespace", "pod"):
        pods = f'label_replace({pods}, "{label}", "$1", "exported_{label}", "(.+)")'
        other = f'label_replace({other}, "{label}", "", "", "")'
    return f"sum by ({by}) (\n    {pods}\n  or\n    {other}\n  )"


def _energy(what: str, window: str, by: str, matcher: str) -> str:
    """Wattprint's `what` (workload_energy_joules, embodied_grams or sci_grams) by key:
    the chips' energy and emissions (not the platform), as the budgets count them."""
    chips = f'{matcher}, component!="platform"' if matcher else 'component!="platform"'
    if what == "workload_energy_joules":
        return _wattprint(ENERGY, window, by, chips)
    if what == "embodied_grams":
        return _wattprint(EMBODIED, window, by, matcher)
    # Operational plus embodied grams; hardware without an embodied figure keeps its
    # operational part (`or`), as in embodied.rules.yml.
    emissions = _wattprint(EMISSIONS, window, by, chips)
    return f"({emissions}\n  + {_wattprint(EMBODIED, window, by, matcher)}\n  or {emissions})"


# The two keys: (the label an engine's series joins on, the matchers that pick the
# series joined on it). A series with a workload joins by workload, whatever its pod.
_KEYS = (("pod", '{pod!="", workload=""}'), ("workload", '{workload!=""}'))


def _by_key(what: str, served: str, window: str) -> str:
    """`what` of each key shared among the key's models by their units, equally where
    the key counted none in the window (a decode pod's prompt tokens, a request-end
    engine with its requests still running): its energy stays its models' cost."""
    parts = []
    for label, picked in _KEYS:
        on, units = f"cluster, namespace, {label}", served + picked
        share = (
            f"{units}\n    / on ({on}) group_left ()\n    (sum by ({on}) ({units}) > 0)\n"
            f"  or\n    ({units} * 0 + 1)\n    / on ({on}) group_left ()\n"
            f"    count by ({on}) ({units})"
        )
        whole = _energy(what, window, on, f'{label}!=""')
        parts.append(f"  {whole}\n* on ({on}) group_right ()\n  (\n    {share}\n  )")
    return "(\n" + "\n)\nor\n(\n".join(parts) + "\n)\n"


def _unjoined(unit: Unit, served: str, window: str) -> list[dict[str, object]]:
    """Energy of models that counted no units in the window (in no ratio), units of
    engines whose key has no energy (or who have no key), engines scraped twice."""
    orphans = []
    for label, picked in _KEYS:
        on, units = f"cluster, namespace, {label}", served + picked
        whole = _energy("workload_energy_joules", window, on, f'{label}!=""')
        orphans.append(f"  {units}\nunless on ({on})\n  {whole}")
    orphans.append(f'  {served}{{pod="", workload=""}}')
    op = f"increase{window}"
    shared = f"namespace_pod_model:wattprint_workload_energy_joules_by_{unit.name}:{op}"
    idle = (
        f"sum by (cluster, namespace, pod, workload) (\n  {shared}\n"
        f"  unless on ({MODEL})\n  (sum by ({MODEL}) ({served}) > 0)\n)\n"
    )
    out: list[dict[str, object]] = [
        {
            "record": f"namespace_pod:wattprint_workload_energy_joules_without_{unit.name}:{op}",
            "expr": idle,
        },
        {
            "record": UNITS.format(f"{unit.name}_without_energy:{op}"),
            "expr": "(\n" + "\n)\nor\n(\n".join(orphans) + "\n)\n",
        },
    ]
    if window == "5m":
        key = ", ".join(GROUP)
        jobs = f"group by ({key}, job) (\n    {_engine_vectors(unit, window)}\n  )"
        out.append(
            {
                "record": UNITS.format(f"{unit.name}_scrape_jobs:count5m"),
                "expr": f"count by ({key}) (\n  {jobs}\n) > 1\n",
            }
        )
    return out


def alert(unit: Unit) -> dict[str, object]:
    """A model's engines counted units for an hour, none joined energy, and Wattprint
    has energy: the join is empty (the engine's scrape labels), not the model idle."""
    without = UNITS.format(f"{unit.name}_without_energy:increase1h")
    return {
        "alert": "WattprintServingJoinEmpty",
        "expr": (
            f"(\n  (sum by ({MODEL}) ({without}) > 0)\n"
            f"  unless on ({MODEL})\n"
            f"  namespace_model:wattprint_joules_per_{unit.name}:ratio_increase1h\n)\n"
            f"and on (cluster) (sum by (cluster) (increase({ENERGY}[1h])) > 0)\n"
        ),
        "for": "15m",
        "labels": {"severity": "warning", "unit": unit.name},
        "annotations": {
            "summary": "{{ $labels.model }} in {{ $labels.namespace }}: "
            f"no {unit.name} joined any energy for an hour",
            "description": (
                f"The engines of {{{{ $labels.model }}}} counted {{{{ $value }}}} {unit.name} "
                "in the last hour, and none of them joined Wattprint's energy, which has "
                "data: the engine's scrape gives no pod or workload, or one Wattprint does "
                "not know. Its energy per unit is not recorded."
            ),
            "runbook_url": RUNBOOK,
        },
    }


def pod_rules(unit: Unit) -> list[dict[str, object]]:
    """Per engine key and model: units served, energy and grams shared among the key's
    models by units; per namespace and model, joules and grams per unit of what joined;
    what did not join."""
    out: list[dict[str, object]] = []
    for window, seconds, ratio in WINDOWS:
        op = f"increase{window}"
        served = f"namespace_pod_model:wattprint_functional_units_{unit.name}:{op}"
        out.append({"record": served, "expr": units_expr(unit, window)})
        if op != ratio:
            per_second = f"namespace_pod_model:wattprint_functional_units_{unit.name}:{ratio}"
            out.append({"record": per_second, "expr": f"{served} / {seconds}"})
        # The embodied part alone, for the dashboard's embodied share: no ratio of its own.
        embodied = f"namespace_pod_model:wattprint_embodied_grams_by_{unit.name}:{op}"
        out.append({"record": embodied, "expr": _by_key("embodied_grams", served, window)})
        for what, name in (("workload_energy_joules", "joules"), ("sci_grams", "sci_grams")):
            part = f"namespace_pod_model:wattprint_{what}_by_{unit.name}:{op}"
            out.append({"record": part, "expr": _by_key(what, served, window)})
            joined = f"{served} and on ({', '.join(GROUP)}) {part}"
            out.append(
                {
                    "record": f"namespace_model:wattprint_{name}_per_{unit.name}:ratio_{ratio}",
                    "expr": f"sum by ({MODEL}) ({part})\n/ (sum by ({MODEL}) ({joined}) > 0)\n",
                }
            )
        out += _unjoined(unit, served, window)
    return out


# ---- the same join over a report's window, from raw samples --------------------------


def _rise(samples: Sequence[tuple[float, float]], since: float, until: float) -> float:
    """A counter's rise in [since, until] from its raw samples: from the last sample at
    or before `since` (the first one, for a counter born later) to the last at or
    before `until`, counter resets counted as restarts."""
    before = [v for t, v in samples if t <= since]
    inside = [v for t, v in samples if since < t <= until]
    values = ([before[-1]] if before else []) + inside
    rise = 0.0
    for a, b in itertools.pairwise(values):
        rise += b - a if b >= a else b
    return rise


def rises(
    client: PrometheusClient, selector: str, since: float, until: float, lookback: float
) -> list[tuple[dict[str, str], float]]:
    span = format_ms(until - since + lookback)
    found: list[Series] = client.instant(f"{selector}[{span}]", until)
    return [(s.labels, _rise(s.samples, since, until)) for s in found]


def engine_key(counter: Counter, labels: Mapping[str, str]) -> tuple[str, str, str, str]:
    """(namespace, pod, workload, model) of an engine series, as the rules read it."""
    got = {k: labels.get(k, "") for k in KEY} | counter.mapped(labels)
    theirs = dict(counter.labels).get("model")
    if theirs and labels.get(f"exported_{theirs}"):
        got["model"] = labels[f"exported_{theirs}"]
    return got["namespace"], got["pod"], got["workload"], got["model"]


def served(
    client: PrometheusClient, unit: Unit, since: float, until: float, lookback: float = 300.0
) -> dict[tuple[str, str, str, str], float]:
    """Units per (namespace, pod, workload, model) over [since, until], counted as the
    rules count them: summed within a scrape job, the highest of the jobs kept."""
    per_job: dict[tuple[tuple[str, str, str, str], str, str], float] = {}
    for counter in unit.counters:
        for metric in counter.metrics:
            found = [
                x
                for s in selectors(counter, metric)
                for x in rises(client, s, since, until, lookback)
            ]
            tagged = [(labels, rise, metric) for labels, rise in found]
            if counter.fallback:
                targets = {(labels.get("job"), labels.get("instance")) for labels, _ in found}
                older = rises(client, counter.fallback, since, until, lookback)
                tagged += [
                    (labels, rise, counter.fallback)
                    for labels, rise in older
                    if (labels.get("job"), labels.get("instance")) not in targets
                ]
            for labels, rise, tag in tagged:
                where = (engine_key(counter, labels), tag, labels.get("job", ""))
                per_job[where] = per_job.get(where, 0.0) + rise
    best: dict[tuple[tuple[str, str, str, str], str], float] = {}
    for (key, tag, _), count in per_job.items():
        best[(key, tag)] = max(best.get((key, tag), 0.0), count)
    out: dict[tuple[str, str, str, str], float] = {}
    for (key, _), count in best.items():
        out[key] = out.get(key, 0.0) + count
    return out


def wattprint_labels(labels: Mapping[str, str]) -> tuple[str, str, str]:
    """(namespace, pod, workload) of a Wattprint series, as the rules read them."""
    if labels.get("scheduler") != "kubernetes":
        return "", "", labels.get("workload", "")
    namespace = labels.get("exported_namespace") or labels.get("namespace", "")
    pod = labels.get("exported_pod") or labels.get("pod", "")
    return namespace, pod, labels.get("workload", "")


def shares(
    units: Mapping[tuple[str, str, str, str], float],
) -> Iterable[tuple[tuple[str, str, str, str], tuple[str, str, str], float]]:
    """Each engine key with the energy key it joins ("pod" or "workload", namespace,
    name) and its share of that energy, by units (equal where the energy key counted
    none); keys with no pod and no workload join nothing."""
    keyed: dict[tuple[str, str, str, str], tuple[str, str, str]] = {}
    for key in units:
        namespace, pod, workload, _ = key
        if workload:
            keyed[key] = ("workload", namespace, workload)
        elif pod:
            keyed[key] = ("pod", namespace, pod)
    totals: dict[tuple[str, str, str], float] = {}
    counts: dict[tuple[str, str, str], int] = {}
    for key, joins in keyed.items():
        totals[joins] = totals.get(joins, 0.0) + units[key]
        counts[joins] = counts.get(joins, 0) + 1
    for key, joins in keyed.items():
        total = totals[joins]
        yield key, joins, units[key] / total if total > 0 else 1 / counts[joins]
