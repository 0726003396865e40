"""Wattprint: per-node energy and carbon exporter for GPU clusters."""

__version__ = "0.1.0"
