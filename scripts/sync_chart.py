#!/usr/bin/env python3
"""Copy rules/ and dashboards/ into the Helm chart.

Helm templates can only read files inside the chart, so the chart carries copies
of the single sources under helm/wattprint/files/. Run this after changing a rule
or a dashboard; `--check` exits 1 and names every copy that differs (for CI).

    python scripts/sync_chart.py          # write the copies
    python scripts/sync_chart.py --check  # compare only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART_FILES = Path("helm/wattprint/files")

# source directory (relative to the repository) -> file patterns -> folder under files/
SOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rules", ("*.yml", "*.yaml")),
    ("dashboards", ("*.json",)),
)


def _is_rule_file(path: Path) -> bool:
    """Only Prometheus rule files (top-level `groups:`) belong in the PrometheusRule;
    promtool tests and budget data may sit beside them."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return True  # copied as is, so that the chart's render names the broken file
    return isinstance(doc, dict) and "groups" in doc


def planned(repo: Path) -> dict[Path, Path]:
    """Map each copy (relative to the chart's files/ folder) to its source."""
    plan: dict[Path, Path] = {}
    for folder, patterns in SOURCES:
        for pattern in patterns:
            for src in sorted((repo / folder).glob(pattern)):
                if src.is_file() and (folder != "rules" or _is_rule_file(src)):
                    plan[Path(folder) / src.name] = src
    return plan


def _existing(files_dir: Path) -> set[Path]:
    found: set[Path] = set()
    for folder, _ in SOURCES:
        base = files_dir / folder
        if base.is_dir():
            found.update(p.relative_to(files_dir) for p in base.iterdir() if p.is_file())
    return found


def differences(repo: Path, files_dir: Path) -> list[str]:
    """What a sync would change in files_dir, one line per copy; empty when in sync."""
    plan = planned(repo)
    problems = []
    for rel, src in sorted(plan.items()):
        dst = files_dir / rel
        if not dst.is_file():
            problems.append(f"missing: {dst}")
        elif dst.read_bytes() != src.read_bytes():
            problems.append(f"differs from {src.relative_to(repo)}: {dst}")
    problems.extend(
        f"no source any more: {files_dir / rel}"
        for rel in sorted(_existing(files_dir) - plan.keys())
    )
    return problems


def sync(repo: Path, files_dir: Path) -> list[Path]:
    """Make files_dir hold exactly the planned copies; return the paths written or removed."""
    plan = planned(repo)
    changed: list[Path] = []
    for rel, src in plan.items():
        dst = files_dir / rel
        data = src.read_bytes()
        if not dst.is_file() or dst.read_bytes() != data:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
            changed.append(dst)
    # A rule or dashboard deleted at the source must leave the chart too.
    for rel in _existing(files_dir) - plan.keys():
        (files_dir / rel).unlink()
        changed.append(files_dir / rel)
    return changed


def main(argv: list[str] | None = None, repo: Path = REPO) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report copies that differ")
    args = parser.parse_args(argv)
    files_dir = repo / CHART_FILES
    if args.check:
        problems = differences(repo, files_dir)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run: python scripts/sync_chart.py", file=sys.stderr)
        return 1 if problems else 0
    for path in sync(repo, files_dir):
        print(f"updated {path.relative_to(repo)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
