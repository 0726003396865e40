"""What a release publishes is what the chart installs, and where alerts link to.

.github/workflows/release.yml pushes the image on a tag; the Helm chart's default image
must be exactly that image, or every default install ends in ImagePullBackOff. Every
alert's runbook_url is one configurable base plus the alert's anchor in
docs/runbooks.md, the same default in the rules, the generator and the chart.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import wattprint
from test_helm import CHART, _rule_groups, exporter, objects, render
from test_rules import REPO, gen, github_anchor

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
ALERTS = REPO / "rules" / "alerts.rules.yml"


def _workflow() -> dict[Any, Any]:
    doc: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return doc


def _step(job: str, uses: str | None = None, step_id: str | None = None) -> list[dict[str, Any]]:
    steps = _workflow()["jobs"][job]["steps"]
    return [
        s
        for s in steps
        if (uses is None or s.get("uses", "").startswith(uses))
        and (step_id is None or s.get("id") == step_id)
    ]


def _chart_yaml() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return doc


def test_chart_default_image_is_the_one_the_release_workflow_pushes() -> None:
    workflow = _workflow()
    image = workflow["env"]["IMAGE"]
    # YAML 1.1 reads the key `on` as True.
    assert workflow[True]["push"]["tags"] == ["v*"]
    pushes = [s for s in _step("image", "docker/build-push-action") if s["with"].get("push")]
    assert len(pushes) == 1
    push = pushes[0]["with"]
    assert push["tags"] == "${{ env.IMAGE }}:${{ env.VERSION }}"
    assert set(push["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert workflow["jobs"]["image"]["env"]["VERSION"] == "${{ needs.version.outputs.version }}"

    version = _chart_yaml()["appVersion"]
    assert version == wattprint.__version__
    assert exporter(objects("defaults"))["image"] == f"{image}:{version}"


def _version_gate(tag: str, tmp_path: Path) -> tuple[int, str]:
    """Run the workflow's version step as Actions would on `tag`."""
    (step,) = _step("version", step_id="check")
    output = tmp_path / "github_output"
    output.write_text("")
    env = {**os.environ, "GITHUB_REF_NAME": tag, "GITHUB_OUTPUT": str(output)}
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, output.read_text() + done.stdout


def test_release_tag_must_match_the_package_and_chart_versions(tmp_path: Path) -> None:
    version = wattprint.__version__
    assert _version_gate(f"v{version}", tmp_path) == (0, f"version={version}\n")
    code, said = _version_gate(f"v{version}.1", tmp_path)
    assert code == 1
    assert f"package {version} and chart appVersion {version} differ" in said


def test_notes_name_the_published_image_and_how_to_build_one(tmp_path: Path) -> None:
    _, notes = render({})
    image = _workflow()["env"]["IMAGE"]
    assert f"Image: {image}:{wattprint.__version__}" in notes
    assert f"publishes {image}:<version>" in notes
    assert f"scripts/build-image registry.example.com/wattprint:{wattprint.__version__}" in notes


def _ci() -> dict[Any, Any]:
    doc: dict[Any, Any] = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    return doc


def test_ci_runs_the_suite_on_every_push_and_pull_request() -> None:
    ci = _ci()
    # YAML 1.1 reads the key `on` as True.
    assert {"push", "pull_request", "workflow_call"} <= set(ci[True])
    assert ci[True]["push"] in (None, {"branches": ["**"]})
    (job,) = ci["jobs"].values()
    assert [s["run"] for s in job["steps"] if s.get("run", "").strip() == ".ci/run"]
    assert job["container"]["image"].startswith("debian:12")
    assert (REPO / ".ci" / "run").stat().st_mode & 0o111


def test_nothing_is_published_before_the_suite_passes() -> None:
    jobs = _workflow()["jobs"]
    assert jobs["test"]["uses"] == "./.github/workflows/ci.yml"
    publishing = [
        name
        for name, job in jobs.items()
        if any(
            s.get("uses", "").startswith("pypa/gh-action-pypi-publish")
            or (s.get("uses", "").startswith("docker/build-push-action") and s["with"].get("push"))
            for s in job.get("steps", [])
        )
    ]
    assert sorted(publishing) == ["image", "pypi"]
    for name in publishing:
        needs = jobs[name]["needs"]
        assert "test" in ([needs] if isinstance(needs, str) else needs), name


