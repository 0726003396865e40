"""Restarts: the state file, the node lock, the saved document and what a gap vouches for."""
