"""One list of sources and carbon providers: flag choices, --help, doctor, the Helm
schema, the chart's secret env, the docs and the `estimated` label all follow it.

A fake source and a fake provider, registered through the registry alone, show up in
each of those places: adding one needs no other file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from wattprint.app import build_exporter
from wattprint.carbon import registry as carbon_registry
from wattprint.carbon.registry import ProviderContext, ProviderSpec
from wattprint.cli import main as cli
from wattprint.cli.doctor import diagnose
from wattprint.core.model import DeviceReading, Intensity, SourceResult
from wattprint.sources import registry
from wattprint.sources.registry import Method, SourceContext, SourceSpec

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "helm" / "wattprint" / "values.schema.json"
METRICS_DOC = REPO / "docs" / "metrics.md"
README = (REPO / "README.md").read_text()


def schema_mismatches(schema: dict[str, Any]) -> list[str]:
    """Where the chart's enums and the registry disagree (empty: they agree)."""
    props = schema["properties"]
    enums = {
        "gpu": props["exporter"]["properties"]["gpu"]["properties"]["source"]["enum"],
        "cpu": schema["definitions"]["source"]["enum"],
        "memory": schema["definitions"]["source"]["enum"],
        "platform": props["exporter"]["properties"]["platform"]["properties"]["source"]["enum"],
    }
    problems = []
    for component, enum in enums.items():
        offered = ["auto", *(s.name for s in registry.sources(component) if s.in_chart), "none"]
        if enum != offered:
            problems.append(f"{component} source: schema {enum}, registry {offered}")
    providers = list(carbon_registry.provider_names())
    if props["carbon"]["properties"]["provider"]["enum"] != providers:
        problems.append(f"carbon provider: schema disagrees with registry {providers}")
    return problems


def method_rows() -> list[str]:
    return [
        f"  | `{s.name}` | {', '.join(s.components)} | `{m.name}` | {str(m.estimated).lower()} |"
        for s in registry.sources()
        for m in s.methods
    ]


def documented_method_rows() -> list[str]:
    text = METRICS_DOC.read_text()
    block = re.search(r"<!-- methods:.*?-->\n(.*?)\n *<!-- end methods -->", text, re.S)
    assert block, "docs/metrics.md: the methods table is gone"
    return block.group(1).splitlines()[2:]


# ---- the built-ins agree everywhere ----------------------------------------------


def test_flag_choices_are_the_registered_sources_and_providers() -> None:
    assert registry.source_choices("gpu") == ("auto", "nvml", "amdsmi", "replay", "none")
    assert registry.source_choices("cpu") == ("auto", "rapl", "model", "none")
    assert registry.source_choices("memory") == ("auto", "rapl", "model", "none")
    assert registry.source_choices("platform") == (
        "auto",
        "pm_counters",
        "redfish",
        "ipmi",
        "none",
    )
    assert carbon_registry.provider_names() == ("static", "electricitymaps", "watttime", "uk-grid")


def test_estimated_methods_are_the_models_and_integrated_power() -> None:
    assert registry.estimated_methods() == {
        "model",
        "redfish_power_integrated",
        "ipmi_dcmi_power_integrated",
        "nvml_power_integrated",
        "amdsmi_power_integrated",
    }
    assert registry.measured_methods() == {
        "nvml_energy_counter",
        "amdsmi_energy_counter",
        "rapl",
        "replay",
        "pm_counters",
        "redfish_energy_counter",
    }
    # A method nothing declares is not vouched for: estimated.
    assert registry.is_estimated("something-else")


def test_helm_schema_enums_are_the_registry() -> None:
    assert schema_mismatches(json.loads(SCHEMA.read_text())) == []


def chart_secret_env() -> set[str]:
    """The environment variables the chart fills from the carbon credentials Secret."""
    from test_helm import _secret_env, objects

    return set(_secret_env(objects("existing-secret")))


def test_chart_secret_env_is_every_providers_secrets() -> None:
    assert chart_secret_env() == set(carbon_registry.provider_secrets())


def test_docs_method_table_is_the_registry() -> None:
    assert documented_method_rows() == method_rows()


def test_readme_provider_table_names_each_provider_and_its_secrets() -> None:
    rows = dict(re.findall(r"^\| `([a-z-]+)`(?: \(default\))? \| (.*)$", README, re.M))
    for spec in carbon_registry.providers():
        assert spec.name in rows, f"README: no row for carbon provider {spec.name}"
        for env in spec.secrets:
            assert env in rows[spec.name], (spec.name, env)


def test_a_second_registration_of_a_name_is_refused() -> None:
    nvml = registry.source("nvml", "gpu")
    with pytest.raises(ValueError, match="already registered"):
        registry.register_source(nvml)
    with pytest.raises(ValueError, match="already registered"):
        carbon_registry.register_provider(carbon_registry.provider("static"))


