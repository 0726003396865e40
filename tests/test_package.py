"""The package as it would be published: `python -m build` gives an sdist and a wheel
that `twine check` passes, and the wheel alone, installed into a clean virtual
environment, runs `wattprint --version`, `doctor` and `report --help` with its carbon
datasets and their licences, and carries nothing from tests/."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from wattprint._version import __version__

REPO = Path(__file__).resolve().parents[1]
DATA = "wattprint/carbon/data/"

pytestmark = pytest.mark.slow


def run(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # Nothing from this checkout or its venv may leak into what runs.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WATTPRINT_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    env["WATTPRINT_STATE_FILE"] = ""  # never the machine's /var/lib/wattprint
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, REPO, cwd=out)
    yield out


def test_build_gives_an_sdist_and_a_wheel_that_twine_accepts(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    assert names == [
        f"wattprint-{__version__}-py3-none-any.whl",
        f"wattprint-{__version__}.tar.gz",
    ]
    result = run(sys.executable, "-m", "twine", "check", "--strict", *dist.iterdir(), cwd=dist)
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_wheel_carries_the_datasets_and_licences_and_nothing_from_tests(dist: Path) -> None:
    [wheel] = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in (
        "owid-carbon-intensity-electricity.csv",
        "gcp-region-carbon-2024.csv",
        "iso3166-1-alpha2-alpha3.csv",
        "README.md",  # the datasets' sources, attribution and licences
        "LICENSE-Apache-2.0",  # the GCP dataset's licence, which must travel with it
    ):
        assert DATA + data in names
    info = f"wattprint-{__version__}.dist-info/"
    assert info + "licenses/LICENSE" in names
    readme = zipfile.ZipFile(wheel).read(DATA + "README.md").decode()
    assert "CC BY 4.0" in readme and "Apache License 2.0" in readme
    assert all(n.startswith(("wattprint/", info)) for n in names), sorted(names)
    assert not [n for n in names if "test" in n.lower() or "fixture" in n.lower()]


def test_the_wheel_alone_runs_in_a_clean_venv(dist: Path, tmp_path: Path) -> None:
    [wheel] = dist.glob("*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python, wattprint = venv / "bin" / "python", venv / "bin" / "wattprint"
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, cwd=tmp_path)

    where = run(python, "-c", "import wattprint; print(wattprint.__file__)", cwd=tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout
    assert run(wattprint, "--version", cwd=tmp_path).stdout.strip() == f"wattprint {__version__}"
    # The embedded datasets answer for DE: they were installed with the code.
    doctor = run(wattprint, "doctor", "--carbon.zone=DE", "--gpu.source=none", cwd=tmp_path)
    assert "Devices:" in doctor.stdout, doctor.stdout
    assert "carbon zone DE: embedded default" in doctor.stdout, doctor.stdout
    assert "(Germany, 2024 average, OWID/Ember, CC BY 4.0)" in doctor.stdout
    help_text = run(wattprint, "report", "--help", cwd=tmp_path).stdout
    assert "--prometheus.url" in help_text and "codecarbon-csv" in help_text
    # psutil is for the tests only; the exporter reads /proc itself.
    missing = subprocess.run([python, "-c", "import psutil"], capture_output=True, timeout=60)
    assert missing.returncode != 0
