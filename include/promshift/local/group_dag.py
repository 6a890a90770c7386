"""A migration DAG with its group already chosen: what a run's tasks are once Airflow renders them.

For tests and benches that execute a step's task directly (``task.execute(context)``) without Airflow rendering
it: in a run, each task takes its group from the trigger form when it renders (``choose_group``); here that is
done once, with the same form value, for every task of the DAG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from promshift.core.catalog import MetricGroup
from promshift.orchestration.dag_factory import build_migration_dag
from promshift.orchestration.operators import GROUP_PARAM


def build_group_dag(group: MetricGroup, *, catalog_path: str | Path, profile: str | None = None) -> Any:
    """``group``'s target migration DAG (``group`` alone in its form), each unmapped task with ``group`` chosen."""
    dag = build_migration_dag([group], target=group.target, catalog_path=catalog_path, profile=profile)
    for task in dag.tasks:
        choose = getattr(task, "choose_group", None)
        if choose is not None:
            choose({"params": {GROUP_PARAM: group.name}})
    return dag
