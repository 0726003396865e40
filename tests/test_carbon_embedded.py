"""The embedded default: OWID per country, Google Cloud per region, latest year, and a
startup error with suggestions for a zone it does not know."""

from __future__ import annotations

import calendar
import csv
import io
import math
from importlib import resources

import pytest

from wattprint.carbon.base import UnknownZoneError
from wattprint.carbon.embedded import dataset, lookup


def _data(name: str) -> str:
    return resources.files("wattprint.carbon").joinpath("data").joinpath(name).read_text("utf-8")


def _owid_latest() -> dict[str, tuple[int, float]]:
    """Latest (year, value) per OWID code, read straight from the shipped CSV."""
    latest: dict[str, tuple[int, float]] = {}
    for row in csv.DictReader(io.StringIO(_data("owid-carbon-intensity-electricity.csv"))):
        code, year = row["Code"], int(row["Year"])
        if code and (code not in latest or year > latest[code][0]):
            latest[code] = (year, float(row["Carbon intensity of electricity - gCO2/kWh"]))
    return latest


def test_de_and_deu_give_the_same_latest_year_value() -> None:
    year, value = _owid_latest()["DEU"]
    de, deu = lookup("DE"), lookup("DEU")
    assert de.grams_per_kwh == deu.grams_per_kwh == value
    assert de.year == deu.year == year
    assert (de.zone, deu.zone) == ("DE", "DEU")
    assert (de.provider, de.signal) == ("static", "average")
    assert lookup("de") == de  # case does not matter; the label is upper case


def test_every_alpha2_code_matches_its_alpha3_row() -> None:
    latest = _owid_latest()
    data = dataset()
    checked = 0
    for alpha2, alpha3 in data.alpha2_to_3.items():
        if alpha3 not in latest:
            continue
        year, value = latest[alpha3]
        assert lookup(alpha2).grams_per_kwh == lookup(alpha3).grams_per_kwh == value
        assert lookup(alpha2).year == year
        checked += 1
    assert checked > 200  # OWID covers the world's grids, not a handful


def test_gcp_europe_west3() -> None:
    rows = csv.DictReader(io.StringIO(_data("gcp-region-carbon-2024.csv")))
    by_region = {
        r["Google Cloud Region"]: float(r["Grid carbon intensity (gCO2eq / kWh)"]) for r in rows
    }
    value = lookup("gcp:europe-west3")
    assert value.grams_per_kwh == by_region["europe-west3"] == 275.82
    assert value.year == 2024
    assert value.zone == "gcp:europe-west3"


def test_timestamp_is_start_of_the_dataset_year() -> None:
    value = lookup("FR")
    assert value.year is not None
    assert value.timestamp == calendar.timegm((value.year, 1, 1, 0, 0, 0))


def test_world_only_when_asked_for() -> None:
    year, value = _owid_latest()["OWID_WRL"]
    world = lookup("WORLD")
    assert (world.grams_per_kwh, world.year) == (value, year)
    with pytest.raises(UnknownZoneError):
        lookup("ZZ")


@pytest.mark.parametrize(
    ("zone", "suggestion"),
    [
        ("DX", "DE (Germany)"),
        ("UK", "GB (United Kingdom)"),
        ("Germny", "DE (Germany)"),
        ("FRR", "FR (France)"),
        ("gcp:europe-west33", "gcp:europe-west3"),
        ("europe-west3", "gcp:europe-west3"),
    ],
)
def test_unknown_zone_names_it_and_suggests(zone: str, suggestion: str) -> None:
    with pytest.raises(UnknownZoneError) as err:
        lookup(zone)
    message = str(err.value)
    assert repr(zone) in message
    assert suggestion in message
    assert "\n" not in message


@pytest.mark.parametrize("zone", ["XX", "QQQ", "OWID_WRL", "", "Europe", "gcp:mars-north1"])
def test_only_real_codes_are_accepted(zone: str) -> None:
    with pytest.raises(UnknownZoneError):
        lookup(zone)


def test_real_code_without_data_is_reported_as_such() -> None:
    with pytest.raises(UnknownZoneError, match=r"'AQ'.*ATA has no value"):
        lookup("AQ")


def test_electricity_maps_subzone_uses_its_country_average() -> None:
    sub = lookup("US-CAL-CISO")
    assert sub.grams_per_kwh == lookup("US").grams_per_kwh
    assert sub.zone == "US-CAL-CISO"
    assert "sub-zone" in dataset().lookup("US-CAL-CISO").describe()


def test_kosovo_by_its_common_code() -> None:
    assert lookup("XK").grams_per_kwh == _owid_latest()["OWID_KOS"][1]


def test_values_are_plausible_and_attributed() -> None:
    data = dataset()
    for zone in data.zones():
        value = lookup(zone)
        assert math.isfinite(value.grams_per_kwh) and 0 <= value.grams_per_kwh < 2000
        assert value.year is not None and value.year >= 2000
    notice = _data("README.md")
    assert "CC BY 4.0" in notice and "Apache" in notice and "Our World in Data" in notice
