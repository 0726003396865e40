"""The embedded default: yearly grid intensity per country (OWID/Ember) and per Google
Cloud region, shipped as package data so that emissions work offline and without a key.

Zones: an ISO 3166-1 code (DE or DEU, any case), gcp:<region>, WORLD (OWID's world row,
only when asked for by name), or an Electricity Maps sub-zone such as US-CAL-CISO, which
takes its country's average. Each zone uses its latest year in the data.
"""

from __future__ import annotations

import calendar
import csv
import difflib
import functools
import io
import re
from dataclasses import dataclass

from wattprint.carbon.base import PROVIDER_STATIC, UnknownZoneError
from wattprint.carbon.registry import SIGNAL_AVERAGE
from wattprint.core.model import Intensity

OWID_FILE = "owid-carbon-intensity-electricity.csv"
GCP_FILE = "gcp-region-carbon-2024.csv"
ISO_FILE = "iso3166-1-alpha2-alpha3.csv"
GCP_YEAR = 2024
OWID_SOURCE = "OWID/Ember, CC BY 4.0"
GCP_SOURCE = "Google Cloud region-carbon-info, Apache-2.0"

# Kosovo has no ISO code; OWID files it under its own, everyone else uses XK/XKX.
_KOSOVO = {"XK": "OWID_KOS", "XKX": "OWID_KOS"}
_WORLD = "OWID_WRL"
# Codes people type that are not ISO's: a hint in the error, never accepted.
_COMMON_MISTAKES = {"UK": "GB", "EL": "GR"}
_SUBZONE = re.compile(r"([A-Z]{2})-[A-Z0-9][A-Z0-9-]*")


@dataclass(frozen=True)
class EmbeddedEntry:
    """One zone's yearly average in the embedded data, with where it comes from."""

    key: str  # OWID code ("DEU", "OWID_WRL") or "gcp:<region>"
    name: str  # "Germany", "Frankfurt"
    grams_per_kwh: float
    year: int
    source: str
    note: str = ""  # how the zone was mapped, when not literally

    def intensity(self, zone: str) -> Intensity:
        return Intensity(
            zone=zone,
            provider=PROVIDER_STATIC,
            signal=SIGNAL_AVERAGE,
            grams_per_kwh=self.grams_per_kwh,
            timestamp=float(calendar.timegm((self.year, 1, 1, 0, 0, 0))),
            year=self.year,
        )

    def describe(self) -> str:
        text = f"{self.name}, {self.year} average, {self.source}"
        return f"{text}; {self.note}" if self.note else text


