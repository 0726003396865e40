"""A tracker beside an exporter whose state file cannot be written: the exporter then
serves scrapers the counters of its last save, held still (sampler/loop.py), and only a
fresh reading (/metrics?fresh) the sample as taken. A held counter is below what the
tracker read at its start: it is no restart, and the job's energy is neither invented
(the whole counter added) nor lost without a word."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SERIES = 'component="gpu",gpu="0",scheduler="env",namespace="",workload="w",pod=""'


@dataclass
class Held:
    """What a fake exporter serves: `live` to a fresh reading it could take, `held` (the
    last save) to every other read; `started`: its process's start time."""

    live: float = 100.0
    held: float | None = 90.0  # None: the last save predates the series
    fresh_ok: bool = True
    started: float = 1000.0
    down: bool = False  # answers HTTP 503
    rate: float = 0.0  # W: `live` rises so
    born: float = field(default_factory=time.time)  # also when the held counters were saved

    def body(self, fresh: bool) -> bytes:
        now = time.time()
        value = self.live + self.rate * (now - self.born) if fresh else self.held
        series = (
            "" if value is None else f"wattprint_workload_energy_joules_total{{{SERIES}}} {value}\n"
        )
        return (
            "# TYPE wattprint_workload_energy_joules counter\n"
            f"{series}"
            "# TYPE wattprint_sampler_last_success_timestamp_seconds gauge\n"
            f"wattprint_sampler_last_success_timestamp_seconds {now if fresh else self.born}\n"
            "# TYPE wattprint_sampler_interval_seconds gauge\n"
            "wattprint_sampler_interval_seconds 0.5\n"
            "# TYPE process_start_time_seconds gauge\n"
            f"process_start_time_seconds {self.started}\n"
        ).encode()


@pytest.fixture
def exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Held, str]]:
    state = Held()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server calls it by this name
            if state.down:
                self.send_error(503)
                return
            fresh = self.path.endswith("?fresh") and state.fresh_ok
            body = state.body(fresh)
            self.send_response(200)
            if fresh:
                self.send_header("X-Wattprint-Fresh", "1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def _tracker(tmp_path: Path, url: str):  # type: ignore[no-untyped-def]
    import wattprint

    return wattprint.track(
        "w",
        output_dir=str(tmp_path / "out"),
        exporter_url=url,
        state_file=str(tmp_path / "state" / "state.json"),
    )


def test_a_held_counter_at_stop_is_no_restart(tmp_path: Path, exporter: tuple[Held, str]) -> None:
    state, url = exporter
    tracker = _tracker(tmp_path, url)
    assert tracker.start()  # fresh: 100 J
    state.live = 150.0
    assert tracker.flush() is not None  # fresh: 50 J so far
    # The exporter's fresh sample now fails (its state still unsaved): stop() gets the
    # held counters, 90 J, below the 100 J of the start.
    state.fresh_ok = False
    job = tracker.stop()
    assert job is not None
    # Not "restarted", not 90 J from nowhere: the 50 J known, and said to be short.
    assert job.energy_j == pytest.approx(50.0)
    assert not any("restarted" in n for n in job.notes), job.notes
    assert any("held" in n for n in job.notes), job.notes
    document = tracker.files[0]
    assert '"final": false' in Path(document).read_text()


def test_a_held_counter_read_between_calls_is_never_the_rows_end(
    tmp_path: Path, exporter: tuple[Held, str]
) -> None:
    state, url = exporter
    tracker = _tracker(tmp_path, url)
    assert tracker.start()
    state.live = 150.0
    tracker.flush()
    time.sleep(1.5)  # the tracker's thread reads the held 90 J meanwhile
    state.down = True  # and it does not answer stop(): its last reading is used
    job = tracker.stop()
    assert job is not None
    assert job.energy_j == pytest.approx(50.0)
    assert not any("restarted" in n for n in job.notes), job.notes


def test_a_restarted_exporter_is_still_a_restart(
    tmp_path: Path, exporter: tuple[Held, str]
) -> None:
    # A new process (a new start time) counting from 0: what it counted since is the
    # job's, and the note says the counter restarted.
    state, url = exporter
    tracker = _tracker(tmp_path, url)
    assert tracker.start()
    state.live, state.held, state.started = 30.0, 30.0, 2000.0
    job = tracker.stop()
    assert job is not None
    assert job.energy_j == pytest.approx(30.0)
    assert any("restarted" in n for n in job.notes), job.notes


def test_a_job_report_tells_a_held_counter_from_a_restart() -> None:
    from wattprint.jobs.meter import Reading, job_report

    key = ("gpu", "0", "env", "", "w", "")
    start = Reading(time=1.0, series={key: (100.0, 10.0)}, started=1000.0)
    held = Reading(time=2.0, series={key: (90.0, 9.0)}, started=1000.0)
    job = job_report(start, held, "w")
    assert job.energy_j == 0 and job.emissions_g == 0
    assert any("held" in n for n in job.notes) and not any("restarted" in n for n in job.notes)
    restarted = Reading(time=2.0, series={key: (30.0, 3.0)}, started=2000.0)
    job = job_report(start, restarted, "w")
    assert job.energy_j == pytest.approx(30.0)
    assert any("restarted" in n for n in job.notes)


def test_run_reads_the_live_counters_of_an_exporter_that_holds_them(
    tmp_path: Path, exporter: tuple[Held, str]
) -> None:
    # `wattprint run --exporter.url` beside an exporter whose counters served to scrapers
    # stand still at a save long past: its fresh readings are the job's (before: it
    # waited for a sample after the command's end that never came, and wrote no report).
    import wattprint

    state, url = exporter
    state.rate = 10.0
    out = tmp_path / "out"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "wattprint", "run", f"--exporter.url={url}"),
            *("--workload=w", f"--output.dir={out}", "--", "sleep", "1"),
        ],
        env=dict(os.environ, PYTHONPATH=str(Path(wattprint.__file__).parents[1])),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    [path] = out.glob("wattprint-w-*.json")
    document = json.loads(path.read_text())
    assert 9 < document["raw"]["components"]["gpu"]["energy_j"] < 30, result.stderr
    assert not any("restarted" in n or "held" in n for n in document["job"]["notes"])


