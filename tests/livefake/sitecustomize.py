"""Put on PYTHONPATH by tests/test_run.py and tests/test_track.py: every Python process
of the test (wattprint run, trackers' samplers) sees the live fake NVML (livenvml.py)
instead of a driver."""

import os
import sys

if os.environ.get("WATTPRINT_TEST_NVML_DIR"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import livenvml

    livenvml.install()
