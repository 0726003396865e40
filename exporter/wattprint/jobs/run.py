"""`wattprint run [flags] -- CMD [ARGS...]`: run CMD as a workload and report what it
used and emitted, without a Prometheus.

The numbers come from the node's one sampler (jobs.discovery.find_sampler): a running
exporter, read at the start and the end; or, where none runs, our own sampler (the
exporter's sources, split and carbon, built from the same flags), which takes the node
lock and serves /metrics on loopback so that trackers inside the job read from it
rather than sampling again.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from types import FrameType

from wattprint.app import world_average_warning
from wattprint.attribution.cardinality import MAX_LABEL_LENGTH, bound_label
from wattprint.config.options import OPTIONS, Config
from wattprint.host.identity.tracked import REGISTRATIONS, Registration, registry_dir
from wattprint.host.procfs import read_proc
from wattprint.jobs import notes
from wattprint.jobs.meter import (
    ExporterReader,
    MeterError,
    job_report,
    node_name,
    render,
    safe_stem,
    sampler_url,
    save_job,
)
from wattprint.jobs.nodesampler import LocalSampler, find_or_start, start_local_sampler
from wattprint.report.jobs import JobReport

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# Under the logger the exporter's own warnings use (app.log).
log = logging.getLogger("wattprint")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run CMD as one workload, then print its energy and emissions and write them to "
        "--output.dir as JSON and as codecarbon's emissions CSV. Reads a running "
        "Wattprint exporter if the node has one; otherwise samples itself."
    )
    parser.add_argument(
        "--workload",
        metavar="NAME",
        help="the job's name (default $SLURM_JOB_ID, else the command and start time); "
        "exported to CMD as WATTPRINT_WORKLOAD",
    )
    parser.add_argument(
        "--output.dir",
        dest="output_dir",
        default=os.environ.get("WATTPRINT_OUTPUT_DIR", "."),
        metavar="DIR",
        help="where to write <name>.json and <name>.emissions.csv (default: .)",
    )
    parser.add_argument(
        "--exporter.url",
        dest="exporter_url",
        default=os.environ.get("WATTPRINT_EXPORTER_URL"),
        metavar="URL",
        help="read this exporter's /metrics instead of finding one by the node lock",
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")


def default_workload(argv: Sequence[str], environ: dict[str, str], now: float) -> str:
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if job:
        return job
    stamp = dt.datetime.fromtimestamp(now, tz=dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{safe_stem(os.path.basename(argv[0]))}-{stamp}"


class _Forwarder:
    """Passes signals on to the command's process group; remembers the first."""

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.received: int | None = None
        self._saved: dict[int, object] = {}

    def __enter__(self) -> _Forwarder:
        for signum in FORWARDED:
            self._saved[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signum)


