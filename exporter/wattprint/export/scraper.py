"""Who is scraping, for the length of one request: the HTTP layer (server.py) sets it
around each scrape, the collector reads it to give each scraper the first 0 of a new
series. Neither imports the other; this is all they share."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar

SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"
MAX_PRODUCT_CHARS = 64

# A scraper's identity (server.py says what makes a scraper), or None for any other
# client, which gets the plain values and changes nothing. Callers of the registry
# itself (the default "") count as one anonymous scraper.
SCRAPER: ContextVar[str | None] = ContextVar("wattprint_scraper", default="")

# A job meter's fresh reading (/metrics?fresh from a client that is no scraper): served
# the sample as taken, saved or not. While the state cannot be saved, scrapers get the
# counters of the last save, held still (sampler/loop.py); a tracker's start and stop
# readings, whose difference is its job's share, must not stand still with them.
LIVE: ContextVar[bool] = ContextVar("wattprint_live", default=False)


def scraper_identity(address: str, headers: Mapping[str, str]) -> str | None:
    """Who is scraping, for the collector's first 0 of each new series; None for a
    client that is not a scraper. `headers` looks names up case-insensitively (Headers).

    Prometheus and the scrapers built like it (vmagent, Grafana Agent, the OpenTelemetry
    Collector's Prometheus receiver) send X-Prometheus-Scrape-Timeout-Seconds with every
    scrape; a person's curl, a health probe or a browser does not, and must not take a
    0 that Prometheus needs. Scrapers are told apart by address and by the product in
    their User-Agent (not its version, which an upgrade changes), so that Prometheus
    and vmagent on one host each get theirs, and the two replicas of an HA pair too.
    """
    if SCRAPE_TIMEOUT_HEADER not in headers:
        return None
    product = headers.get("User-Agent", "").split("/", 1)[0].strip()
    return f"{address} {product[:MAX_PRODUCT_CHARS]}"
