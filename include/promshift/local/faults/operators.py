"""Faults 7, 8, 10, 11 at the Airflow operators: a scheduler or triggerer restart while warm-up is
deferred, an approval that times out, a self-approval (four eyes).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from promshift.adapters.settings import load_catalog
from promshift.local.faults.env import (
    CATALOG,
    GROUP,
    PROFILE,
    TRIGGERED_BY,
    Fault,
    FaultEnv,
    FaultResult,
    first_event,
    now,
)

# -- 7, 8, 10, 11: the Airflow operators (scheduler, triggerer, approval) -------------------------------------------


class FakeTI:
    """Airflow's side of a task instance: the XComs earlier tasks returned, as ``XComArg.resolve`` pulls them when
    Airflow renders a task's inputs (the operators never pull); keeps what a task pushes."""

    def __init__(self, xcoms: dict[str, Any]) -> None:
        self.xcoms, self.pushed, self.map_index = xcoms, {}, -1

    def xcom_pull(self, *, task_ids: str, key: str, default: Any = None, **_: Any) -> Any:
        return self.xcoms.get(task_ids, default) if key == "return_value" else default

    def xcom_push(self, key: str, value: Any) -> None:
        json.dumps(value)
        self.pushed[key] = value


@contextlib.contextmanager
def audit_url_env(url: str) -> Iterator[None]:
    saved = os.environ.get("PROMSHIFT_AUDIT_URL")
    os.environ["PROMSHIFT_AUDIT_URL"] = url
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PROMSHIFT_AUDIT_URL", None)
        else:
            os.environ["PROMSHIFT_AUDIT_URL"] = saved