def test_the_slurm_epilogs_read_after_the_job_is_the_live_sample(
    exporter: tuple[Held, str],
) -> None:
    # The epilog waits for a sample taken after the job ended: beside an exporter whose
    # scraped counters stand at a save long past, that is the live one (before: it
    # waited its whole patience and wrote nothing).
    from wattprint.jobs.meter import ExporterReader

    state, url = exporter
    ended = time.time()
    reading = ExporterReader(url).read_after(ended, 0.5, patience=2.0)
    assert reading.time > ended
    assert sum(v for v, _ in reading.series.values()) >= state.live


def _metrics(value: float, started: float, resumed: int, fresh: int) -> str:
    return (
        "# TYPE wattprint_workload_energy_joules counter\n"
        f"wattprint_workload_energy_joules_total{{{SERIES}}} {value}\n"
        "# TYPE wattprint_sampler_last_success_timestamp_seconds gauge\n"
        f"wattprint_sampler_last_success_timestamp_seconds {started + 10}\n"
        "# TYPE process_start_time_seconds gauge\n"
        f"process_start_time_seconds {started}\n"
        "# HELP wattprint_restarts_total Starts after an earlier run.\n"
        "# TYPE wattprint_restarts_total counter\n"
        f'wattprint_restarts_total{{outcome="fresh"}} {fresh}\n'
        f'wattprint_restarts_total{{outcome="resumed"}} {resumed}\n'
    )


def test_a_restart_resumed_below_an_unsaved_fresh_reading_invents_nothing() -> None:
    # The start reading was a fresh sample (/metrics?fresh: served, not saved). The
    # exporter is then killed and resumes from its state file, saved an interval before:
    # the workload's counter goes on from 95 J, below the 100 J read. That is no counter
    # from 0: counting the whole 95 J would add the workload's energy of before the job.
    from wattprint.jobs.meter import job_report
    from wattprint.jobs.reading import reading_from_text

    start = reading_from_text(_metrics(100.0, 1000.0, resumed=3, fresh=0))
    resumed = reading_from_text(_metrics(97.0, 2000.0, resumed=4, fresh=0))
    job = job_report(start, resumed, "w")
    assert job.energy_j == 0, job.notes
    assert not any("restarted during" in n for n in job.notes), job.notes
    assert any("state file" in n for n in job.notes), job.notes
    # Once above the start reading again, its rise is the job's.
    later = reading_from_text(_metrics(130.0, 2000.0, resumed=4, fresh=0))
    assert job_report(start, later, "w").energy_j == pytest.approx(30.0)
    # A restart from 0 (its state missing: a "fresh" start) is still a restart.
    zeroed = reading_from_text(_metrics(20.0, 2000.0, resumed=3, fresh=1))
    job = job_report(start, zeroed, "w")
    assert job.energy_j == pytest.approx(20.0)
    assert any("restarted" in n for n in job.notes), job.notes


def test_the_trackers_thread_never_makes_a_fresh_reading_look_stale(
    tmp_path: Path, exporter: tuple[Held, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # flush() reads a fresh sample while the tracker's thread reads the plain /metrics:
    # the thread's answer (not fresh) must not be taken for flush()'s, which would say,
    # in every row from then on, that the exporter takes no sample on request.
    from wattprint.jobs import meter

    _, url = exporter
    tracker = _tracker(tmp_path, url)
    assert tracker.start()
    parse, threads_read = meter.reading_from_text, threading.Event()

    def reading_from_text(text: str) -> meter.Reading:
        if threading.current_thread().name == "wattprint-tracker":
            threads_read.set()  # its answer is in, and said whether it was fresh
        elif threading.current_thread() is threading.main_thread():
            threads_read.clear()
            assert threads_read.wait(10)  # the thread reads while flush() parses
        return parse(text)

    monkeypatch.setattr(meter, "reading_from_text", reading_from_text)
    job = tracker.flush()
    monkeypatch.setattr(meter, "reading_from_text", parse)
    tracker.stop()
    assert job is not None
    assert not any("no sample on request" in n for n in job.notes), job.notes


def test_a_save_older_than_the_fresh_readings_is_never_the_rows_end(
    tmp_path: Path, exporter: tuple[Held, str]
) -> None:
    # The tracker's series first appear in the fresh sample of its start(); the last
    # saved sample, which its thread reads between calls, is older and has none of them.
    # It is no newer reading: stop() without an answer keeps flush()'s 50 J, not 0.
    state, url = exporter
    state.held = None
    tracker = _tracker(tmp_path, url)
    assert tracker.start()
    state.live = 150.0
    first = tracker.flush()
    assert first is not None and first.energy_j == pytest.approx(50.0)
    time.sleep(1.5)  # the tracker's thread reads the old save meanwhile
    state.down = True
    job = tracker.stop()
    assert job is not None
    assert job.energy_j == pytest.approx(50.0)
