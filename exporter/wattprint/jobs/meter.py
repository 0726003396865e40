"""One job's energy from two readings of the node's counters, for `wattprint run` and
`wattprint.track()`, and the files they write.

A reading is what a Wattprint sampler's counters stand at: either our own sampler's
snapshot, or a running exporter's /metrics. The job's report is the rise of its
workload series between two readings, put into report.JobReport so that the report's
own renderers print and write it. Nothing here samples hardware.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from wattprint.core import safeio
from wattprint.jobs.discovery import MeterError as MeterError  # raised where the lock is found
from wattprint.jobs.discovery import find_sampler
from wattprint.jobs.reading import Reading as Reading
from wattprint.jobs.reading import SeriesKey, reading_from_text, resumed_between, same_exporter
from wattprint.jobs.reading import reading_from_snapshot as reading_from_snapshot
from wattprint.report.common import COMPONENTS, PLATFORM
from wattprint.report.jobdoc import job_document
from wattprint.report.jobs import GpuUse, JobReport
from wattprint.report.queries import make_window
from wattprint.report.render import Units, render_codecarbon, render_table
from wattprint.sources import registry

# Far above a node's /metrics at --workload.max-series=500 (a few MB).
MAX_METRICS_BYTES = 64 << 20


class ExporterReader:
    """Reads a running exporter's /metrics (its own sampler; none of ours)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
        self.timeout = timeout
        self.fresh = False  # whether the last answer was of a sample taken for it

    def _scrape(self, query: str = "") -> Reading:
        # An overall deadline, not a per-recv timeout: a server trickling a byte at a
        # time would otherwise hold the job's start for as long as it likes.
        target = self.url + query
        try:
            body, headers = safeio.http_fetch(target, self.timeout, MAX_METRICS_BYTES)
        except OSError as err:
            reason = str(err.strerror or err).removeprefix(f"{target}: ")
            raise MeterError(
                f"cannot read the exporter at {self.url}: {reason.removeprefix(target + ' ')}"
            ) from None
        self.fresh = headers.get("X-Wattprint-Fresh") == "1"
        text = body.decode("utf-8", "replace")
        try:
            return reading_from_text(text)
        except ValueError as err:
            raise MeterError(f"{self.url} is not Prometheus text: {err}") from None

    def read(self, patience: float = 30.0) -> Reading:
        # An exporter that is starting serves /metrics before its first sample (build
        # info only): a job's start read then would have no time and no counters.
        deadline = time.monotonic() + patience
        reading = self._scrape()
        while math.isnan(reading.time):
            if time.monotonic() > deadline:
                raise MeterError(f"the exporter at {self.url} took no sample in {patience:.0f} s")
            time.sleep(0.1)
            reading = self._scrape()
        # The exporter serves a series at 0 the first time a scraper sees it (so that
        # Prometheus counts its first interval): scrape again until no series is new.
        for _ in range(5):
            again = self._scrape()
            if again.series.keys() <= reading.series.keys():
                return again
            reading = again
        return reading

    def read_fresh(self, patience: float = 10.0, wait: bool = True) -> Reading:
        """A reading of a sample begun after this call: the sampler takes one at once
        (/metrics?fresh, one for every caller meanwhile). From an exporter that takes none
        on request (self.fresh is False), the first sample after the one it serves now;
        without `wait`, the one it serves now."""
        reading = self._scrape("?fresh")
        if (self.fresh or not wait) and not math.isnan(reading.time):
            return reading
        deadline = time.monotonic() + max(patience, 5 * reading.interval)
        while True:
            time.sleep(min(reading.interval / 4, 0.25))
            # Still as a meter: an exporter that takes no sample for this client serves
            # it its latest sample all the same, where scrapers get counters held still.
            again = self._scrape("?fresh")
            if again.time > reading.time or (math.isnan(reading.time) and again.time > 0):
                return again
            if time.monotonic() > deadline:
                raise MeterError(f"the exporter at {self.url} took no sample in {patience:.0f} s")

    def read_after(self, moment: float, interval: float, patience: float = 10.0) -> Reading:
        """The first reading of a sample taken after `moment` (wall clock): asked for
        as a meter, so that an exporter whose saved counters stand still (its state file
        unwritable) still gives the sample as taken."""
        deadline = time.monotonic() + max(patience, 5 * interval)
        while True:
            reading = self._scrape("?fresh")
            if not math.isnan(reading.time) and reading.time > moment:
                return reading
            if time.monotonic() > deadline:
                raise MeterError(
                    f"the exporter at {self.url} took no sample after the job ended "
                    f"(waited {max(patience, 5 * interval):.0f} s)"
                )
            time.sleep(min(interval / 4, 0.25))


def sampler_url(state_file: str) -> tuple[str, str] | None:
    """(lock path, /metrics URL) of the sampler this node already has, once it has
    named its address in the lock."""
    found = find_sampler(state_file)
    if found is None or not found[1].get("listen_address"):
        return None
    return found[0], url_for(str(found[1]["listen_address"]))


