"""Prometheus 2.42 and VictoriaMetrics 1.79 side by side, on the same data (about 5 min).

    python benchmarks/engines.py

Two parts, built from the stacks of tests/test_e2e_victoriametrics.py:

1. Identical data: one synthetic two-node history, 15 s scrapes, written into both
   engines. Every recording rule, alert and dashboard query (recorded series written out
   as the expressions that define them) is evaluated on both at seven sample instants;
   the largest relative difference is printed, then the same at an instant 7 s after a
   sample, where Prometheus extrapolates to the end of each window and VictoriaMetrics
   does not. The rows "rate()" evaluate MetricsQL's and PromQL's rate() for comparison.
2. Live: the exporter replays the H200 trace (4x, 1 s scrapes); vmagent and vmalert
   (their defaults) beside a Prometheus, all on the same exporter and rule files. The
   table holds what each engine says just after the job, at its own last sample, and
   when each raised the page alert.

Prints Markdown tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import test_e2e_victoriametrics as e2e  # noqa: E402

JOULES_PER_KWH = 3.6e6


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b)) if a or b else 0.0


def largest_difference(
    twins: e2e.Twins, cases: list[tuple[str, str]], at: float
) -> tuple[float, str]:
    worst, where = 0.0, ""
    for name, expr in cases:
        prom, vm = (e2e.as_map(e.query(expr, at)) for e in twins.engines())
        for key in prom.keys() & vm.keys():
            d = rel(prom[key], vm[key])
            if name in e2e.ABSOLUTE:
                d = min(d, abs(prom[key] - vm[key]))
            if d > worst:
                worst, where = d, f"{name} {dict(key)}"
    return worst, where


def identical_data(tmp: Path) -> None:
    with e2e.twins_stack(tmp) as twins:
        rules = e2e.rule_cases()
        boards = [
            (where, expr)
            for workload in ("train", "infer")
            for where, target, expr in e2e.dashboard_cases(workload)
            if target.get("instant")
        ]
        print("| identical history, 15 s samples | expressions | largest difference |")
        print("|---|---|---|")
        for label, cases in (("rules and alerts", rules), ("instant dashboard queries", boards)):
            worst, where = 0.0, ""
            for at in e2e.INSTANTS.values():
                d, w = largest_difference(twins, cases, twins.t0 + at)
                if d >= worst:
                    worst, where = d, w
            print(f"| {label}, at 7 sample instants | {len(cases)} | {worst:.2e} ({where}) |")
            between = twins.t0 + e2e.HISTORY - 7
            d, w = largest_difference(twins, cases, between)
            print(f"| {label}, 7 s after a sample | {len(cases)} | {d:.2%} ({w}) |")
        for what, expr in (
            (
                "job 45 s old",
                'sum(rate(wattprint_workload_energy_joules_total{workload="infer"}[5m]))',
            ),
            (
                "job 45 s old, increase()/300",
                'sum(increase(wattprint_workload_energy_joules_total{workload="infer"}[5m])) / 300',
            ),
            (
                "job ended 20 min before, 2h window",
                'sum(rate(wattprint_workload_emissions_grams_total{workload="batch"}[2h]))',
            ),
        ):
            at = twins.t0 + (e2e.HISTORY if "45" in what else e2e.BATCH[1] + 1200)
            p, v = (e.value(expr, at) for e in twins.engines())
            name = expr.split("(")[1]
            print(
                f"| {what}: `{name}` | Prometheus {p:.6g} |"
                f" VictoriaMetrics {v:.6g} ({v / p - 1:+.1%}) |"
            )
    print()


def value_or_none(engine: e2e.Engine, expr: str, at: float) -> float | None:
    result = engine.query(expr, at)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def live(tmp: Path) -> None:
    with e2e.live_stack(tmp) as stack:
        end = e2e.wait_for_the_end(stack)
        w = f'workload="{e2e.WORKLOAD}"'
        rows: list[tuple[str, str]] = [
            ("job GPU energy, increase1h rule (J)", e2e.RECORDED[e2e.ENERGY_RULE]),
            ("job GPU emissions, increase1h rule (g)", e2e.RECORDED[e2e.EMISSIONS_RULE]),
            (
                "job power, rate5m rule (W)",
                f"sum(increase(wattprint_workload_energy_joules_total{{{w}}}[5m])) / 300",
            ),
            (
                "job power with rate() (W)",
                f"sum(rate(wattprint_workload_energy_joules_total{{{w}}}[5m]))",
            ),
        ]
        budget = "namespace_workload:wattprint_emissions_budget_grams:30d / 2592000"
        for window in ("5m", "1h", "6h"):
            rows.append((f"burn rate {window}", str(e2e.inline(e2e.BURN.format(window)))))
            old = f"rate(wattprint_workload_emissions_grams_total{{{w}}}[{window}])"
            rows.append(
                (
                    f"burn rate {window} with rate()",
                    f"sum by (namespace, workload) ({old}) / on (namespace, workload) ({budget})",
                )
            )
        rows.append(('Fleet "Power now" (W)', e2e.board_expr("fleet", "Power now")))
        devices = e2e.DEVICES
        rows.append(('Fleet "Power now" with rate() (W)', f"sum(rate({devices}[5m]))"))
        residual = "instance_component:wattprint_attribution_residual:ratio_increase1h"
        rows.append(("attribution residual, gpu, as recorded", f'{residual}{{component="gpu"}}'))
        print("| just after the job, each at its last sample | Prometheus | VictoriaMetrics | |")
        print("|---|---|---|---|")
        for label, expr in rows:
            p = value_or_none(stack.prom, expr, end["Prometheus"])
            v = value_or_none(stack.vm, expr, end["VictoriaMetrics"])
            diff = f"{v / p - 1:+.2%}" if p and v else "-"
            shown = [f"{x:.6g}" if x is not None else "none" for x in (p, v)]
            print(f"| {label} | {shown[0]} | {shown[1]} | {diff} |")
        counter = {e.name: e.samples(e2e.COUNTER, end[e.name])[-1][1] for e in stack.engines()}
        reports = {}
        for engine in stack.engines():
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "wattprint",
                    "report",
                    f"--prometheus.url={engine.url}",
                    f"--workload={e2e.WORKLOAD}",
                    "--format=json",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            doc: dict[str, Any] = json.loads(out.stdout)
            reports[engine.name] = doc["jobs"][0]["energy_kwh"]["gpu"] * JOULES_PER_KWH
            print(
                f"| `wattprint report` GPU energy, {doc['engine']} | counter"
                f" {counter[engine.name]:.3f} J | report {reports[engine.name]:.3f} J | |"
            )
        firing: dict[str, float] = {}
        deadline = time.monotonic() + 300
        while len(firing) < 2 and time.monotonic() < deadline:
            for engine in stack.engines():
                if engine.name not in firing and engine.query(
                    f'{e2e.PAGE[:-1]}, alertstate="firing"}}'
                ):
                    firing[engine.name] = time.time() - stack.started
            time.sleep(1)
        for engine in stack.engines():
            # The rule engines record when each alert became active (pending).
            active = engine.query(e2e.PAGE.replace("ALERTS{", "ALERTS_FOR_STATE{"))
            pending = float(active[0]["value"][1]) - stack.started if active else float("nan")
            residual = "yes" if engine.query(e2e.RESIDUAL) else "no"
            print(
                f"| page alert, {engine.name} | pending +{pending:.0f} s | firing"
                f" +{firing.get(engine.name, float('nan')):.0f} s | residual alert: {residual} |"
            )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        identical_data(Path(tmp) / "twins")
        live(Path(tmp) / "live")


if __name__ == "__main__":
    main()
