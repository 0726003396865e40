from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

REPO = TESTS.parent
SHARED = REPO.parent / "shared"
TRACE = SHARED / "fixtures" / "h200" / "phased-load.jsonl"


def require_tool(name: str) -> str:
    """The path of a tool the test needs: skip without it locally, fail under CI=true."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def trace_path() -> Path:
    if not TRACE.exists():
        pytest.fail(f"fixture trace missing: {TRACE} (../shared must sit beside the repo)")
    return TRACE