def url_for(listen_address: str) -> str:
    host, _, port = listen_address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "::", "0.0.0.0"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics"


def same_endpoint(a: str, b: str) -> bool:
    """Whether two URLs name one listener on this node (its name, localhost and
    127.0.0.1 alike)."""
    loopback = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "", socket.gethostname().lower()}

    def where(url: str) -> tuple[str, int | None]:
        parsed = urllib.parse.urlsplit(url if "//" in url else "http://" + url)
        host = (parsed.hostname or "").lower()
        try:
            port = parsed.port
        except ValueError:
            port = None
        return ("loopback" if host in loopback else host), port

    return where(a) == where(b)


# -- the job's report ---------------------------------------------------------------------

HELD_NOTE = (
    "the exporter served its counters held at its last save (its state file cannot be "
    "written): energy since is not counted here"
)
RESUMED_NOTE = (
    "the exporter restarted and went on from its state file, saved before this job's "
    "first reading of it: energy since the restart is not counted here until its counter "
    "is past that reading"
)


def job_report(
    start: Reading,
    end: Reading,
    workload: str | None,
    pod: str | None = None,
    host: str | None = None,
) -> JobReport:
    """The rise of `workload`'s series from start to end; with `pod`, only the series
    of that tracker (whatever workload the sampler found its process in). The chips'
    in its components; its share of the rest of the server in its platform, and the
    node in its platform_nodes where a platform source read the node's input."""
    host = host or node_name()
    mine = series_of(workload, pod)
    chosen = [key for key in end.series if key[0] in (*COMPONENTS, PLATFORM) and mine(key)]
    workloads = sorted({key[4] for key in chosen})
    workload = workload or (workloads[0] if workloads else pod or "")
    schedulers = sorted({key[2] for key in chosen}) or ["env"]
    namespaces = sorted({key[3] for key in chosen}) or [""]
    job = JobReport(schedulers[0], namespaces[0], workload, start=start.time, end=end.time)
    job.instances.add(("wattprint", host))
    if (PLATFORM, "node") in end.devices:  # sampler/platform.py's device
        job.platform_nodes.add(("wattprint", host))
    job.zones = set(end.zones)
    for key in chosen:
        component, gpu = key[0], key[1]
        before = start.series.get(key, (0.0, 0.0))
        after = end.series[key]
        if after[0] < before[0] and same_exporter(start, end):
            # Served held at the exporter's last save (reading.behind): what it counted
            # since is not in `end`; none of it is invented, and the note says so.
            after = before
            job.notes.append(f"{component} {gpu}: {HELD_NOTE}")
        elif after[0] < before[0] and resumed_between(start, end):
            # Resumed from its last save, below the unsaved sample read before: nothing
            # of it is counted until the counter passes that reading again.
            after = before
            job.notes.append(f"{component} {gpu}: {RESUMED_NOTE}")
        elif after[0] < before[0]:
            # The counters restarted in between (an exporter restart without state):
            # what was counted before the restart cannot be told apart.
            before = (0.0, 0.0)
            job.notes.append(f"{component} {gpu}: counter restarted during the job")
        joules, grams = after[0] - before[0], after[1] - before[1]
        if joules == 0 and grams == 0:
            continue
        part = job.platform if component == PLATFORM else job.components[component]
        method = end.methods.get((component, gpu)) or _component_method(end, component)
        estimated = not method or any(map(registry.is_estimated, method.split(",")))
        part.energy_j += joules
        part.emissions_g += grams
        part.pue_energy_j += joules * end.pue
        part.methods |= set(filter(None, (method or "").split(",")))
        if estimated:
            part.estimated_j += joules
        if component == "gpu":
            use = job.gpus.setdefault((host, gpu), GpuUse(host, gpu, end.gpu_models.get(gpu, "")))
            use.energy_j += joules
            use.emissions_g += grams
            if estimated:
                use.estimated_j += joules
    if len(schedulers) > 1 or len(namespaces) > 1:
        job.notes.append(
            f"workload {workload!r} was seen under schedulers {schedulers} and "
            f"namespaces {namespaces}: added up"
        )
    return job


def series_of(workload: str | None, pod: str | None = None) -> Callable[[SeriesKey], bool]:
    """Whether a series is the job's: `workload`'s, or with `pod`, that tracker's."""

    def mine(key: SeriesKey) -> bool:
        if pod is not None:
            # A tracker's series are its own by their pod alone: the sampler names the
            # workload as it found the process (a Slurm job, `wattprint run --workload`).
            return key[5] == pod or key[5].endswith("/" + pod)
        return workload is None or key[4] == workload

    return mine


def _component_method(reading: Reading, component: str) -> str:
    return ",".join(sorted({m for (c, _), m in reading.methods.items() if c == component}))


