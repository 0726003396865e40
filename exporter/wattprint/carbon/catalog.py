"""The built-in carbon-intensity providers, registered once each.

A new provider is a module under carbon/ plus one register_provider() call here: its
name becomes a --carbon.provider choice, and its secrets join the chart's env list.
The flags' choices read this list at start-up, so the providers themselves (and
carbon.base, with its HTTP client) load only in the factories.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from wattprint.carbon.registry import (
    SIGNAL_AVERAGE,
    SIGNAL_MARGINAL,
    ProviderContext,
    ProviderSpec,
    register_provider,
)

if TYPE_CHECKING:
    from wattprint.carbon.base import Provider, Secret

log = logging.getLogger("wattprint.carbon")

TOKEN_ENV = "WATTPRINT_CARBON_TOKEN"
WATTTIME_USER_ENV = "WATTPRINT_WATTTIME_USERNAME"
WATTTIME_PASSWORD_ENV = "WATTPRINT_WATTTIME_PASSWORD"


def secret(ctx: ProviderContext, name: str) -> Secret:
    from wattprint.carbon.base import CarbonConfigError, Secret

    found = Secret.from_env(ctx.environ, name)
    if found is None:
        raise CarbonConfigError(f"carbon provider {ctx.name} needs {name} or {name}_FILE")
    return found


def _static(ctx: ProviderContext) -> None:
    return None


def _electricitymaps(ctx: ProviderContext) -> Provider:
    from wattprint.carbon import embedded
    from wattprint.carbon.base import CarbonConfigError
    from wattprint.carbon.electricitymaps import ElectricityMaps

    em_zone = (ctx.region or ctx.zone).upper()
    data = embedded.dataset()
    # Electricity Maps names countries by alpha-2; accept the alpha-3 we accept.
    alpha3_to_2 = {a3: a2 for a2, a3 in data.alpha2_to_3.items()}
    em_zone = alpha3_to_2.get(em_zone.upper(), em_zone)
    if em_zone.startswith("GCP:") or em_zone == "WORLD":
        raise CarbonConfigError(
            f"carbon zone {em_zone} is not an Electricity Maps zone: set the provider "
            "region to one (e.g. DE, US-CAL-CISO)"
        )
    return ElectricityMaps(em_zone, secret(ctx, TOKEN_ENV), ctx.http, ctx.api_url)


def _watttime(ctx: ProviderContext) -> Provider:
    from wattprint.carbon.base import CarbonConfigError
    from wattprint.carbon.watttime import WattTime

    if not ctx.region:
        raise CarbonConfigError(
            "carbon provider watttime needs a provider region (e.g. CAISO_NORTH)"
        )
    user = secret(ctx, WATTTIME_USER_ENV)
    password = secret(ctx, WATTTIME_PASSWORD_ENV)
    return WattTime(ctx.region, user, password, ctx.http, ctx.api_url)


def _uk_grid(ctx: ProviderContext) -> Provider:
    from wattprint.carbon.base import CarbonConfigError
    from wattprint.carbon.ukgrid import REGION_IDS, UkGrid

    region_id: int | None = None
    if ctx.region:
        try:
            region_id = int(ctx.region)
        except ValueError:
            region_id = -1
        if region_id not in REGION_IDS:
            raise CarbonConfigError(
                f"carbon provider region {ctx.region!r} for uk-grid must be a "
                "region id 1-18 (empty for national)"
            )
    if ctx.zone_key not in ("GBR", "gcp:europe-west2"):
        log.warning(
            "carbon zone %s is not Great Britain: its embedded default stands in for the "
            "UK grid when uk-grid fails; set the carbon zone to GB",
            ctx.zone,
        )
    return UkGrid(region_id, ctx.http, ctx.api_url)


register_provider(
    ProviderSpec(
        "static",
        _static,
        "the embedded yearly average of the zone; offline",
        live=False,  # its citation is the embedded dataset's, named by the zone
    )
)
register_provider(
    ProviderSpec(
        "electricitymaps",
        _electricitymaps,
        "Electricity Maps live carbon intensity (zone, or region as an Electricity Maps zone)",
        secrets=(TOKEN_ENV,),
        region="optional",
        citation="Electricity Maps API, lifecycle average intensity",
    )
)
register_provider(
    ProviderSpec(
        "watttime",
        _watttime,
        "WattTime average and marginal intensity of a balancing authority",
        secrets=(WATTTIME_USER_ENV, WATTTIME_PASSWORD_ENV),
        region="required",
        signals=(SIGNAL_AVERAGE, SIGNAL_MARGINAL),
        citation="WattTime API, marginal (MOER)",
    )
)
register_provider(
    ProviderSpec(
        "uk-grid",
        _uk_grid,
        "National Grid ESO carbon intensity of Great Britain, with its forecast; no key",
        default_zone="GB",
        region="optional",
        citation="NESO Carbon Intensity API (carbonintensity.org.uk), direct emissions, CC BY 4.0",
    )
)