def _runbook_urls(groups: list[dict[str, Any]]) -> dict[str, str]:
    return {
        r["alert"]: r["annotations"]["runbook_url"]
        for g in groups
        for r in g["rules"]
        if "alert" in r
    }


# Every alert of the file has a runbook_url (counted from the text, not the YAML).
ALERT_COUNT = len(re.findall(r"^\s*- alert: ", ALERTS.read_text(), re.MULTILINE))


def _chart_default_base() -> str:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    base: str = values["prometheusRule"]["runbookBaseURL"]
    return base


def test_one_runbook_base_by_default_the_repository_docs() -> None:
    base = gen.RUNBOOK_BASE
    assert _chart_default_base() == base
    urls = _runbook_urls(yaml.safe_load(ALERTS.read_text())["groups"])
    assert len(urls) == ALERT_COUNT
    assert urls == {name: f"{base}#{name.lower()}" for name in urls}
    # The docs of the repository the release workflow publishes the image from.
    repo = re.fullmatch(r"https://github\.com/([^/]+/[^/]+)/blob/main/docs/runbooks\.md", base)
    assert repo is not None, base
    assert _workflow()["env"]["IMAGE"] == f"ghcr.io/{repo.group(1)}"


def test_systemd_unit_documentation_is_a_section_of_the_repository_docs() -> None:
    unit = (REPO / "deploy" / "wattprint.service").read_text()
    (url,) = re.findall(r"^Documentation=(\S+)$", unit, re.MULTILINE)
    docs_base = gen.RUNBOOK_BASE.removesuffix("/runbooks.md")
    page, _, anchor = url.partition("#")
    assert page.startswith(docs_base + "/"), url
    headings = (REPO / "docs" / page.removeprefix(docs_base + "/")).read_text().splitlines()
    assert anchor in {github_anchor(h.lstrip("#")) for h in headings if h.startswith("#")}


def test_chart_links_every_alert_to_the_configured_base() -> None:
    base = "https://wiki.example.com/ops/wattprint-runbooks"
    docs, _ = render({"prometheusRule": {"enabled": True, "runbookBaseURL": base}})
    urls = _runbook_urls(_rule_groups(docs))
    assert len(urls) == ALERT_COUNT
    assert urls == {name: f"{base}#{name.lower()}" for name in urls}


def test_chart_rejects_a_runbook_base_with_an_anchor() -> None:
    with pytest.raises(Exception, match="runbookBaseURL"):
        render({"prometheusRule": {"enabled": True, "runbookBaseURL": "https://x/r.md#a"}})


def test_generator_writes_the_alerts_with_another_base(tmp_path: Path) -> None:
    base = "https://wiki.example.com/ops/wattprint-runbooks"
    out = tmp_path / "alerts.rules.yml"
    assert gen.main(["--alerts", str(ALERTS), "--runbook-base", base, "-o", str(out)]) == 0
    written, original = out.read_text(), ALERTS.read_text()
    urls = _runbook_urls(yaml.safe_load(written)["groups"])
    assert urls == {name: f"{base}#{name.lower()}" for name in urls}
    # Only the runbook lines change: comments, order and expressions stay as they were.
    changed = [
        (a, b) for a, b in zip(original.splitlines(), written.splitlines(), strict=True) if a != b
    ]
    assert len(changed) == ALERT_COUNT
    assert all(b.strip().startswith("runbook_url: ") for _, b in changed)
    # The default base gives the file back unchanged.
    assert gen.main(["--alerts", str(ALERTS), "-o", str(out)]) == 0
    assert out.read_text() == original


def test_generator_rejects_a_bad_runbook_base_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert gen.main(["--alerts", str(ALERTS), "--runbook-base", "wiki#runbooks"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "gen_budget_rules: runbook base 'wiki#runbooks' is not an http(s) URL without a #fragment\n"
    )


def test_chart_readme_says_how_to_build_the_image_of_its_version() -> None:
    readme = (CHART / "README.md").read_text()
    version = _chart_yaml()["appVersion"]
    assert f"`{_workflow()['env']['IMAGE']}:<appVersion>`" in readme
    assert f"scripts/build-image <your registry>/wattprint:{version} " in readme
    assert (REPO / "scripts" / "build-image").exists()
