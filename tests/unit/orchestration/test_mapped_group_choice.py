"""A mapped step of a migration DAG takes the form's group, as its unmapped steps do.

Airflow renders one map index of a mapped task (``parity_samples``) by building that index's task and rendering
it through ``_do_render_template_fields``, never through the task's own ``render_template_fields``: on a real
Airflow the shard task of a DAG shared by a target's groups ran without a group and failed every migration."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.orchestration.dag_factory import build_migration_dag
from promshift.orchestration.operators import GROUP_PARAM

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"


def shard_task_rendered(group: str) -> Any:
    """``parity_samples`` of the repository's promshift_target DAG for one shard, rendered as Airflow renders a
    map index (``MappedOperator.render_template_fields``), the form's group being ``group``."""
    catalog = load_catalog(CATALOG, profile="demo")
    dag = build_migration_dag(catalog.groups, target="promshift_target", catalog_path=CATALOG, profile="demo")
    mapped = dag.get_task("parity_samples")
    shard = {"index": 0, "hosts": ["gpu-node-0000"]}
    context: dict[str, Any] = {"params": {GROUP_PARAM: group}}
    # What MappedOperator.render_template_fields does once it has resolved the map index's arguments.
    task = mapped.unmap({"shard": shard})
    task._do_render_template_fields(parent=task, template_fields=mapped.template_fields, context=context,
                                    jinja_env=mapped.get_template_env(), seen_oids=set())
    assert task.shard == shard
    return task


def test_a_shard_task_takes_the_group_chosen_in_the_form_and_its_connections() -> None:
    task = shard_task_rendered("gpu-memory")
    group = load_catalog(CATALOG, profile="demo").get("gpu-memory")
    assert (task.group_name, task.source_conn_id, task.target_conn_id) == ("gpu-memory", group.source, group.target)


def test_a_shard_task_refuses_a_group_the_catalog_does_not_have() -> None:
    with pytest.raises(AirflowFailException, match="unknown metric group 'gpu-nothing'"):
        shard_task_rendered("gpu-nothing")
