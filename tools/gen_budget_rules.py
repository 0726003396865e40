#!/usr/bin/env python3
"""Turn emission budgets (data) into the Prometheus rules the budget alerts join on.

Budgets are data, never hand-edited into rule expressions. The input is YAML in the
shape of the Helm chart's `prometheusRule.budgets` value (rules/budgets.example.yaml):

    budgets:
      - namespace: team-a      # no workload: the namespace's budget
        budget: 500kg
      - namespace: team-b      # a workload's budget; leave namespace out
        workload: train-llm    # for workloads outside Kubernetes
        grams: 50000

Each entry gives either `grams` (a number) or `budget` (a number of grams, or a
string with the unit g, kg or t). The period is a rolling 30 days, as the burn-rate
factors of rules/alerts.rules.yml assume; `period`, if given, must say 30d. The
output is one rule group of constant series:

    namespace:wattprint_emissions_budget_grams:30d{namespace}
    namespace_workload:wattprint_emissions_budget_grams:30d{namespace, workload}

Usage: gen_budget_rules.py BUDGETS.yaml [-o OUT.rules.yml]. budget_rules() is pure,
so that other tooling (the Helm chart's helper) can build the same rules.

Every alert's runbook_url is <base>#<alert name in lower case>, its section of
docs/runbooks.md. The base defaults to RUNBOOK_BASE, the repository's docs; to point
the alerts at your own copy of the runbooks (a wiki, a fork), write the alert rules
with your base (the Helm chart's value prometheusRule.runbookBaseURL does the same):

    gen_budget_rules.py --alerts rules/alerts.rules.yml --runbook-base URL -o OUT
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from wattprint.config import yamlfile

NAMESPACE_SERIES = "namespace:wattprint_emissions_budget_grams:30d"
WORKLOAD_SERIES = "namespace_workload:wattprint_emissions_budget_grams:30d"
GROUP_NAME = "wattprint-budgets"
PERIOD = "30d"

# rules/alerts.rules.yml and the chart's prometheusRule.runbookBaseURL default to it.
RUNBOOK_BASE = "https://github.com/wattprint/wattprint/blob/main/docs/runbooks.md"
_RUNBOOK_LINE = re.compile(r"^(\s*runbook_url:\s*)(\S*?)(#\S+)\s*$")
_BASE = re.compile(r"^https?://[^\s#]+$")

_UNITS = {"": 1.0, "g": 1.0, "kg": 1e3, "t": 1e6}
_AMOUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_FIELDS = {"namespace", "workload", "grams", "budget", "period"}


class BudgetError(ValueError):
    """The budget data is invalid; the message names the entry and the bad value."""


def parse_grams(value: object, where: str) -> float:
    """Grams from a number (grams) or a string such as "50kg", "1.5 t" or "2000"."""
    grams: float | None = None
    # bool is an int to Python, and YAML reads yes/no as booleans: never a budget.
    if isinstance(value, int | float) and not isinstance(value, bool):
        grams = float(value)
    elif isinstance(value, str):
        match = _AMOUNT.match(value)
        if match and match.group(2).lower() in _UNITS:
            grams = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if grams is None:
        raise BudgetError(f"{where}: {value!r} is not an amount in g, kg or t (e.g. 50kg)")
    if not math.isfinite(grams) or grams <= 0:
        raise BudgetError(f"{where}: budget must be positive, got {value!r}")
    return grams


def _promql_number(grams: float) -> str:
    # repr() round-trips exactly; PromQL reads both 500000 and 1e+16.
    text = repr(grams)
    return text[:-2] if text.endswith(".0") else text


def _label(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BudgetError(f"{where}: {key} must be a string, got {value!r}")
    return value


def _rule(entry: object, where: str) -> tuple[tuple[str, str, str], dict[str, Any]]:
    """The identity of one budget (to find duplicates) and its recording rule."""
    if not isinstance(entry, Mapping):
        raise BudgetError(f"{where}: must be a mapping, got {entry!r}")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise BudgetError(f"{where}: unknown field {unknown[0]!r} (allowed: {sorted(_FIELDS)})")
    namespace = _label(entry, "namespace", where)
    workload = _label(entry, "workload", where)
    if not namespace and not workload:
        raise BudgetError(f"{where}: needs a namespace, a workload or both")
    if ("grams" in entry) == ("budget" in entry):
        raise BudgetError(f"{where}: give exactly one of grams and budget")
    amount = entry["grams"] if "grams" in entry else entry["budget"]
    grams = parse_grams(amount, where)
    if "period" in entry and entry["period"] != PERIOD:
        raise BudgetError(
            f"{where}: period {entry['period']!r} is not supported; budgets are per {PERIOD}"
        )

    expr = f"vector({_promql_number(grams)})"
    if not workload:
        return ("namespace", namespace, ""), {
            "record": NAMESPACE_SERIES,
            "expr": expr,
            "labels": {"namespace": namespace},
        }
    # An empty namespace is left out, as it is on the exporter's series.
    labels = {"namespace": namespace, "workload": workload} if namespace else {"workload": workload}
    return ("workload", namespace, workload), {
        "record": WORKLOAD_SERIES,
        "expr": expr,
        "labels": labels,
    }


def budget_rules(budgets: Sequence[object]) -> list[dict[str, Any]]:
    """One recording rule per budget, in the order given."""
    if not isinstance(budgets, Sequence) or isinstance(budgets, str):
        raise BudgetError(f"budgets must be a list, got {budgets!r}")
    rules: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    for i, entry in enumerate(budgets):
        key, rule = _rule(entry, f"budgets[{i}]")
        if key in seen:
            kind, namespace, workload = key
            name = workload if kind == "workload" else namespace
            raise BudgetError(f"budgets[{i}]: {kind} {name!r} has a budget already")
        seen.add(key)
        rules.append(rule)
    return rules


def rules_document(budgets: Sequence[object]) -> dict[str, Any]:
    """A complete Prometheus rules file (as data) holding the budget group."""
    return {"groups": [{"name": GROUP_NAME, "rules": budget_rules(budgets)}]}


def render(budgets: Sequence[object], source: str = "budget data") -> str:
    header = (
        f"# Generated by tools/gen_budget_rules.py from {source}.\n"
        "# Do not edit: change the budget data and generate again.\n"
    )
    return header + yaml.safe_dump(rules_document(budgets), sort_keys=False, allow_unicode=True)


def rebase_runbooks(text: str, base: str) -> str:
    """Alert rules (YAML text) with every runbook_url on `base`, each keeping its
    anchor; every other line, comments included, is left as it was."""
    if not _BASE.match(base):
        raise BudgetError(f"runbook base {base!r} is not an http(s) URL without a #fragment")
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("runbook_url:"):
            match = _RUNBOOK_LINE.match(line)
            if match is None:
                raise BudgetError(f"line {number}: runbook_url has no #anchor: {line.strip()}")
            lines[number - 1] = f"{match.group(1)}{base}{match.group(3)}\n"
    return "".join(lines)


def load(text: str | bytes) -> list[object]:
    """The budget list of a YAML document with a top-level `budgets:` key, read as
    strictly as the exporter's config (a key given twice is refused, not won by the last);
    YamlFileError (one line) if it is not such YAML."""
    data = yamlfile.parse(text.encode("utf-8") if isinstance(text, str) else text)
    if data is None:
        return []
    if not isinstance(data, Mapping) or set(data) - {"budgets"}:
        raise BudgetError("budget data must be a mapping with the single key budgets")
    budgets = data.get("budgets") or []
    if not isinstance(budgets, list):
        raise BudgetError(f"budgets must be a list, got {budgets!r}")
    return budgets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("budgets", nargs="?", help="budget data (YAML); - reads standard input")
    parser.add_argument("-o", "--output", help="rules file to write (default: standard output)")
    parser.add_argument(
        "--alerts", metavar="FILE", help="write these alert rules with --runbook-base instead"
    )
    parser.add_argument(
        "--runbook-base",
        metavar="URL",
        help=f"where the runbooks are, without the #anchor (default: {RUNBOOK_BASE})",
    )
    args = parser.parse_args(argv)
    if (args.budgets is None) == (args.alerts is None):
        parser.error("give either budget data or --alerts FILE")
    if args.runbook_base is not None and args.alerts is None:
        parser.error("--runbook-base goes with --alerts")
    try:
        if args.alerts is not None:
            text = Path(args.alerts).read_text(encoding="utf-8")
            output = rebase_runbooks(text, args.runbook_base or RUNBOOK_BASE)
        elif args.budgets == "-":
            output = render(load(sys.stdin.buffer.read()), "standard input")
        else:
            output = render(load(Path(args.budgets).read_bytes()), args.budgets)
    except yamlfile.YamlFileError as err:
        source = "standard input" if args.budgets == "-" else args.budgets
        print(f"gen_budget_rules: {source} {err}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError, BudgetError) as err:
        print(f"gen_budget_rules: {err}", file=sys.stderr)
        return 2
    if args.output:
        Path(args.output).write_text(output, encoding="utf-8")
    else:
        sys.stdout.write(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
