"""Device reading: each energy source, its registry, and the counters that keep it monotonic."""

# Importing the package registers the built-in sources, as node_exporter's collectors
# register from init(): the registry itself imports no source.
from wattprint.sources import catalog as catalog
