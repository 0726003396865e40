"""Putting a job together: energy, GPUs, intensity, PUE and budget from the counters."""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from wattprint.report.common import (
    BUDGET,
    EMBODIED,
    EMISSIONS,
    ENERGY,
    ESTIMATED_METHODS,
    GPU_COUNTER,
    INTENSITY,
    LOOKBACK_S,
    MAX_INSTANCE_FILTER,
    MEASUREMENT,
    PLATFORM,
    PUE,
    ReportError,
    iso,
)
from wattprint.report.jobreport import Component, GpuUse, JobReport
from wattprint.report.ledger import Counter, read_counters
from wattprint.report.progress import Progress
from wattprint.report.promapi import PrometheusClient, format_ms, quote
from wattprint.report.queries import (
    Window,
    job_key,
    label_selector,
    on_grid,
    series_key,
    workload_selector,
)


def _instance_key(labels: dict[str, str]) -> tuple[str, str]:
    return (labels.get("job", ""), labels.get("instance", ""))


def _instance_filter(instances: set[tuple[str, str]]) -> str:
    names = sorted({instance for _, instance in instances})
    if not names or len(names) > MAX_INSTANCE_FILTER:
        return ""
    return "instance=~" + quote("|".join(re.escape(n) for n in names))


class _StepLookup:
    """A per-step value of a gauge, keyed by labels, carried forward over gaps."""

    def __init__(self) -> None:
        self._steps: dict[Any, dict[int, Any]] = defaultdict(dict)
        self._order: dict[Any, list[int]] = {}

    def add(self, key: Any, k: int, value: Any) -> None:
        self._steps[key][k] = value
        self._order.pop(key, None)

    def collect(self, key: Any, k: int, item: Any) -> None:
        """Add an item to the set at a step (several series can be seen at one step)."""
        self._steps[key].setdefault(k, set()).add(item)
        self._order.pop(key, None)

    def get(self, key: Any, k: int) -> Any:
        steps = self._steps.get(key)
        if not steps:
            return None
        if k in steps:
            return steps[k]
        order = self._order.get(key)
        if order is None:
            order = self._order[key] = sorted(steps)
        i = bisect.bisect_right(order, k)
        return steps[order[i - 1] if i else order[0]]


def build_reports(
    client: PrometheusClient,
    window: Window,
    workload: str | None,
    namespace: str | None,
    progress: Progress,
) -> list[JobReport]:
    selector = workload_selector(workload, namespace)

    progress.say("reading energy counters")
    energy = read_counters(client, ENERGY, selector, window)
    progress.say("reading emissions counters")
    emissions = read_counters(client, EMISSIONS, selector, window)

    jobs: dict[tuple[str, str, str], JobReport] = {}
    for counter in [*energy.values(), *emissions.values()]:
        key = job_key(counter.labels)
        if key not in jobs:
            jobs[key] = JobReport(*key)
        jobs[key].instances.add(_instance_key(counter.labels))
    if not jobs:
        raise ReportError(_why_empty(client, window, workload, namespace))

    instances = set().union(*(job.instances for job in jobs.values()))
    where = _instance_filter(instances)
    progress.say("reading measurement methods and PUE")
    methods = _StepLookup()
    platform_nodes: set[tuple[str, str]] = set()
    for series in on_grid(client, MEASUREMENT, f"{{{where}}}", window):
        labels = series.labels
        if labels.get("component") == PLATFORM and series.samples:
            platform_nodes.add(_instance_key(labels))
        device = (*_instance_key(labels), labels.get("component", ""))
        for t, _ in series.samples:
            methods.collect(
                device, window.index(t), (labels.get("device", ""), labels.get("method", ""))
            )
    pues = _StepLookup()
    for series in on_grid(client, PUE, f"{{{where}}}", window):
        for t, value in series.samples:
            pues.add(_instance_key(series.labels), window.index(t), value)

    for counter in energy.values():
        job = jobs[job_key(counter.labels)]
        _add_energy(job, counter, methods, pues)
    for job in jobs.values():
        job.platform_nodes = job.instances & platform_nodes
    for counter in emissions.values():
        job = jobs[job_key(counter.labels)]
        component = counter.labels.get("component", "")
        if component in job.components:
            job.components[component].emissions_g += counter.total
        elif component == PLATFORM:
            job.platform.emissions_g += counter.total
        if component == "gpu":
            gpu = job.gpus.setdefault(
                (counter.labels.get("instance", ""), counter.labels.get("gpu", "")),
                GpuUse(counter.labels.get("instance", ""), counter.labels.get("gpu", "")),
            )
            gpu.emissions_g += counter.total

    progress.say("reading embodied emissions counters")
    for counter in read_counters(client, EMBODIED, selector, window).values():
        key = job_key(counter.labels)
        if key in jobs:
            jobs[key].embodied_g += counter.total

    active = [job for job in jobs.values() if job.energy_j > 0]
    if not active:
        raise ReportError(_why_flat(window, workload, namespace))

    by_job: dict[tuple[str, str, str], list[Counter]] = defaultdict(list)
    for counter in energy.values():
        by_job[job_key(counter.labels)].append(counter)
    for number, job in enumerate(active, start=1):
        progress.say(f"finding when job {number}/{len(active)} ran")
        _find_life(client, window, job, by_job[(job.scheduler, job.namespace, job.workload)])
        _note_restarts(client, job)

    progress.say("reading GPU models, zones and budgets")
    _add_context(client, window, active, where)
    active.sort(key=lambda j: (j.start, j.namespace, j.workload, j.scheduler))
    return active


