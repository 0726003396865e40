"""The command line as a user meets it: flags, environment, config file, doctor, and the
running exporter process answering HTTP."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from wattprint.cli.main import LogfmtFormatter

REPO = Path(__file__).resolve().parents[1]


def wattprint(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("WATTPRINT_")}
    # No state file or node lock: the machine's own exporter may hold /var/lib/wattprint's.
    full_env["WATTPRINT_STATE_FILE"] = ""
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "wattprint", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--sample.interval=fast"], {}, "--sample.interval"),
        (["--sample.interval=0s"], {}, "--sample.interval"),
        (["--sample.interval=2m"], {}, "--sample.timestamps=false"),
        (["--sample.timestamps=maybe"], {}, "--sample.timestamps"),
        (["--pue=0.5"], {}, "--pue"),
        (["--pue=abc"], {}, "--pue"),
        (["--gpu.source=cuda"], {}, "--gpu.source"),
        (["--web.listen-address=9950"], {}, "--web.listen-address"),
        (["--gpu.source=replay"], {}, "--gpu.replay-file"),
        (["--gpu.replay-file=/nonexistent.jsonl"], {}, "--gpu.replay-file"),
        (["--carbon.zone=Atlantis"], {}, "Atlantis"),
        (["--carbon.api-url=ftp://x"], {}, "--carbon.api-url"),
        (
            ["--carbon.provider=watttime", "--carbon.provider-region=CAISO_NORTH"],
            {"WATTPRINT_WATTTIME_USERNAME": "u", "WATTPRINT_WATTTIME_PASSWORD": "p"},
            "watttime needs --carbon.zone",
        ),
        (["--no-such-flag"], {}, "--no-such-flag"),
        ([], {"WATTPRINT_SAMPLE_INTERVAL": "soon"}, "WATTPRINT_SAMPLE_INTERVAL"),
        ([], {"WATTPRINT_CPU_SOURCE": "gpu"}, "WATTPRINT_CPU_SOURCE"),
        (["--cpu.source=rapl", "--path.sysfs=/nonexistent"], {}, "--cpu.source=rapl"),
    ],
)
def test_bad_values_exit_2_with_one_line_naming_them(
    args: list[str], env: dict[str, str], named: str
) -> None:
    result = wattprint(*args, "doctor", env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert named in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("sample.interval: never\n", "sample.interval"),
        ("no.such.key: 1\n", "no.such.key"),
        ("[1, 2\n", "not valid YAML"),
        ("- a\n- b\n", "mapping"),
    ],
)
def test_bad_config_file_exits_2(tmp_path: Path, content: str, named: str) -> None:
    path = tmp_path / "wattprint.yml"
    path.write_text(content)
    result = wattprint(f"--config.file={path}", "doctor")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and named in result.stderr


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = wattprint(f"--config.file={tmp_path}/absent.yml", "doctor")
    assert result.returncode == 2 and "absent.yml" in result.stderr


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    from wattprint.config.options import build_config

    path = tmp_path / "wattprint.yml"
    path.write_text("sample.interval: 5s\npue: 1.2\ncarbon.zone: FR\n")
    config = build_config({"pue": "1.4"}, {"WATTPRINT_CARBON_ZONE": "DE"}, str(path))
    assert (config.sample_interval, config.pue, config.carbon_zone) == (5.0, 1.4, "DE")


def test_sample_timestamps_from_flag_env_and_yaml_bool(tmp_path: Path) -> None:
    from wattprint.config.options import build_config

    assert build_config({}, {}).sample_timestamps is True
    assert build_config({"sample.timestamps": "false"}, {}).sample_timestamps is False
    assert build_config({}, {"WATTPRINT_SAMPLE_TIMESTAMPS": "no"}).sample_timestamps is False
    path = tmp_path / "wattprint.yml"
    path.write_text("sample.timestamps: false\nsample.interval: 5m\n")
    config = build_config({}, {}, str(path))
    assert (config.sample_timestamps, config.sample_interval) == (False, 300.0)


def test_version() -> None:
    result = wattprint("--version")
    assert result.returncode == 0 and result.stdout.startswith("wattprint ")


def test_help_shows_each_flags_choices_and_one_default() -> None:
    result = wattprint("--help", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    # Each option: its line, and the help text argparse wraps onto the lines below it.
    blocks = re.findall(r"^  (--\S+.*(?:\n {3,}.*)*)", result.stdout, re.M)
    lines = {block.split()[0]: " ".join(block.split()) for block in blocks}
    assert "VALUE" not in result.stdout
    for flag, shown in [
        ("--gpu.source", "auto|nvml|amdsmi|replay|none"),
        ("--cpu.source", "auto|rapl|model|none"),
        ("--memory.source", "auto|rapl|model|none"),
        ("--carbon.provider", "static|electricitymaps|watttime|uk-grid"),
        ("--carbon.accounting-signal", "average|marginal"),
        ("--sample.timestamps", "true|false"),
        ("--log.level", "debug|info|warn|error"),
        ("--sample.interval", "DURATION"),
        ("--web.listen-address", "[HOST]:PORT"),
        ("--pue", "NUMBER"),
        ("--web.config.file", "PATH"),
    ]:
        assert lines[flag].split()[1] == shown, lines[flag]
    assert "(default 1s; env WATTPRINT_SAMPLE_INTERVAL)" in lines["--sample.interval"]
    node = lines["--kubernetes.node-name"]
    assert node.count("default") == 1 and "$NODE_NAME" in node, node


LOGFMT = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"=]+)(?: |$)')


def logfmt(line: str) -> dict[str, str]:
    """Parse one logfmt line strictly: every byte belongs to a key=value pair."""
    pairs = list(LOGFMT.finditer(line))
    assert "".join(m.group(0) for m in pairs) == line, f"not logfmt: {line!r}"
    return {
        m.group(1): json.loads(m.group(2)) if m.group(2).startswith('"') else m.group(2)
        for m in pairs
    }


def test_log_lines_are_logfmt_with_double_quoted_messages() -> None:
    record = logging.LogRecord(
        "wattprint.x", logging.WARNING, __file__, 1, "zone 'DE' said \"hi\"\nback\\slash", (), None
    )
    line = LogfmtFormatter().format(record)
    assert "\n" not in line
    fields = logfmt(line)
    assert fields["msg"] == "zone 'DE' said \"hi\"\nback\\slash"
    assert (fields["level"], fields["source"]) == ("warn", "wattprint.x")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["ts"])


def test_doctor_explains_a_machine_without_gpu_and_rapl(tmp_path: Path) -> None:
    (tmp_path / "sys" / "class").mkdir(parents=True)
    result = wattprint(
        "doctor",
        f"--path.sysfs={tmp_path}/sys",
        "--carbon.zone=DE",
        env={"WATTPRINT_GPU_SOURCE": "auto"},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "gpu: none" in out and ("NVML" in out or "pynvml" in out)
    assert "cpu: model" in out and "RAPL" in out
    assert "memory: model" in out
    assert "DE" in out


def test_exporter_process_serves_metrics_healthz_and_landing(trace_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wattprint",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--gpu.replay-file={trace_path}",
            "--replay.speed=20",
            "--carbon.zone=DE",
            "--sample.interval=200ms",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "exporter did not become healthy"
            time.sleep(0.1)
        text = requests.get(f"{base}/metrics", timeout=5)
        assert text.headers["Content-Type"].startswith("text/plain")
        assert (
            'wattprint_measurement_info{component="gpu",device="0",estimated="false",'
            'method="replay"} 1.0' in text.text
        )
        om = requests.get(
            f"{base}/metrics",
            timeout=5,
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        )
        assert om.headers["Content-Type"].startswith("application/openmetrics-text")
        assert om.text.rstrip().endswith("# EOF")
        assert "metrics" in requests.get(base + "/", timeout=5).text
        assert requests.get(f"{base}/nope", timeout=5).status_code == 404
        assert requests.post(f"{base}/metrics", timeout=5).status_code == 405
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    logged = [logfmt(line) for line in err.splitlines()]
    assert any(f["msg"].startswith("listening on 127.0.0.1:") for f in logged), err
    assert all(f.keys() >= {"ts", "level", "source", "msg"} for f in logged), err
    assert all(f'msg="{f["msg"]}' in err for f in logged if '"' not in f["msg"])


def test_healthz_turns_503_when_the_sampler_stalls() -> None:
    from wattprint.core.model import SourceResult
    from wattprint.sampler.loop import Sampler, SamplerParts

    class Stuck:
        name = "stuck"

        def read(self) -> SourceResult:
            return SourceResult()

        def explain(self) -> list[str]:
            return []

        def close(self) -> None:
            pass

    sampler = Sampler(SamplerParts(sources=[Stuck()], interval=1.0))
    assert not sampler.healthy()  # never sampled
    sampler.sample_once()
    now = time.monotonic()
    assert sampler.healthy(now + 2.0)
    assert not sampler.healthy(now + 4.0)


def test_memory_model_rate_can_be_corrected_for_big_memory_nodes(tmp_path: Path) -> None:
    (tmp_path / "sys" / "class").mkdir(parents=True)
    result = wattprint("doctor", f"--path.sysfs={tmp_path}/sys", "--memory.watts-per-gib=0.1")
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "W/GiB" in x)
    gib = float(line.split("GiB")[0].split()[-1])
    assert line.endswith(f"x 0.1 W/GiB = {gib * 0.1:.1f} W")


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?:\.[a-z0-9-]+)*")


def test_every_flag_the_package_names_to_users_exists() -> None:
    """A message, help text or report row that names a flag names one `--help` lists
    (the GHG export once cited --carbon.pue for --pue). Docstrings are for readers of
    the code and are left out."""
    import ast

    package = Path(__file__).resolve().parents[1] / "exporter" / "wattprint"
    named: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and id(node) not in docstrings:
                for flag in FLAG.findall(text):
                    named.setdefault(flag, set()).add(path.name)
    known = {"--rdzv-id"}  # torchrun's, named as where a job's launch id came from
    known |= {"--json", "--jobs", "--states"}  # squeue's, in the epilog's call of it
    for command in ([], ["report"], ["run"], ["doctor"], ["slurm-epilog"]):
        shown = subprocess.run(
            [sys.executable, "-m", "wattprint", *command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        known |= set(FLAG.findall(shown.stdout))
    assert "--pue" in named and len(known) > 30
    unknown = {flag: sorted(where) for flag, where in named.items() if flag not in known}
    assert not unknown, f"flags named that no command has: {unknown}"


def test_report_help_writes_the_formats_as_every_other_choice_is_written() -> None:
    from wattprint.report.common import FORMATS

    shown = subprocess.run(
        [sys.executable, "-m", "wattprint", "report", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert f"--format {'|'.join(FORMATS)}" in shown, shown
    assert "{" not in shown, shown


@pytest.mark.parametrize("command", ["run", "doctor"])
def test_subcommand_help_shows_its_own_flags_first_and_the_exporters_apart(command: str) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "wattprint", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COLUMNS="120"),
    ).stdout
    usage, _, rest = shown.partition("\n\n")
    assert usage.count("\n") == 0 and "[exporter flags]" in usage, usage
    assert "--gpu.source" not in usage, usage
    own, heading, exporter = rest.partition("\nexporter flags (")
    assert heading, shown
    assert "--gpu.source" in exporter and "--gpu.source" not in own
    if command == "run":
        assert "--workload NAME" in own and "--output.dir DIR" in own
        assert "--workload" in usage and usage.endswith("-- CMD [ARGS...]")
