"""Each group's tasks use the group's own source and target connections (the catalog's ``source``/``target``):
a target's migration DAG takes them from the group chosen in its form (``choose_group``), as do the by-hand DAGs;
the bake watch's mapped checks and the waves' starts get them from the catalog when they run."""

from __future__ import annotations

import copy
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException

from promshift.core.catalog import migration_dag_id, parse_catalog
from promshift.local.group_dag import build_group_dag
from promshift.orchestration.dag_factory import (
    build_bake_watch_dag,
    build_by_hand_dags,
    build_migration_dags,
    build_waves_dag,
)
from promshift.orchestration.migration_operators import ValidateGroupOperator

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {"gpu-utilization": ("promshift_source", "promshift_target"),
            "gpu-memory": ("promshift_source", "amp_c"),
            "gpu-power-thermal": ("cluster_b", "amp_b"), "gpu-clocks": ("cluster_b", "amp_b")}


@pytest.fixture
def catalog_path(tmp_path: Path) -> Path:
    doc = yaml.safe_load((REPO / "catalog" / "metric_groups.yaml").read_text())
    doc["waves"] = {2: {"source": "cluster_b", "target": "amp_b"}}
    next(g for g in doc["groups"] if g["name"] == "gpu-memory")["target"] = "amp_c"
    path = tmp_path / "metric_groups.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copytree(REPO / "catalog" / "dashboards", tmp_path / "dashboards")
    return path


def _chosen(steps: list[Any], group: str) -> list[Any]:
    """Copies of ``steps`` with ``group`` chosen in the form, as a run's rendering does."""
    chosen = [copy.copy(t) for t in steps]
    for task in chosen:
        task.choose_group({"params": {"group": group}})
    return chosen


def test_every_task_of_a_migration_dag_uses_the_chosen_groups_pair(catalog_path: Path) -> None:
    catalog = parse_catalog(catalog_path.read_text())
    dags = {dag.dag_id: dag for dag in build_migration_dags(catalog.groups, catalog_path=catalog_path)}
    assert set(dags) == {migration_dag_id(target) for _, target in EXPECTED.values()}
    for group in catalog.groups:
        source, target = EXPECTED[group.name]
        dag = dags[group.dag_id]
        assert group.dag_id == migration_dag_id(target)
        steps = [t for t in dag.tasks if hasattr(t, "choose_group")]
        # Every unmapped step (the mapped parity shards are rendered from the same partial arguments).
        assert {t.task_id for t in steps} == {t.task_id for t in dag.tasks} - {"parity_samples"}, dag.dag_id
        # Built for no group: the DAG's target, the default source, until a run chooses.
        assert {(t.group_name, t.target_conn_id, t.dag_target) for t in steps} == {("", target, target)}
        chosen = _chosen(steps, group.name)
        assert {(t.group_name, t.source_conn_id, t.target_conn_id) for t in chosen} == {(group.name, source, target)}
        assert {f"source:{source}", f"target:{target}"} <= set(dag.tags)
        # A group of another target is refused by every step, naming the DAG to trigger instead.
        for other, (_, other_target) in EXPECTED.items():
            if other_target != target:
                for task in steps:
                    with pytest.raises(AirflowFailException, match=f"trigger {migration_dag_id(other_target)}"):
                        _chosen([task], other)
    # amp_b's DAG serves two groups of one pair: its source tag is that cluster's alone.
    assert sorted(t for t in dags["promshift__migrate__amp_b"].tags if ":" in t) == ["source:cluster_b",
                                                                                      "target:amp_b"]


def test_a_group_dag_for_tests_has_its_group_chosen_in_every_step(catalog_path: Path) -> None:
    catalog = parse_catalog(catalog_path.read_text())
    for group in catalog.groups:
        dag = build_group_dag(group, catalog_path=catalog_path)
        assert dag.dag_id == group.dag_id
        steps = [t for t in dag.tasks if hasattr(t, "source_conn_id")]
        assert steps, dag.dag_id
        assert {(t.group_name, t.source_conn_id, t.target_conn_id) for t in steps} == {
            (group.name, *EXPECTED[group.name])}, dag.dag_id


