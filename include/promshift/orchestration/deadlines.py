"""The migration DAGs' deadline alert (Airflow 3's ``DeadlineAlert``): a run still going long after its warm-up and
its approval could both have ended is recorded in the audit (``run_overdue``) and its group's owners are told.

Each migration DAG carries one alert counted from the run's ``queued_at`` (``DeadlineReference.DAGRUN_QUEUED_AT``):
``overdue_after`` its groups, the longest over them of ``warmup.timeout`` + ``approval_timeout``, plus
``OVERDUE_MARGIN`` for the steps' own work. The scheduler creates the deadline when the run is created and deletes
it when the run ends first; once it has passed, the scheduler (``Deadline.handle_miss``) queues
``migration_overdue`` on the triggerer, with ``kwargs["context"]`` = the run as the REST API shows it
(``DAGRunResponse`` JSON: ``dag_id``, ``dag_run_id``, ``conf``, ``queued_at``, ...) and the deadline
(``id``, ``deadline_time``); ``CallbackTrigger`` awaits it.

Nothing is stopped or failed: the run goes on, and its owners decide. A second call for the same run (the
triggerer restarted mid-callback) records nothing new and sends nothing again (the delivery ledger of
``orchestration.notify``). The callback raises only when it cannot do its job (no group in the run's conf, the
audit database unreachable, the group not in the catalog): Airflow then marks the callback failed with that line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference

if TYPE_CHECKING:
    from promshift.core.catalog import MetricGroup

log = logging.getLogger(__name__)

# What a healthy migration run spends outside its two waits (the warm-up's and the approval's own timeouts, which
# the interval counts in full): why the margin is 4 h. The chain's ``execution_timeout`` backstops (validate,
# snapshot, deploy_dual_write, warm_up's worker part, parity_plan, parity_samples, parity, latency, gate, approval's
# worker part, cutover, done: ``dag_factory.EXECUTION_TIMEOUTS``) add up to 3 h 35 min, and the two waits' triggers
# run 5 min past their timeouts; a healthy run's steps take minutes. A run past this is stuck beyond both waits
# (a task hung, a trigger lost), or waiting behind other groups' probes on its target workspace (one at a time:
# LATENCY_PROBES_PER_WORKSPACE; the notice says which stage and step it is at). Raising a backstop means raising this.
OVERDUE_MARGIN = timedelta(hours=4)


def overdue_after(groups: Sequence[MetricGroup]) -> timedelta:
    """The deadline's interval for a migration DAG of ``groups``: the longest warm-up timeout + approval timeout
    of any of them, plus ``OVERDUE_MARGIN``. A ``warmup_override`` is the run's, not the DAG's: a run with a longer
    one can reach the deadline while still warming up (its notice says so)."""
    if not groups:
        raise ValueError("a migration DAG has at least one group")
    longest = max(g.warmup.timeout_s + g.approval_timeout_s for g in groups)
    return timedelta(seconds=longest) + OVERDUE_MARGIN


def migration_deadline(groups: Sequence[MetricGroup], *, catalog_path: str | Path,
                       profile: str | None = None) -> DeadlineAlert:
    """The ``deadline=`` of a migration DAG of ``groups``: ``overdue_after`` them from the run's ``queued_at``,
    then ``migration_overdue`` on the triggerer."""
    return DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=overdue_after(groups),
                         callback=AsyncCallback(migration_overdue,
                                                kwargs={"catalog_path": str(catalog_path), "profile": profile}))


class OverdueNotReported(RuntimeError):
    """The overdue run could not be recorded or its owners told; one line saying why (Airflow shows it)."""


@dataclass(frozen=True)
class OverdueRun:
    """What the deadline's context says about the run."""

    dag_id: str
    run_id: str
    group: str
    queued_at: datetime | None
    deadline_time: datetime | None
    deadline_id: str
    conf: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> OverdueRun:
        """The run from ``Deadline.handle_miss``'s context; OverdueNotReported when it names no run or group."""
        run = context.get("dag_run") if isinstance(context, Mapping) else None
        deadline = context.get("deadline") if isinstance(context, Mapping) else None
        if not isinstance(run, Mapping):
            raise OverdueNotReported("the deadline's context has no dag_run: nothing to report")
        run_id, dag_id = run.get("dag_run_id") or run.get("run_id"), run.get("dag_id")
        if not isinstance(run_id, str) or not run_id or not isinstance(dag_id, str):
            raise OverdueNotReported(f"the deadline's dag_run names no run (dag_run_id={run_id!r:.80})")
        conf = run.get("conf") if isinstance(run.get("conf"), Mapping) else {}
        group = conf.get("group")
        if not isinstance(group, str) or not group:
            raise OverdueNotReported(f"run {run_id!r:.120} of {dag_id}: its conf names no group: nothing to report")
        deadline = deadline if isinstance(deadline, Mapping) else {}
        return cls(dag_id=dag_id, run_id=run_id, group=group, queued_at=_when(run.get("queued_at")),
                   deadline_time=_when(deadline.get("deadline_time")), deadline_id=str(deadline.get("id") or ""),
                   conf=dict(conf))


