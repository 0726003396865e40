"""Wattprint: per-node energy and carbon exporter for GPU clusters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wattprint._version import __version__ as __version__

if TYPE_CHECKING:
    from wattprint.jobs.tracker import Tracker

# codecarbon's names, loaded on first use: the exporter's start-up never loads jobs/.
_CODECARBON = (
    "EmissionsTracker",
    "OfflineEmissionsTracker",
    "track_emissions",
    "track_task_emissions",
    "OutputMethod",
    "EmissionsData",
)


def track(
    workload: str | None = None,
    output_dir: str = ".",
    exporter_url: str | None = None,
    **flags: str,
) -> Tracker:
    """A tracker for this process tree: see wattprint.jobs.tracker.track."""
    from wattprint.jobs.tracker import track as make

    return make(workload, output_dir, exporter_url, **flags)


def __getattr__(name: str) -> Any:
    if name in _CODECARBON:
        from wattprint.jobs import codecarbon_api

        return getattr(codecarbon_api, name)
    raise AttributeError(f"module 'wattprint' has no attribute {name!r}")


__all__ = [
    "EmissionsData",
    "EmissionsTracker",
    "OfflineEmissionsTracker",
    "OutputMethod",
    "__version__",
    "track",
    "track_emissions",
    "track_task_emissions",
]
