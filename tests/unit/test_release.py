"""One version everywhere: ``pyproject.toml``'s is the package's, the newest CHANGELOG release's, the image tag's in
the Helm values and every wheel or image name the docs tell someone to type (the release tag:
tests/package/test_release_tag.py).

A release bump that forgets one of them (a quickstart still installing the old wheel, an image tag the values never
pull) fails here, before anyone follows the docs."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import promshift

REPO = Path(__file__).resolve().parents[2]
VERSION_RE = r"\d+\.\d+\.\d+"


def version() -> str:
    found = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert found, "pyproject.toml has no version"
    return found.group(1)


def test_the_package_the_changelog_and_the_values_name_one_version() -> None:
    ours = version()
    assert promshift.__version__ == ours
    changelog = (REPO / "CHANGELOG.md").read_text()
    releases = re.findall(rf"^## ({VERSION_RE})\b", changelog, re.M)
    assert releases and releases[0] == ours, f"the newest CHANGELOG release is {releases[:1]}, the package {ours}"
    assert len(set(releases)) == len(releases), "a version released twice"
    # Unreleased, if any, comes before every release
    headings = re.findall(r"^## (\S+)", changelog, re.M)
    assert "Unreleased" not in headings[1:], headings
    values = yaml.safe_load((REPO / "deploy/helm/values.yaml").read_text())
    assert values["defaultAirflowTag"].split("-airflow")[0] == ours


def test_every_wheel_and_image_the_docs_and_deploy_files_name_is_this_version() -> None:
    ours = version()
    named: dict[str, set[str]] = {}
    deploy = [p for p in sorted((REPO / "deploy").rglob("*")) if p.suffix in (".md", ".txt", ".yaml", ".yml")]
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *deploy]:
        text = path.read_text()
        for found in re.findall(rf"promshift-({VERSION_RE})-py3-none-any\.whl", text) + re.findall(
                rf"promshift:({VERSION_RE})-airflow", text):
            named.setdefault(found, set()).add(str(path.relative_to(REPO)))
    assert named, "the docs name no wheel or image of promshift"
    assert set(named) == {ours}, {v: sorted(f) for v, f in named.items() if v != ours}

