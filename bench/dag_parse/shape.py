"""Airflow's own cost for DAGs of a given shape: the floor under any DAG file that builds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def build_same_shape(dags: Sequence[Any]) -> list[Any]:
    """As many DAGs as ``dags``, each with the same task ids as ``EmptyOperator``s (with their
    ``execution_timeout``), the same edges (``>>``), ``default_args`` and tags; no params, schedule, docs or
    XComArgs. What Airflow charges for that many tasks and edges before a DAG file does anything of its own."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    built = []
    for i, dag in enumerate(dags):
        with DAG(f"shape_{i}", schedule=None, start_date=dag.start_date, catchup=False, max_active_runs=1,
                 tags=list(dag.tags), default_args=dict(dag.default_args)) as shape:
            ops = {t.task_id: EmptyOperator(task_id=t.task_id, execution_timeout=t.execution_timeout)
                   for t in dag.tasks}
            for t in dag.tasks:
                for down in sorted(t.downstream_task_ids):
                    ops[t.task_id] >> ops[down]
        built.append(shape)
    return built