class CannotStart(Exception):
    """The command could not be started; str() is the shell's kind of line, `status` its
    exit status (127: not found, 126: found but not executable)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def run_main(args: argparse.Namespace, config: Config) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("wattprint run: no command given (wattprint run [flags] -- CMD ...)", file=sys.stderr)
        return 2
    now = time.time()
    given = args.workload or default_workload(argv, dict(os.environ), now)
    # Never cut silently where the sampler would cut it: the name hashed, and said.
    workload = bound_label(given)
    launch = launch_id(os.environ)
    env = dict(os.environ, WATTPRINT_WORKLOAD=workload, WATTPRINT_LAUNCH_ID=launch)
    try:
        # Before any sampler is started: a command that cannot start gets no report.
        check_command(argv, env)
    except CannotStart as err:
        print(f"wattprint run: {err}", file=sys.stderr)
        return err.status
    explicit = getattr(args, "opt:web.listen-address", None) is not None or (
        "WATTPRINT_WEB_LISTEN_ADDRESS" in os.environ
    )
    listen = config.listen_address if explicit else "127.0.0.1:0"
    try:
        local, reader, source = _open(args, config, listen, explicit, workload)
        # Registered with the node's sampler for jobs, shared with trackers and other runs.
        shared = bool(REGISTRATIONS.directories())
        if local is not None:
            start = local.read()
        else:
            assert reader is not None
            reader.read()  # perhaps just started: its first sample
            # A sample taken now, as taken: one that has seen the node's processes, and
            # live where the exporter holds what it serves scrapers (its state unsaved).
            start = reader.read_fresh()
        read_at = time.monotonic()
    except MeterError as err:
        _unregister(REGISTRATIONS.directories())
        # The command is the user's job: it runs whether or not it can be measured.
        print(f"wattprint run: {err}; running the command with no report", file=sys.stderr)
        try:
            return _run_command(argv, env)[0]
        except CannotStart as cannot:
            print(f"wattprint run: {cannot}", file=sys.stderr)
            return cannot.status
    if local is not None or (shared and start.zones == {"WORLD"}):
        warning = world_average_warning(config)
        if warning is not None:
            log.warning("%s", warning)
    status, received, ran_s = 1, None, 0.0
    try:
        status, received, ran_s = _run_command(argv, env)
        if local is not None:
            end = local.read()
        else:
            assert reader is not None
            end = reader.read_fresh()  # begun after the command ended
        elapsed = time.monotonic() - read_at
    except CannotStart as err:
        print(f"wattprint run: {err}", file=sys.stderr)
        return err.status
    except MeterError as err:
        print(f"wattprint run: {err}; no report", file=sys.stderr)
        return status
    finally:
        if local is not None:
            local.stop()
        _unregister(REGISTRATIONS.directories())
    job = job_report(start, end, workload)
    stepped = monotonic_window(job, elapsed, start.interval)
    if stepped is not None:
        job.notes.append(stepped)
    namesake = notes.namesake(start, workload)
    if namesake is not None:
        job.notes.append(namesake)
    short = notes.unseen(job.energy_j > 0, ran_s, start.interval)
    if short is not None:
        job.notes.append(short)
    if local is None:
        named = source.removeprefix("exporter ")
        job.notes += notes.overridden(config, notes.given_settings(args, os.environ), end, named)
        world = notes.world_average(end, named)
        if world is not None:
            job.notes.append(world)
    elif not config.carbon_zone and end.zones == {"WORLD"}:
        job.notes.append("emissions at the world average (zone WORLD): no --carbon.zone was set")
    if workload != given:
        job.notes.append(
            f"--workload is {len(given)} characters, over the {MAX_LABEL_LENGTH} a label "
            f"may be: counted as {workload!r} (its start and a hash of the whole)"
        )
    full = notes.cap_note(end, registered=shared, counted=job.energy_j > 0)
    if full is not None:
        job.notes.append(full)
    if received is not None:
        job.notes.append(f"interrupted by signal {received}")
    if status != 0:
        job.notes.append(f"the command exited with status {status}")
    host = node_name()
    title = f"wattprint run ({source}): {job.workload} on {host}"
    sys.stderr.write(render(job, title, "table"))
    try:
        extra = {"launch": launch, "command": argv, "exit_status": status}
        written = save_job(job, start, end, args.output_dir, source, host, extra)
        sys.stderr.write("wrote " + ", ".join(written) + "\n")
    except OSError as err:
        print(
            f"wattprint run: cannot write to --output.dir={args.output_dir}: {err}", file=sys.stderr
        )
        return status or 1
    return status


def monotonic_window(job: JobReport, elapsed: float, interval: float) -> str | None:
    """Where the samples' wall times and the monotonic time between the two readings
    disagree by more than the samples' own lag, the wall clock was stepped (`date -s`,
    a VM resumed): the job's end is set from the monotonic clock, and the note says so."""
    wall = job.end - job.start
    if abs(wall - elapsed) <= max(5.0, 3 * interval):
        return None
    job.end = job.start + elapsed
    return (
        f"the node's wall clock stepped by {wall - elapsed:+.0f} s during the job: its "
        f"duration ({elapsed:.1f} s) is from the monotonic clock"
    )


def launch_id(environ: Mapping[str, str]) -> str:
    """What every process of this launch shares and no other launch does: the one the
    launch was given, else Slurm's job and step (every node's `srun wattprint run`),
    else a new one."""
    given = environ.get("WATTPRINT_LAUNCH_ID")
    if given:
        return given
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if job:
        step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
        return f"slurm-{job}" + (f".{step}" if step else "")
    return uuid.uuid4().hex[:16]