class EmbeddedDataset:
    """The embedded CSVs parsed: finds the entry for a zone, or suggests the zones it may mean."""

    def __init__(self, owid_csv: str, gcp_csv: str, iso_csv: str) -> None:
        iso = csv.DictReader(io.StringIO(iso_csv))
        self.alpha2_to_3 = {row["alpha_2"]: row["alpha_3"] for row in iso}
        self.alpha3 = frozenset(self.alpha2_to_3.values())
        self.countries: dict[str, EmbeddedEntry] = {}
        reader = csv.reader(io.StringIO(owid_csv))
        next(reader)  # Entity,Code,Year,<value column>
        for entity, code, year_text, value in reader:
            # Rows without a code are aggregates (continents, income groups, Ember groups).
            if not code or not value:
                continue
            year = int(year_text)
            known = self.countries.get(code)
            if known is None or year > known.year:
                self.countries[code] = EmbeddedEntry(code, entity, float(value), year, OWID_SOURCE)
        self.gcp: dict[str, EmbeddedEntry] = {}
        for row in csv.DictReader(io.StringIO(gcp_csv)):
            key = "gcp:" + row["Google Cloud Region"].strip()
            self.gcp[key] = EmbeddedEntry(
                key,
                row["Location"].strip(),
                float(row["Grid carbon intensity (gCO2eq / kWh)"]),
                GCP_YEAR,
                GCP_SOURCE,
            )

    def lookup(self, zone: str) -> EmbeddedEntry:
        """The entry for a zone, or UnknownZoneError naming it with close matches."""
        text = zone.strip()
        upper = text.upper()
        if upper.startswith("GCP:"):
            key = "gcp:" + text[4:].strip().lower()
            if key in self.gcp:
                return self.gcp[key]
            raise UnknownZoneError(self._unknown(text, "no such Google Cloud region in the data"))
        if upper == "WORLD":
            return self.countries[_WORLD]
        code = self._owid_code(upper)
        if code is not None:
            if code in self.countries:
                return self.countries[code]
            raise UnknownZoneError(self._unknown(text, f"{code} has no value in the OWID data"))
        sub = _SUBZONE.fullmatch(upper)
        if sub:
            code = self._owid_code(sub.group(1))
            if code is not None and code in self.countries:
                entry = self.countries[code]
                note = f"country average used for sub-zone {upper}"
                return EmbeddedEntry(
                    entry.key, entry.name, entry.grams_per_kwh, entry.year, entry.source, note
                )
        raise UnknownZoneError(self._unknown(text, "not a known zone"))

    def canonical(self, zone: str) -> str:
        """The zone as it is labelled: codes upper case, GCP regions lower case."""
        text = zone.strip()
        if text.upper().startswith("GCP:"):
            return "gcp:" + text[4:].strip().lower()
        return text.upper()

    def _owid_code(self, upper: str) -> str | None:
        if upper in _KOSOVO:
            return _KOSOVO[upper]
        if len(upper) == 2 and upper in self.alpha2_to_3:
            return self.alpha2_to_3[upper]
        if len(upper) == 3 and upper in self.alpha3:
            return upper
        return None

    def _unknown(self, zone: str, why: str) -> str:
        suggestions = self.suggest(zone)
        hint = f" Did you mean {', '.join(suggestions)}?" if suggestions else ""
        return (
            f"unknown carbon zone {zone!r} ({why}).{hint} Zones are ISO 3166-1 codes "
            "(DE, DEU), gcp:<region> (gcp:europe-west3) or WORLD."
        )

    def suggest(self, zone: str, limit: int = 4) -> list[str]:
        text = zone.strip()
        upper = text.upper()
        found: list[str] = []
        if upper in _COMMON_MISTAKES:
            found.append(self._label(_COMMON_MISTAKES[upper]))
        if upper.startswith("GCP:"):
            key = "gcp:" + text[4:].strip().lower()
            found += difflib.get_close_matches(key, list(self.gcp), n=limit, cutoff=0.6)
            return found[:limit]
        # A country's name ("Germany", "germny") points at its code.
        names = {e.name.lower(): code for code, e in self._alpha2_with_data().items()}
        for name in difflib.get_close_matches(text.lower(), list(names), n=limit, cutoff=0.75):
            found.append(self._label(names[name]))
        if 0 < len(upper) <= 4:
            codes = list(self._alpha2_with_data())
            codes += [c for c in self.countries if c in self.alpha3]
            ratio = {c: difflib.SequenceMatcher(None, upper, c).ratio() for c in codes}
            # Among equally close codes, a typo keeps the first letter more often than
            # not: DX is DE before TD.
            close = sorted(
                (c for c in codes if ratio[c] >= 0.5),
                key=lambda c: (-ratio[c], not c.startswith(upper[0]), c),
            )
            found += [self._label(code) for code in close[:limit]]
        elif difflib.SequenceMatcher(None, upper, "WORLD").ratio() >= 0.6:
            found.append("WORLD")
        # Someone who typed a GCP region without the prefix.
        found += difflib.get_close_matches("gcp:" + text.lower(), list(self.gcp), n=2, cutoff=0.8)
        return list(dict.fromkeys(found))[:limit]

    def _alpha2_with_data(self) -> dict[str, EmbeddedEntry]:
        pairs = self.alpha2_to_3.items()
        return {a2: self.countries[a3] for a2, a3 in pairs if a3 in self.countries}

    def _label(self, code: str) -> str:
        entry = self.countries.get(self.alpha2_to_3.get(code, code))
        return f"{code} ({entry.name})" if entry and code != "WORLD" else code

    def zones(self) -> list[str]:
        """Every zone the dataset answers for, by its shortest name."""
        return [*sorted(self._alpha2_with_data()), "WORLD", *sorted(self.gcp)]


def _read(name: str) -> str:
    # importlib.resources pulls in tempfile, shutil and random: loaded when the dataset
    # is first read, not with every import of the carbon package.
    from importlib import resources

    data = resources.files("wattprint.carbon").joinpath("data")
    return data.joinpath(name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def dataset() -> EmbeddedDataset:
    return EmbeddedDataset(_read(OWID_FILE), _read(GCP_FILE), _read(ISO_FILE))


def lookup(zone: str) -> Intensity:
    """The embedded intensity for a zone, labelled with the zone in canonical form."""
    data = dataset()
    return data.lookup(zone).intensity(data.canonical(zone))
