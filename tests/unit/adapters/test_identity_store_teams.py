# ruff: noqa: F811 - the operator fixtures (env, audit, dag) are test_operators.py's, imported by name
"""Teams as IAM Identity Center groups, against moto's identity store (botocore checks every request's shape).

alice and bob are in the group ``gpu-oncall``, and so is the trigger user (UserName ``sre-carol``); dave is in
another group. The ids asked are Identity Center ``UserId``s, what the AWS auth manager's users carry as their
id (the SAML ``id`` attribute), so HITL's check lets exactly the asked answer; four eyes and the trigger user's
exclusion work on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from airflow.providers.amazon.aws.auth_manager.user import AwsAuthManagerUser
from airflow.sdk.exceptions import AirflowFailException, TaskAwaitingInput
from moto import mock_aws

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.identity_store_teams import MAX_TEAM_MEMBERS, IdentityStoreTeams
from promshift.core.approvers import Approver, ApproversError, resolve
from promshift.core.stages import Stage
from tests.unit.core.test_approvers import ask
from tests.unit.orchestration.test_operators import (  # noqa: F401 - fixtures
    GROUP,
    TRIGGERED_BY,
    audit,
    dag,
    env,
    hitl_event,
)

STORE = "d-9067642ac7"
REGION = "us-east-1"
AWS_AUTH_MANAGER = "airflow.providers.amazon.aws.auth_manager.aws_auth_manager.AwsAuthManager"


@pytest.fixture
def store() -> Iterator[dict[str, Any]]:
    """moto's identity store with the users and groups above; yields the client and the user ids by name."""
    with mock_aws():
        client = boto3.client("identitystore", region_name=REGION)

        def user(name: str) -> str:
            return client.create_user(IdentityStoreId=STORE, UserName=name, DisplayName=name,
                                      Name={"GivenName": name, "FamilyName": "test"},
                                      Emails=[{"Value": f"{name}@example.com", "Primary": True}])["UserId"]

        def group(name: str, members: list[str]) -> str:
            gid = client.create_group(IdentityStoreId=STORE, DisplayName=name)["GroupId"]
            for uid in members:
                client.create_group_membership(IdentityStoreId=STORE, GroupId=gid, MemberId={"UserId": uid})
            return gid

        ids = {n: user(n) for n in ("alice", "bob", TRIGGERED_BY, "dave")}
        group("gpu-oncall", [ids["alice"], ids["bob"], ids[TRIGGERED_BY]])
        group("db-oncall", [ids["dave"]])
        yield {"client": client, "ids": ids, "group": group, "user": user}


def _teams(store: dict[str, Any], **kwargs: Any) -> IdentityStoreTeams:
    return IdentityStoreTeams(store["client"], identity_store_id=STORE, source="IAM Identity Center", **kwargs)


def test_a_group_resolves_to_its_members_user_ids(store: dict[str, Any]) -> None:
    ids = store["ids"]
    assert _teams(store).members("gpu-oncall") == [Approver(ids["alice"], "alice"), Approver(ids["bob"], "bob"),
                                                   Approver(ids[TRIGGERED_BY], TRIGGERED_BY)]
    # When the application's Subject is the email, names are the primary emails (the ids do not change).
    assert [a.name for a in _teams(store, name_attribute="email").members("gpu-oncall")] == \
        ["alice@example.com", "bob@example.com", f"{TRIGGERED_BY}@example.com"]
    assert ids["dave"] not in {a.id for a in _teams(store).members("gpu-oncall")}


