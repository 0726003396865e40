"""Plain data shared by every stage: the snapshot, its value types, units, the background thread."""
