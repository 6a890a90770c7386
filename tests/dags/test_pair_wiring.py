"""Each group's DAGs use the group's own source and target connections (the catalog's ``source``/``target``);
the by-hand DAGs of every group (decommission, recommission, rollback) take them from the group chosen in the form."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from promshift.core.catalog import parse_catalog
from promshift.local.group_dag import build_group_dag
from promshift.orchestration.dag_factory import build_bake_watch_dag, build_by_hand_dags
from promshift.orchestration.operators import ValidateGroupOperator

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def catalog_path(tmp_path: Path) -> Path:
    doc = yaml.safe_load((REPO / "catalog" / "metric_groups.yaml").read_text())
    doc["waves"] = {2: {"source": "cluster_b", "target": "amp_b"}}
    next(g for g in doc["groups"] if g["name"] == "gpu-memory")["target"] = "amp_c"
    path = tmp_path / "metric_groups.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    import shutil

    shutil.copytree(REPO / "catalog" / "dashboards", tmp_path / "dashboards")
    return path


def test_every_task_of_a_group_uses_its_pair(catalog_path: Path) -> None:
    catalog = parse_catalog(catalog_path.read_text())
    expected = {"gpu-utilization": ("promshift_source", "promshift_target"),
                "gpu-memory": ("promshift_source", "amp_c"),
                "gpu-power-thermal": ("cluster_b", "amp_b"), "gpu-clocks": ("cluster_b", "amp_b")}
    for group in catalog.groups:
        dag = build_group_dag(group, catalog_path=catalog_path)
        steps = [t for t in dag.tasks if hasattr(t, "source_conn_id")]
        assert steps, dag.dag_id
        assert {(t.source_conn_id, t.target_conn_id) for t in steps} == {expected[group.name]}, dag.dag_id
        assert {f"source:{expected[group.name][0]}", f"target:{expected[group.name][1]}"} <= set(dag.tags)
    for dag in build_by_hand_dags(catalog.groups, catalog_path=catalog_path):
        steps = [t for t in dag.tasks if hasattr(t, "choose_group")]
        assert steps, dag.dag_id
        for name, pair in expected.items():
            chosen = [copy.copy(t) for t in steps]
            for task in chosen:
                task.choose_group({"params": {"group": name}})
            assert {(t.source_conn_id, t.target_conn_id) for t in chosen} == {pair}, (dag.dag_id, name)
    watch = build_bake_watch_dag(catalog.groups, catalog_path=catalog_path)
    checks = {t.group_name: (t.source_conn_id, t.target_conn_id) for t in watch.tasks if hasattr(t, "group_name")}
    assert checks == expected


def test_validate_refuses_a_task_built_for_another_pair(catalog_path: Path) -> None:
    op = ValidateGroupOperator(task_id="validate", group_name="gpu-power-thermal", catalog_path=str(catalog_path))
    with pytest.raises(ValueError, match="this DAG uses connections 'promshift_source' -> 'promshift_target', "
                                         "the catalog says 'cluster_b' -> 'amp_b'"):
        op.check_pair()
    ok = ValidateGroupOperator(task_id="validate", group_name="gpu-power-thermal", catalog_path=str(catalog_path),
                               source_conn_id="cluster_b", target_conn_id="amp_b")
    ok.check_pair()
