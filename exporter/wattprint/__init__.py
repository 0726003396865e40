"""Wattprint: per-node energy and carbon exporter for GPU clusters."""

from wattprint._version import __version__ as __version__


def track(*args: object, **kwargs: object) -> object:
    """wattprint.track(): see wattprint.jobs.track.track (imported on first use)."""
    from wattprint.jobs.track import track as _track

    return _track(*args, **kwargs)  # type: ignore[arg-type]