def _when(value: Any) -> datetime | None:
    """A time of the context: a datetime (as the trigger's kwargs come back) or its ISO text (the run's JSON)."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment is not None else None


def _minutes(seconds: float) -> str:
    from promshift.core.durations import format_duration

    return format_duration(60.0 * max(0, round(seconds / 60.0)))


@dataclass
class _OverdueStep:
    """What ``orchestration.notify.tell_owners`` reads of a step: the group (its notify policy) and a logger."""

    group: MetricGroup
    log: logging.Logger = log


@dataclass(frozen=True)
class _DeadlineHolder:
    """Who claims the notice in the delivery ledger, named as a task instance is (``notify.holder_of``): the
    deadline of the DAG, one "try" (a second call finds the claim and sends nothing)."""

    dag_id: str
    task_id: str = "deadline"
    map_index: int = -1
    try_number: int = 1


def report_overdue(*, catalog_path: str, profile: str | None, context: Mapping[str, Any],
                   now: datetime | None = None) -> dict[str, Any]:
    """Record ``run_overdue`` for the run (once per deadline) and tell the group's owners (once per channel).

    Blocking (database, catalog file, the channel): ``migration_overdue`` runs it in a thread. Returns what it
    did; raises OverdueNotReported (one line) when it could not record the event or find the group."""
    from promshift.adapters.settings import load_catalog
    from promshift.core import notify as notices
    from promshift.core.events import EventKind
    from promshift.core.text import shown
    from promshift.orchestration.notify import tell_owners
    from promshift.orchestration.wiring import audit_store
    from promshift.steps.migration import record_event, steps_of

    now = now or datetime.now(UTC)
    run = OverdueRun.from_context(context)
    where = f"run {shown(run.run_id)[:120]!r} of group {shown(run.group)[:100]!r}"
    try:
        audit = audit_store()
    except Exception as exc:  # noqa: BLE001 - the callback's one line
        raise OverdueNotReported(f"{where} is overdue, but the audit database cannot be opened: "
                                 f"{type(exc).__name__}: {notices.one_line(exc, 240)}") from None
    try:
        stage = audit.stage_of(run.group).value
        events = audit.events(group=run.group, run_id=run.run_id)
        steps = steps_of(events)
        last = steps[-1] if steps else None
        queued_at = run.queued_at
        evidence = {
            "dag_id": run.dag_id, "stage": stage, "last_event": last.kind if last else None,
            "last_event_at": _iso(last.at) if last else None, "queued_at": _iso(queued_at),
            "deadline_time": _iso(run.deadline_time), "deadline_id": run.deadline_id,
            "deadline_after_s": ((run.deadline_time - queued_at).total_seconds()
                                 if run.deadline_time and queued_at else None),
            "running_for_s": round((now - queued_at).total_seconds()) if queued_at else None,
            "dry_run": run.conf.get("dry_run") is True,
            "warmup_override": str(run.conf.get("warmup_override") or ""),
        }
        already = [e for e in events if e.kind == EventKind.RUN_OVERDUE
                   and e.evidence_data.get("deadline_id") == run.deadline_id]
        recorded = None if already else record_event(audit, group_name=run.group, run_id=run.run_id,
                                                     kind=EventKind.RUN_OVERDUE, evidence=evidence, now=now)
    except Exception as exc:  # noqa: BLE001
        raise OverdueNotReported(f"{where} is overdue, but it was not recorded in the audit: "
                                 f"{type(exc).__name__}: {notices.one_line(exc, 240)}") from None
    finally:
        audit.engine.dispose()
    if already:
        log.info("%s: run_overdue already recorded (event %s)", where, already[0].seq)
    try:
        group = load_catalog(catalog_path, profile=profile).get(run.group)
    except Exception as exc:  # noqa: BLE001 - the catalog changed since the run started, or is broken now
        why = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # a KeyError's str() adds quotes
        raise OverdueNotReported(f"{where} is overdue (recorded), but its owners were not told: the catalog "
                                 f"{catalog_path}: {notices.one_line(why, 240)}") from None
    deadline_s = evidence["deadline_after_s"]
    running_s = evidence["running_for_s"]
    notice_context = {"run_id": run.run_id, "dag_id": run.dag_id, "ti": _DeadlineHolder(run.dag_id)}
    notified = tell_owners(
        _OverdueStep(group), notice_context, notices.RUN_OVERDUE, stage=stage,
        running_for=_minutes(running_s) if running_s is not None else "?",
        deadline_after=_minutes(deadline_s) if deadline_s is not None else "?",
        last_step=evidence["last_event"], last_at=evidence["last_event_at"],
        queued_at=evidence["queued_at"] or "?", dry_run=evidence["dry_run"],
        warmup_override=evidence["warmup_override"])
    log.warning("%s is overdue at stage %s (last step %s); owners notified: %s", where, stage,
                evidence["last_event"], None if notified is None else notified.get("sent"))
    return {"group": run.group, "run_id": run.run_id, "stage": stage,
            "recorded_seq": recorded.seq if recorded is not None else None,
            "notified": notified}


async def migration_overdue(*, catalog_path: str, profile: str | None = None,
                            context: Mapping[str, Any]) -> dict[str, Any]:
    """The deadline's callback, awaited by Airflow's ``CallbackTrigger`` on the triggerer: ``report_overdue`` in a
    thread (its database, file and channel calls block). Raises only OverdueNotReported, one line."""
    try:
        return await asyncio.to_thread(report_overdue, catalog_path=catalog_path, profile=profile, context=context)
    except OverdueNotReported as exc:
        raise OverdueNotReported(str(exc)) from None  # the line alone, not the thread's frames
    except Exception as exc:  # noqa: BLE001 - anything else becomes the callback's one line too
        from promshift.core.notify import one_line

        raise OverdueNotReported(f"the overdue run was not reported: {type(exc).__name__}: "
                                 f"{one_line(exc, 240)}") from None