def node_energy(start: Reading, end: Reading) -> dict[str, float]:
    """What the node's devices used between the readings, per component (J)."""
    totals = dict.fromkeys(COMPONENTS, 0.0)
    # The node's input and the rest of the server, where a platform source reads them.
    totals |= {c: 0.0 for c, _ in end.devices if c in ("node", PLATFORM)}
    for key, value in end.devices.items():
        if key[0] in totals:
            totals[key[0]] += max(0.0, value - start.devices.get(key, value))
    return totals


def render(job: JobReport, title: str, fmt: str) -> str:
    window = make_window(job.start, max(job.end, job.start + 0.001), whole_life=False)
    if fmt == "codecarbon-csv":
        return render_codecarbon([job], window, "")
    # The table's first line names a Prometheus server; here the numbers came from
    # somewhere else, and the title says where.
    body = render_table([job], window, "", Units.suited([job])).split("\n", 1)[1]
    return f"{title}\n{body}"


def write_files(
    job: JobReport,
    directory: str,
    stem: str,
    source: str,
    extra: dict[str, Any] | None = None,
    append_csv: bool = False,
) -> list[str]:
    """Write <stem>.json and <stem>.emissions.csv (codecarbon's columns) atomically; with
    `append_csv`, add the row to the CSV as codecarbon's FileOutput does ("append").

    Never through a link planted in the directory; any failure is an OSError of one line."""
    out = Path(directory)
    csv_text = render(job, "", "codecarbon-csv")
    csv_path = out / f"{stem}.emissions.csv"
    header, row = csv_text.split("\n", 1)
    document = json.dumps(job_document(job, source, extra), indent=2) + "\n"
    with written_to(directory):
        out.mkdir(parents=True, exist_ok=True)
        if append_csv and first_line(csv_path) == header:
            # One write() to an O_APPEND file: a reader sees the row whole or not at all.
            fd = safeio.open_append(str(csv_path))
            try:
                safeio.write_all(fd, _encode(row))
            finally:
                os.close(fd)
        else:
            safeio.write_atomic(str(csv_path), _encode(csv_text))
        safeio.write_atomic(str(out / f"{stem}.json"), _encode(document))
    return [str(out / f"{stem}.json"), str(csv_path)]


def save_job(
    job: JobReport,
    start: Reading,
    end: Reading,
    directory: str,
    source: str,
    host: str,
    extra: dict[str, Any],
    tracker: str = "",
    append_csv: bool = False,
) -> list[str]:
    """write_files() as wattprint-<workload>-<host>[-<tracker>]; the JSON names the host
    and what the node's devices used between start and end, besides `extra`."""
    names = [job.workload, host, tracker] if tracker else [job.workload, host]
    document = {"host": host, **extra, "node_energy_j": node_energy(start, end)}
    return write_files(job, directory, file_stem(names), source, document, append_csv=append_csv)


# The first line of a file this tool wrote is its CSV header (under 1 KiB); anything
# longer is not one.
HEAD_BYTES = 64 << 10


def first_line(path: Path) -> str | None:
    """The first line of a regular file (never through a link or a FIFO), None where
    there is none to read; bytes that are not UTF-8 read as U+FFFD."""
    try:
        fd = os.open(path, os.O_RDONLY | safeio.NOFOLLOW | safeio.NONBLOCK | safeio.CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.pread(fd, HEAD_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return head.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")


class CannotWrite(OSError):
    """A job file not written; str() is one line naming where."""

    def __str__(self) -> str:
        return str(self.strerror)


@contextlib.contextmanager
def written_to(where: str | Path) -> Iterator[None]:
    """Any failure to write as CannotWrite: one line, `where` and the reason (the
    callers say "cannot write to ...")."""
    try:
        yield
    except CannotWrite:
        raise
    except OSError as err:
        reason = err.strerror or str(err)
        raise CannotWrite(err.errno, f"{where}: {reason}") from None


def _encode(text: str) -> bytes:
    # A name given by the user may hold lone surrogates (os.fsdecode of bad bytes).
    return text.encode("utf-8", "replace")


def node_name() -> str:
    """This node's name in the job's files: Slurm's name for it where Slurm runs the job
    (what sacct and `srun -w` call it), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def safe_stem(text: str) -> str:
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:120] or "job"
    # A file name is at most 255 bytes: a stem of letters of several bytes is cut by bytes.
    return stem.encode()[:120].decode("utf-8", "ignore")


# Of a file system's 255 bytes per name, what a stem may take: its suffix and the
# temporary name made from it (".<name>.<random>.tmp") need the rest.
MAX_STEM_BYTES = 160


def file_stem(names: list[str]) -> str:
    """wattprint-<names...>, at most MAX_STEM_BYTES bytes of UTF-8: a longer one (80 CJK
    characters are 240) is cut and ends in a hash of the whole, so two stay two."""
    stem = "-".join(["wattprint", *(safe_stem(name) for name in names)])
    raw = stem.encode("utf-8", "replace")
    if len(raw) <= MAX_STEM_BYTES:
        return stem
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return raw[: MAX_STEM_BYTES - 13].decode("utf-8", "ignore") + "~" + digest


Clock = Callable[[], float]
