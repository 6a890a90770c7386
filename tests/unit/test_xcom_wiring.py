"""Task outputs pass between operators as typed values (XComArgs), never as pulls by task id.

The DAGs are built from the shipped catalog with the production factory. What is pinned here:
the XCom pulls by task id left in ``orchestration/`` (an AST scan), and the DAGs' edges as they were
before any output became an XComArg (an XComArg in a template field makes Airflow add an edge of its
own: the factory must keep the chain's edges exactly).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.orchestration.dag_factory import build_bake_watch_dag, build_decommission_dags, build_group_dag

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
PROFILE = "demo"
ORCHESTRATION = Path(__file__).resolve().parents[2] / "include" / "promshift" / "orchestration"

# Each task's upstream task ids, recorded from the DAGs before the change (every group's DAG is the same).
_ROLLBACK_UPSTREAM = {"deploy_dual_write", "warm_up", "parity_plan", "parity_samples", "parity", "latency", "gate",
                      "approval", "cutover"}
GROUP_EDGES: dict[str, set[str]] = {
    "validate": set(), "snapshot": {"validate"}, "deploy_dual_write": {"snapshot"}, "warm_up": {"deploy_dual_write"},
    "parity_plan": {"warm_up"}, "parity_samples": {"parity_plan"}, "parity": {"parity_samples"},
    "latency": {"parity"}, "gate": {"latency"}, "approval": {"gate"}, "cutover": {"approval"}, "done": {"cutover"},
    "rollback": _ROLLBACK_UPSTREAM,
}
DECOMMISSION_EDGES: dict[str, set[str]] = {"prepare": set(), "approval": {"prepare"}, "decommission": {"approval"}}

# (class.method, task_ids) of every xcom_pull by task id still in orchestration/; empty is the goal.
REMAINING_PULLS: set[tuple[str, str]] = {
    ("DeployDualWriteOperator.execute", "snapshot"),
    ("WarmupOperator.execute", "deploy_dual_write"),
    ("ParityPlanOperator.execute", "deploy_dual_write"),
    ("ParityOperator.execute", "parity_plan"),
    ("ParityOperator.execute", "['parity_samples']"),
    ("LatencyOperator.execute", "deploy_dual_write"),
    ("GateOperator.execute", "parity"),
    ("GateOperator.execute", "latency"),
    ("MigrationApprovalOperator.evidence", "gate"),
    ("RollbackOperator.execute", "snapshot"),
    ("RollbackOperator.execute_complete", "snapshot"),
    ("BakedAssetOperator.execute", "self.check_task_id"),
    ("DecommissionApprovalOperator.evidence", "prepare"),
    ("DecommissionOperator.execute", "approval"),
}


def pulls_by_task_id(path: Path) -> set[tuple[str, str]]:
    """Every ``<anything>.xcom_pull(task_ids=...)`` call: (enclosing Class.method, the task_ids source text)."""
    found: set[tuple[str, str]] = set()

    def visit(node: ast.AST, where: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = [*where, child.name] if isinstance(child, ast.ClassDef | ast.FunctionDef) else where
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr == "xcom_pull"):
                ids = next((k.value for k in child.keywords if k.arg == "task_ids"),
                           child.args[0] if child.args else None)
                if ids is not None:
                    found.add((".".join(where), ast.unparse(ids).strip("'\"")))
            visit(child, inner)

    visit(ast.parse(path.read_text()), [])
    return found


def test_no_pull_by_task_id_is_left_in_the_airflow_shell() -> None:
    found: set[tuple[str, str]] = set()
    for path in sorted(ORCHESTRATION.glob("*.py")):
        found |= pulls_by_task_id(path)
    assert found == REMAINING_PULLS


@pytest.fixture(scope="module")
def catalog() -> Any:
    return load_catalog(CATALOG, profile=PROFILE)


def upstream_of(dag: Any) -> dict[str, set[str]]:
    return {t.task_id: set(t.upstream_task_ids) for t in dag.tasks}


def downstream_of(dag: Any) -> dict[str, set[str]]:
    return {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}


def reversed_edges(upstream: dict[str, set[str]]) -> dict[str, set[str]]:
    down: dict[str, set[str]] = {task_id: set() for task_id in upstream}
    for task_id, ups in upstream.items():
        for up in ups:
            down[up].add(task_id)
    return down


def test_every_group_dag_keeps_its_edges(catalog: Any) -> None:
    for group in catalog.groups:
        dag = build_group_dag(group, catalog_path=CATALOG, profile=PROFILE)
        assert upstream_of(dag) == GROUP_EDGES, group.name
        assert downstream_of(dag) == reversed_edges(GROUP_EDGES), group.name


def test_the_lifecycle_dags_keep_their_edges(catalog: Any) -> None:
    for group in catalog.groups:
        decommission, recommission, rollback = build_decommission_dags(group, catalog_path=CATALOG, profile=PROFILE)
        assert upstream_of(decommission) == DECOMMISSION_EDGES, group.name
        assert downstream_of(decommission) == reversed_edges(DECOMMISSION_EDGES), group.name
        assert upstream_of(recommission) == {"recommission": set()}
        assert upstream_of(rollback) == {"rollback": set()}
    watch = build_bake_watch_dag(catalog.groups, catalog_path=CATALOG, profile=PROFILE)
    keys = [g.name.replace("-", "_") for g in catalog.groups]
    expected = {**{f"bake_check__{k}": set() for k in keys}, **{f"baked__{k}": {f"bake_check__{k}"} for k in keys}}
    assert upstream_of(watch) == expected
    assert downstream_of(watch) == reversed_edges(expected)