def _add_energy(job: JobReport, counter: Counter, methods: _StepLookup, pues: _StepLookup) -> None:
    labels = counter.labels
    component = labels.get("component", "")
    if component == PLATFORM:
        totals: Component = job.platform
    elif component in job.components:
        totals = job.components[component]
    else:
        return
    node = _instance_key(labels)
    gpu_label = labels.get("gpu", "")
    gpu: GpuUse | None = None
    if component == "gpu":
        gpu = job.gpus.setdefault(
            (labels.get("instance", ""), gpu_label), GpuUse(labels.get("instance", ""), gpu_label)
        )
    missing_pue = False
    for k, delta in counter.deltas.items():
        seen = methods.get((*node, component), k) or set()
        used = {m for device, m in seen if component != "gpu" or device == gpu_label}
        # A device whose method is unknown, or changed within the step, counts as
        # estimated: the report never claims more measurement than there was.
        estimated = not used or bool(used & ESTIMATED_METHODS)
        totals.methods |= used
        pue = pues.get(node, k)
        if pue is None:
            missing_pue, pue = True, 1.0
        totals.energy_j += delta
        totals.pue_energy_j += delta * pue
        if estimated:
            totals.estimated_j += delta
        if gpu is not None:
            gpu.energy_j += delta
            if estimated:
                gpu.estimated_j += delta
    if missing_pue:
        note = f"no {PUE} from {node[1]}: PUE 1.0 assumed"
        if note not in job.notes:
            job.notes.append(note)


def _note_restarts(client: PrometheusClient, job: JobReport) -> None:
    """Say so when an exporter serving the job restarted during its life: resumed from
    its state file (the gap's energy booked from the hardware counters), or not (the
    device counters reset: what the devices used while it was down is missing)."""
    where = _instance_filter(job.instances)
    span = format_ms(max(job.end - job.start, 1.0) + LOOKBACK_S)
    device = '__name__=~"wattprint_(gpu|cpu|memory)_energy_joules_total"'
    resumed = client.instant(
        f'sum by (instance) (changes(wattprint_restarts_total{{outcome="resumed"'
        f"{',' + where if where else ''}}}[{span}]))",
        job.end,
    )
    lost = client.instant(
        f"sum by (instance) (resets({{{device}{',' + where if where else ''}}}[{span}]))",
        job.end,
    )
    for series in resumed:
        count = round(series.samples[-1][1]) if series.samples else 0
        if count:
            job.notes.append(
                f"the exporter on {series.labels.get('instance', '?')} restarted {count} "
                "time(s) and resumed: the energy used while it was down was booked from "
                "the devices' counters (wattprint_restart_gap_energy_joules_total)"
            )
    for series in lost:
        if series.samples and series.samples[-1][1] > 0:
            job.notes.append(
                f"the exporter on {series.labels.get('instance', '?')} restarted without "
                "its state file: the energy used while it was down is missing"
            )


