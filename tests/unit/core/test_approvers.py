# ruff: noqa: F811 - the operator fixtures (env, audit, dag) are test_operators.py's, imported by name
"""Approvers by team: ``team:<name>`` in the catalog, resolved when the approval is asked, trigger user left out.

The core resolution (``core.approvers``) on its own, then the approval operator on the real DAG: the team comes
from the Airflow Variable ``promshift_teams`` (set through the environment, as Airflow reads Variables), the
simple auth manager's configured users bound the members, and HITL's request is written with the resolved ids.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskAwaitingInput

from promshift.adapters.audit_store import AuditStore
from promshift.core.approvers import Approver, ApproversError, MappingTeams, parse_teams, resolve
from promshift.core.stages import Stage
from tests.fakes import fed
from tests.unit.orchestration.test_operators import (  # noqa: F401 - fixtures
    GROUP,
    TRIGGERED_BY,
    UP_TO_WARMING,
    audit,
    dag,
    env,
    gate_inputs,
    hitl_event,
    make_context,
    seed,
)

TEAMS = {"gpu-oncall": ["oncall-alice", "oncall-bob", TRIGGERED_BY], "night": ["oncall-dave"]}


# -- core ------------------------------------------------------------------------------------------------------


def test_users_and_teams_resolve_in_order_without_repeats_or_the_trigger_user() -> None:
    teams = MappingTeams(TEAMS, source="teams")
    asked = resolve(["oncall-bob", "team:gpu-oncall", "team:night"], teams, group="g", exclude=[TRIGGERED_BY])
    assert [a.id for a in asked] == ["oncall-bob", "oncall-alice", "oncall-dave"]


def test_the_trigger_user_is_left_out_by_id_or_name() -> None:
    class Fab:
        def members(self, team: str) -> list[Approver]:
            return [Approver("7", "oncall-alice"), Approver("9", "sre-carol")]

    assert [a.id for a in resolve(["team:x"], Fab(), group="g", exclude=["sre-carol"])] == ["7"]
    assert [a.id for a in resolve(["team:x"], Fab(), group="g", exclude=["9"])] == ["7"]


def test_nobody_left_to_ask_is_refused_in_one_line() -> None:
    teams = MappingTeams({"solo": [TRIGGERED_BY]}, source="teams")
    with pytest.raises(ApproversError) as err:
        resolve(["team:solo"], teams, group="gpu-memory", exclude=[TRIGGERED_BY])
    assert str(err.value) == ("group gpu-memory: nobody may approve: team:solo resolve to sre-carol, and the run's "
                              "trigger user cannot approve it (four eyes)")
    with pytest.raises(ApproversError, match="no team directory is configured"):
        resolve(["team:solo"], None, group="g")


def test_unknown_teams_and_strangers_are_named() -> None:
    teams = MappingTeams(TEAMS, source="the Variable", known_users=["oncall-alice", "oncall-bob"])
    with pytest.raises(ApproversError, match=r"team 'day' is not in the Variable \(teams there: gpu-oncall, night\)"):
        teams.members("day")
    with pytest.raises(ApproversError, match="names sre-carol, who are not users of the auth manager"):
        teams.members("gpu-oncall")


@pytest.mark.parametrize(("value", "fragment"), [
    ([], "must be a JSON object of team -> list of user ids, got list"),
    ({"bad name": ["a"]}, "team name 'bad name' must match"),
    ({"t": "alice"}, "team 't' must list user ids"),
    ({"t": ["alice", " bob"]}, "team 't' must list user ids"),
    ({"t": [3]}, "team 't' must list user ids"),
])
def test_a_malformed_teams_value_is_refused(value: Any, fragment: str) -> None:
    with pytest.raises(ApproversError, match="^src"):
        parse_teams(value, source="src")
    with pytest.raises(ApproversError) as err:
        parse_teams(value, source="src")
    assert fragment in str(err.value)


# -- the approval operator -------------------------------------------------------------------------------------


@pytest.fixture
def teams_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Simple auth manager users and the team Variable as a deployment sets them; HITL's request captured."""
    from airflow.providers.standard.operators import hitl

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER",
                       "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
                       f"oncall-alice:user,oncall-bob:user,oncall-dave:user,{TRIGGERED_BY}:admin")
    monkeypatch.setenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", json.dumps(TEAMS))
    captured: dict[str, Any] = {}
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kwargs: captured.update(kwargs))
    return captured


def ask(dag: Any, audit: AuditStore, approvers: list[str]) -> tuple[Any, dict[str, Any]]:
    seed(audit, UP_TO_WARMING)
    ctx = make_context()
    gate = fed(dag, "gate", **gate_inputs("SUCCESSFUL")).execute(ctx)
    ctx["task_instance"] = SimpleNamespace(id="0190a0f0-0000-7000-8000-000000000002")
    approval = fed(dag, "approval", gate_evidence=gate)
    approval.approver_entries = approvers
    return approval, ctx


def test_a_team_is_asked_without_the_trigger_user(dag: Any, audit: AuditStore, teams_env: dict[str, Any]) -> None:
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(TaskAwaitingInput):
        approval.execute(ctx)
    assert teams_env["assigned_users"] == [{"id": "oncall-alice", "name": "oncall-alice"},
                                           {"id": "oncall-bob", "name": "oncall-bob"}]
    [shown] = [e for e in audit.events(group=GROUP) if e.kind == "evidence_shown"]
    assert shown.evidence_data["approvers"] == ["oncall-alice", "oncall-bob"]
    approval.execute_complete(ctx, hitl_event("Approve", {"id": "oncall-bob", "name": "oncall-bob"}))
    assert audit.stage_of(GROUP) == Stage.APPROVED


def test_a_team_of_only_the_trigger_user_fails_before_asking(dag: Any, audit: AuditStore,
                                                              teams_env: dict[str, Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", json.dumps({"solo": [TRIGGERED_BY]}))
    approval, ctx = ask(dag, audit, ["team:solo"])
    with pytest.raises(AirflowFailException, match="nobody may approve"):
        approval.execute(ctx)
    assert "assigned_users" not in teams_env  # no request assigned to nobody (anyone could answer it)


def test_a_team_member_who_is_no_user_or_no_variable_fails_in_one_line(dag: Any, audit: AuditStore,
                                                                       teams_env: dict[str, Any],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", f"oncall-alice:user,{TRIGGERED_BY}:admin")
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(AirflowFailException, match="names oncall-bob, who are not users of the auth manager"):
        approval.execute(ctx)
    monkeypatch.delenv("AIRFLOW_VAR_PROMSHIFT_TEAMS")
    with pytest.raises(AirflowFailException, match="no team directory is configured"):
        approval.execute(ctx)