def test_the_trigger_user_is_left_out_and_the_aws_auth_managers_users_match_the_asked_ids(
        store: dict[str, Any]) -> None:
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager

    ids = store["ids"]
    asked = resolve(["team:gpu-oncall"], _teams(store), group=GROUP, exclude=[TRIGGERED_BY])
    assert [a.id for a in asked] == [ids["alice"], ids["bob"]]
    assigned = {a.id for a in asked}

    def user(name: str) -> AwsAuthManagerUser:  # as the AWS auth manager builds it from the SAML assertion
        return AwsAuthManagerUser(user_id=ids[name], groups=[], username=name)

    # The AWS auth manager keeps Airflow's check (the user's id among the assigned): no override to trust.
    from airflow.providers.amazon.aws.auth_manager.aws_auth_manager import AwsAuthManager
    assert AwsAuthManager.is_authorized_hitl_task is BaseAuthManager.is_authorized_hitl_task
    check = BaseAuthManager.is_authorized_hitl_task
    assert check(None, assigned_users=assigned, user=user("alice"))  # type: ignore[arg-type]
    assert not check(None, assigned_users=assigned, user=user(TRIGGERED_BY))  # type: ignore[arg-type]
    assert not check(None, assigned_users=assigned, user=user("dave"))  # type: ignore[arg-type]


def test_an_unknown_group_a_huge_group_and_a_bad_setting_fail_in_one_line(store: dict[str, Any]) -> None:
    with pytest.raises(ApproversError, match="'gpu-nights' is not a group in IAM Identity Center"):
        _teams(store).members("gpu-nights")
    store["group"]("everyone", [store["user"](f"u{i}") for i in range(MAX_TEAM_MEMBERS + 1)])
    with pytest.raises(ApproversError, match=f"more than {MAX_TEAM_MEMBERS} members"):
        _teams(store).members("everyone")
    with pytest.raises(ApproversError, match="must be one of UserName, email"):
        _teams(store, name_attribute="mail")
    other = IdentityStoreTeams(store["client"], identity_store_id="d-0000000000", source="IAM Identity Center")
    with pytest.raises(ApproversError, match="IAM Identity Center") as err:
        other.members("gpu-oncall")
    assert "\n" not in str(err.value)


@pytest.fixture
def aws_env(store: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A deployment on the AWS auth manager with the identity store's connection; HITL's request captured."""
    from airflow.providers.standard.operators import hitl

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", AWS_AUTH_MANAGER)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_IDENTITY_STORE", json.dumps(
        {"conn_type": "aws", "extra": {"identity_store_id": STORE, "region_name": REGION}}))
    monkeypatch.delenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", raising=False)
    captured: dict[str, Any] = {}
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kwargs: captured.update(kwargs))
    return captured


def test_the_approval_asks_the_group_without_the_trigger_user_and_keeps_four_eyes(
        dag: Any, audit: AuditStore, store: dict[str, Any], aws_env: dict[str, Any]) -> None:
    ids = store["ids"]
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(TaskAwaitingInput):
        approval.execute(ctx)
    assert aws_env["assigned_users"] == [{"id": ids["alice"], "name": "alice"}, {"id": ids["bob"], "name": "bob"}]
    with pytest.raises(AirflowFailException, match="four-eyes"):
        approval.execute_complete(ctx, hitl_event("Approve", {"id": ids[TRIGGERED_BY], "name": TRIGGERED_BY}))
    assert audit.stage_of(GROUP) != Stage.APPROVED


def test_an_asked_identity_center_user_approves(dag: Any, audit: AuditStore, store: dict[str, Any],
                                                aws_env: dict[str, Any]) -> None:
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(TaskAwaitingInput):
        approval.execute(ctx)
    approval.execute_complete(ctx, hitl_event("Approve", {"id": store["ids"]["bob"], "name": "bob"}))
    assert audit.stage_of(GROUP) == Stage.APPROVED


def test_a_connection_without_the_store_id_is_refused(dag: Any, audit: AuditStore, store: dict[str, Any],
                                                      aws_env: dict[str, Any],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_IDENTITY_STORE", json.dumps({"conn_type": "aws",
                                                                            "extra": {"region_name": REGION}}))
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(AirflowFailException, match="names no identity_store_id"):
        approval.execute(ctx)