def _started(samples: Sequence[tuple[float, float]], after: float) -> float:
    """When a counter born at zero started.

    Its first sample already holds what was drawn before it, so the start moves back
    by the time that took at the rate of the next interval; at most one scrape
    interval, because the scrape before did not see the series, and never before
    `after`."""
    (t0, v0), rest = samples[0], samples[1:]
    if rest and v0 > 0:
        t1, v1 = rest[0]
        if v1 > v0 and t1 > t0:
            interval = t1 - t0
            return max(after, t0 - interval, t0 - v0 * interval / (v1 - v0))
    return t0


def _ended(samples: Sequence[tuple[float | None, float]]) -> float | None:
    """When a counter last rose: the sample that shows the last rise, moved back to
    where the rate of the interval before would have reached its final value."""
    changes = [i for i in range(1, len(samples)) if samples[i][1] != samples[i - 1][1]]
    if not changes:
        return None
    i = changes[-1]
    t_end, v_end = samples[i]
    t_prev, v_prev = samples[i - 1]
    if t_end is None:
        return None
    if i >= 2 and t_prev is not None and samples[i - 2][0] is not None:
        t_before, v_before = samples[i - 2]
        assert t_before is not None
        if v_prev > v_before and v_end > v_prev and t_prev > t_before:
            rate = (v_prev - v_before) / (t_prev - t_before)
            return min(t_end, t_prev + (v_end - v_prev) / rate)
    return t_end


def _find_life(
    client: PrometheusClient, window: Window, job: JobReport, counters: list[Counter]
) -> None:
    """Start and end of the job in the range, from the raw samples around them."""
    selector = ENERGY + label_selector(
        {"scheduler": job.scheduler, "namespace": job.namespace, "workload": job.workload}
    )
    rising = [c for c in counters if c.deltas]
    if not rising:
        return

    def raw(at: float, span: float) -> dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]:
        result = client.instant(f"{selector}[{format_ms(span)}]", at)
        return {series_key(s.labels): s.samples for s in result}

    if any(c.baseline is not None for c in rising):
        job.start = window.since
        if window.whole_life:
            job.notes.append(f"ran before {iso(window.since)}, the oldest data kept")
    else:
        first = min(c.first_step for c in rising if c.first_step is not None)
        before = window.at(first - 1)
        # A step earlier too: a series born at 0 may show its 0 before the step it first
        # rises in, and its life starts there.
        reach = window.at(max(first - 2, 0))
        at = min(window.until, window.at(first) + window.lookback)
        samples = raw(at, at - reach)
        starts = []
        for c in rising:
            if c.first_step != first:
                continue
            born = samples.get(series_key(c.labels), [])
            zeros = [i for i, p in enumerate(born) if p[1] == 0 and p[0] <= before]
            if zeros:
                starts.append(_started(born[zeros[-1] :], window.since))
            elif after := [p for p in born if p[0] > before]:
                # Bounded by the range, not by the step's boundary: that is no scrape,
                # and a job born just after it started up to a scrape interval before.
                starts.append(_started(after, window.since))
        job.start = min(starts) if starts else window.at(first)
        if first == 1 and window.whole_life:
            job.notes.append(f"may have run before {iso(window.since)}, the oldest data kept")
    last = max(max(c.deltas) for c in rising)
    before = window.at(last - 1)
    samples = raw(window.at(last), window.lookback + window.step)
    ends: list[float] = []
    for counter in rising:
        if last not in counter.deltas:
            continue
        points: list[tuple[float | None, float]] = list(samples.get(series_key(counter.labels), []))
        if points and points[0][0] is not None and points[0][0] > before:
            # No sample at or before the previous step in reach: its value there is known.
            points.insert(0, (None, counter.value_before(last)))
        end = _ended(points)
        if end is not None:
            ends.append(end)
    job.end = max(max(ends) if ends else window.at(last), job.start)
    if any(c.rising_at_until for c in rising):
        job.end = window.until  # still drawing when the range ends


