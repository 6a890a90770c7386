"""The migration operators' decision branches, run on real objects: catalog, DAG, audit store, connections.

No network is needed: the Airflow connections point at a closed port, and every branch
tested here decides from the event, the upstream outputs and the audit store before touching a
backend. The operators are taken from the DAG that ``build_group_dag`` builds, so
their wiring (group, catalog, profile, connection ids) is the production wiring; an operator
with inputs (upstream outputs, XComArgs in the DAG) is built again with them as typed values
(``fed``): what Airflow hands it once it has rendered the task (``test_xcom_wiring`` checks the XComArgs).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.audit import AuditEvent
from promshift.core.events import EventKind
from promshift.core.evidence import evidence_sha256
from promshift.core.latency import ProbeRun
from promshift.core.stages import Stage
from promshift.local.airflow_lab import DEMO_TEAMS
from promshift.local.group_dag import build_group_dag
from promshift.orchestration.approval_operators import MigrationApprovalOperator
from promshift.orchestration.migration_operators import (
    GateOperator,
    RollbackOperator,
    ValidateGroupOperator,
    WarmupOperator,
)
from tests.fakes import FakeTI, fed

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
PROFILE = "demo"
GROUP = "gpu-memory"
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
TRIGGERED_BY = "sre-carol"
# The shipped catalog's groups all migrate to connection promshift_target: one DAG, the group chosen in its form.
MIGRATION_DAG = "promshift__migrate__promshift_target"
APPROVER = "oncall-alice"

# Legal histories (stages entered, oldest first) a run has made before the step under test.
UP_TO_DUAL_WRITING = [Stage.DUAL_WRITING]
UP_TO_WARMING = [Stage.DUAL_WRITING, Stage.WARMING]
UP_TO_VERIFIED = [Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED]
UP_TO_CUT_OVER = [Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER]


# -- Airflow's side of the interface: a task instance with XComs and a dag run ----------------


@dataclass
class FakeDagRun:
    triggering_user_name: str | None = TRIGGERED_BY


def make_context(*, triggered_by: str | None = TRIGGERED_BY, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``params``: the trigger form's values as Airflow hands them to a task (``context["params"]``).
    ``outlet_events``: Airflow's own accessors, where a task emits an asset through its alias."""
    from airflow.sdk.execution_time.context import OutletEventAccessors

    return {"run_id": RUN_ID, "ti": FakeTI(), "dag_run": FakeDagRun(triggered_by),
            "params": dict(params or {}), "outlet_events": OutletEventAccessors()}


def alias_events(context: dict[str, Any], alias: str) -> list[tuple[str, dict[str, Any]]]:
    """(asset uri, extra) of each asset a task emitted through asset alias ``alias`` in ``context``."""
    from airflow.sdk import AssetAlias

    events = context["outlet_events"][AssetAlias(alias)].asset_alias_events
    return [(e.dest_asset_key.uri, e.extra) for e in events]


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throwaway PROMSHIFT_HOME, SQLite audit DB and both Airflow connections (closed port)."""
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 2s}\n")
    monkeypatch.setenv("PROMSHIFT_HOME", str(home))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1",
        "extra": {"config_path": str(config)}}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1",
        "extra": {"config_path": str(config), "remote_write_url": "http://127.0.0.1:1/api/v1/write"}}))
    # The shipped catalog's gpu-memory asks team:gpu-oncall: the demo's teams, as the Airflow Variable.
    monkeypatch.setenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", json.dumps(DEMO_TEAMS))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
                       ",".join(f"{user}:user" for team in DEMO_TEAMS.values() for user in team))
    return tmp_path


@pytest.fixture
def audit(env: Path) -> Iterator[AuditStore]:
    store = AuditStore()  # the same URL the operators resolve (PROMSHIFT_AUDIT_URL)
    assert store.url == f"sqlite:///{env / 'audit.db'}"
    yield store
    store.engine.dispose()


@pytest.fixture
def dag() -> Any:
    """A fresh DAG per test, so operators' cached groups and hooks never leak between tests."""
    group = load_catalog(CATALOG, profile=PROFILE).get(GROUP)
    return build_group_dag(group, catalog_path=CATALOG, profile=PROFILE)


def task(dag: Any, task_id: str) -> Any:
    return dag.get_task(task_id)


def seed(audit: AuditStore, history: list[Stage], *, asked: bool = False, gate: dict[str, Any] | None = None) -> None:
    """Record a legal prior history of the group (each event a checked stage transition).

    ``asked``: then the gate's evidence as the gate recorded it (``gate``: the gate task's output, which the
    approval is fed), and the approval request, as ``MigrationApprovalOperator.execute`` records it before the
    question is shown: the hash of that evidence.
    """
    current = Stage.PLANNED
    for stage in history:
        audit.append(group=GROUP, run_id=RUN_ID, kind=f"seed_{stage.value}", actor="test",
                     at=datetime.now(UTC), evidence={"seeded": True}, stage_from=current, stage_to=stage)
        current = stage
    if asked:
        evidence = gate or {}
        audit.append(group=GROUP, run_id=RUN_ID, kind="gate_passed", actor="test", at=datetime.now(UTC),
                     evidence=evidence)
        audit.append(group=GROUP, run_id=RUN_ID, kind="evidence_shown", actor="test", at=datetime.now(UTC),
                     evidence={"evidence_sha256": evidence_sha256(evidence)})
    assert audit.stage_of(GROUP) == current


SEEDED = {"gate_passed", "evidence_shown"}


def new_events(audit: AuditStore, history: list[Stage]) -> list[AuditEvent]:
    """Events recorded after the seeded history (and the seeded gate and approval request)."""
    return [e for e in audit.events(group=GROUP)[len(history):] if not (e.kind in SEEDED and e.actor == "test")]


BINDING = {"hitl", "evidence_sha256", "current_sha256"}


def decision_of(ev: AuditEvent) -> dict[str, Any]:
    """An approval event's evidence without the HITL record and evidence hashes it names (tested on their own)."""
    return {k: v for k, v in ev.evidence_data.items() if k not in BINDING}


def hitl_event(choice: str, responder: Any, comment: str = "") -> dict[str, Any]:
    """The success payload Airflow's HITL trigger hands to ``execute_complete``."""
    return {"chosen_options": [choice], "params_input": {"comment": comment},
            "responded_at": datetime.now(UTC), "responded_by_user": responder, "timedout": False}


# -- wiring ----------------------------------------------------------------------------------------


def test_operators_come_from_the_group_dag(dag: Any) -> None:
    # The group's target's migration DAG, the group chosen (as the trigger form's ``group`` is when a run renders).
    assert dag.dag_id == MIGRATION_DAG == load_catalog(CATALOG, profile=PROFILE).get(GROUP).dag_id
    expected = {"approval": MigrationApprovalOperator, "warm_up": WarmupOperator, "gate": GateOperator,
                "rollback": RollbackOperator, "validate": ValidateGroupOperator}
    for task_id, cls in expected.items():
        op = dag.get_task(task_id)
        assert isinstance(op, cls), task_id
        assert (op.group_name, op.profile, op.catalog_path) == (GROUP, PROFILE, str(CATALOG))
        assert (op.dag_target, op.target_conn_id) == ("promshift_target", "promshift_target"), task_id
    approval = dag.get_task("approval")
    assert approval.options == [approval.APPROVE, approval.REJECT]
    # The approvers are the chosen group's: read from the catalog (a team resolved) when the question is asked,
    # never when the DAG is parsed.
    assert approval.approver_entries is None and approval.assigned_users == []


# -- MigrationApprovalOperator.execute_complete ---------------------------------------------------


@pytest.mark.parametrize("error_type", ["timeout", "unknown"])
def test_approval_error_event_fails_and_records_timeout(dag: Any, audit: AuditStore, error_type: str) -> None:
    seed(audit, UP_TO_VERIFIED, asked=True)
    event = {"error": "The timeout has passed, and the response has not yet been received.",
             "error_type": error_type}
    with pytest.raises(AirflowFailException, match=f"approval not given: {error_type}"):
        fed(dag, "approval").execute_complete(make_context(), event)
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert ev.kind == "approval_timeout"
    assert ev.actor == "nobody"
    assert ev.run_id == RUN_ID
    assert (ev.stage_from, ev.stage_to) == (None, None)
    assert decision_of(ev) == {"decision": "timeout", "by": "nobody", "comment": event["error"]}
    assert ev.evidence_data["hitl"] == {"dag_id": MIGRATION_DAG, "run_id": RUN_ID, "task_id": "approval",
                                        "map_index": -1, "responder_id": None, "responded_at": None}
    assert audit.stage_of(GROUP) == Stage.VERIFIED
    assert audit.verify().ok


