"""The functional core imports no framework, network or clock: its modules' imports are checked."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "include" / "promshift" / "core"
FORBIDDEN = {"airflow", "boto3", "botocore", "requests", "sqlalchemy", "os", "time", "subprocess", "socket",
             "promshift.adapters", "promshift.orchestration", "promshift.stack", "promshift.settings"}
CLOCK_CALLS = ("datetime.now", "datetime.utcnow", "time.time", "date.today")


@pytest.mark.parametrize("module", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_is_pure(module: Path) -> None:
    tree = ast.parse(module.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), f"{module.name} imports {name}"
    source = module.read_text()
    assert not any(call in source for call in CLOCK_CALLS), f"{module.name} reads the clock"
