"""Command line: `wattprint` (run the exporter), `wattprint doctor`, `wattprint report`,
`wattprint run`, `wattprint slurm-epilog`.

Bad flags, environment variables or config files exit with status 2 and one line on
stderr that names the bad value; nothing else the user did wrong prints a traceback.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NoReturn

from wattprint._version import __version__
from wattprint.config.flags import exporter_flags, load
from wattprint.config.options import Config, ConfigError
from wattprint.durability.nodelock import NodeLockHeld

log = logging.getLogger("wattprint")

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}


class _Parser(argparse.ArgumentParser):
    # Adds the arguments when this parser is first used: the report's come with
    # report.py and requests, which the exporter must not import, and a subcommand's
    # copy of the exporter flags costs start-up time (a help formatter per flag).
    add_later: Callable[[argparse.ArgumentParser], None] | None = None

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse builds a formatter for every flag added, each asking shutil (which
        # imports bz2 and lzma) for the terminal's width: ask once, as shutil would.
        return argparse.HelpFormatter(prog=self.prog, width=_help_width())

    def error(self, message: str) -> NoReturn:
        # argparse prints the whole usage; a user (and a log pipeline) wants one line.
        self.exit(2, f"wattprint: {message} (see --help)\n")

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        if self.add_later is not None:
            add, self.add_later = self.add_later, None
            add(self)
        return super().parse_known_args(*args, **kwargs)


@functools.cache
def _help_width() -> int:
    try:
        columns = int(os.environ.get("COLUMNS", "")) or os.get_terminal_size(1).columns
    except (ValueError, OSError):
        columns = 80
    return columns - 2


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="wattprint",
        description="Energy and carbon of GPUs, CPUs and memory, per device and per job, "
        "for Prometheus.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"wattprint {__version__}")
    exporter_flags(parser)
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    doctor = sub.add_parser(
        "doctor", help="what will be measured, what estimated, and why", allow_abbrev=False
    )
    doctor.add_later = _sub_exporter_flags
    report = sub.add_parser(
        "report", help="per-job energy and emissions from Prometheus", allow_abbrev=False
    )
    report.add_later = _report_arguments
    run_cmd = sub.add_parser(
        "run", help="run a command and report its energy and emissions", allow_abbrev=False
    )
    run_cmd.add_later = _run_arguments
    epilog = sub.add_parser(
        "slurm-epilog",
        help="a finished Slurm job's energy, from this node's exporter, into its AdminComment",
        allow_abbrev=False,
    )
    epilog.add_later = _slurm_arguments
    return parser


# A subcommand's help shows its own flags first, and the exporter's ~30 apart, after them.
EXPORTER_FLAGS = "exporter flags (as for wattprint itself; see wattprint --help)"


def _sub_exporter_flags(parser: argparse.ArgumentParser) -> None:
    parser.usage = "%(prog)s [-h] [exporter flags]"
    exporter_flags(parser.add_argument_group(EXPORTER_FLAGS), sub=True)


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    from wattprint.report.arguments import add_report_arguments

    add_report_arguments(parser)


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    from wattprint.jobs.run import add_run_arguments

    add_run_arguments(parser)
    own = [
        f"[{a.option_strings[-1]}{' ' + a.metavar if isinstance(a.metavar, str) else ''}]"
        for a in parser._actions
        if a.option_strings and a.dest != "help"
    ]
    parser.usage = f"%(prog)s [-h] {' '.join(own)} [exporter flags] -- CMD [ARGS...]"
    exporter_flags(parser.add_argument_group(EXPORTER_FLAGS), sub=True)


def _slurm_arguments(parser: argparse.ArgumentParser) -> None:
    from wattprint.cli.slurm import add_arguments

    add_arguments(parser)


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'


class LogfmtFormatter(logging.Formatter):
    """One logfmt line per record, as Prometheus and its exporters log (msg always
    double-quoted, a traceback folded into err="..."):
    ts=2024-05-01T12:00:00.123Z level=info source=wattprint.cli msg="listening on :9950"
    """

    _NAMES: ClassVar[dict[str, str]] = {"WARNING": "warn", "CRITICAL": "error"}

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        level = self._NAMES.get(record.levelname, record.levelname.lower())
        line = (
            f"ts={ts}.{int(record.msecs):03d}Z level={level} source={record.name} "
            f"msg={_quote(record.getMessage())}"
        )
        if record.exc_info:
            line += f" err={_quote(self.formatException(record.exc_info))}"
        return line


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    logging.basicConfig(level=_LEVELS.get(level, logging.INFO), handlers=[handler])


def run(config: Config) -> int:
    from wattprint.app import LockPlan, build_exporter, world_average_warning

    try:
        # Listening before the sources, the carbon provider and the state are loaded (most
        # of the start-up): until the sampler is built, /metrics has the build info and
        # /healthz says 503, as while the first sample is read.
        exporter = build_exporter(
            config, lock=LockPlan.exporter(config), listen_early=True, web_config=True
        )
    except NodeLockHeld as err:
        raise ConfigError(str(err)) from None
    except OSError as err:
        where = f" {err.filename}" if err.filename else ""
        raise ConfigError(f"cannot start:{where} {err.strerror or err}") from None
    for note in exporter.notes:
        log.info("%s", note)
    warning = world_average_warning(config)
    if warning is not None:
        log.warning("%s", warning)
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("received signal %d, shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    exporter.start()
    address = config.listen_address
    if exporter.server is not None:  # the port bound, where :0 asked for any
        address = f"{address.rpartition(':')[0]}:{exporter.server.port}"
    log.info("listening on %s (version %s)", address, __version__)
    # Timed waits: a SIGTERM the kernel hands to another thread only sets a flag, which the
    # main thread acts on when it next runs, and an untimed wait would never end.
    while not stop.wait(0.5) and not exporter.sampler.lost:
        pass
    exporter.stop()  # gives back the node lock last
    return 1 if exporter.sampler.lost else 0


def doctor(config: Config) -> int:
    from wattprint.cli.doctor import diagnose

    print(diagnose(config))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command == "report":
        from wattprint.report.command import run_report

        return run_report(args)
    if args.command == "slurm-epilog":
        from wattprint.cli.slurm import main as slurm_epilog

        return slurm_epilog(args)
    try:
        config = load(args)
        if args.command == "run":
            _setup_logging("warn")
            from wattprint.jobs.run import run_main

            return run_main(args, config)
        if args.command == "doctor":
            # doctor prints its findings; only problems belong on stderr.
            _setup_logging("warn")
            return doctor(config)
        _setup_logging(config.log_level)
        return run(config)
    except ConfigError as err:
        print(f"wattprint: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
