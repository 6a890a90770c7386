"""The decommission's second approval: ``accept_history_loss`` is a field of the approver's form, shown the history
the drop would lose, recorded in the approval event, and required when anything still reads further back than
the target holds (issue 36 item 2: "Decommission waits ... or records the loss with its own approval")."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import load_catalog
from promshift.core.evidence import evidence_sha256
from promshift.core.stages import Stage
from promshift.orchestration.approval_operators import ACCEPT_HISTORY_LOSS, history_loss_text
from promshift.orchestration.dag_factory import build_by_hand_dags
from tests.fakes import fed
from tests.unit.orchestration.test_operators import (  # noqa: F401  (the env fixture: audit DB, connections)
    APPROVER,
    CATALOG,
    GROUP,
    PROFILE,
    RUN_ID,
    env,
    make_context,
)

BAKED = [Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER, Stage.BAKING, Stage.BAKED]
DAY = "2026-01-02T00:00:00+00:00"
WAITING = [{"kind": "panel", "name": "GPU memory (7 days)", "where": "dcgm", "ready_at": DAY, "reach_s": 604800.0,
            "since_run": "r1"}]
PREPARED = {"freed": {"series": 4800, "series_by_job": {"fleet": 4800}, "samples_per_s": 960.0},
            "bake": {"at": "2026-01-01T00:00:00+00:00", "checks": 3},
            "history_loss": {"waiting": WAITING, "short_by_s": 518400.0, "accepted": False}}


@pytest.fixture
def audit(env: Path) -> Iterator[AuditStore]:  # noqa: F811
    store = AuditStore()
    yield store
    store.engine.dispose()


@pytest.fixture
def dag() -> Any:
    groups = load_catalog(CATALOG, profile=PROFILE).groups
    decommission, _re, _rb = build_by_hand_dags(groups, catalog_path=CATALOG, profile=PROFILE)
    return decommission


def seed(audit: AuditStore, prepared: dict[str, Any]) -> None:
    """A baked group, and the second approval asked on ``prepared`` (the hash the body showed)."""
    current = Stage.PLANNED
    for stage in BAKED:
        audit.append(group=GROUP, run_id="migration", kind=f"seed_{stage.value}", actor="test", at=datetime.now(UTC),
                     evidence={}, stage_from=current, stage_to=stage)
        current = stage
    audit.append(group=GROUP, run_id=RUN_ID, kind="evidence_shown", actor="test", at=datetime.now(UTC),
                 evidence={"evidence_sha256": evidence_sha256({"prepare": prepared})})


def answer(accept: Any, choice: str = "Approve") -> dict[str, Any]:
    params: dict[str, Any] = {"comment": "bake reviewed"}
    if accept is not None:
        params[ACCEPT_HISTORY_LOSS] = accept
    return {"chosen_options": [choice], "params_input": params, "responded_at": datetime.now(UTC),
            "responded_by_user": {"id": APPROVER, "name": APPROVER}, "timedout": False}


def context() -> dict[str, Any]:
    return make_context(params={"group": GROUP})


def test_the_form_has_the_field_unticked_and_the_body_lists_the_loss(dag: Any) -> None:
    field = dag.get_task("approval").params.get_param(ACCEPT_HISTORY_LOSS)
    assert field.value is False and field.schema["type"] == "boolean" and field.source == "task"
    text = history_loss_text(PREPARED["history_loss"])
    assert "1 panel(s) or rule(s)" in text and "GPU memory (7 days)" in text and DAY in text
    assert "518400s short" in text and ACCEPT_HISTORY_LOSS in text
    assert "no history is lost" in history_loss_text({"waiting": [], "short_by_s": 0})


@pytest.mark.parametrize("accept", [None, False, "true", 1])
def test_an_approval_that_does_not_accept_the_loss_is_refused_and_recorded(dag: Any, audit: AuditStore,
                                                                          accept: Any) -> None:
    seed(audit, PREPARED)
    with pytest.raises(AirflowFailException, match="did not accept it"):
        fed(dag, "approval", prepared=PREPARED).execute_complete(context(), answer(accept))
    approved, refused = [e for e in audit.events(group=GROUP) if e.actor != "test"]
    assert approved.kind == "decommission_approved"
    assert approved.evidence_data[ACCEPT_HISTORY_LOSS] is False and approved.evidence_data["history_loss_shown"] == 1
    assert refused.kind == "decommission_refused" and refused.evidence_data["history_loss"]["waiting"] == WAITING
    assert audit.stage_of(GROUP) == Stage.BAKED and audit.verify().ok


def test_an_approval_that_accepts_the_loss_is_recorded_and_handed_to_the_drop(dag: Any, audit: AuditStore) -> None:
    seed(audit, PREPARED)
    result = fed(dag, "approval", prepared=PREPARED).execute_complete(context(), answer(True))
    assert result == {"decision": "Approve", "by": APPROVER, "comment": "bake reviewed", ACCEPT_HISTORY_LOSS: True}
    [approved] = [e for e in audit.events(group=GROUP) if e.actor != "test"]
    assert approved.kind == "decommission_approved" and approved.actor == APPROVER
    assert approved.evidence_data[ACCEPT_HISTORY_LOSS] is True and approved.evidence_data["history_loss_shown"] == 1


def test_without_history_loss_nothing_needs_accepting(dag: Any, audit: AuditStore) -> None:
    prepared = {**PREPARED, "history_loss": {"waiting": [], "short_by_s": 0.0, "accepted": False}}
    seed(audit, prepared)
    result = fed(dag, "approval", prepared=prepared).execute_complete(context(), answer(None))
    assert result[ACCEPT_HISTORY_LOSS] is False and result["decision"] == "Approve"


def test_a_rejection_is_a_rejection_whatever_the_field_says(dag: Any, audit: AuditStore) -> None:
    seed(audit, PREPARED)
    with pytest.raises(AirflowFailException):
        fed(dag, "approval", prepared=PREPARED).execute_complete(context(), answer(True, choice="Reject"))
    [rejected] = [e for e in audit.events(group=GROUP) if e.actor != "test"]
    assert rejected.kind != "decommission_approved" and rejected.evidence_data[ACCEPT_HISTORY_LOSS] is True