# ---- a fake source and provider, through the registry alone ------------------------


class FakeMeter:
    name = "fake-meter"

    def __init__(self, ctx: SourceContext) -> None:
        self.energy = 0

    def read(self) -> SourceResult:
        self.energy += 5_000_000
        reading = DeviceReading("gpu", "0", self.energy, 5.0, "fake_counter")
        return SourceResult(devices=[reading])

    def explain(self) -> list[str]:
        return ["gpu 0: fake_counter (the fake meter's own counter)"]

    def close(self) -> None:
        pass


class FakeGrid:
    name = "fake-grid"
    signals = ("average",)

    def __init__(self, ctx: ProviderContext) -> None:
        self.zone = ctx.zone
        self.token = ctx.environ.get("FAKE_GRID_TOKEN", "")

    def fetch(self) -> list[Intensity]:
        import time

        return [Intensity(self.zone, self.name, "average", 123.0, time.time() // 3600 * 3600)]

    def describe(self) -> str:
        return "the fake grid"

    def secrets(self) -> list[str]:
        return [self.token]


@pytest.fixture
def fakes() -> Iterator[None]:
    registry.register_source(
        SourceSpec(
            "fake-meter",
            ("gpu",),
            (Method("fake_counter", False, "the fake meter's counter"),),
            FakeMeter,
            "a meter for tests",
        )
    )
    carbon_registry.register_provider(
        ProviderSpec("fake-grid", FakeGrid, "a grid for tests", secrets=("FAKE_GRID_TOKEN",))
    )
    try:
        yield
    finally:
        registry.unregister_source("fake-meter")
        carbon_registry.unregister_provider("fake-grid")
    assert "fake-meter" not in registry.source_choices("gpu")


ARGS = ["--gpu.source=fake-meter", "--carbon.provider=fake-grid", "--carbon.zone=DE"]


def config_of(args: list[str], tmp_path: Path) -> Any:
    environ = {"FAKE_GRID_TOKEN": "t0k3n"}
    flags = [*args, "--cpu.source=none", "--memory.source=none", "--state.file="]
    return cli.load(cli.make_parser().parse_args(flags), environ=environ)


def test_a_fake_source_and_provider_appear_in_help(fakes: None) -> None:
    text = cli.make_parser().format_help()
    assert "--gpu.source auto|nvml|amdsmi|replay|fake-meter|none" in " ".join(text.split())
    assert "static|electricitymaps|watttime|uk-grid|fake-grid" in text


def test_a_fake_source_and_provider_appear_in_doctor(
    fakes: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GRID_TOKEN", "t0k3n")
    text = diagnose(config_of(ARGS, tmp_path))
    assert "gpu 0: fake_counter (the fake meter's own counter)" in text
    assert "fake-meter (gpu): a meter for tests; fake_counter measured" in text
    assert "carbon fake-grid: a grid for tests; needs FAKE_GRID_TOKEN" in text
    assert "carbon provider fake-grid: the fake grid" in text


def test_a_fake_source_and_provider_are_checked_against_the_chart(fakes: None) -> None:
    problems = schema_mismatches(json.loads(SCHEMA.read_text()))
    assert any("fake-meter" in p for p in problems)
    assert any("fake-grid" in p for p in problems)
    assert "FAKE_GRID_TOKEN" in set(carbon_registry.provider_secrets()) - chart_secret_env()


def test_a_fake_source_and_provider_appear_in_metrics(fakes: None, tmp_path: Path) -> None:
    exporter = build_exporter(config_of(ARGS, tmp_path), serve=False)
    try:
        exporter.carbon.poll_once()
        exporter.sampler.sample_once()
        exporter.sampler.sample_once()
        text = exporter.collector.render().decode()
    finally:
        exporter.stop()
    assert (
        'wattprint_measurement_info{component="gpu",device="0",'
        'estimated="false",method="fake_counter"} 1.0'
    ) in text
    assert re.search(r'wattprint_gpu_energy_joules_total\{gpu="0"[^}]*\} [1-9]', text), text
    assert re.search(
        r'wattprint_grid_carbon_intensity_grams_per_kwh\{[^}]*provider="fake-grid"[^}]*\} 123',
        text,
    ), text


def test_an_estimated_fake_method_is_labelled_estimated(fakes: None, tmp_path: Path) -> None:
    registry.register_source(
        SourceSpec(
            "fake-model",
            ("gpu",),
            (Method("fake_guess", True, "a guess"),),
            FakeMeter,
            "a guessing meter",
        )
    )
    try:
        assert registry.is_estimated("fake_guess")
        assert "fake_guess" in registry.estimated_methods()
    finally:
        registry.unregister_source("fake-model")
