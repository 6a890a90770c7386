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
from promshift.local.group_dag import build_group_dag
from promshift.orchestration.dag_factory import (
    build_bake_watch_dag,
    build_by_hand_dags,
    build_migration_dags,
    build_waves_dag,
)

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
PROFILE = "demo"
ORCHESTRATION = Path(__file__).resolve().parents[3] / "include" / "promshift" / "orchestration"

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
# The bake watch and the waves: a list, then one mapped task per entry of it.
BAKE_WATCH_EDGES: dict[str, set[str]] = {"watched": set(), "bake_check": {"watched"}}
WAVES_EDGES: dict[str, set[str]] = {"ready": set(), "start": {"ready"}}

# (class.method, task_ids) of every xcom_pull by task id still in orchestration/; empty is the goal.
REMAINING_PULLS: set[tuple[str, str]] = set()


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
    # The DAG a run of any group of a target runs in: the same tasks and edges, whatever the number of groups.
    [dag] = build_migration_dags(catalog.groups, catalog_path=CATALOG, profile=PROFILE)
    assert dag.dag_id == "promshift__migrate__promshift_target"
    assert upstream_of(dag) == GROUP_EDGES
    assert downstream_of(dag) == reversed_edges(GROUP_EDGES)


def test_the_lifecycle_dags_keep_their_edges(catalog: Any) -> None:
    decommission, recommission, rollback = build_by_hand_dags(catalog.groups, catalog_path=CATALOG, profile=PROFILE)
    assert upstream_of(decommission) == DECOMMISSION_EDGES
    assert downstream_of(decommission) == reversed_edges(DECOMMISSION_EDGES)
    assert upstream_of(recommission) == {"recommission": set()}
    assert upstream_of(rollback) == {"rollback": set()}
    watch = build_bake_watch_dag(catalog.groups, catalog_path=CATALOG, profile=PROFILE)
    assert upstream_of(watch) == BAKE_WATCH_EDGES
    assert downstream_of(watch) == reversed_edges(BAKE_WATCH_EDGES)
    waves = build_waves_dag(catalog.groups, catalog_path=CATALOG, profile=PROFILE)
    assert upstream_of(waves) == WAVES_EDGES
    assert downstream_of(waves) == reversed_edges(WAVES_EDGES)


# (task id, input) -> (the upstream task id, the XCom key) its XComArg reads; "return_value": the task's output.
GROUP_INPUTS: dict[tuple[str, str], tuple[str, str]] = {
    ("deploy_dual_write", "snapshot"): ("snapshot", "return_value"),
    ("warm_up", "deployed"): ("deploy_dual_write", "return_value"),
    ("parity_plan", "deployed"): ("deploy_dual_write", "return_value"),
    ("parity", "plan"): ("parity_plan", "plan"),
    ("parity", "shards"): ("parity_samples", "return_value"),
    ("latency", "deployed"): ("deploy_dual_write", "return_value"),
    ("gate", "parity"): ("parity", "return_value"),
    ("gate", "latency"): ("latency", "return_value"),
    ("approval", "gate_evidence"): ("gate", "return_value"),
    ("rollback", "snapshot"): ("snapshot", "return_value"),
}
DECOMMISSION_INPUTS: dict[tuple[str, str], tuple[str, str]] = {
    ("approval", "prepared"): ("prepare", "return_value"),
    ("decommission", "approval"): ("approval", "return_value"),
}


def xcom_inputs(dag: Any) -> dict[tuple[str, str], tuple[str, str]]:
    """Every XComArg in a task's template fields: (task, field) -> (the task it reads, the key)."""
    from airflow.sdk.definitions.xcom_arg import PlainXComArg

    found = {}
    for task in dag.tasks:
        for field in task.template_fields:
            value = getattr(task, field, None)
            if isinstance(value, PlainXComArg):
                found[(task.task_id, field)] = (value.operator.task_id, value.key)
    return found


def mapped_inputs(dag: Any) -> dict[str, tuple[str, str]]:
    """Every mapped task's expansion: task -> (the task whose output it is mapped over, the key)."""
    from airflow.sdk.definitions.mappedoperator import MappedOperator
    from airflow.sdk.definitions.xcom_arg import PlainXComArg

    found = {}
    for task in dag.tasks:
        if isinstance(task, MappedOperator):
            value = task._get_specified_expand_input().value
            [arg] = value.values() if isinstance(value, dict) else [value]  # expand(name=...) or expand_kwargs(...)
            assert isinstance(arg, PlainXComArg), task.task_id
            found[task.task_id] = (arg.operator.task_id, arg.key)
    return found