def _add_context(
    client: PrometheusClient, window: Window, jobs: list[JobReport], where: str
) -> None:
    first = min(job.start for job in jobs)
    last = max(job.end for job in jobs)
    at = min(window.until, last + window.step)
    span = format_ms(max(at - first + window.lookback, window.step))
    for series in client.instant(
        f"group by (instance, gpu, model) (last_over_time({GPU_COUNTER}{{{where}}}[{span}]))", at
    ):
        key = (series.labels.get("instance", ""), series.labels.get("gpu", ""))
        for job in jobs:
            if key in job.gpus:
                job.gpus[key].model = series.labels.get("model", "")
    zone_filter = ",".join(x for x in (where, 'signal="average"') if x)
    for series in client.instant(
        f"group by (job, instance, zone) (last_over_time({INTENSITY}{{{zone_filter}}}[{span}]))",
        at,
    ):
        node = _instance_key(series.labels)
        for job in jobs:
            if node in job.instances and series.labels.get("zone"):
                job.zones.add(series.labels["zone"])
    names = sorted({job.workload for job in jobs})
    matcher = "workload=~" + quote("|".join(re.escape(n) for n in names))
    for series in client.instant(f"last_over_time({BUDGET}{{{matcher}}}[{span}])", at):
        if not series.samples:
            continue
        key = (series.labels.get("namespace", ""), series.labels.get("workload", ""))
        for job in jobs:
            if (job.namespace, job.workload) == key:
                job.budget_grams = series.samples[-1][1]


def _why_empty(
    client: PrometheusClient, window: Window, workload: str | None, namespace: str | None
) -> str:
    span = f"between {iso(window.since)} and {iso(window.until)}"
    hint = "" if window.whole_life else " (try a wider --range, or none for whole lives)"

    def unknown(label: str, value: str, known: list[str]) -> str:
        if not client.label_values("workload", ENERGY):
            return (
                f"no wattprint workload data on {client.url} at all: "
                "does this Prometheus scrape the wattprint exporter?"
            )
        import difflib

        close = difflib.get_close_matches(value, known, n=3, cutoff=0.6)
        suggestion = f"; did you mean {', '.join(close)}?" if close else ""
        return f"unknown {label} {value!r} on {client.url}{suggestion}"

    if workload is not None:
        known = client.label_values("workload", ENERGY)
        if workload not in known:
            return unknown("workload", workload, known)
        if namespace is not None:
            where = client.label_values("namespace", f"{ENERGY}{{workload={quote(workload)}}}")
            if namespace not in where:
                found = ", ".join(repr(n) for n in where) or "no namespace"
                return f"workload {workload!r} never ran in namespace {namespace!r} (only {found})"
        return f"workload {workload!r} has no data {span}{hint}"
    if namespace is not None:
        known = client.label_values("namespace", ENERGY)
        if namespace not in known:
            return unknown("namespace", namespace, known)
        return f"namespace {namespace!r} has no data {span}{hint}"
    if not client.label_values("workload", ENERGY):
        return unknown("workload", "", [])
    return f"no workload has data {span}{hint}"


def _why_flat(window: Window, workload: str | None, namespace: str | None) -> str:
    what = f"workload {workload!r}" if workload is not None else "no workload"
    if namespace is not None:
        what += f" in namespace {namespace!r}"
    span = f"between {iso(window.since)} and {iso(window.until)}"
    if workload is not None:
        return f"{what} used no energy {span}"
    return f"{what} used energy {span}"
