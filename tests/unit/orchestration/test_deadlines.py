# ruff: noqa: F811 - the slack fixture is test_notify_once's, imported by name (it uses this module's audit)
"""The migration DAGs' deadline alert: what each DAG carries, and what its callback does when Airflow runs it.

The callback is run by Airflow's own ``CallbackTrigger`` (what the triggerer awaits), built the way Airflow builds
it: the DAG's alert serialized and read back (``DagSerialization``), its callback turned into the triggerer's
callback row (``Callback.create_from_sdk_def``), the context added as ``Deadline.handle_miss`` adds it (the run as
``DAGRunResponse`` JSON, the deadline's id and time), and the trigger's kwargs through the trigger table's
encryption and back. No scheduler or triggerer runs here: a live scheduler never fired this deadline in a test.
The audit database is SQLite (``PROMSHIFT_AUDIT_URL``), the owners' channel Slack's contract server.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.models.callback import Callback
from airflow.models.trigger import Trigger
from airflow.sdk import DeadlineReference
from airflow.serialization.decoders import decode_deadline_alert
from airflow.serialization.serialized_objects import DagSerialization
from airflow.triggers.callback import CallbackTrigger

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.notify_deliveries import SENT, DeliveryLedger
from promshift.adapters.settings import load_catalog
from promshift.core import notify as notices
from promshift.core.events import EventKind
from promshift.core.stages import Stage
from promshift.orchestration import deadlines
from promshift.orchestration.dag_factory import EXECUTION_TIMEOUTS, build_migration_dags
from promshift.steps.migration import steps_of
from tests.slack_webhook import SlackWebhook
from tests.unit.core.test_notify_once import slack  # noqa: F401 - fixture

CATALOG_TEXT = """\
version: 1
defaults:
  approval_timeout: 24h
  warmup: {duration: 30m, timeout: 2h}
  latency:
    windows: [{range: 1h, slo_p95: 2s}]
groups:
  - name: gpu-memory
    owners: [gpu-platform]
    approvers: [oncall-alice, oncall-bob]
    notify: {channel: slack}
    metrics: [DCGM_FI_DEV_FB_USED]
    latency: {queries: [sum(DCGM_FI_DEV_FB_USED)]}
  - name: gpu-clocks
    owners: [gpu-platform]
    approvers: [oncall-alice, oncall-bob]
    approval_timeout: 36h
    warmup: {duration: 1h, timeout: 6h}
    metrics: [DCGM_FI_DEV_SM_CLOCK]
    latency: {queries: [max(DCGM_FI_DEV_SM_CLOCK)]}
  - name: gpu-power
    owners: [datacenter-ops]
    approvers: [oncall-alice, oncall-bob]
    target: amp_eu
    approval_timeout: 48h
    metrics: [DCGM_FI_DEV_POWER_USAGE]
    latency: {queries: [sum(DCGM_FI_DEV_POWER_USAGE)]}