def check_command(argv: list[str], env: Mapping[str, str]) -> None:
    """CannotStart, as a shell would say it, for a command that cannot be run."""
    program = argv[0]
    if "/" not in program:
        if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
            raise CannotStart(f"{program}: command not found", 127)
        return
    if not os.path.exists(program):
        raise CannotStart(f"cannot run {program}: No such file or directory", 127)
    if os.path.isdir(program):
        raise CannotStart(f"cannot run {program}: Is a directory", 126)
    if not os.access(program, os.X_OK):
        raise CannotStart(f"cannot run {program}: Permission denied", 126)


def _open(
    args: argparse.Namespace, config: Config, listen: str, explicit_listen: bool, workload: str
) -> tuple[LocalSampler | None, ExporterReader | None, str]:
    if args.exporter_url:
        return None, ExporterReader(args.exporter_url), f"exporter {args.exporter_url}"
    if not explicit_listen and config.state_file:
        try:
            return _shared(args, config, workload)
        except MeterError as err:
            # Measured all the same, as before the node had a sampler for jobs.
            log.warning("%s: sampling in this process", err)
    running = sampler_url(config.state_file)
    if running is not None:
        url = running[1]
        return None, ExporterReader(url), f"exporter {url}"
    started = start_local_sampler(config, listen)
    if isinstance(started, str):
        return None, ExporterReader(started), f"exporter {started}"
    return started, None, f"own sampler, /metrics on {started.address}"


def _shared(
    args: argparse.Namespace, config: Config, workload: str
) -> tuple[LocalSampler | None, ExporterReader | None, str]:
    # The node's sampler for jobs, as trackers use it (started here where none
    # runs): it outlives this run while another run or tracker still reads it, so
    # two runs both get their report whichever ends first.
    flags = {
        option.flag: str(value)
        for option in OPTIONS
        if (value := getattr(args, f"opt:{option.flag}", None)) is not None
    }
    lock, url = find_or_start(config.state_file, flags)
    try:
        info = read_proc(os.getpid())
        REGISTRATIONS.add(
            registry_dir(lock),
            _REGISTERED,
            # With no tracker it books nothing (the command's processes carry
            # WATTPRINT_WORKLOAD; run's own are not the job's): it keeps the sampler,
            # and its workload past a full --workload.max-series.
            Registration(os.getpid(), info.start_ticks if info else 0, workload, ""),
        )
    except OSError as err:
        raise MeterError(f"cannot register with the node's sampler: {err}") from None
    return None, ExporterReader(url), f"exporter {url}"


# This process's registration with the node's sampler: its command's processes are the
# run's workload, and the sampler stays while the run lasts.
_REGISTERED = object()


def _unregister(lock_dirs: list[str]) -> None:
    for directory in lock_dirs:
        with contextlib.suppress(OSError):
            REGISTRATIONS.remove(directory, _REGISTERED)


def _run_command(argv: list[str], env: dict[str, str]) -> tuple[int, int | None, float]:
    """Run the command in its own process group: its status as a shell gives it, the
    first signal forwarded to it, and how long it ran."""
    tty = _foreground_tty()
    with _Forwarder() as forwarder:
        began = time.monotonic()
        try:
            # Its own process group (setpgid in the child, as process_group=0 does on
            # 3.11+), so that a signal reaches every process it starts.
            child = subprocess.Popen(argv, env=env, preexec_fn=_own_group)
        except OSError as err:
            status = 127 if isinstance(err, FileNotFoundError) else 126
            raise CannotStart(f"cannot run {argv[0]}: {err.strerror}", status) from None
        forwarder.pgid = child.pid
        if tty is not None:
            _give_terminal(tty, child.pid)
        if forwarder.received is not None:  # arrived before the pgid was known
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, forwarder.received)
        code = child.wait()
        ran_s = time.monotonic() - began
        if tty is not None:
            _give_terminal(tty, os.getpgrp())
    status = 128 - code if code < 0 else code
    return status, forwarder.received, ran_s


def _own_group() -> None:
    os.setpgid(0, 0)


def _foreground_tty() -> int | None:
    # An interactive command must own the terminal, or reading it stops it (SIGTTIN).
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except (OSError, ValueError):
        pass
    return None


def _give_terminal(fd: int, pgid: int) -> None:
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, pgid)
    finally:
        signal.signal(signal.SIGTTOU, previous)
