"""The suite on a machine whose own exporter runs (the README's quick start, as root):
that exporter holds the node lock in /var/lib/wattprint, and the tests' exporters, runs
and trackers still start, take none of it, and leave it held.

The machine's exporter runs in a private mount namespace with a tmpfs over /var/lib, so
that the test holds the default lock path without touching the machine's own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import private_namespace

REPO = Path(__file__).resolve().parents[1]

# Tests that start exporters, `wattprint run` and trackers as child processes, some with
# none of the test run's WATTPRINT_* settings.
INNER_TESTS = [
    "tests/test_web_security.py::test_exporter_process_protected_end_to_end",
    "tests/test_node_lock.py",
    "tests/test_startup.py",
    "tests/test_run.py::test_sigterm_reaches_the_command_and_a_report_is_written",
    "tests/test_run.py::test_trackers_without_run_start_one_sampler",
]

INNER = textwrap.dedent("""
    import os, subprocess, sys, time
    from wattprint.durability.nodelock import lock_holder

    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/var/lib"], check=True)
    lock = "/var/lib/wattprint/state.json.lock"
    env = {k: v for k, v in os.environ.items() if k != "WATTPRINT_STATE_FILE"}
    exporter = subprocess.Popen(
        [sys.executable, "-m", "wattprint", "--web.listen-address=127.0.0.1:0",
         "--gpu.source=none", "--cpu.source=none", "--memory.source=none",
         "--carbon.zone=DE"],
        env=env, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 30
    while lock_holder(lock) is None:
        if exporter.poll() is not None or time.monotonic() > deadline:
            sys.exit("the machine's exporter did not take the lock: " + exporter.stderr.read())
        time.sleep(0.05)
    holder = lock_holder(lock)
    print("machine exporter holds", lock, holder, flush=True)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-rfEs",
                            "-p", "no:cacheprovider", *sys.argv[1:]])
    after = lock_holder(lock)
    exporter.terminate()
    exporter.wait(timeout=10)
    if after != holder:
        sys.exit(f"the lock changed hands during the tests: {holder} -> {after}")
    sys.exit(tests.returncode)
""")


@pytest.mark.slow
def test_the_suite_passes_beside_the_machines_exporter_and_leaves_its_lock() -> None:
    command = [*private_namespace("mount"), sys.executable, "-c", INNER, *INNER_TESTS]
    env = dict(os.environ, PYTHONPATH=str(REPO / "exporter"))
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert "machine exporter holds /var/lib/wattprint/state.json.lock" in output, output
    assert result.returncode == 0, output
    # Every one ran (none skipped for a tool or a namespace it lacks, none deselected)
    # and passed: the summary names nothing but passes.
    assert re.search(r"^[1-9]\d* passed in ", result.stdout, re.M), output