"""
MAIN_DAG = "promshift__migrate__promshift_target"
EU_DAG = "promshift__migrate__amp_eu"
RUN_ID = "manual__2026-12-04T02:00:00+00:00"
# Three days ago: past every deadline here (the callback measures "running for" on the clock).
QUEUED_AT = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=3)
# The steps of a migration run outside its two waits (each one's backstop; the waits' worker phases included).
CHAIN = ("validate", "snapshot", "deploy_dual_write", "warm_up", "parity_plan", "parity_samples", "parity", "latency",
         "gate", "approval", "cutover", "done")


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    path = tmp_path / "metric_groups.yaml"
    path.write_text(CATALOG_TEXT)
    return path


@pytest.fixture
def dags(catalog: Path) -> dict[str, Any]:
    return {d.dag_id: d for d in build_migration_dags(load_catalog(catalog).groups, catalog_path=catalog)}


@pytest.fixture
def audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AuditStore]:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com")
    store = AuditStore()
    yield store
    store.engine.dispose()


# -- the alert each migration DAG carries ------------------------------------------------------------------


def test_each_migration_dag_is_due_after_its_longest_warm_up_and_approval_plus_the_margin(
        dags: dict[str, Any], catalog: Path) -> None:
    assert set(dags) == {MAIN_DAG, EU_DAG}
    # promshift_target: gpu-clocks' 6h + 36h beats gpu-memory's 2h + 24h; amp_eu: gpu-power's 2h + 48h.
    expected = {MAIN_DAG: timedelta(hours=42) + deadlines.OVERDUE_MARGIN,
                EU_DAG: timedelta(hours=50) + deadlines.OVERDUE_MARGIN}
    for dag_id, dag in dags.items():
        [alert] = dag.deadline
        assert alert.interval == expected[dag_id], dag_id
        assert alert.reference == DeadlineReference.DAGRUN_QUEUED_AT
        assert alert.callback.path == "promshift.orchestration.deadlines.migration_overdue"
        assert alert.callback.kwargs == {"catalog_path": str(catalog), "profile": None}
        # What the scheduler reads: the serialized DAG, read back, and its alert decoded.
        back = DagSerialization.from_dict(json.loads(json.dumps(DagSerialization.to_dict(dag))))
        [encoded] = back.deadline
        decoded = decode_deadline_alert(encoded)
        assert decoded.interval == expected[dag_id]
        assert decoded.reference.reference_name == "DagRunQueuedAtDeadline"
        assert (decoded.callback.path, decoded.callback.kwargs) == (alert.callback.path, alert.callback.kwargs)
    assert inspect.iscoroutinefunction(deadlines.migration_overdue)


def test_the_margin_covers_every_steps_backstop_and_the_waits_overrun() -> None:
    """A healthy run never reaches the deadline through its steps' own work: raising a backstop means raising
    the margin (the warm-up and the scraper's creation are deferred 5 min past their timeouts)."""
    work = sum((EXECUTION_TIMEOUTS[t] for t in CHAIN), timedelta()) + 2 * timedelta(minutes=5)
    assert work <= deadlines.OVERDUE_MARGIN
    assert work > deadlines.OVERDUE_MARGIN - timedelta(hours=1)  # a margin, not a day of slack
    with pytest.raises(ValueError):
        deadlines.overdue_after([])


# -- the callback, as Airflow runs it ---------------------------------------------------------------------


def missed_context(dag: Any, *, conf: dict[str, Any], now: datetime) -> dict[str, Any]:
    """``Deadline.handle_miss``'s context for a run of ``dag`` queued at QUEUED_AT: the run as the REST API's
    ``DAGRunResponse`` JSON, and the deadline (its time as a datetime, as the scheduler stores it)."""
    from airflow.api_fastapi.core_api.datamodels.dag_run import DAGRunResponse

    [alert] = dag.deadline
    run = SimpleNamespace(
        run_id=RUN_ID, dag_id=dag.dag_id, logical_date=None, queued_at=QUEUED_AT, start_date=QUEUED_AT,
        end_date=None, duration=None, data_interval_start=None, data_interval_end=None, run_after=QUEUED_AT,
        last_scheduling_decision=now, run_type="manual", state="running", triggered_by="ui",
        triggering_user_name="sre-carol", conf=conf, note=None, dag_versions=[], bundle_version=None,
        dag_model=SimpleNamespace(dag_display_name=dag.dag_id), partition_key=None, partition_date=None)
    return {"dag_run": DAGRunResponse.model_validate(run).model_dump(mode="json"),
            "deadline": {"id": "0193a5c4-0000-7000-8000-00000000dead", "deadline_time": QUEUED_AT + alert.interval}}


def fire(dag: Any, context: dict[str, Any]) -> list[dict[str, Any]]:
    """The alert's callback as the triggerer runs it; the trigger events' payloads."""
    [encoded] = DagSerialization.from_dict(DagSerialization.to_dict(dag)).deadline
    row = Callback.create_from_sdk_def(callback_def=decode_deadline_alert(encoded).callback,
                                       prefix="deadline_alerts", dag_id=dag.dag_id)
    kwargs = {**row.data["kwargs"], "context": context}  # as handle_miss adds it
    stored = Trigger.from_object(CallbackTrigger(callback_path=row.data["path"], callback_kwargs=kwargs))
    trigger = CallbackTrigger(**stored.kwargs)  # the triggerer rebuilds it from the table

    async def run() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(run())


def seed_run(audit: AuditStore, group: str = "gpu-memory") -> None:
    """A run that warmed up and then stopped recording: validated, dual-writing, warming, ready, a notice."""
    now = QUEUED_AT + timedelta(minutes=1)
    stage = Stage.PLANNED
    for kind, to in ((EventKind.VALIDATED, None), (EventKind.DUAL_WRITE_DEPLOYED, Stage.DUAL_WRITING),
                     (EventKind.WARMUP_STARTED, Stage.WARMING), (EventKind.WARMUP_READY, None),
                     (EventKind.NOTIFIED, None)):
        audit.append(group=group, run_id=RUN_ID, kind=kind, actor="promshift", at=now, evidence={},
                     stage_from=stage if to else None, stage_to=to)
        stage = to or stage
        now += timedelta(minutes=10)


def test_an_overdue_run_is_recorded_and_its_owners_told_once(dags: dict[str, Any], audit: AuditStore,
                                                             slack: SlackWebhook) -> None:
    dag = dags[MAIN_DAG]
    seed_run(audit)
    now = datetime.now(UTC)
    context = missed_context(dag, conf={"group": "gpu-memory", "dry_run": False, "warmup_override": "",
                                        "change_ticket": "CHG-1", "reason": ""}, now=now)
    first = fire(dag, context)
    assert [e["state"] for e in first] == ["running", "success"], first
    body = first[-1]["body"]
    assert (body["group"], body["run_id"], body["stage"]) == ("gpu-memory", RUN_ID, "warming")
    assert body["notified"]["sent"] is True and body["notified"]["notice"] == "run_overdue"

    events = audit.events(group="gpu-memory", run_id=RUN_ID)
    [overdue] = [e for e in events if e.kind == EventKind.RUN_OVERDUE]
    assert overdue.stage_to is None and overdue.seq == body["recorded_seq"]
    ev = overdue.evidence_data
    assert (ev["dag_id"], ev["stage"], ev["last_event"]) == (MAIN_DAG, "warming", "warmup_ready")
    assert ev["last_event_at"] == (QUEUED_AT + timedelta(minutes=31)).isoformat()
    assert ev["queued_at"] == QUEUED_AT.isoformat()
    assert ev["deadline_time"] == (QUEUED_AT + timedelta(hours=46)).isoformat()
    # "running for" is measured on the clock: from the queue time to the callback, before this line
    assert ev["deadline_after_s"] == 46 * 3600.0
    assert 72 * 3600 <= ev["running_for_s"] <= (datetime.now(UTC) - QUEUED_AT).total_seconds() + 1  # whole seconds
    assert ev["deadline_id"] == context["deadline"]["id"] and ev["dry_run"] is False
    # A side event: a step resuming from this run's last event looks past it.
    assert steps_of(audit.events(group="gpu-memory", run_id=RUN_ID))[-1].kind == EventKind.WARMUP_READY
    assert audit.stage_of("gpu-memory") == Stage.WARMING  # nothing moved
    assert audit.verify().ok

    [message] = slack.accepted
    text = message["text"]
    assert "gpu-memory" in text and RUN_ID in text and "stage warming" in text and "warmup_ready" in text
    assert "Deadline: 1d22h after queued" in text and re.search(r"still going 3d(\d+m)? after it was queued", text)
    assert "https://airflow.example.com/dags/promshift__migrate__promshift_target/runs/" in json.dumps(message)
    [notified] = [e.evidence_data for e in audit.events(group="gpu-memory") if e.kind == EventKind.NOTIFIED
                  and e.evidence_data.get("notice") == "run_overdue"]
    assert notified["sent"] is True and notified["channel"] == "slack"

    # The triggerer restarted and ran the callback again: nothing recorded twice, nothing sent twice.
    again = fire(dag, context)
    assert [e["state"] for e in again] == ["running", "success"]
    assert again[-1]["body"]["recorded_seq"] is None and again[-1]["body"]["notified"] is None
    assert len(slack.received) == 1
    assert [e.kind for e in audit.events(group="gpu-memory", run_id=RUN_ID)].count(EventKind.RUN_OVERDUE) == 1
    key = notices.delivery_key(group="gpu-memory", run_id=RUN_ID, kind="run_overdue", channel="slack")
    row = DeliveryLedger(audit.url, engine=audit.engine).get(key)
    assert row is not None and (row["state"], row["attempts"], row["holder_task"]) == (
        SENT, 1, f"{MAIN_DAG}/deadline/-1")


def test_a_failed_send_is_sent_by_the_next_call(dags: dict[str, Any], audit: AuditStore,
                                                slack: SlackWebhook) -> None:
    dag = dags[MAIN_DAG]
    slack.script.append((500, "rollup_error", {}))
    context = missed_context(dag, conf={"group": "gpu-memory", "warmup_override": "3d"}, now=datetime.now(UTC))
    first = fire(dag, context)
    assert first[-1]["state"] == "success" and first[-1]["body"]["notified"]["sent"] is False
    # A run that recorded nothing yet (stuck before validate), with a warm-up override the deadline cannot see.
    ev = next(e for e in audit.events(group="gpu-memory") if e.kind == EventKind.RUN_OVERDUE).evidence_data
    assert (ev["stage"], ev["last_event"], ev["warmup_override"]) == ("planned", None, "3d")
    second = fire(dag, context)
    assert second[-1]["body"]["notified"]["sent"] is True
    assert [r.status for r in slack.received] == [500, 200]
    text = slack.accepted[0]["text"]
    assert "nothing recorded yet" in text and "Warm-up override: 3d" in text


def test_a_group_without_a_channel_is_recorded_only(dags: dict[str, Any], audit: AuditStore,
                                                    slack: SlackWebhook) -> None:
    events = fire(dags[EU_DAG], missed_context(dags[EU_DAG], conf={"group": "gpu-power"}, now=datetime.now(UTC)))
    assert events[-1]["state"] == "success" and events[-1]["body"]["notified"] is None
    assert [e.kind for e in audit.events(group="gpu-power")] == [EventKind.RUN_OVERDUE]
    assert slack.received == []


def test_what_it_cannot_do_fails_the_callback_with_one_line(dags: dict[str, Any], audit: AuditStore,
                                                            slack: SlackWebhook, catalog: Path) -> None:
    dag = dags[MAIN_DAG]
    # No group in the run's conf: nothing to record against.
    [_, failed] = fire(dag, missed_context(dag, conf={}, now=datetime.now(UTC)))
    assert failed["state"] == "failed"
    assert f"run '{RUN_ID}' of {MAIN_DAG}: its conf names no group: nothing to report" in failed["body"]
    assert audit.events() == []
    # A group the catalog no longer has: recorded, then the callback fails saying the owners were not told.
    [_, failed] = fire(dag, missed_context(dag, conf={"group": "gpu-gone"}, now=datetime.now(UTC)))
    assert failed["state"] == "failed"
    assert ("of group 'gpu-gone' is overdue (recorded), but its owners were not told: the catalog "
            f"{catalog}: unknown metric group 'gpu-gone'; known groups: gpu-memory, gpu-clocks, gpu-power"
            in failed["body"])
    assert [e.kind for e in audit.events(group="gpu-gone")] == [EventKind.RUN_OVERDUE]
    assert slack.received == []


def test_an_unreachable_audit_database_fails_the_callback_with_one_line(dags: dict[str, Any], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the database's folder should be")
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{blocker / 'audit.db'}")
    dag = dags[MAIN_DAG]
    [_, failed] = fire(dag, missed_context(dag, conf={"group": "gpu-memory"}, now=datetime.now(UTC)))
    assert failed["state"] == "failed"
    assert "of group 'gpu-memory' is overdue, but the audit database cannot be opened" in failed["body"]
