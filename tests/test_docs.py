"""What the README shows is what the code does: the `doctor` example is real output, the
accuracy figures are docs/accuracy.md's, and nothing refers to files outside the
repository (a clone must stand alone)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fake_nvml import FakeNvml
from procfs_fixture import FakeProc
from wattprint.cli import main as cli
from wattprint.sources import nvml

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
# Masked on both sides: how old the embedded yearly value is grows every day.
AGE = re.compile(r"\(\w+ old, ")


def test_readme_doctor_example_is_real_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The machine the README describes: two H200s (the recorded trace's GPU, through
    the fake NVML), AMD RAPL with package zones and no DRAM zone, 512 GiB of memory."""
    block = re.search(r"```text\n(\$ \.venv/bin/wattprint doctor .*?)\n```", README, re.S)
    assert block, "README: the doctor example is gone"
    command, _, shown = block.group(1).partition("\n")
    args = command.split()[2:]
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    shutil.copytree(REPO / "tests" / "fixtures" / "sys" / "amd-2pkg", sysfs)
    FakeProc(procfs, mem_total_kb=512 * 1024 * 1024)
    monkeypatch.setattr(nvml, "_load_pynvml", lambda: FakeNvml.from_trace(copies=2))
    for name in [n for n in os.environ if n.startswith("WATTPRINT_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("NODE_NAME", raising=False)

    assert cli.main([*args, f"--path.sysfs={sysfs}", f"--path.procfs={procfs}"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    out = out.replace(str(sysfs), "/sys").replace(str(procfs), "/proc")
    assert AGE.sub("(AGE old, ", out) == AGE.sub("(AGE old, ", shown)


def accuracy_row(method: str, interval: str) -> list[tuple[float, float]]:
    """The (min, max) ranges in one row of docs/accuracy.md's tables."""
    text = (REPO / "docs" / "accuracy.md").read_text()
    row = re.search(rf"^\| {re.escape(method)} \| {re.escape(interval)} \|(.*)$", text, re.M)
    assert row, (method, interval)
    ranges = re.findall(r"([-+]\d+\.\d+) \.\. ([-+]\d+\.\d+) %", row.group(1))
    return [(float(low), float(high)) for low, high in ranges]


def rounded(span: tuple[float, float]) -> str:
    return f"{span[0]:+.0f} .. {span[1]:+.0f} %"


def test_readme_and_rules_doc_quote_docs_accuracy() -> None:
    readme = " ".join(README.split())
    gauge = "GPU watts gauge, avg_over_time x window"
    job15, windows15, _ = accuracy_row(gauge, "15 s, 10 phases")
    job30, windows30, _ = accuracy_row(gauge, "30 s, 10 phases")
    _, windows1, _ = accuracy_row(gauge, "1 s, 10 phases")
    assert (
        f"off by {rounded(job15)} for the job at 15 s ({rounded(windows15)} over 1-minute "
        f"windows), and {rounded(job30)} ({rounded(windows30)}) at 30 s"
    ) in readme
    assert f"at a 15 s scrape, {rounded(windows15)} over 1-minute windows" in readme
    rules = (REPO / "docs" / "rules.md").read_text()
    cells = [f"{low:+.2f} .. {high:+.2f} %" for low, high in (windows1, windows15, windows30)]
    assert f"| {cells[0]} | **{cells[1]}** | {cells[2]} |" in rules
    accuracy = (REPO / "docs" / "accuracy.md").read_text()
    over = re.search(
        r"^\| codecarbon, one tracker per process, .*? \| ([-+]\d+\.\d+) % \|", accuracy, re.M
    )
    assert over, "docs/accuracy.md: the codecarbon row is gone"
    times = f"{1 + float(over.group(1)) / 100:.1f}"
    assert f"counts the GPU {times} times" in readme
    assert f"reported {times}x the GPU's own energy counter" in readme


def test_nothing_refers_to_files_beside_the_repository() -> None:
    outside = ".." + "/shared"  # spelled apart so this file does not match itself
    found = subprocess.run(
        ["git", "grep", "-n", "-I", "-F", "--untracked", "-e", outside, "-e", "/work/" + "shared"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if found.returncode == 128:
        pytest.fail(f"git grep failed: {found.stderr}")
    assert found.stdout == "", found.stdout


# A path as the docs name it: a Markdown link's target or a `code` span that looks like
# a file or folder of the repository (has a slash or a known ending).
_PATH = re.compile(r"\]\(([^)#\s]+)|`([\w./-]+/[\w./-]*|[\w-]+\.(?:py|md|yml|yaml|json|toml))`")


@pytest.mark.parametrize("page", ["docs/architecture.md", "docs/performance.md"])
def test_the_design_docs_name_only_paths_that_exist(page: str) -> None:
    # Paths there are relative to the page, to the repository or, for modules, to the
    # package (architecture.md says so); a renamed module must not leave a dead name.
    text = (REPO / page).read_text()
    bases = [(REPO / page).parent, REPO, REPO / "exporter" / "wattprint"]
    missing = []
    for link, code in _PATH.findall(text):
        name = link or code
        if "://" in name or name.startswith("--"):
            continue
        if not any((base / name).exists() for base in bases):
            missing.append(name)
    assert not missing, f"{page} names paths that do not exist: {missing}"