class OperatorRun:
    """One DAG run driven through the group DAG's own operators (``build_group_dag``), XComs kept in memory.

    ``fresh()`` re-parses the DAG: new operator objects, as a restarted scheduler or another worker has.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.xcoms: dict[str, Any] = {}
        self.dag = self.fresh()

    @staticmethod
    def fresh() -> Any:
        from promshift.local.group_dag import build_group_dag

        return build_group_dag(load_catalog(CATALOG, profile=PROFILE).get(GROUP), catalog_path=CATALOG,
                               profile=PROFILE)

    def context(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "ti": FakeTI(self.xcoms),
                "dag_run": SimpleNamespace(triggering_user_name=TRIGGERED_BY)}

    def task(self, task_id: str) -> Any:
        """The DAG's task as a worker runs it: its inputs (XComArgs of earlier tasks' outputs) rendered to values."""
        op = self.dag.get_task(task_id)
        op.render_template_fields(self.context())
        return op

    def run(self, task_id: str) -> Any:
        value = self.task(task_id).execute(self.context())
        self.xcoms[task_id] = value
        return value

    def up_to_dual_write(self) -> None:
        for task_id in ("validate", "snapshot", "deploy_dual_write"):
            self.run(task_id)

    def rollback(self) -> dict[str, Any]:
        return self.run("rollback")


def deferred(op: Any, context: dict[str, Any]) -> Any:
    from airflow.sdk.exceptions import TaskDeferred

    try:
        op.execute(context)
    except TaskDeferred as exc:
        return exc
    raise RuntimeError(f"{op.task_id} did not defer")


def rebuild(serialized: tuple[str, dict[str, Any]], **overrides: Any) -> Any:
    """What a triggerer does with a trigger row: import the class path and call it with the stored kwargs."""
    path, kwargs = serialized
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**{**kwargs, **overrides})


async def run_then_drop(trigger: Any, seconds: float) -> dict[str, Any] | None:
    """Run a trigger for ``seconds`` and drop it (cancelled, as a dying triggerer's loop is); its event if any."""
    agen = trigger.run()
    task = asyncio.ensure_future(agen.__anext__())
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if done:
        return dict(task.result().payload)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await task
    with contextlib.suppress(Exception):
        await agen.aclose()
    return None


# The catalog's demo warm-up is 2 minutes; the rebuilt trigger gets 3 s (the only kwargs changed, and said so).
SHORT_WARMUP = {"min_duration_s": 3.0, "timeout_s": 60.0, "poll_interval_s": 1.0}


def fault_restart_during_warmup(env: FaultEnv, *, who: str) -> FaultResult:
    number = 7 if who == "scheduler" else 8
    f = Fault(env, f"{who} restarted while warm-up is deferred", "warm_up (deferred)")
    url = env.sqlite_url(f"f{number}")
    with audit_url_env(url):
        run = OperatorRun(f"manual__fault-{number}")
        run.up_to_dual_write()
        ctx = run.context()
        first = deferred(run.task("warm_up"), ctx)
        serialized = first.trigger.serialize()
        drops = 0
        if who == "scheduler":
            # The scheduler restarts: the DAG is parsed again and the deferred task may be queued to run again.
            run.dag = run.fresh()
            again = deferred(run.task("warm_up"), run.context())
            serialized = again.trigger.serialize()
            event = asyncio.run(first_event(rebuild(serialized, **SHORT_WARMUP), 60))
        else:
            # The triggerer dies mid-poll: its trigger instance is dropped; the new triggerer rebuilds it from
            # the stored kwargs and runs it from the start (started_at is kept, so elapsed time is not reset).
            event = asyncio.run(run_then_drop(rebuild(serialized, **SHORT_WARMUP), 1.5))
            drops = 1 if event is None else 0
            if event is None:
                event = asyncio.run(first_event(rebuild(serialized, **SHORT_WARMUP), 60))
        run.dag = run.fresh()  # execute_complete runs on whichever worker picks it up
        run.task("warm_up").execute_complete(run.context(), event)
        rolled = run.rollback()
        audit = env.audit(url, f"f{number}")
    kinds = [e.kind for e in audit.events()]
    f.details.update(serialized_kwargs=sorted(serialized[1]), event={k: event.get(k) for k in ("status", "reason")},
                     dropped_mid_run=drops, warmup_started_events=kinds.count("warmup_started"), rollback=rolled)
    where = ("the DAG re-parsed (new operator objects), warm_up's execute run a second time (re-queued), the "
             "trigger completed and execute_complete ran on new objects" if who == "scheduler" else
             "the WarmupTrigger was serialized, its instance dropped after 1.5 s of polling (cancelled), rebuilt "
             "from the serialized kwargs and run again to completion")
    return f.finish(outcome=f"warm-up {event['status']} after the restart; warmup_started recorded "
                            f"{kinds.count('warmup_started')}x; rollback restored_identical="
                            f"{rolled['restored_identical']}",
                    notes=f"trigger/operator level, not a real Airflow scheduler or triggerer: {where}; the rebuilt "
                          f"trigger's min_duration/timeout/poll were shortened ({SHORT_WARMUP}); validate, "
                          "snapshot, deploy, warm_up and rollback are the group DAG's own operators",
                    audit=audit, must_have=("warmup_started", "warmup_ready", "rolled_back"),
                    extra_ok=event["status"] == "ready" and kinds.count("warmup_started") == 1
                    and rolled["restored_identical"] is True)


def fault_restart_scheduler(env: FaultEnv) -> FaultResult:
    return fault_restart_during_warmup(env, who="scheduler")


def fault_restart_triggerer(env: FaultEnv) -> FaultResult:
    return fault_restart_during_warmup(env, who="triggerer")


def fault_approval(env: FaultEnv, kind: str) -> FaultResult:
    from airflow.sdk.exceptions import AirflowFailException

    number = 10 if kind == "timeout" else 11
    name = "approval timed out" if kind == "timeout" else "approver is the run's trigger (four eyes)"
    f = Fault(env, name, "approval")
    url = env.sqlite_url(f"f{number}")
    with audit_url_env(url):
        run = OperatorRun(f"manual__fault-{number}")
        run.up_to_dual_write()
        if kind == "timeout":
            event = {"error": "The timeout has passed, and no response was received.", "error_type": "timeout"}
        else:
            event = {"chosen_options": ["Approve"], "params_input": {"comment": "mine, lgtm"},
                     "responded_at": now(), "responded_by_user": {"id": TRIGGERED_BY, "name": TRIGGERED_BY}}
        try:
            run.task("approval").execute_complete(run.context(), event)
            failed = "approval passed"
        except AirflowFailException as exc:
            failed = str(exc)
        rolled = run.rollback()
        audit = env.audit(url, f"f{number}")
    expect = "approval_timeout" if kind == "timeout" else "approval_refused_four_eyes"
    f.details.update(task_failed=failed, rollback=rolled)
    return f.finish(outcome=f"approval task failed ({failed}); {expect} audited; rollback "
                            f"restored_identical={rolled['restored_identical']} (reason: {rolled['reason']})",
                    notes="MigrationApprovalOperator.execute_complete given the event Airflow's HITL trigger hands "
                          "it (no HITL request or UI; gate/parity skipped: the group was dual-writing); the "
                          "rollback is the DAG's RollbackOperator",
                    audit=audit, must_have=(expect, "rolled_back"),
                    extra_ok=failed != "approval passed" and rolled["restored_identical"] is True)


def fault_approval_timeout(env: FaultEnv) -> FaultResult:
    return fault_approval(env, "timeout")


def fault_self_approval(env: FaultEnv) -> FaultResult:
    return fault_approval(env, "four-eyes")