@pytest.mark.parametrize("responder", [
    pytest.param({"id": TRIGGERED_BY, "name": TRIGGERED_BY}, id="dict"),
    pytest.param(SimpleNamespace(id=TRIGGERED_BY, name=TRIGGERED_BY), id="object"),
])
def test_approval_by_the_runs_trigger_is_refused_four_eyes(dag: Any, audit: AuditStore, responder: Any) -> None:
    seed(audit, UP_TO_VERIFIED, asked=True)
    with pytest.raises(AirflowFailException, match=f"{TRIGGERED_BY} triggered this run .*four-eyes"):
        fed(dag, "approval").execute_complete(make_context(), hitl_event("Approve", responder, "lgtm"))
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert ev.kind == "approval_refused_four_eyes"
    assert ev.actor == TRIGGERED_BY
    assert ev.stage_to is None
    assert decision_of(ev) == {"decision": "refused_four_eyes", "by": TRIGGERED_BY, "comment": "lgtm"}
    assert ev.evidence_data["hitl"]["responder_id"] == TRIGGERED_BY
    assert audit.stage_of(GROUP) == Stage.VERIFIED  # never approved


@pytest.mark.parametrize("responder", [
    pytest.param({"id": "9067a1b2-sso-user-id", "name": TRIGGERED_BY}, id="dict"),
    pytest.param(SimpleNamespace(id="42", name=TRIGGERED_BY), id="object"),
])
def test_four_eyes_holds_when_user_id_differs_from_user_name(dag: Any, audit: AuditStore, responder: Any) -> None:
    """HITL records the responder's user id; the dag run only its trigger's *name*.

    They are equal under the Simple auth manager only: the AWS auth manager's id is the
    Identity Center user id and FAB's is numeric, and the rule must hold there too.
    """
    seed(audit, UP_TO_VERIFIED, asked=True)
    with pytest.raises(AirflowFailException, match="four-eyes"):
        fed(dag, "approval").execute_complete(make_context(), hitl_event("Approve", responder))
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert ev.kind == "approval_refused_four_eyes"
    assert ev.actor == (responder["id"] if isinstance(responder, dict) else responder.id)
    assert audit.stage_of(GROUP) == Stage.VERIFIED


def test_reject_fails_and_records_the_comment(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_VERIFIED, asked=True)
    comment = "p95 on the 2m window looks off, not tonight"
    with pytest.raises(AirflowFailException, match=f"rejected by {APPROVER}: {comment}"):
        fed(dag, "approval").execute_complete(make_context(), hitl_event("Reject", {"id": APPROVER,
                                                                                    "name": "Alice"}, comment))
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert ev.kind == "approval_reject"
    assert ev.actor == APPROVER
    assert ev.stage_to is None
    assert decision_of(ev) == {"decision": "Reject", "by": APPROVER, "comment": comment}
    assert audit.stage_of(GROUP) == Stage.VERIFIED


def test_reject_without_comment_says_so(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_VERIFIED, asked=True)
    event = hitl_event("Reject", {"id": APPROVER, "name": APPROVER})
    event["params_input"] = None
    with pytest.raises(AirflowFailException, match="no comment"):
        fed(dag, "approval").execute_complete(make_context(), event)
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert (ev.kind, ev.evidence_data["comment"]) == ("approval_reject", "")


def test_the_runs_trigger_may_reject(dag: Any, audit: AuditStore) -> None:
    """Four eyes guards approval only: the person who started a run can always stop it."""
    seed(audit, UP_TO_VERIFIED, asked=True)
    with pytest.raises(AirflowFailException, match=f"rejected by {TRIGGERED_BY}"):
        fed(dag, "approval").execute_complete(make_context(), hitl_event("Reject", {"id": TRIGGERED_BY,
                                                                                    "name": TRIGGERED_BY}))
    assert [e.kind for e in new_events(audit, UP_TO_VERIFIED)] == ["approval_reject"]


@pytest.mark.parametrize("responder", [
    pytest.param({"id": APPROVER, "name": "Alice"}, id="dict"),
    pytest.param(SimpleNamespace(id=APPROVER, name="Alice"), id="object"),
])
def test_approve_returns_the_decision_and_moves_to_approved(dag: Any, audit: AuditStore, responder: Any) -> None:
    seed(audit, UP_TO_VERIFIED, asked=True)
    result = fed(dag, "approval").execute_complete(make_context(), hitl_event("Approve", responder, "ship it"))
    assert result == {"decision": "Approve", "by": APPROVER, "comment": "ship it"}
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert ev.kind == "approved"
    assert ev.actor == APPROVER
    assert (ev.stage_from, ev.stage_to) == (Stage.VERIFIED.value, Stage.APPROVED.value)
    assert decision_of(ev) == {"decision": "Approve", "by": APPROVER, "comment": "ship it"}
    assert audit.stage_of(GROUP) == Stage.APPROVED
    assert audit.verify().ok


