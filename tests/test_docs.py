"""What the README shows is what the code does: the `doctor` example is real output, the
accuracy figures are docs/accuracy.md's, and nothing refers to files outside the
repository (a clone must stand alone)."""

from __future__ import annotations

import json
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


def readme_section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end >= 0 else None]


def sh_blocks(text: str) -> list[list[str]]:
    return [block.strip().splitlines() for block in re.findall(r"```sh\n(.*?)```", text, re.S)]


# Runs the quick start as root in a mount and network namespace of its own: a tmpfs over
# /var/lib for the node lock it takes, and its own localhost:9950.
QUICK_START = """
import json, os, shlex, signal, subprocess, sys, time, urllib.request
from wattprint.durability.nodelock import lock_holder

subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/var/lib"], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
(start,), *others = json.loads(sys.argv[1])
env = json.loads(sys.argv[2])
# No shell: scripts/run execs the exporter, whose exit status is then what Ctrl-C gives.
exporter = subprocess.Popen(shlex.split(start), env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
deadline = time.monotonic() + 60
while True:
    try:
        if urllib.request.urlopen("http://localhost:9950/healthz", timeout=2).status == 200:
            break
    except OSError:
        pass
    if exporter.poll() is not None or time.monotonic() > deadline:
        exporter.kill()
        sys.exit("the exporter did not start: " + exporter.communicate()[1])
    time.sleep(0.1)
ran = []
for line in [line for block in others for line in block]:
    done = subprocess.run(line, shell=True, env=env, capture_output=True, text=True, timeout=120)
    ran.append({"line": line, "returncode": done.returncode, "stdout": done.stdout,
                "stderr": done.stderr})
holder = lock_holder("/var/lib/wattprint/state.json.lock")
os.killpg(exporter.pid, signal.SIGINT)  # Ctrl-C in its terminal
_, err = exporter.communicate(timeout=20)
print(json.dumps({"ran": ran, "holder": holder, "exporter_pid": exporter.pid,
                  "exit": exporter.returncode, "stderr": err}))
"""


@pytest.mark.slow
def test_the_quick_start_does_what_it_says(tmp_path: Path) -> None:
    """The quick start's commands as written, on a copy of the checkout: the first
    installs and runs the exporter (as root it holds the node lock in /var/lib/wattprint);
    the second terminal's lines read its /metrics and run doctor from .venv."""
    from conftest import private_namespace
    from test_scripts import checkout_copy

    for tool, package in (("curl", "curl"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            message = (
                f"{tool} is not installed (Debian package {package}; ./scripts/test installs it)"
            )
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message)
            pytest.skip(message)
    blocks = sh_blocks(readme_section("Quick start"))
    assert [b[0] for b in blocks[:1]] == ["./scripts/run --carbon.zone=DE"], blocks
    assert "./scripts/test" not in str(blocks), "a contributor step in the user's quick start"
    copy = checkout_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WATTPRINT_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    # The first start installs (pip may need the network, which the namespace has not).
    install = subprocess.run(
        ["./scripts/run", "--version"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    inner = [str(copy / ".venv" / "bin" / "python"), "-c", QUICK_START]
    result = subprocess.run(
        [*private_namespace("mount", "net"), *inner, json.dumps(blocks), json.dumps(env)],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    done = json.loads(result.stdout.strip().splitlines()[-1])
    for step in done["ran"]:
        assert step["returncode"] == 0, step
        assert "Traceback" not in step["stderr"], step
    curl, doctor = done["ran"][0], done["ran"][-1]
    assert curl["line"].startswith("curl ") and "wattprint_measurement_info{" in curl["stdout"]
    assert doctor["line"].startswith(".venv/bin/wattprint doctor")
    assert doctor["stdout"].startswith("Wattprint doctor\n"), doctor
    # Run as root, the exporter held the node's lock in /var/lib/wattprint.
    assert done["holder"] and done["holder"]["listen_address"] == ":9950", done
    assert done["exit"] == 0, done["stderr"]


def test_the_readme_names_every_package_the_tests_install() -> None:
    script = (REPO / "scripts" / "test").read_text()
    packages = set(re.findall(r"packages\+=\(([\w.+-]+)\)", script))
    assert {"prometheus", "victoria-metrics", "buildah", "python3-venv"} <= packages
    section = readme_section("Contributing: tests")
    missing = [p for p in sorted(packages) if f"`{p}`" not in section]
    assert not missing, f"README's test section does not name {missing}"


def test_the_readme_stays_short() -> None:
    assert len(README.splitlines()) <= 300, "README.md: at most 300 lines; the rest in docs/"


def expand(pattern: str) -> list[str]:
    """A shell-style brace pattern: `a_{b,c}_d` -> a_b_d, a_c_d (nested in sequence)."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [name for alt in match.group(1).split(",") for name in expand(head + alt + tail)]


def test_the_readme_lists_every_metric_family_the_exporter_serves(tmp_path: Path) -> None:
    """The fixture node's exposition, plus those served only with an embodied figure or
    a forecasting provider (docs/metrics.md's second table)."""
    from prometheus_client.parser import text_string_to_metric_families

    from test_exposition import fixture_node

    _, collector = fixture_node(tmp_path)
    served = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(collector.render().decode())
    }
    contract = (REPO / "docs" / "metrics.md").read_text()
    conditional = set(
        re.findall(r"^\| `(wattprint_\w+)` \| \w+ \| [^|]* \| [^|]+ \|$", contract, re.M)
    )
    assert len(conditional) >= 5, "docs/metrics.md: the table of conditional metrics is gone"
    section = readme_section("Metrics")
    # The process_* metrics every client library serves are named as a group.
    assert "`process_*`" in section and any(n.startswith("process_") for n in served)
    served = {n for n in served if not n.startswith("process_")}
    listed = {n for code in re.findall(r"`(wattprint_[\w{},]+)`", section) for n in expand(code)}
    assert listed == served | conditional, (
        f"not in the README: {sorted(served | conditional - listed)}; "
        f"not served: {sorted(listed - served - conditional)}"
    )


def test_the_documented_vmalert_setup_is_the_tested_one() -> None:
    """docs/scale.md's vmalert command carries the lookback the e2e harness runs with."""
    from prom_harness import VMALERT_LOOKBACK

    scale = (REPO / "docs" / "scale.md").read_text()
    block = re.search(r"^vmalert .*?(?=^\S)", scale, re.M | re.S)
    assert block, "docs/scale.md: the tested vmalert command is gone"
    assert f"-datasource.lookback={VMALERT_LOOKBACK}" in block.group(0)
