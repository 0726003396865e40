"""Wattprint: per-node energy and carbon exporter for GPU clusters."""

__version__ = "0.1.0"


def track(*args: object, **kwargs: object) -> object:
    """wattprint.track(): see wattprint.track.track (imported on first use)."""
    from .track import track as _track

    return _track(*args, **kwargs)  # type: ignore[arg-type]
