"""In-memory stand-ins for Airflow's side of the operator interface, shared by unit and integration tests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeTI:
    """Keeps what a task pushes (its audit head, its report), as a task instance does. It has no ``xcom_pull``: an
    operator's inputs are constructor arguments (``fed``), never looked up by task id."""

    map_index: int = -1
    pushed: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        json.dumps(value)  # XCom values must serialise
        self.pushed[key] = value


def fed(dag: Any, task_id: str, **inputs: Any) -> Any:
    """The DAG's task constructed again with its inputs (upstream outputs) as typed keyword arguments: the same
    class, group wiring and approvers, in a DAG of the same id. In the DAG the inputs are XComArgs, which Airflow
    resolves to these values when it renders the task; an input left out is None (that upstream returned nothing)."""
    from airflow.sdk import DAG
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    from promshift.orchestration.approval_operators import MigrationApprovalOperator
    from promshift.orchestration.operators import _GroupStep

    op = dag.get_task(task_id)
    if isinstance(op, MappedOperator):  # one mapped instance (``inputs``: its expanded argument), its group chosen
        chosen = next(t for t in dag.tasks if isinstance(t, _GroupStep) and t.group_name)
        wiring = {"catalog_path": chosen.catalog_path, "profile": chosen.profile, "group_name": chosen.group_name,
                  "source_conn_id": chosen.source_conn_id, "target_conn_id": chosen.target_conn_id,
                  "dag_target": chosen.dag_target}
        with DAG(dag.dag_id, schedule=None):
            return op.operator_class(task_id=task_id, **wiring, **inputs)
    wiring: dict[str, Any] = {"catalog_path": op.catalog_path, "profile": op.profile}  # bake watch list, waves
    if isinstance(op, _GroupStep):
        wiring |= {"group_name": op.group_name, "source_conn_id": op.source_conn_id,
                   "target_conn_id": op.target_conn_id, "dag_target": op.dag_target}
    if isinstance(op, MigrationApprovalOperator):
        # None: a DAG of every group (the chosen group's approvers are read when the task runs).
        wiring["approvers"] = None if op.approver_entries is None else list(op.approver_entries)
    with DAG(dag.dag_id, schedule=None):
        return type(op)(task_id=task_id, outlets=list(op.outlets), **wiring, **inputs)


def as_promshift_sent(form: dict[str, str]) -> dict[str, str]:
    """A fake server's view of a query form: promshift marks every query it sends as its own
    (``core.promql.mark_own_read``: a trailing PromQL comment a real server ignores); the fake checks the mark and
    answers the query without it, as Prometheus evaluates it."""
    from promshift.core.promql import OWN_READ_COMMENT, is_own_read

    if "query" in form:
        assert is_own_read(form["query"]), f"a query promshift sent without its own-read mark: {form['query']!r}"
        form = {**form, "query": form["query"][:-len(OWN_READ_COMMENT) - 1]}
    return form
