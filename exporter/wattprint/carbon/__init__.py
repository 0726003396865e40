"""Grid carbon intensity: the embedded default, live providers, forecasts, and the service."""

# Importing the package registers the built-in providers (see sources/__init__.py).
from wattprint.carbon import catalog as catalog
