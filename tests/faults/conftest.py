"""Fixtures of the fault-injection suite (see faultrig.py)."""

from .faultrig import node_fixture, rig_factory_fixture

__all__ = ["node_fixture", "rig_factory_fixture"]
