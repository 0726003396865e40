"""Secret files read as the state file is (issue 39): a FIFO or a device named by
WATTPRINT_CARBON_TOKEN_FILE is one line at start, never a hang or a traceback, and
one error later where the file is replaced by one after the start."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from wattprint.carbon.base import ProviderError, Secret

ENV = "WATTPRINT_CARBON_TOKEN"


def _token_path(tmp_path: Path, kind: str) -> Path:
    if kind == "fifo":
        path = tmp_path / "token"
        os.mkfifo(path)  # nobody ever writes: a blocking open waits forever
        return path
    if kind == "huge":
        path = tmp_path / "token"
        with path.open("wb") as handle:  # sparse: a gigabyte on paper
            handle.truncate(1 << 30)
        return path
    return Path("/dev/zero")  # endless: read whole, a MemoryError


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_token_file_that_is_not_a_token_is_one_line_at_start(tmp_path: Path, kind: str) -> None:
    path = _token_path(tmp_path, kind)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("WATTPRINT_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattprint",
            "--web.listen-address=127.0.0.1:0",
            "--carbon.provider=electricitymaps",
            "--carbon.zone=DE",
            "--state.file=",
        ],
        env=environ | {f"{ENV}_FILE": str(path)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"{ENV}_FILE" in line and str(path) in line, line
    assert "Traceback" not in done.stderr


def test_a_token_file_replaced_by_a_fifo_after_the_start_is_an_error_not_a_hang(
    tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    path.write_text("secret-token\n")
    secret = Secret.from_env({f"{ENV}_FILE": str(path)}, ENV)
    assert secret is not None and secret.get() == "secret-token"
    path.unlink()
    os.mkfifo(path)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            secret.get()
        except ProviderError as err:
            errors.append(err)

    reader = threading.Thread(target=read, daemon=True)  # a hang must fail, not hang
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading the token hangs on the FIFO"
    [error] = errors
    assert "is a FIFO, not a regular file" in str(error)
