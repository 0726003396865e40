"""The job tools read an exporter within an overall deadline (issue 43): a /metrics that
trickles one byte every 2 s must not hold a job's start."""

from __future__ import annotations

import threading
import time

from wattprint.jobs.meter import ExporterReader, MeterError

from .jobnode import JobNode, Trickle, job_node, one_line

__all__ = ["job_node"]


def test_a_trickling_exporter_is_cut_off_at_the_deadline() -> None:
    server = Trickle()
    errors: list[str] = []

    def read() -> None:
        try:
            ExporterReader(server.url, timeout=3.0).read()
        except MeterError as err:
            errors.append(str(err))

    reader = threading.Thread(target=read, daemon=True)
    try:
        began = time.monotonic()
        reader.start()
        reader.join(20)
        took = time.monotonic() - began
    finally:
        server.close()
    assert took < 6, took
    want = f"cannot read the exporter at {server.url}: did not answer in full within 3 s"
    assert errors == [want]


def test_run_with_a_trickling_exporter_runs_the_command_without_a_report(
    job_node: JobNode,
) -> None:
    server = Trickle()
    marker = job_node.tmp / "ran"
    try:
        began = time.monotonic()
        result = job_node.run(
            f"--exporter.url={server.url}", command=("touch", str(marker)), timeout=40
        )
        took = time.monotonic() - began
    finally:
        server.close()
    # The job is not held: the 5 s deadline, the command's run, no report.
    assert took < 15, took
    assert result.returncode == 0 and marker.exists()
    line = one_line(result.stderr, "wattprint run:")
    assert "did not answer in full within 5 s" in line
    assert line.endswith("running the command with no report")
    assert not job_node.out.exists()
