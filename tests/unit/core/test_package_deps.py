"""The wheel's declared dependencies against the pins and against what its code imports.

- every range in pyproject.toml (``dependencies`` and the extras) is pinned in requirements.txt, and the pin
  lies in the range: the image installs those pins, so a range that excludes one is a lie;
- every third-party module the production code imports (``include/promshift`` less ``local/``, ``dags/``,
  ``plugins/``) comes from a declared runtime dependency (an ``airflow.providers.X`` import from that provider);
- the lab's packages (requirements-lab.in, and moto/aiosmtpd by name) are neither dependencies of the wheel nor
  pins of the production requirements.txt.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "include" / "promshift"
PRODUCTION = [p for p in sorted(PACKAGE.rglob("*.py")) if "local" not in p.relative_to(PACKAGE).parts[:1]]
PRODUCTION += sorted((REPO / "dags").glob("*.py")) + sorted((REPO / "plugins").glob("*.py"))
LAB_BY_NAME = {"moto", "aiosmtpd"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#]+)")


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def runtime() -> list[Requirement]:
    return [Requirement(r) for r in project()["dependencies"]]


def extras() -> dict[str, list[Requirement]]:
    return {name: [Requirement(r) for r in reqs] for name, reqs in project().get("optional-dependencies", {}).items()}


def pins(text: str) -> dict[str, Version]:
    """``name==version`` lines of a pip-compile'd file, by canonical name."""
    return {canonicalize_name(m[1]): Version(m[2]) for line in text.splitlines() if (m := PIN.match(line))}


def names_in(text: str) -> set[str]:
    """The requirement names of a ``.in`` file (options and comments skipped)."""
    out = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.add(canonicalize_name(Requirement(line).name))
    return out


def range_misses(requirements: list[Requirement], pinned: dict[str, Version]) -> list[str]:
    """Each requirement whose package is unpinned, or whose pin lies outside its range."""
    misses = []
    for req in requirements:
        version = pinned.get(canonicalize_name(req.name))
        if version is None:
            misses.append(f"{req}: not pinned")
        elif not req.specifier.contains(version, prereleases=True):
            misses.append(f"{req}: pinned {version}")
    return misses


def third_party_imports(paths: list[Path]) -> set[str]:
    """Every imported module (dotted, at any depth) that is neither stdlib nor promshift."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    return {m for m in found if m.split(".")[0] not in sys.stdlib_module_names | {"promshift"}}


def undeclared(modules: set[str], declared: list[Requirement]) -> list[str]:
    """The modules no declared distribution provides (``airflow.providers.X`` only by X's provider)."""
    names = {canonicalize_name(r.name) for r in declared}
    dists = packages_distributions()
    missing = []
    for module in sorted(modules):
        parts = module.split(".")
        if parts[:2] == ["airflow", "providers"]:
            ok = any(canonicalize_name("apache-airflow-providers-" + "-".join(parts[2:2 + n])) in names
                     for n in range(1, len(parts) - 1))
        elif parts[0] == "airflow":
            ok = "apache-airflow" in names
        else:
            ok = any(canonicalize_name(d) in names for d in dists.get(parts[0], []))
        if not ok:
            missing.append(module)
    return missing


def test_every_range_holds_its_pin() -> None:
    pinned = pins((REPO / "requirements.txt").read_text())
    declared = runtime() + [r for reqs in extras().values() for r in reqs]
    assert len(declared) > 10
    assert range_misses(declared, pinned) == []


def test_airflow_is_the_3_3_line() -> None:
    (airflow,) = [r for r in extras()["airflow"] if r.name == "apache-airflow"]
    assert airflow.specifier.contains("3.3.2") and not airflow.specifier.contains("3.4.0")
    assert not airflow.specifier.contains("3.2.9")


def test_production_imports_are_declared() -> None:
    """In the base or an extra: the base is the command line (no Airflow), Airflow's side is the ``airflow`` extra
    (tests/package/test_install_lines.py runs the command line with the base alone)."""
    modules = third_party_imports(PRODUCTION)
    assert {"yaml", "re2", "airflow.providers.cncf.kubernetes.hooks.kubernetes"} <= modules
    assert undeclared(modules, runtime() + [r for reqs in extras().values() for r in reqs]) == []


def test_the_base_needs_no_airflow() -> None:
    base = {canonicalize_name(r.name) for r in runtime()}
    assert not {n for n in base if n.startswith("apache-airflow")} and not base & {"fastapi", "kubernetes"}
    airflow = {canonicalize_name(r.name): r for r in extras()["airflow"]}
    assert "s3fs" in airflow["apache-airflow-providers-amazon"].extras
    assert undeclared({"airflow.sdk", "fastapi"}, runtime()) == ["airflow.sdk", "fastapi"]


def test_the_base_repeats_no_ceiling_of_airflow() -> None:
    """promshift's own ranges only: a package Airflow brings and bounds is named without a range of ours."""
    for req in extras()["airflow"]:
        if not canonicalize_name(req.name).startswith("apache-airflow"):
            assert not req.specifier, req


def test_deployment_choices_are_extras_not_dependencies() -> None:
    names = {canonicalize_name(r.name) for r in runtime()}
    assert not names & {"psycopg", "celery", "apache-airflow-providers-celery", "redis"}
    by_extra = {k: {canonicalize_name(r.name) for r in v} for k, v in extras().items()}
    assert by_extra["postgres"] == {"psycopg"}
    assert by_extra["celery"] == {"celery", "apache-airflow-providers-celery"}


def test_the_lab_is_not_a_runtime_dependency() -> None:
    lab = names_in((REPO / "requirements-lab.in").read_text()) | LAB_BY_NAME
    assert LAB_BY_NAME <= lab
    declared = {canonicalize_name(r.name) for r in runtime() + [r for v in extras().values() for r in v]}
    assert not declared & lab
    assert not set(pins((REPO / "requirements.txt").read_text())) & lab, "requirements.txt pins a lab package"
    assert not names_in((REPO / "requirements.in").read_text()) & lab
    # the dev venv still gets them: requirements-dev.in takes the lab's file in
    assert "-r requirements-lab.in" in (REPO / "requirements-dev.in").read_text().splitlines()
    assert lab <= set(pins((REPO / "requirements-dev.txt").read_text()))


@pytest.mark.parametrize("case", ["pin outside range", "unpinned", "undeclared module", "provider not declared"])
def test_the_rules_can_fail(case: str) -> None:
    if case == "pin outside range":
        assert range_misses([Requirement("boto3>=2")], {"boto3": Version("1.44.8")}) == ["boto3>=2: pinned 1.44.8"]
    elif case == "unpinned":
        assert range_misses([Requirement("requests<3")], {}) == ["requests<3: not pinned"]
    elif case == "undeclared module":
        assert undeclared({"yaml", "re2"}, [Requirement("PyYAML")]) == ["re2"]
    else:
        mods = {"airflow.sdk", "airflow.providers.cncf.kubernetes.hooks.kubernetes"}
        assert undeclared(mods, [Requirement("apache-airflow"), Requirement("apache-airflow-providers-amazon")]) == [
            "airflow.providers.cncf.kubernetes.hooks.kubernetes"]
        assert undeclared(mods, [Requirement("apache-airflow"),
                                 Requirement("apache-airflow-providers-cncf-kubernetes")]) == []