def test_approve_of_inconclusive_evidence_moves_from_warming(dag: Any, audit: AuditStore) -> None:
    """INCONCLUSIVE never verifies a group, so a human approval carries it from warming."""
    seed(audit, UP_TO_WARMING, asked=True)
    fed(dag, "approval").execute_complete(make_context(), hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    [ev] = new_events(audit, UP_TO_WARMING)
    assert (ev.kind, ev.stage_from, ev.stage_to) == ("approved", "warming", "approved")


def test_approve_without_a_known_trigger_user_is_allowed(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_VERIFIED, asked=True)
    ctx = make_context(triggered_by=None)  # e.g. a scheduled run: nobody to compare with
    result = fed(dag, "approval").execute_complete(ctx, hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    assert result["by"] == APPROVER
    assert audit.stage_of(GROUP) == Stage.APPROVED


def test_an_approval_names_the_hitl_record_it_came_from(dag: Any, audit: AuditStore) -> None:
    """dag, run, task, map index, responder id and HITL's responded_at: enough to find Airflow's own record."""
    seed(audit, UP_TO_VERIFIED, asked=True)
    event = hitl_event("Approve", {"id": APPROVER, "name": "Alice"}, "ship it")
    ctx = make_context()
    ctx["ti"].map_index = 3
    fed(dag, "approval").execute_complete(ctx, event)
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert ev.evidence_data["hitl"] == {"dag_id": MIGRATION_DAG, "run_id": RUN_ID, "task_id": "approval",
                                        "map_index": 3, "responder_id": APPROVER,
                                        "responded_at": event["responded_at"].isoformat()}


# The gate's evidence (``GateEvidence.to_dict``): the gate task's output, the approval's input.
EVIDENCE = {"gate": {"verdict": "SUCCESSFUL", "reason": "parity and latency passed"},
            "parity": {"verdict": "SUCCESSFUL", "series_compared": 640},
            "latency": {"verdict": "SUCCESSFUL", "windows": [{"window": "1h", "speedup": 3.2}]}}


def test_an_approval_records_the_evidence_hash_it_was_shown(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_VERIFIED, asked=True, gate=EVIDENCE)
    fed(dag, "approval", gate_evidence=EVIDENCE).execute_complete(
        make_context(), hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    [asked] = [e for e in audit.events(group=GROUP) if e.kind == "evidence_shown"]
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert ev.kind == "approved"
    assert ev.evidence_data["evidence_sha256"] == asked.evidence_data["evidence_sha256"] == evidence_sha256(EVIDENCE)
    assert "current_sha256" not in ev.evidence_data and "recorded_sha256" not in ev.evidence_data
    assert audit.stage_of(GROUP) == Stage.APPROVED


@pytest.mark.parametrize("changed", ["parity", "latency", "gate"])
def test_an_approval_of_evidence_that_changed_since_it_was_shown_is_refused(
        dag: Any, audit: AuditStore, changed: str) -> None:
    """Say parity was cleared and re-ran while the question waited: the approver never saw the new result."""
    seed(audit, UP_TO_VERIFIED, asked=True, gate=EVIDENCE)
    now = {**EVIDENCE, changed: {**EVIDENCE[changed], "verdict": "FAILED"}}
    with pytest.raises(AirflowFailException, match="changed after it was shown, so the approval is refused"):
        fed(dag, "approval", gate_evidence=now).execute_complete(
            make_context(), hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert ev.kind == "approval_refused_evidence_changed"
    assert ev.evidence_data["evidence_sha256"] == evidence_sha256(EVIDENCE)
    assert ev.evidence_data["current_sha256"] == evidence_sha256(now)
    assert audit.stage_of(GROUP) == Stage.VERIFIED  # never approved


def test_the_hash_in_the_approval_body_is_the_audited_gate_evidences_and_an_approval_proceeds(
        dag: Any, audit: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real gate and the real request: the body shows the sha256 of the gate event's evidence as the audit log
    holds it; the answer reads that event back, finds the same hash, and the approval moves the group."""
    from airflow.providers.standard.operators import hitl
    from airflow.sdk.exceptions import TaskAwaitingInput

    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kwargs: None)
    seed(audit, UP_TO_WARMING)
    ctx = make_context()
    gate = fed(dag, "gate", **gate_inputs("SUCCESSFUL")).execute(ctx)
    ctx["task_instance"] = SimpleNamespace(id="0190a0f0-0000-7000-8000-000000000001")  # HITL's request key
    approval = fed(dag, "approval", gate_evidence=gate)
    with pytest.raises(TaskAwaitingInput):
        approval.execute(ctx)
    [gate] = [e for e in audit.events(group=GROUP) if e.kind == "gate_passed"]
    audited = evidence_sha256(gate.evidence_data)
    assert f"Evidence sha256 `{audited}`" in approval.body
    approval.execute_complete(ctx, hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    [ev] = [e for e in audit.events(group=GROUP) if e.kind == "approved"]
    assert ev.evidence_data["evidence_sha256"] == audited and "recorded_sha256" not in ev.evidence_data
    assert audit.stage_of(GROUP) == Stage.APPROVED


def test_an_approval_of_evidence_the_audit_log_does_not_hold_is_refused(dag: Any, audit: AuditStore) -> None:
    """The gate's XCom was edited (Airflow's API lets a user with access write XCom) before the question was asked:
    the approver was shown, and the XCom still holds, evidence whose hash is not that of the gate event in the
    audit log. The answer reads the gate event back from the audit store: the approval is refused, never cut over."""
    seed(audit, UP_TO_VERIFIED)
    audit.append(group=GROUP, run_id=RUN_ID, kind="gate_passed", actor="promshift", at=datetime.now(UTC),
                 evidence={**EVIDENCE, "parity": {"verdict": "FAILED", "series_compared": 640}})
    audit.append(group=GROUP, run_id=RUN_ID, kind="evidence_shown", actor="promshift", at=datetime.now(UTC),
                 evidence={"evidence_sha256": evidence_sha256(EVIDENCE)})
    [gate] = [e for e in audit.events(group=GROUP) if e.kind == "gate_passed"]
    with pytest.raises(AirflowFailException) as refused:
        fed(dag, "approval", gate_evidence=EVIDENCE).execute_complete(
            make_context(), hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    message = str(refused.value)
    assert "\n" not in message and message == (
        f"{APPROVER} approved evidence sha256 {evidence_sha256(EVIDENCE)}, but this run's gate evidence in the "
        f"audit log (audit seq {gate.seq}) hashes to {evidence_sha256(gate.evidence_data)}: the approver was not "
        "shown it, so the approval is refused")
    [ev] = [e for e in audit.events(group=GROUP) if e.seq > gate.seq + 1]
    assert ev.kind == "approval_refused_evidence_unverified" and ev.stage_to is None
    assert ev.evidence_data["evidence_sha256"] == evidence_sha256(EVIDENCE)
    assert ev.evidence_data["recorded_sha256"] == evidence_sha256(gate.evidence_data)
    assert audit.stage_of(GROUP) == Stage.VERIFIED  # never approved, so never cut over
    with pytest.raises(Exception, match="illegal transition verified -> cut_over"):
        task(dag, "cutover").execute(make_context())


def test_an_approval_without_a_gate_event_in_the_audit_log_is_refused(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_VERIFIED)
    audit.append(group=GROUP, run_id=RUN_ID, kind="evidence_shown", actor="promshift", at=datetime.now(UTC),
                 evidence={"evidence_sha256": evidence_sha256(EVIDENCE)})
    with pytest.raises(AirflowFailException, match=r"\(no gate event recorded\) hashes to \(nothing\)"):
        fed(dag, "approval", gate_evidence=EVIDENCE).execute_complete(
            make_context(), hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    assert [e.kind for e in new_events(audit, UP_TO_VERIFIED)][-1] == "approval_refused_evidence_unverified"
    assert audit.stage_of(GROUP) == Stage.VERIFIED


def test_an_approval_without_a_recorded_request_is_refused(dag: Any, audit: AuditStore) -> None:
    """No record of what was shown (the request's audit append never happened): nothing to bind to."""
    seed(audit, UP_TO_VERIFIED)
    with pytest.raises(AirflowFailException, match=r"\(none recorded\)"):
        fed(dag, "approval", gate_evidence=EVIDENCE).execute_complete(
            make_context(), hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    assert [e.kind for e in new_events(audit, UP_TO_VERIFIED)] == ["approval_refused_evidence_changed"]
    assert audit.stage_of(GROUP) == Stage.VERIFIED


def test_a_rejection_stands_even_when_the_evidence_changed(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_VERIFIED, asked=True, gate=EVIDENCE)
    now = {**EVIDENCE, "parity": {"verdict": "FAILED"}}
    with pytest.raises(AirflowFailException, match="rejected by"):
        fed(dag, "approval", gate_evidence=now).execute_complete(
            make_context(), hitl_event("Reject", {"id": APPROVER, "name": APPROVER}))
    [ev] = new_events(audit, UP_TO_VERIFIED)
    assert ev.kind == "approval_reject"
    assert ev.evidence_data["current_sha256"] == evidence_sha256(now) != ev.evidence_data["evidence_sha256"]


def test_each_step_publishes_the_anchored_audit_head_in_xcom(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_VERIFIED, asked=True)
    ctx = make_context()
    fed(dag, "approval").execute_complete(ctx, hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    last = audit.events()[-1]
    assert ctx["ti"].pushed["audit_head"] == {"seq": last.seq, "head": last.hash}
    latest = audit.anchor.latest()
    assert latest is not None and latest.to_dict() == ctx["ti"].pushed["audit_head"]


def test_the_audit_key_comes_from_the_airflow_connection_first(
        dag: Any, audit: AuditStore, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from promshift.core.audit import HMAC_SHA256_V2

    conn_key = "key-from-the-promshift_audit-connection"
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_AUDIT", json.dumps({"conn_type": "generic", "password": conn_key}))
    fed(dag, "rollback").execute(make_context())
    # The rollback, its notification (not sent: no SMTP connection here) and its report, all under that key.
    events = audit.events()
    assert [e.kind for e in events] == ["rollback_not_needed", EventKind.NOTIFIED, "report_published"]
    for ev in events:
        assert ev.scheme == HMAC_SHA256_V2
        assert ev.hash_matches(conn_key.encode()) and not ev.hash_matches(audit.key)
    assert AuditStore(audit.url, key=conn_key.encode()).verify().ok
    assert not audit.verify().ok  # the environment's key is not the one the chain was written with


def test_an_audit_connection_without_a_key_fails_the_task(
        dag: Any, audit: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_AUDIT", json.dumps({"conn_type": "generic", "login": "x"}))
    with pytest.raises(AirflowFailException, match="'promshift_audit' has no password"):
        fed(dag, "rollback").execute(make_context())
    assert audit.events() == []


# -- WarmupOperator.execute_complete --------------------------------------------------------------


def test_warmup_ready_returns_the_event_and_records_it(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_WARMING)
    event = {"status": "ready", "reason": "target holds 240/240 series, lag 1.2s after 125s",
             "observation": {"elapsed_s": 125.0, "source_series": 240, "target_series": 240, "lag_s": 1.2,
                             "failed_samples": 0.0}}
    assert task(dag, "warm_up").execute_complete(make_context(), event) == event
    [ev] = new_events(audit, UP_TO_WARMING)
    assert ev.kind == "warmup_ready"
    assert ev.stage_to is None
    assert ev.evidence_data == event
    assert audit.stage_of(GROUP) == Stage.WARMING


@pytest.mark.parametrize(("status", "reason"), [
    ("timeout", "not ready after 300s: target holds 200 of 240 series"),
    ("error", "http://127.0.0.1:1: unreachable (GET /metrics): ConnectionError"),
])
def test_warmup_timeout_or_error_fails_with_the_reason(dag: Any, audit: AuditStore, status: str,
                                                       reason: str) -> None:
    seed(audit, UP_TO_WARMING)
    event = {"status": status, "reason": reason}
    with pytest.raises(AirflowFailException) as excinfo:
        task(dag, "warm_up").execute_complete(make_context(), event)
    assert str(excinfo.value) == f"warm-up {status}: {reason}"
    [ev] = new_events(audit, UP_TO_WARMING)
    assert ev.kind == f"warmup_{status}"
    assert ev.evidence_data == event
    assert audit.stage_of(GROUP) == Stage.WARMING


# -- GateOperator ------------------------------------------------------------------------------------


def measurement(name: str, verdict: str, reason: str) -> dict[str, Any]:
    return {"name": name, "verdict": verdict, "reason": reason, "queries": [], "numbers": {}}


def gate_inputs(parity: str, latency: str = "SUCCESSFUL") -> dict[str, Any]:
    """The gate's inputs: the parity and latency tasks' outputs."""
    return {
        "parity": {"verdict": parity, "points_compared": 96,
                   "measurements": [measurement("samples", parity, f"samples {parity.lower()}")]},
        "latency": {"verdict": latency, "measurement": measurement("latency", latency, "p95 within SLO"),
                    "windows": [], "runs": [ProbeRun("source", "1h", "q", wall_s=0.01, ok=True, series=1).to_dict()]},
    }


@pytest.mark.parametrize("bad", ["FAILED", "ERROR"])
def test_gate_failed_or_error_parity_fails_the_task(dag: Any, audit: AuditStore, bad: str) -> None:
    seed(audit, UP_TO_WARMING)
    with pytest.raises(AirflowFailException, match=f"gate {bad}: .*parity"):
        fed(dag, "gate", **gate_inputs(bad)).execute(make_context())
    [ev] = new_events(audit, UP_TO_WARMING)
    assert ev.kind == "gate_failed"
    assert ev.stage_to is None
    data = ev.evidence_data
    assert data["gate"]["verdict"] == bad and data["gate"]["action"] == "roll_back"
    assert "runs" not in data["latency"]  # the raw probe runs stay in XCom, not in the audit
    assert audit.stage_of(GROUP) == Stage.WARMING


def test_gate_successful_verifies_the_group(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_WARMING)
    result = fed(dag, "gate", **gate_inputs("SUCCESSFUL")).execute(make_context())
    assert result["gate"]["verdict"] == "SUCCESSFUL" and result["gate"]["action"] == "ask_approval"
    assert result["gate"]["checks"] == {"latency": "SUCCESSFUL", "parity": "SUCCESSFUL"}
    [ev] = new_events(audit, UP_TO_WARMING)
    assert result == ev.evidence_data  # the gate's XCom is its evidence, whole, as the audit log recorded it
    assert (ev.kind, ev.stage_from, ev.stage_to) == ("gate_passed", "warming", "verified")
    assert audit.stage_of(GROUP) == Stage.VERIFIED


def test_gate_inconclusive_asks_a_human_without_a_stage_change(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_WARMING)
    result = fed(dag, "gate", **gate_inputs("INCONCLUSIVE")).execute(make_context())
    assert result["gate"]["verdict"] == "INCONCLUSIVE" and result["gate"]["action"] == "ask_approval"
    [ev] = new_events(audit, UP_TO_WARMING)
    assert ev.kind == "gate_inconclusive"
    assert (ev.stage_from, ev.stage_to) == (None, None)
    assert audit.stage_of(GROUP) == Stage.WARMING


# -- RollbackOperator --------------------------------------------------------------------------------


def test_rollback_without_a_snapshot_records_not_needed(dag: Any, audit: AuditStore, env: Path) -> None:
    config = env / "prometheus.yml"
    before = config.read_bytes()
    ctx = make_context()
    result = fed(dag, "rollback", snapshot=None).execute(ctx)
    assert result["performed"] is False
    assert result["restored_identical"] is None
    assert result["reason"] == "a step failed before the gate; see that task's log"
    [ev, published] = [e for e in audit.events(group=GROUP) if e.kind != EventKind.NOTIFIED]
    assert ev.kind == "rollback_not_needed"
    assert ev.stage_to is None
    assert ev.evidence_data == result
    assert audit.stage_of(GROUP) == Stage.PLANNED
    assert config.read_bytes() == before
    # The run's report, published under PROMSHIFT_HOME/reports (no PROMSHIFT_REPORTS_URL here), and linked.
    assert published.kind == "report_published" and ctx["ti"].pushed["report"] == published.evidence_data
    run_dir = env / "home" / "reports" / GROUP / "manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    assert published.evidence_data["url"] == f"file://{run_dir}"
    assert sorted(p.name for p in run_dir.iterdir()) == ["report.json", "report.md"]  # no latency: no chart
    assert json.loads((run_dir / "report.json").read_text())["rollback"]["reason"] == result["reason"]


def test_done_publishes_the_report_where_PROMSHIFT_REPORTS_URL_says(
        dag: Any, audit: AuditStore, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_REPORTS_URL", f"file://{env / 'shared-reports'}")
    seed(audit, UP_TO_CUT_OVER)
    ctx = make_context()
    task(dag, "done").execute(ctx)
    kinds = [e.kind for e in new_events(audit, UP_TO_CUT_OVER)]
    assert kinds == ["run_complete", "report_published"]
    record = ctx["ti"].pushed["report"]
    assert record["url"].startswith(f"file://{env / 'shared-reports' / GROUP}/")
    assert record["final_stage"] == "cut_over" and record["group"] == GROUP


def test_a_report_store_that_cannot_be_written_does_not_fail_the_step(
        dag: Any, audit: AuditStore, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit log is the evidence; the report is a view of it. The step's outcome stands, and says why."""
    blocker = env / "not-a-directory"
    blocker.write_text("a file where the reports should go")
    monkeypatch.setenv("PROMSHIFT_REPORTS_URL", f"file://{blocker}/reports")
    seed(audit, UP_TO_CUT_OVER)
    ctx = make_context()
    assert task(dag, "done").execute(ctx)["next"].startswith("bake")
    assert [e.kind for e in new_events(audit, UP_TO_CUT_OVER)] == ["run_complete"]
    assert "report" not in ctx["ti"].pushed


def test_rollback_reason_names_the_failed_gate(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_WARMING)
    with pytest.raises(AirflowFailException):
        fed(dag, "gate", **gate_inputs("FAILED")).execute(make_context())
    result = fed(dag, "rollback").execute(make_context())
    assert result["performed"] is False
    assert result["reason"] == "parity FAILED (samples: samples failed)"


# -- CutoverOperator: the routing state in the audit database the connection names ------------------


def test_cutover_routes_in_the_database_the_audit_connection_names(
        dag: Any, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No PROMSHIFT_AUDIT_URL: connection promshift_audit's extra.url names the database that gets
    both the cut_over event and the route; an old routing.json under PROMSHIFT_HOME is taken in."""
    from promshift.adapters.routing import RoutingStore

    url = f"sqlite:///{env / 'named-by-connection.db'}"
    monkeypatch.delenv("PROMSHIFT_AUDIT_URL")
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_AUDIT", json.dumps(
        {"conn_type": "generic", "password": "key-from-the-promshift_audit-connection", "extra": {"url": url}}))
    old = {"read_from": "target", "url": "http://amp/old", "since": "2026-01-01T00:00:00+00:00", "run_id": "old"}
    (env / "home" / "routing.json").write_text(json.dumps({"groups": {"gpu-ecc": old}}))
    audit = AuditStore(url, key=b"key-from-the-promshift_audit-connection")
    seed(audit, UP_TO_CUT_OVER[:-1])
    ctx = make_context()
    result = task(dag, "cutover").execute(ctx)
    # The group's own cut_over asset, through the task's alias (the waves DAG is scheduled on it).
    assert alias_events(ctx, "promshift-cut-over") == [("promshift://group/gpu-memory/cut_over",
                                                        {"group": GROUP, "run_id": RUN_ID})]
    routing = RoutingStore(url).load()["groups"]
    assert routing == {"gpu-ecc": old, GROUP: result["routing"]}
    assert routing[GROUP]["read_from"] == "target" and routing[GROUP]["url"] == "http://127.0.0.1:1"
    [ev] = new_events(audit, UP_TO_CUT_OVER[:-1])
    assert (ev.kind, ev.stage_to) == ("cut_over", "cut_over")
    assert ev.evidence_data["routing"] == routing[GROUP]
    assert ev.evidence_data["manifest"] == f"{url} table promshift_routing"
    assert not (env / "audit.db").exists() and not (env / "home" / "audit.db").exists()
    # A retry finds the event and the route, and writes neither again.
    assert task(dag, "cutover").execute(make_context()) == result
    assert RoutingStore(url).version(GROUP) == 1 and len(audit.events(group=GROUP)) == len(UP_TO_CUT_OVER)


def test_a_corrupt_old_routing_manifest_does_not_stop_a_step(
        dag: Any, audit: AuditStore, env: Path, caplog: pytest.LogCaptureFixture) -> None:
    (env / "home" / "routing.json").write_text('{"groups": {"gpu-memory": ')
    seed(audit, UP_TO_CUT_OVER[:-1])
    assert task(dag, "cutover").execute(make_context())["routing"]["read_from"] == "target"
    assert "old routing manifest not imported" in caplog.text


# -- ValidateGroupOperator ---------------------------------------------------------------------------


def test_validate_skips_a_group_already_cut_over(dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_CUT_OVER)
    with pytest.raises(AirflowSkipException, match="'gpu-memory' is cut_over"):
        task(dag, "validate").execute(make_context())
    # The refusal is audited (no stage move), with the form's values.
    [ev] = new_events(audit, UP_TO_CUT_OVER)
    assert (ev.kind, ev.stage_to) == ("start_refused", None)
    assert ev.evidence_data["reason"].startswith("group 'gpu-memory' is cut_over; a new migration run starts only")
    assert ev.evidence_data["run_params"]["dry_run"] is False
    assert audit.stage_of(GROUP) == Stage.CUT_OVER


def test_validate_fails_naming_unreachable_backends(dag: Any, audit: AuditStore) -> None:
    with pytest.raises(RuntimeError, match=r"source http://127\.0\.0\.1:1 is unreachable.*"
                                           r"target http://127\.0\.0\.1:1 is unreachable"):
        task(dag, "validate").execute(make_context())
    [ev] = audit.events()
    assert ev.kind == "validation_failed" and ev.stage_to is None
    assert ev.evidence_data["reason"].startswith("source http://127.0.0.1:1 is unreachable or not ready; target ")
    assert ev.evidence_data["source_config_sha256"]  # the config nothing was deployed to, for a later comparison
    # The rollback that follows names it.
    result = fed(dag, "rollback").execute(make_context())
    assert result["performed"] is False
    assert result["reason"] == "validation failed: " + ev.evidence_data["reason"]


# -- an AMP target: the hook is chosen by conn_type, its problems fail the task in one line ------------


def amp_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "amp", "login": "AKIDTEST", "password": "op-test-secret",
        "extra": {"region_name": "us-east-1", "workspace_id": "ws-op"}}))


def workspace_answer(status: str) -> dict[str, Any]:
    return {"workspace": {"workspaceId": "ws-op", "status": {"statusCode": status},
                          "arn": "arn:aws:aps:us-east-1:123456789012:workspace/ws-op",
                          "prometheusEndpoint": "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-op/",
                          "createdAt": datetime(2026, 1, 1, tzinfo=UTC)}}


def test_an_amp_target_builds_signed_backends_with_a_sigv4_write(dag: Any, env: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.stub import Stubber

    amp_target(monkeypatch)
    op = task(dag, "validate")
    assert type(op.target_hook).__name__ == "AmpHook" and type(op.source_hook).__name__ == "PrometheusHook"
    with Stubber(op.target_hook.conn) as stub:
        stub.add_response("describe_workspace", workspace_answer("ACTIVE"), {"workspaceId": "ws-op"})
        backends = op.backends()
    endpoint = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-op"
    assert backends.target.base_url == endpoint
    assert backends.target_remote_write_url == endpoint + "/api/v1/remote_write"
    assert backends.target_sigv4 == {"region": "us-east-1"}
    assert backends.target_identity == {"kind": "amp", "workspace_id": "ws-op", "region": "us-east-1"}
    assert backends.target.auth is not None and backends.source.auth is None
    assert "op-test-secret" not in repr(backends)


@pytest.mark.parametrize(("setup", "raises", "message"), [
    (lambda s: s.add_response("describe_workspace", workspace_answer("CREATING"), {"workspaceId": "ws-op"}),
     "AmpError", "AMP workspace ws-op is CREATING, not ACTIVE: wait until it is ACTIVE"),
    (lambda s: s.add_client_error("describe_workspace", "AccessDeniedException", http_status_code=403),
     "AirflowFailException", "DescribeWorkspace on AMP workspace ws-op in us-east-1: access denied "
                             "(AccessDeniedException); the credentials need aps:DescribeWorkspace"),
    (lambda s: s.add_client_error("describe_workspace", "ThrottlingException", http_status_code=429),
     "AmpError", "DescribeWorkspace on AMP workspace ws-op in us-east-1: ThrottlingException from the AMP "
                 "control plane; retry later"),
])
def test_amp_problems_fail_validate_in_one_line_retrying_only_what_may_pass(
        dag: Any, audit: AuditStore, monkeypatch: pytest.MonkeyPatch, setup: Any, raises: str, message: str) -> None:
    from botocore.stub import Stubber

    amp_target(monkeypatch)
    op = task(dag, "validate")
    with Stubber(op.target_hook.conn) as stub:
        setup(stub)
        with pytest.raises(Exception) as excinfo:  # noqa: B017 - the type is asserted by name below
            op.execute(make_context())
    assert type(excinfo.value).__name__ == raises  # AirflowFailException is never retried
    assert str(excinfo.value) == message
    assert excinfo.value.__cause__ is None and "op-test-secret" not in str(excinfo.value)
    # Nothing deployed; the failure and its one-line reason are recorded (retryable ones on every attempt).
    [ev] = audit.events()
    assert ev.kind == "validation_failed" and ev.stage_to is None
    assert ev.evidence_data["reason"] == message
    assert ev.evidence_data["retryable"] is (raises == "AmpError")
    assert "op-test-secret" not in ev.evidence


def test_rollback_restores_the_source_even_when_the_amp_target_refuses_us(
        dag: Any, audit: AuditStore, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad credentials fail every control-plane call; the rollback needs only the source and still runs."""
    from botocore.stub import Stubber

    amp_target(monkeypatch)
    op = fed(dag, "rollback")
    with Stubber(op.target_hook.conn) as stub:
        stub.add_client_error("describe_workspace", "UnrecognizedClientException", http_status_code=403)
        result = op.execute(make_context())
    assert result["performed"] is False
    [ev, _published] = [e for e in audit.events(group=GROUP) if e.kind != EventKind.NOTIFIED]
    assert ev.kind == "rollback_not_needed"
    # Every other step does need the target, and says why it cannot have it.
    with Stubber(task(dag, "validate").target_hook.conn) as stub:
        stub.add_client_error("describe_workspace", "UnrecognizedClientException", http_status_code=403)
        with pytest.raises(AirflowFailException, match=r"AWS refused the credentials' signature "
                                                       r"\(UnrecognizedClientException\)$"):
            task(dag, "validate").execute(make_context())


# -- snapshots any worker can read ---------------------------------------------------------------


def test_a_snapshot_taken_on_one_worker_is_read_back_on_another(
        dag: Any, audit: AuditStore, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PROMSHIFT_SNAPSHOTS_URL (ObjectStoragePath) is shared; each worker's PROMSHIFT_HOME is its own disk."""
    from promshift.steps.migration import SnapshotError

    shared = env / "object-store"
    monkeypatch.setenv("PROMSHIFT_SNAPSHOTS_URL", f"file://{shared}")
    monkeypatch.setenv("PROMSHIFT_HOME", str(env / "worker-a"))
    info = task(dag, "snapshot").execute(make_context())
    assert info["snapshot_path"].startswith(f"file://{shared}/{GROUP}/")
    stored = Path(info["snapshot_path"].removeprefix("file://"))
    assert stored.read_bytes() == (env / "prometheus.yml").read_bytes()
    assert stored.stat().st_mode & 0o777 == (env / "prometheus.yml").stat().st_mode & 0o644  # never wider
    assert not (env / "worker-a" / "snapshots").exists()  # nothing on worker A's own disk
    monkeypatch.setenv("PROMSHIFT_HOME", str(env / "worker-b"))
    other = task(build_group_dag(load_catalog(CATALOG, profile=PROFILE).get(GROUP), catalog_path=CATALOG,
                                 profile=PROFILE), "rollback")
    loaded = other.migration(make_context())._load_snapshot(info)
    assert loaded.data == (env / "prometheus.yml").read_bytes() and loaded.sha256 == info["sha256"]
    # Checked by hash: an edited object is refused, never restored.
    stored.write_bytes(stored.read_bytes() + b"# edited in the bucket\n")
    with pytest.raises(SnapshotError, match="does not match its recorded hash"):
        other.migration(make_context())._load_snapshot(info)


def test_a_retried_rollback_looks_past_its_notification_and_report(dag: Any, audit: AuditStore) -> None:
    """The retry of a rollback whose first try notified the owners and published the report records no second
    rollback: side events (``notified``, ``report_published``) are not the step's own last event."""
    first = fed(dag, "rollback").execute(make_context())
    again = fed(dag, "rollback").execute(make_context())
    assert again == first
    kinds = [e.kind for e in audit.events(group=GROUP)]
    assert kinds.count("rollback_not_needed") == 1, kinds
    assert kinds.count(EventKind.NOTIFIED) == 2  # each try tells the owners (here: recorded as not sent)


def test_a_kubernetes_source_without_its_object_is_refused_before_anything_is_deployed(
        env: Path, audit: AuditStore, dag: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """extra.deploy k8s-cr chooses the CR deployer; without extra.kubernetes (which object, which API) it is one
    line and nothing is recorded or deployed."""
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1", "extra": {"deploy": "k8s-cr"}}))
    for step in ("snapshot", "deploy_dual_write"):
        with pytest.raises(AirflowFailException, match=r"^connection 'promshift_source': extra.deploy 'k8s-cr' "
                                                       r"needs extra.kubernetes"):
            fed(dag, step).execute(make_context())
    assert audit.events(group=GROUP) == []


# -- the trigger form (dry_run, change_ticket, warmup_override, reason) ------------------------------------


class ScriptedPrometheus:
    """A Prometheus that is ready and counts ``series`` for any instant query; records what it was asked."""

    def __init__(self, series: int = 24) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        owner = self
        self.asked: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self.answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                self.answer("POST")

            def answer(self, method: str) -> None:
                url = urlsplit(self.path)
                owner.asked.append(f"{method} {url.path}")
                if url.path == "/-/ready":
                    return self.reply(200, b"Prometheus Server is Ready.\n")
                if url.path == "/api/v1/query":
                    body = {"status": "success", "data": {"resultType": "vector", "result": [
                        {"metric": {}, "value": [1767225600, str(series)]}]}}
                    return self.reply(200, json.dumps(body).encode())
                return self.reply(404, b"{}")

            def reply(self, status: int, raw: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()


@pytest.fixture
def live(env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedPrometheus]:
    """Both connections on one scripted Prometheus that answers validate's checks (read-only)."""
    prom = ScriptedPrometheus()
    config = env / "prometheus.yml"
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": prom.url, "extra": {"config_path": str(config)}}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": prom.url,
        "extra": {"config_path": str(config), "remote_write_url": prom.url + "/api/v1/write"}}))
    yield prom
    prom.server.shutdown()
    prom.server.server_close()


DRY = {"dry_run": True, "change_ticket": "CHG-1234", "warmup_override": "", "reason": "rehearse before the window"}
DRY_KINDS = {"validated", "dry_run_step", "dry_run_gate", "dry_run_complete", "report_published"}


def deployed_before(audit: AuditStore, since: float) -> None:
    """The group's live dual-write as a real run records it (``dual_write_deployed``, into dual_writing)."""
    audit.append(group=GROUP, run_id="manual__earlier", kind="dual_write_deployed", actor="test",
                 at=datetime.now(UTC), evidence={"dual_write_since": since, "remote_write": "promshift-gpu-memory"},
                 stage_from=Stage.PLANNED, stage_to=Stage.DUAL_WRITING)


def test_a_dry_run_moves_no_stage_deploys_routes_and_tells_nothing(
        dag: Any, audit: AuditStore, env: Path, live: ScriptedPrometheus) -> None:
    """Every step of a dry run on a group that is already dual-writing: only audited dry-run events."""
    from promshift.adapters.routing import RoutingStore

    since = 1_767_225_000.0
    deployed_before(audit, since)
    config = env / "prometheus.yml"
    before = config.read_bytes()
    ctx = make_context(params=DRY)

    validated = task(dag, "validate").execute(ctx)
    assert validated["run_params"] == {**DRY, "warmup_override_s": None, "accept_short_history": False}
    assert validated["dry_run"] is True
    # What would refuse a real run is said, not enforced: a dry run changes nothing.
    assert validated["would_refuse"][0].startswith("group 'gpu-memory' is dual_writing")
    snapshot = task(dag, "snapshot").execute(ctx)
    assert snapshot["would"].startswith("keep the group's remote_write config")
    deployed = fed(dag, "deploy_dual_write", snapshot=snapshot).execute(ctx)
    assert deployed["dual_write_since"] == since and deployed["dry_run"] is True
    assert fed(dag, "warm_up", deployed=deployed).execute(ctx) is None  # no deferral: nothing to wait for
    gate = fed(dag, "gate", **gate_inputs("SUCCESSFUL")).execute(ctx)
    assert gate["gate"]["verdict"] == "SUCCESSFUL"
    with pytest.raises(AirflowSkipException, match="dry run: gate SUCCESSFUL; no approval asked"):
        fed(dag, "approval", gate_evidence=gate).execute(ctx)
    with pytest.raises(AirflowSkipException, match="dry run"):
        task(dag, "cutover").execute(ctx)
    rolled = fed(dag, "rollback", snapshot=snapshot).execute(ctx)
    assert rolled["performed"] is False and rolled["step"] == "rollback"

    events = new_events(audit, [Stage.DUAL_WRITING])
    assert {e.kind for e in events} <= DRY_KINDS, [e.kind for e in events]
    assert all(e.stage_to is None for e in events)
    steps = [e.evidence_data["step"] for e in events if e.kind == "dry_run_step"]
    assert steps == ["snapshot", "deploy_dual_write", "warm_up", "rollback"]
    [done] = [e for e in events if e.kind == "dry_run_complete"]
    assert done.evidence_data["gate"] == "SUCCESSFUL"
    assert done.evidence_data["run_params"]["change_ticket"] == "CHG-1234"
    assert audit.stage_of(GROUP) == Stage.DUAL_WRITING
    assert config.read_bytes() == before
    assert not (env / "home" / "snapshots").exists()
    assert RoutingStore(audit.url).get(GROUP) is None
    assert not any(e.kind == EventKind.NOTIFIED for e in events)
    # Read-only: readiness, the source's version (validate's promtool check) and instant queries, never a reload or
    # a write.
    assert {asked.split(" ")[1] for asked in live.asked} == {"/-/ready", "/api/v1/status/buildinfo", "/api/v1/query"}


def test_a_dry_run_without_dual_write_has_no_parity_data_and_never_passes(
        dag: Any, audit: AuditStore, live: ScriptedPrometheus) -> None:
    ctx = make_context(params=DRY)
    deployed = fed(dag, "deploy_dual_write").execute(ctx)
    assert deployed["dual_write_since"] is None and deployed["existing_dual_write_since"] is None
    assert fed(dag, "parity_plan", deployed=deployed).execute(ctx) == []  # no shards: nothing to compare
    plan = ctx["ti"].pushed["plan"]
    # No shards: Airflow resolves the mapped task's output to an empty sequence.
    parity = fed(dag, "parity", plan=plan, shards=[]).execute(ctx)
    assert parity["verdict"] == "INCONCLUSIVE"
    assert "dry run: the group is not dual-writing (planned)" in json.dumps(parity)
    latency = gate_inputs("SUCCESSFUL")["latency"]
    assert fed(dag, "gate", parity=parity, latency=latency).execute(ctx)["gate"]["verdict"] == "INCONCLUSIVE"
    [gate] = [e for e in audit.events(group=GROUP) if e.kind == "dry_run_gate"]
    assert gate.evidence_data["dry_run"] is True and gate.stage_to is None
    assert audit.stage_of(GROUP) == Stage.PLANNED


def test_a_dry_run_with_a_failed_gate_fails_and_rolls_nothing_back(dag: Any, audit: AuditStore, env: Path) -> None:
    config = env / "prometheus.yml"
    before = config.read_bytes()
    ctx = make_context(params=DRY)
    with pytest.raises(AirflowFailException, match=r"^dry run \(nothing to roll back\): gate FAILED"):
        fed(dag, "gate", **gate_inputs("FAILED")).execute(ctx)
    result = fed(dag, "rollback").execute(ctx)
    assert result["performed"] is False
    assert result["reason"] == "parity FAILED (samples: samples failed)"
    kinds = [e.kind for e in audit.events(group=GROUP)]
    assert kinds == ["dry_run_gate", "dry_run_step", "report_published"]  # nobody notified
    assert config.read_bytes() == before and audit.stage_of(GROUP) == Stage.PLANNED


@pytest.mark.parametrize(("override", "message"), [
    ("1s", "param 'warmup_override' must be at least one scrape interval (30s), got '1s'"),
    ("30m1h", "param 'warmup_override': invalid duration '30m1h'"),
    ("ten minutes", "param 'warmup_override' must be a duration like '10m', got 'ten minutes'"),
    ("30d", "param 'warmup_override' must be at most 1w, got '30d'"),
])
def test_a_bad_warmup_override_fails_validate_in_one_line_audited(
        dag: Any, audit: AuditStore, override: str, message: str) -> None:
    params = {**DRY, "dry_run": False, "warmup_override": override}
    with pytest.raises(AirflowFailException) as excinfo:
        task(dag, "validate").execute(make_context(params=params))
    assert str(excinfo.value).startswith(message)
    [ev] = audit.events()
    assert ev.kind == "validation_failed" and ev.stage_to is None
    assert ev.evidence_data["reason"].startswith(message)
    assert ev.evidence_data["run_params"]["warmup_override"] == override
    assert ev.evidence_data["run_params"]["change_ticket"] == "CHG-1234"


def test_a_warmup_override_sets_this_runs_warmup_and_keeps_the_timeout_margin(
        dag: Any, audit: AuditStore) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    seed(audit, UP_TO_DUAL_WRITING)
    group = load_catalog(CATALOG, profile=PROFILE).get(GROUP)
    ctx = make_context(params={"warmup_override": "10m"})
    with pytest.raises(TaskDeferred) as deferred:
        fed(dag, "warm_up", deployed={"dual_write_since": 1_767_225_000.0}).execute(ctx)
    trigger = deferred.value.trigger
    margin = group.warmup.timeout_s - group.warmup.duration_s
    assert (trigger.min_duration_s, trigger.timeout_s) == (600.0, 600.0 + margin)
    [ev] = new_events(audit, UP_TO_DUAL_WRITING)
    assert (ev.kind, ev.stage_to) == ("warmup_started", "warming")
    assert ev.evidence_data["override"] == {"warmup_override": "10m", "duration_s": 600.0,
                                            "timeout_s": 600.0 + margin}


# -- waves at run time ------------------------------------------------------------------------------------


def group_dag(name: str, catalog: Path = CATALOG) -> Any:
    return build_group_dag(load_catalog(catalog, profile=PROFILE).get(name), catalog_path=catalog, profile=PROFILE)


def move(audit: AuditStore, group: str, history: list[Stage]) -> None:
    current = audit.stage_of(group)
    for stage in history:
        audit.append(group=group, run_id="manual__dep", kind=f"seed_{stage.value}", actor="test",
                     at=datetime.now(UTC), evidence={}, stage_from=current, stage_to=stage)
        current = stage


def test_a_wave_2_group_cannot_start_while_its_dependency_only_dual_writes(audit: AuditStore) -> None:
    wave2 = group_dag("gpu-power-thermal")
    move(audit, "gpu-utilization", [Stage.DUAL_WRITING])
    with pytest.raises(AirflowSkipException, match="depends on 'gpu-utilization', which is dual_writing: it must be "
                                                   "cut over first"):
        task(wave2, "validate").execute(make_context())
    [ev] = audit.events(group="gpu-power-thermal")
    assert (ev.kind, ev.stage_to) == ("start_refused", None)
    assert ev.evidence_data["depends_on"] == {"gpu-utilization": "dual_writing"}
    assert ev.evidence_data["wave"] == 2
    assert audit.stage_of("gpu-power-thermal") == Stage.PLANNED
    # Once the dependency is cut over (or later), the same run passes the wave check and goes on to the
    # backends (unreachable here: a validation failure, not a refusal).
    move(audit, "gpu-utilization", UP_TO_CUT_OVER[1:] + [Stage.BAKING])
    with pytest.raises(RuntimeError, match="unreachable"):
        task(group_dag("gpu-power-thermal"), "validate").execute(make_context())
    assert audit.events(group="gpu-power-thermal")[-1].kind == "validation_failed"


def test_a_dependency_whose_reads_were_rolled_back_blocks_again(audit: AuditStore) -> None:
    move(audit, "gpu-utilization", [*UP_TO_CUT_OVER, Stage.BAKING, Stage.ROLLED_BACK_READS])
    with pytest.raises(AirflowSkipException, match="which is rolled_back_reads"):
        task(group_dag("gpu-power-thermal"), "validate").execute(make_context())


def test_a_paused_wave_does_not_start(audit: AuditStore, tmp_path: Path) -> None:
    text = CATALOG.read_text().replace("  paused_waves: []", "  paused_waves: [1]")
    assert "paused_waves: [1]" in text
    catalog = tmp_path / "metric_groups.yaml"
    catalog.write_text(text)
    shutil.copytree(CATALOG.parent / "dashboards", tmp_path / "dashboards")
    with pytest.raises(AirflowSkipException, match=r"wave 1 is paused in the catalog \(defaults.paused_waves\)"):
        task(group_dag(GROUP, catalog), "validate").execute(make_context())
    [ev] = audit.events(group=GROUP)
    assert ev.kind == "start_refused" and ev.evidence_data["blockers"] == [
        "wave 1 is paused in the catalog (defaults.paused_waves)"]


def test_a_dry_run_of_a_blocked_group_says_what_would_refuse_it(audit: AuditStore, live: ScriptedPrometheus) -> None:
    move(audit, "gpu-utilization", [Stage.DUAL_WRITING])
    result = task(group_dag("gpu-power-thermal"), "validate").execute(make_context(params=DRY))
    assert result["would_refuse"] == ["group 'gpu-power-thermal' depends on 'gpu-utilization', which is "
                                      "dual_writing: it must be cut over first"]
    assert [e.kind for e in audit.events(group="gpu-power-thermal")] == ["validated"]


# -- the bake watch ---------------------------------------------------------------------------------------


@pytest.fixture
def bake_dag() -> Any:
    from promshift.orchestration.dag_factory import build_bake_watch_dag

    return build_bake_watch_dag(load_catalog(CATALOG, profile=PROFILE).groups, catalog_path=CATALOG, profile=PROFILE)


def bake_check(bake_dag: Any, watched: dict[str, Any]) -> Any:
    """The mapped ``bake_check`` for one entry of ``watched``'s output, unmapped as Airflow does when it runs it."""
    return bake_dag.get_task("bake_check").unmap(watched)


GROUP_WATCHED = {"group_name": GROUP, "source_conn_id": "promshift_source", "target_conn_id": "promshift_target"}


def test_the_bake_watch_skips_a_group_that_is_not_cut_over(bake_dag: Any, audit: AuditStore) -> None:
    seed(audit, UP_TO_VERIFIED)
    # The watch list leaves it out: no check is mapped for it.
    assert task(bake_dag, "watched").execute(make_context()) == []
    # A check of it all the same (its stage moved after the list was made) skips, records nothing, emits nothing.
    ctx = make_context()
    with pytest.raises(AirflowSkipException, match="'gpu-memory' is verified: the bake watch checks only baking, "
                                                   "cut_over"):
        bake_check(bake_dag, GROUP_WATCHED).execute(ctx)
    assert new_events(audit, UP_TO_VERIFIED) == []
    assert alias_events(ctx, "promshift-baked") == []


def test_a_target_the_watch_cannot_read_rolls_the_reads_back_and_tells_the_owners(
        bake_dag: Any, audit: AuditStore) -> None:
    """Both backends unreachable: every observation is an error, so the check is ERROR and fails the bake."""
    from promshift.adapters.routing import RoutingStore

    seed(audit, UP_TO_CUT_OVER)
    RoutingStore(audit.url).route(GROUP, read_from="target", url="http://amp.example", at=datetime.now(UTC),
                                  run_id=RUN_ID)
    [watched] = task(bake_dag, "watched").execute(make_context())
    assert watched == GROUP_WATCHED
    ctx = make_context()
    with pytest.raises(AirflowFailException, match=r"^bake check ERROR: .*reads returned to the source, dual-write "
                                                   r"stays on$"):
        bake_check(bake_dag, watched).execute(ctx)
    assert alias_events(ctx, "promshift-baked") == []
    kinds = [e.kind for e in new_events(audit, UP_TO_CUT_OVER)]
    assert kinds == ["bake_started", "bake_check", "reads_rolled_back", EventKind.NOTIFIED]
    check = next(e for e in audit.events(group=GROUP) if e.kind == "bake_check").evidence_data
    assert check["verdict"] == "ERROR"
    # Every measurement could not be observed: each is ERROR with the read that failed, none judged on no data.
    assert {m["name"]: m["verdict"] for m in check["measurements"]} == {
        "freshness": "ERROR", "lag": "ERROR", "series": "ERROR", "parity": "ERROR", "entry": "ERROR"}
    # (The parity check reports its unreachable backends itself, as its own ERROR verdict.)
    assert set(check["observation"]["errors"]) == {"age", "lag", "source_series", "target_series", "entry"}
    assert check["observation"]["parity"] == "ERROR"
    assert "unreachable" in check["observation"]["errors"]["age"]
    notified = audit.events(group=GROUP)[-1].evidence_data
    assert notified["notice"] == "bake_failed" and notified["subject"].endswith("failed")
    assert audit.stage_of(GROUP) == Stage.ROLLED_BACK_READS
    assert RoutingStore(audit.url).read_from(GROUP) == "source"


@pytest.mark.parametrize("outcome", ["baked", "baking"])
def test_the_baked_asset_is_emitted_only_after_a_bake(bake_dag: Any, audit: AuditStore,
                                                      monkeypatch: pytest.MonkeyPatch, outcome: str) -> None:
    """The check's outcome (``GroupLifecycle.bake_check``, tested in test_lifecycle) decides: the group's ``baked``
    asset goes out through the check's alias after a clean bake period only."""
    from airflow.sdk import AssetAlias

    from promshift.steps.lifecycle import GroupLifecycle

    seed(audit, [*UP_TO_CUT_OVER, Stage.BAKING])
    checked = {"outcome": outcome, "clean_since": 1.0}
    monkeypatch.setattr(GroupLifecycle, "bake_check", lambda self, now: checked)
    assert bake_dag.get_task("bake_check").outlets == [AssetAlias("promshift-baked")]
    check = bake_check(bake_dag, GROUP_WATCHED)
    assert check.outlets == [AssetAlias("promshift-baked")] and check.group_name == GROUP
    ctx = make_context()
    assert check.execute(ctx) == checked
    expected = [("promshift://group/gpu-memory/baked", {"group": GROUP, "clean_since": 1.0})]
    assert alias_events(ctx, "promshift-baked") == (expected if outcome == "baked" else [])
    assert alias_events(ctx, "promshift-cut-over") == []


# -- decommission: the second approval ------------------------------------------------------------------

UP_TO_BAKED = [*UP_TO_CUT_OVER, Stage.BAKING, Stage.BAKED]
# The prepare task's output, the second approval's input (shown as {"prepare": ...}).
PREPARED = {"freed": {"series": 240, "series_by_job": {"fleet": 240}, "samples_per_s": 48.0},
            "bake": {"at": "2026-12-02T00:00:00+00:00", "checks": 96, "period_s": 86400.0}}


@pytest.fixture
def decommission_dag() -> Any:
    from promshift.orchestration.dag_factory import build_by_hand_dags

    return build_by_hand_dags(load_catalog(CATALOG, profile=PROFILE).groups, catalog_path=CATALOG,
                              profile=PROFILE)[0]


CHOSEN = {"group": GROUP}  # the by-hand DAGs' form: the group chosen


@pytest.mark.parametrize(("history", "message"), [
    (UP_TO_CUT_OVER, "is cut_over; a decommission starts only from baked, recommissioned"),
    (UP_TO_BAKED, "the source is the target's only writer"),  # the connections here: the remote_write path
])
def test_decommission_prepare_refuses_in_one_line_audited(
        decommission_dag: Any, audit: AuditStore, history: list[Stage], message: str) -> None:
    seed(audit, history)
    with pytest.raises(AirflowFailException, match=message):
        task(decommission_dag, "prepare").execute(make_context(params=CHOSEN))
    [ev] = new_events(audit, history)
    assert (ev.kind, ev.stage_to) == ("decommission_refused", None) and message in ev.evidence_data["reason"]
    assert audit.stage_of(GROUP) == history[-1]


def seed_decommission_request(audit: AuditStore) -> None:
    seed(audit, UP_TO_BAKED)
    shown = evidence_sha256({"prepare": PREPARED})
    audit.append(group=GROUP, run_id=RUN_ID, kind="evidence_shown", actor="test", at=datetime.now(UTC),
                 evidence={"evidence_sha256": shown})


def test_the_second_approval_is_recorded_without_moving_the_stage(decommission_dag: Any, audit: AuditStore) -> None:
    seed_decommission_request(audit)
    result = fed(decommission_dag, "approval", prepared=PREPARED).execute_complete(
        make_context(params=CHOSEN), hitl_event("Approve", {"id": APPROVER, "name": APPROVER}, "bake is clean"))
    assert result["by"] == APPROVER
    [ev] = new_events(audit, UP_TO_BAKED)
    assert (ev.kind, ev.stage_to, ev.actor) == ("decommission_approved", None, APPROVER)
    assert audit.stage_of(GROUP) == Stage.BAKED  # the drop itself moves it, once verified


def test_the_second_approval_keeps_four_eyes_and_the_evidence_binding(decommission_dag: Any, audit: AuditStore) -> None:
    seed_decommission_request(audit)
    with pytest.raises(AirflowFailException, match="four-eyes"):
        fed(decommission_dag, "approval", prepared=PREPARED).execute_complete(
            make_context(params=CHOSEN), hitl_event("Approve", {"id": TRIGGERED_BY, "name": TRIGGERED_BY}))
    changed = {**PREPARED, "freed": {"series": 1}}
    with pytest.raises(AirflowFailException, match="changed after it was shown"):
        fed(decommission_dag, "approval", prepared=changed).execute_complete(
            make_context(params=CHOSEN), hitl_event("Approve", {"id": APPROVER, "name": APPROVER}))
    kinds = [e.kind for e in new_events(audit, UP_TO_BAKED)]
    assert kinds == ["decommission_approval_refused_four_eyes", "decommission_approval_refused_evidence_changed"]
    assert audit.stage_of(GROUP) == Stage.BAKED


def test_the_full_rollback_dag_refuses_a_group_that_was_never_cut_over(audit: AuditStore) -> None:
    from promshift.orchestration.dag_factory import build_by_hand_dags

    rollback = build_by_hand_dags(load_catalog(CATALOG, profile=PROFILE).groups, catalog_path=CATALOG,
                                  profile=PROFILE)[2]
    seed(audit, UP_TO_VERIFIED)
    with pytest.raises(AirflowFailException, match="'gpu-memory' is verified; a full rollback by hand starts only "
                                                   "from baked, baking, cut_over, recommissioned, rolled_back_reads"):
        task(rollback, "rollback").execute(make_context(params={**CHOSEN, "reason": "test"}))
    assert new_events(audit, UP_TO_VERIFIED) == []


@pytest.mark.parametrize("own_entry_removed", [True, False])
def test_a_rollback_that_kept_another_writers_change_fails_only_if_our_entry_stayed(
        dag: Any, audit: AuditStore, monkeypatch: pytest.MonkeyPatch, own_entry_removed: bool) -> None:
    from promshift.steps.migration import GroupMigration

    evidence = {"performed": True, "restored_identical": False, "method": "removed_entry",
                "kept_changes_since_snapshot": ["promshift-other"], "own_entry_removed": own_entry_removed}
    monkeypatch.setattr(GroupMigration, "rollback", lambda self, snap, *, reason, now: dict(evidence))
    rollback = fed(dag, "rollback", snapshot={"sha256": "x"})
    ctx = make_context()
    if own_entry_removed:
        assert rollback.execute(ctx)["own_entry_removed"] is True
    else:
        with pytest.raises(AirflowFailException, match="did not restore"):
            rollback.execute(ctx)


@pytest.mark.parametrize("chosen", ["no-such-group", "", None, "gpu-memory\n"])
def test_a_by_hand_dag_refuses_an_unknown_group_in_one_line_touching_nothing(
        decommission_dag: Any, audit: AuditStore, chosen: Any) -> None:
    """The form's list was the catalog's at parse time; the run checks the group against the catalog now."""
    from promshift.orchestration.dag_factory import build_by_hand_dags

    seed(audit, UP_TO_BAKED)
    _, recommission, rollback = build_by_hand_dags(load_catalog(CATALOG, profile=PROFILE).groups,
                                                   catalog_path=CATALOG, profile=PROFILE)
    for dag, task_id in ((decommission_dag, "prepare"), (recommission, "recommission"), (rollback, "rollback")):
        with pytest.raises(AirflowFailException, match=r"^(unknown metric group .*|no metric group chosen .*): "
                                                       r"the catalog .* has ") as caught:
            task(dag, task_id).execute(make_context(params={"group": chosen, "reason": "test"}))
        assert "\n" not in str(caught.value)
    assert new_events(audit, UP_TO_BAKED) == []


def test_the_chosen_groups_approvers_and_wait_are_read_when_the_task_runs(decommission_dag: Any) -> None:
    approval = task(decommission_dag, "approval")
    assert approval.assigned_users == [] and approval.approver_entries is None  # nobody before a group is chosen
    approval.choose_group(make_context(params=CHOSEN))
    group = load_catalog(CATALOG, profile=PROFILE).get(GROUP)
    assert approval.group_name == GROUP and list(approval.group.approvers) == list(group.approvers)