def test_every_input_is_an_xcomarg_of_the_right_upstream_task(catalog: Any) -> None:
    for group in catalog.groups:
        dag = build_group_dag(group, catalog_path=CATALOG, profile=PROFILE)
        assert xcom_inputs(dag) == GROUP_INPUTS, group.name
        assert mapped_inputs(dag) == {"parity_samples": ("parity_plan", "return_value")}, group.name
    decommission, _, _ = build_by_hand_dags(catalog.groups, catalog_path=CATALOG, profile=PROFILE)
    assert xcom_inputs(decommission) == DECOMMISSION_INPUTS
    # The bake watch's check and the waves' start take their arguments from the list before them (expand_kwargs).
    watch = build_bake_watch_dag(catalog.groups, catalog_path=CATALOG, profile=PROFILE)
    assert xcom_inputs(watch) == {}
    assert mapped_inputs(watch) == {"bake_check": ("watched", "return_value")}
    waves = build_waves_dag(catalog.groups, catalog_path=CATALOG, profile=PROFILE)
    assert xcom_inputs(waves) == {}
    assert mapped_inputs(waves) == {"start": ("ready", "return_value")}
    for group in catalog.groups:
        dag = build_group_dag(group, catalog_path=CATALOG, profile=PROFILE)
        # Each input is read from a task that runs before it (directly or through the chain).
        for (task_id, _), (producer, _) in {**GROUP_INPUTS}.items():
            assert producer in dag.get_task(task_id).get_flat_relative_ids(upstream=True), (task_id, producer)


class RenderTI:
    """What ``XComArg.resolve`` asks of a task instance when Airflow renders a task: ``xcom_pull`` by task id and
    key, ``default`` when there is none (Airflow's own side of the interface; the operators never pull)."""

    dag_id = "promshift__migrate__promshift_target"

    def __init__(self, xcoms: dict[tuple[str, str], Any]) -> None:
        self.xcoms = xcoms

    def xcom_pull(self, *, task_ids: str, key: str, default: Any, map_indexes: Any = None) -> Any:
        return self.xcoms.get((task_ids, key), default)


def test_airflow_resolves_the_inputs_when_it_renders_a_task(catalog: Any) -> None:
    from airflow.sdk.exceptions import XComNotFound
    from airflow.sdk.execution_time.lazy_sequence import LazyXComSequence

    dag = build_group_dag(catalog.get("gpu-memory"), catalog_path=CATALOG, profile=PROFILE)
    deployed, snap = {"dual_write_since": 1.0}, {"sha256": "x"}
    ti = RenderTI({("deploy_dual_write", "return_value"): deployed, ("snapshot", "return_value"): snap,
                   ("parity_plan", "plan"): {"window": None}})
    for task_id in ("deploy_dual_write", "warm_up", "parity", "rollback"):
        dag.get_task(task_id).render_template_fields({"ti": ti})
    assert dag.get_task("deploy_dual_write").snapshot == snap and dag.get_task("warm_up").deployed == deployed
    parity = dag.get_task("parity")
    assert parity.plan == {"window": None}
    # A mapped task's output: a lazy sequence of every shard's value (read when iterated).
    assert isinstance(parity.shards, LazyXComSequence)
    assert dag.get_task("rollback").snapshot == snap
    # A task that never ran (the snapshot after a failed validate): its output resolves to None, as a pull did.
    rollback = build_group_dag(catalog.get("gpu-memory"), catalog_path=CATALOG, profile=PROFILE).get_task("rollback")
    rollback.render_template_fields({"ti": RenderTI({})})
    assert rollback.snapshot is None
    # A missing XCom under another key than the return value fails the render (a pull answered None).
    other = build_group_dag(catalog.get("gpu-memory"), catalog_path=CATALOG, profile=PROFILE).get_task("parity")
    with pytest.raises(XComNotFound):
        other.render_template_fields({"ti": RenderTI({})})


def test_an_unrendered_input_fails_loudly(catalog: Any) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    dag = build_group_dag(catalog.get("gpu-memory"), catalog_path=CATALOG, profile=PROFILE)
    with pytest.raises(AirflowFailException, match="input 'parity' is unresolved"):
        dag.get_task("gate").execute({"run_id": "r", "params": {}, "ti": RenderTI({})})
