#!/usr/bin/env python3
"""Turn functional units (data) into the recording rules of carbon per unit of work.

A functional unit is a counter the job already exports and how its labels map to
Wattprint's workload labels (rules/sci-units.example.yaml):

    units:
      - name: tokens
        metric: vllm:generation_tokens_total
        labels: {namespace: namespace, workload: app}

For each unit and each window of the energy rules (5m rate, 1h increase) the output
records, per namespace and workload:

    namespace_workload:wattprint_functional_units_<name>:{rate5m,increase1h}
    namespace_workload:wattprint_sci_grams_per_<name>:ratio_{rate5m,increase1h}
    namespace_workload:wattprint_joules_per_<name>:ratio_{rate5m,increase1h}

grams are operational (Scope 2) plus embodied (Scope 3): the SCI of ISO/IEC 21031,
(E x I + M) / R. `wattprint report --per=<name> --units FILE` prints the same per job.

Usage: gen_sci_rules.py UNITS.yaml [-o OUT.rules.yml]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from wattprint.report.sci import UnitError, load_units, render


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("units", help="functional-unit data (YAML)")
    parser.add_argument("-o", "--output", help="rules file to write (default: standard output)")
    args = parser.parse_args(argv)
    try:
        text = render(load_units(args.units))
    except UnitError as exc:
        print(f"gen_sci_rules: {exc}", file=sys.stderr)
        return 2  # bad input, as gen_budget_rules.py and wattprint say it
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
