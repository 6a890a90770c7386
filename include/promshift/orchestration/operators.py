"""What every operator shares: the step base (its wiring is ``orchestration.wiring``), inputs, the report.

The operators themselves live by DAG family: ``migration_operators`` (a group's migration DAG),
``approval_operators`` (the cut-over's and the decommission's approvals) and ``lifecycle_operators``
(the bake watch, the waves, and the by-hand decommission, recommission and full rollback).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from promshift.orchestration.wiring import (  # noqa: F401 - the shell's names, where DAG files look for them
    AUDIT_CONN,
    GRAFANA_CONN,
    GROUP_PARAM,
    SOURCE_CONN,
    TARGET_CONN,
    GroupWiring,
)

# An upstream task's output as an operator's argument (a template field): the factory passes an XComArg
# (``task.output``), which Airflow resolves to the value when it renders the task, also when a deferred task
# resumes; a test passes the value itself. Never a pull by task id: the DAG file says where a value comes from.
Output = Any  # XComArg | the value

# The trigger form of a group's DAG (``core.run_params``; the schema is in ``dag_factory.run_params_schema``).
RUN_PARAMS = ("dry_run", "change_ticket", "warmup_override", "reason", "accept_short_history")

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


# The step base of every operator (kept under its old name: tests and DAG files reach it so).
_GroupStep = GroupWiring


def given(op: BaseOperator, name: str) -> Any:
    """The value of input ``name`` (a template field) as the task runs: an XComArg still there means the task
    was not rendered (a test calling ``execute`` on the DAG's own task, or the field missing from
    ``template_fields``), which must fail loudly rather than be read as a dict."""
    from airflow.sdk.definitions.xcom_arg import XComArg

    value = getattr(op, name)
    if isinstance(value, XComArg):
        raise AirflowFailException(f"{op.task_id}: input {name!r} is unresolved ({value!r}); Airflow resolves it "
                                   "when it renders the task's template fields")
    return value


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)

def publish_report(step: _GroupStep, context: Any, migration: Any) -> dict[str, Any] | None:
    """Write the run's report through ``ObjectStoragePath`` and audit where (``report_published``, with hashes).

    The report is a view of the audit log, which stays the evidence: a store that cannot be written is
    logged, and the step's outcome stands.
    """
    from promshift.adapters.settings import reports_url
    from promshift.orchestration.report_store import ReportStore
    from promshift.orchestration.report_store import publish_report as publish

    try:
        record = publish(migration.audit, ReportStore(reports_url()), group=step.group_name,
                         run_id=context["run_id"])
        from promshift.core.events import EventKind

        migration.record(EventKind.REPORT_PUBLISHED, _now(), record)
    except Exception as exc:  # noqa: BLE001 (any store failure: the report is secondary evidence)
        step.log.warning("report not published: %s", exc)
        return None
    step.log.info("report published to %s (%s)", record["url"], ", ".join(record["files"]))
    context["ti"].xcom_push(key="report", value=record)
    return record


def run_rollback(step: Any, context: Any, reason: str, rollback: Any,
                 refusals: tuple[type[Exception], ...] = ()) -> dict[str, Any]:
    """Run a rollback for every DAG family: a refusal (``refusals``) fails the task as it is; a deploy refusal
    tells the owners and fails the task; anything else tells the owners and is raised again (Airflow retries)."""
    from promshift.steps.deploy import DeployStepFailed

    try:
        return rollback()
    except refusals as exc:
        raise AirflowFailException(str(exc)) from None
    except DeployStepFailed as exc:
        failure = AirflowFailException(str(exc))
        step.tell_owners(context, "rollback_failed", reason=reason, error=failure)
        raise failure from None
    except Exception as exc:
        step.tell_owners(context, "rollback_failed", reason=reason, error=exc)
        raise


class GroupStepOperator(_GroupStep, BaseOperator):
    """Base for the plain (non-deferring) steps."""

    template_fields: Sequence[str] = ("group_name",)
    ui_color = "#e8f0fe"

    def __init__(self, *, group_name: str | None, catalog_path: str, profile: str | None = None,
                 source_conn_id: str = SOURCE_CONN, target_conn_id: str = TARGET_CONN, dag_target: str | None = None,
                 **kwargs: Any) -> None:
        # A step's template fields besides ``group_name`` are its inputs: upstream outputs (XComArgs) given as
        # keyword arguments, None when not given. Taken here, not in an ``__init__`` of each step: Airflow wraps
        # every ``__init__`` of an operator's classes, and each wrapper deep-copies the DAG's Params again.
        inputs = {name: kwargs.pop(name, None) for name in self.template_fields if name != "group_name"}
        super().__init__(**kwargs)
        self._init_group(group_name=group_name, catalog_path=catalog_path, profile=profile,
                         source_conn_id=source_conn_id, target_conn_id=target_conn_id, dag_target=dag_target)
        for name, value in inputs.items():
            setattr(self, name, value)

def emit_group_asset(op: BaseOperator, context: Any, asset: Any, extra: dict[str, Any]) -> None:
    """Emit ``asset`` (one group's) through the task's asset alias, its only outlet: a task shared by every group
    knows which group's asset only when it runs. A task built without the alias (a test's) emits nothing."""
    from airflow.sdk import AssetAlias

    for outlet in op.outlets or ():
        if isinstance(outlet, AssetAlias):
            context["outlet_events"][outlet].add(asset, extra=extra)

class _EveryGroupTask(BaseOperator):
    """A task about every group of the catalog (the mapped tasks' arguments): the catalog as it is when the
    task runs, and every group's stage moves from the audit log in one read."""

    ui_color = "#e6f4ea"

    def __init__(self, *, catalog_path: str, profile: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog_path = catalog_path
        self.profile = profile

    def catalog_and_moves(self) -> tuple[Any, dict[str, list[str]]]:
        from promshift.adapters.settings import load_catalog
        from promshift.orchestration.wiring import audit_store

        return load_catalog(self.catalog_path, profile=self.profile), audit_store().stage_moves()
