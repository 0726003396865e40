"""Who is scraping, for the length of one request: the HTTP layer (server.py) sets it
around each scrape, the collector reads it to give each scraper the first 0 of a new
series. Neither imports the other; this is all they share."""

from __future__ import annotations

from contextvars import ContextVar

# A scraper's identity (server.py says what makes a scraper), or None for any other
# client, which gets the plain values and changes nothing. Callers of the registry
# itself (the default "") count as one anonymous scraper.
SCRAPER: ContextVar[str | None] = ContextVar("wattprint_scraper", default="")

# A job meter's fresh reading (/metrics?fresh from a client that is no scraper): served
# the sample as taken, saved or not. While the state cannot be saved, scrapers get the
# counters of the last save, held still (sampler/loop.py); a tracker's start and stop
# readings, whose difference is its job's share, must not stand still with them.
LIVE: ContextVar[bool] = ContextVar("wattprint_live", default=False)