def test_the_by_hand_dags_use_the_chosen_groups_pair(catalog_path: Path) -> None:
    catalog = parse_catalog(catalog_path.read_text())
    for dag in build_by_hand_dags(catalog.groups, catalog_path=catalog_path):
        steps = [t for t in dag.tasks if hasattr(t, "choose_group")]
        assert steps, dag.dag_id
        for name, pair in EXPECTED.items():
            assert {(t.source_conn_id, t.target_conn_id) for t in _chosen(steps, name)} == {pair}, (dag.dag_id, name)


def _seed(history: dict[str, list[str]]) -> None:
    """Each group's stages entered, as legal moves, in the audit the operators open (PROMSHIFT_AUDIT_URL)."""
    from promshift.adapters.audit_store import AuditStore
    from promshift.core.stages import Stage

    store = AuditStore()
    try:
        for group, stages in history.items():
            current = Stage.PLANNED
            for stage in map(Stage, stages):
                store.append(group=group, run_id="seeded", kind=f"seed_{stage.value}", actor="test",
                             at=datetime.now(UTC), evidence={}, stage_from=current, stage_to=stage)
                current = stage
    finally:
        store.engine.dispose()


TO_CUT_OVER = ["dual_writing", "warming", "verified", "approved", "cut_over"]


@pytest.fixture
def audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PROMSHIFT_HOME", str(home))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    return tmp_path


def test_the_bake_watch_checks_each_watched_group_with_its_pair(catalog_path: Path, audit: Path) -> None:
    catalog = parse_catalog(catalog_path.read_text())
    watch = build_bake_watch_dag(catalog.groups, catalog_path=catalog_path)
    watched = watch.get_task("watched")
    assert watched.execute({}) == []  # nothing cut over yet: the mapped check is skipped
    # gpu-memory cut over, gpu-power-thermal baking, gpu-clocks baked (no longer watched), gpu-utilization planned.
    _seed({"gpu-memory": TO_CUT_OVER, "gpu-power-thermal": [*TO_CUT_OVER, "baking"],
           "gpu-clocks": [*TO_CUT_OVER, "baking", "baked"]})
    kwargs = watched.execute({})
    assert kwargs == [{"group_name": name, "source_conn_id": EXPECTED[name][0], "target_conn_id": EXPECTED[name][1]}
                      for name in ("gpu-memory", "gpu-power-thermal")]  # catalog order
    # Each map index is the check built with its group's arguments (the partial's own plus these).
    check = watch.get_task("bake_check")
    for arguments in kwargs:
        built = check.operator_class(task_id="bake_check", catalog_path=check.partial_kwargs["catalog_path"],
                                     **arguments)
        assert (built.group_name, built.source_conn_id, built.target_conn_id) == (
            arguments["group_name"], *EXPECTED[arguments["group_name"]])


def test_the_waves_start_a_ready_group_in_its_targets_dag(catalog_path: Path, audit: Path) -> None:
    catalog = parse_catalog(catalog_path.read_text())
    ready = build_waves_dag(catalog.groups, catalog_path=catalog_path).get_task("ready")
    assert ready.execute({}) == []  # gpu-power-thermal waits for gpu-utilization, gpu-clocks for gpu-power-thermal
    _seed({"gpu-utilization": TO_CUT_OVER})
    (start,) = ready.execute({})
    assert start["trigger_dag_id"] == migration_dag_id("amp_b") == catalog.get("gpu-power-thermal").dag_id
    assert start["trigger_run_id"].startswith("wave__gpu-power-thermal__")
    assert start["conf"] == {"group": "gpu-power-thermal", "reason": "wave: gpu-utilization cut over"}
    assert ready.execute({}) == [start]  # the same cut-overs name the same run: Airflow starts it once


def test_validate_refuses_a_task_built_for_another_pair(catalog_path: Path) -> None:
    op = ValidateGroupOperator(task_id="validate", group_name="gpu-power-thermal", catalog_path=str(catalog_path))
    with pytest.raises(ValueError, match="this DAG uses connections 'promshift_source' -> 'promshift_target', "
                                         "the catalog says 'cluster_b' -> 'amp_b'"):
        op.check_pair()
    ok = ValidateGroupOperator(task_id="validate", group_name="gpu-power-thermal", catalog_path=str(catalog_path),
                               source_conn_id="cluster_b", target_conn_id="amp_b")
    ok.check_pair()
