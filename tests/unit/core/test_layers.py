"""The architecture as a test: one folder per layer, each importing only what its layer may.

- ``core/`` is pure: no framework, network, clock, environment or process, and no other layer;
- ``steps/`` is framework-free: no Airflow, and never an adapter (steps see ``core.ports`` only), the Airflow shell,
  the CLI, the board or the lab;
- ``orchestration/triggers.py`` (the triggerer's) imports no step, so no SQLAlchemy or audit store;
- ``adapters/`` talk to one outside system each and never reach up into steps or the Airflow shell;
- ``orchestration/`` (the Airflow shell) never reaches up into the board, the CLI or the lab;
- nothing outside ``local/`` (the package, ``dags/``, ``plugins/``) imports the lab;
- ``include/promshift/`` has no loose modules beyond package plumbing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "include" / "promshift"
LAYERS = ("core", "adapters", "steps", "orchestration", "board", "cli", "local")
FORBIDDEN = {
    "core": {"airflow", "boto3", "botocore", "requests", "sqlalchemy", "os", "time", "subprocess", "socket",
             "promshift.adapters", "promshift.steps", "promshift.orchestration", "promshift.board", "promshift.cli",
             "promshift.local"},
    "steps": {"airflow", "promshift.adapters", "promshift.orchestration", "promshift.board", "promshift.cli",
              "promshift.local"},
    "adapters": {"promshift.steps", "promshift.orchestration", "promshift.board", "promshift.cli",
                 "promshift.local"},
    "orchestration": {"promshift.board", "promshift.cli", "promshift.local"},
}
PRODUCTION = [p for p in sorted(PACKAGE.rglob("*.py")) if "local" not in p.relative_to(PACKAGE).parts[:1]]
PRODUCTION += sorted((REPO / "dags").glob("*.py")) + sorted((REPO / "plugins").glob("*.py"))
CLOCK_CALLS = ("datetime.now", "datetime.utcnow", "time.time", "date.today")


def imported(path: Path) -> list[str]:
    """Every module name ``path`` imports, at any depth (function-level imports count too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def hits(names: list[str], forbidden: set[str]) -> list[str]:
    return [n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden)]


def layer_modules(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_what_it_may(layer: str) -> None:
    bad = {str(p.relative_to(PACKAGE)): found for p in layer_modules(layer)
           if (found := hits(imported(p), FORBIDDEN[layer]))}
    assert not bad, f"{layer}/ imports what its layer may not: {bad}"


def test_the_triggerer_imports_no_step() -> None:
    """``orchestration/triggers.py`` runs on the triggerer: no step (and so no SQLAlchemy or audit store) with it."""
    found = hits(imported(PACKAGE / "orchestration" / "triggers.py"),
                 {"promshift.steps", "promshift.adapters.audit_store", "promshift.adapters.routing", "sqlalchemy"})
    assert not found, f"orchestration/triggers.py imports {found}"


def test_core_reads_no_clock() -> None:
    readers = [str(p.relative_to(PACKAGE)) for p in layer_modules("core")
               if any(call in p.read_text() for call in CLOCK_CALLS)]
    assert not readers, f"core reads the clock: {readers}"


def test_production_never_imports_the_lab() -> None:
    bad = {str(p.relative_to(REPO)): found for p in PRODUCTION if (found := hits(imported(p), {"promshift.local"}))}
    assert not bad, f"production code imports the lab: {bad}"


def test_no_loose_modules() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert loose == [], f"loose modules at include/promshift/: {loose}"
    assert set(LAYERS) <= set(folders), f"layers missing: {set(LAYERS) - set(folders)}"
    assert set(folders) <= set(LAYERS) | {"data"}, f"folders outside the layers: {set(folders) - set(LAYERS)}"


@pytest.mark.parametrize("rule", ["catches a forbidden import", "ignores an allowed one"])
def test_the_rule_can_fail(tmp_path: Path, rule: str) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from promshift.local.stack import fleet\n" if rule.startswith("catches")
                      else "from promshift.core import stages\n")
    assert bool(hits(imported(module), {"promshift.local"})) == rule.startswith("catches")
