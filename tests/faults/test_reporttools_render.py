"""`wattprint report`'s table shows names that others chose (a workload's label, which
any user sets with WATTPRINT_WORKLOAD): an escape code in one is shown as text, never
sent to the terminal of whoever reads the report."""

from __future__ import annotations

from wattprint.report.jobs import JobReport
from wattprint.report.queries import make_window
from wattprint.report.render import Units, render_table


def test_a_workload_named_with_escape_codes_is_printed_as_text() -> None:
    evil = "train\x1b]0;owned\x07\x1b[2J"
    job = JobReport("slurm", "", evil, start=100.0, end=160.0)
    job.components["gpu"].energy_j = 3600.0
    job.notes = [f"a note about {evil}"]
    table = render_table([job], make_window(100.0, 160.0, whole_life=True), "", Units.suited([job]))
    assert "\x1b" not in table and "\x07" not in table
    assert "train\\x1b]0;owned\\x07\\x1b[2J" in table
