"""AmpRulesNamespace against botocore's Stubber: the statuses moto never shows (it goes ACTIVE at once)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from promshift.adapters.rules_deploy import AmpRulesNamespace
from promshift.core.deploy import DeployError, DeploySnapshot, DeployState
from promshift.core.rules import parse_rule_file, select_rules

NOW = datetime(2026, 12, 3, 18, 0, tzinfo=UTC)
WS = "ws-12345678-abcd-ef01-2345-6789abcdef01"
NAME = "promshift-gpu-memory"
ARN = f"arn:aws:aps:us-east-1:123456789012:rulegroupsnamespace/{WS}/{NAME}"
DOC = "groups:\n- name: gpu-memory\n  rules:\n  - alert: FbHigh\n    expr: DCGM_FI_DEV_FB_USED > 1000\n"
SELECTION = select_rules([parse_rule_file("r.yml", DOC)], lambda m: m == "DCGM_FI_DEV_FB_USED")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def stubbed(timeout_s: float = 60.0) -> tuple[AmpRulesNamespace, Stubber, FakeClock]:
    client = boto3.client("amp", region_name="us-east-1", aws_access_key_id="AKIDTEST",
                          aws_secret_access_key="not-a-secret")  # noqa: S106
    clock = FakeClock()
    ns = AmpRulesNamespace(client, WS, "gpu-memory", timeout_s=timeout_s, poll_s=5.0, sleep=clock.sleep, clock=clock)
    return ns, Stubber(client), clock


def describe(stub: Stubber, code: str | None, reason: str | None = None, data: str = DOC) -> None:
    params = {"workspaceId": WS, "name": NAME}
    if code is None:
        stub.add_client_error("describe_rule_groups_namespace", "ResourceNotFoundException", "not found", 404,
                              expected_params=params)
        return
    status: dict[str, Any] = {"statusCode": code}
    if reason:
        status["statusReason"] = reason
    stub.add_response("describe_rule_groups_namespace", {"ruleGroupsNamespace": {
        "arn": ARN, "name": NAME, "status": status, "data": data.encode(), "createdAt": NOW, "modifiedAt": NOW}},
        expected_params=params)


def absent() -> DeploySnapshot:
    return DeploySnapshot("rules-amp", None, "", {"existed": False})


def test_creation_polls_until_active() -> None:
    ns, stub, clock = stubbed()
    describe(stub, None)
    stub.add_response("create_rule_groups_namespace", {"name": NAME, "arn": ARN, "status": {"statusCode": "CREATING"}},
                      expected_params={"workspaceId": WS, "name": NAME, "data": DOC.encode()})
    describe(stub, "CREATING")
    describe(stub, "ACTIVE")
    with stub:
        done = ns.put(absent(), DOC, SELECTION, NOW)
        stub.assert_no_pending_responses()
    assert done.state == DeployState.DONE
    assert [c.status for c in done.status_history] == ["CREATING", "ACTIVE"]
    assert clock.sleeps == [5.0]


def test_creation_failed_raises_with_aws_reason() -> None:
    ns, stub, _ = stubbed()
    describe(stub, None)
    stub.add_response("create_rule_groups_namespace", {"name": NAME, "arn": ARN, "status": {"statusCode": "CREATING"}})
    describe(stub, "CREATING")
    describe(stub, "CREATION_FAILED", "1:1: parse error: unexpected identifier")
    # The failed namespace goes: there was none before.
    describe(stub, "CREATION_FAILED", "1:1: parse error: unexpected identifier")
    stub.add_response("delete_rule_groups_namespace", {}, expected_params={"workspaceId": WS, "name": NAME})
    describe(stub, None)
    with stub, pytest.raises(DeployError) as excinfo:
        ns.put(absent(), DOC, SELECTION, NOW)
    stub.assert_no_pending_responses()
    assert str(excinfo.value) == (f"rule-groups namespace {NAME} is CREATION_FAILED: 1:1: parse error: unexpected "
                                  "identifier")


def test_update_failed_on_an_existing_namespace_raises_with_aws_reason() -> None:
    ns, stub, _ = stubbed()
    describe(stub, "ACTIVE", data="groups: []\n")
    stub.add_response("put_rule_groups_namespace", {"name": NAME, "arn": ARN, "status": {"statusCode": "UPDATING"}},
                      expected_params={"workspaceId": WS, "name": NAME, "data": DOC.encode()})
    describe(stub, "UPDATING")
    describe(stub, "UPDATE_FAILED", "rule group limit exceeded")
    # The previous rules are put back.
    stub.add_response("put_rule_groups_namespace", {"name": NAME, "arn": ARN, "status": {"statusCode": "UPDATING"}},
                      expected_params={"workspaceId": WS, "name": NAME, "data": b"groups: []\n"})
    describe(stub, "ACTIVE", data="groups: []\n")
    with stub, pytest.raises(DeployError, match="is UPDATE_FAILED: rule group limit exceeded$"):
        ns.put(DeploySnapshot("rules-amp", NAME, "groups: []\n", {"existed": True}), DOC, SELECTION, NOW)
    stub.assert_no_pending_responses()


def test_a_namespace_that_never_turns_active_times_out() -> None:
    ns, stub, clock = stubbed(timeout_s=12)
    describe(stub, None)
    stub.add_response("create_rule_groups_namespace", {"name": NAME, "arn": ARN, "status": {"statusCode": "CREATING"}})
    for _ in range(4):
        describe(stub, "CREATING")
    # Deleting a namespace still CREATING is refused: both failures are named in one line.
    describe(stub, "CREATING")
    stub.add_client_error("delete_rule_groups_namespace", "ConflictException", "namespace is being created", 409)
    with stub, pytest.raises(DeployError, match=f"^putting rule-groups namespace {NAME} failed \\(rule-groups "
                                                f"namespace {NAME} still CREATING after 12s\\) and restoring the "
                                                "snapshot failed too: DeleteRuleGroupsNamespace .*ConflictException"):
        ns.put(absent(), DOC, SELECTION, NOW)
    assert clock.t >= 12


def test_a_create_that_lost_the_race_becomes_a_put() -> None:
    ns, stub, _ = stubbed()
    describe(stub, None)
    stub.add_client_error("create_rule_groups_namespace", "ConflictException", "exists", 409)
    stub.add_response("put_rule_groups_namespace", {"name": NAME, "arn": ARN, "status": {"statusCode": "UPDATING"}})
    describe(stub, "ACTIVE")
    with stub:
        assert ns.put(absent(), DOC, SELECTION, NOW).state == DeployState.DONE


def test_rollback_puts_the_previous_rules_back_and_waits_for_active() -> None:
    ns, stub, _ = stubbed()
    old = "groups:\n- name: old\n  rules: []\n"
    stub.add_response("put_rule_groups_namespace", {"name": NAME, "arn": ARN, "status": {"statusCode": "UPDATING"}},
                      expected_params={"workspaceId": WS, "name": NAME, "data": old.encode()})
    describe(stub, "UPDATING", data=old)
    describe(stub, "ACTIVE", data=old)
    with stub:
        done = ns.restore(DeploySnapshot("rules-amp", NAME, old, {"existed": True}), NOW)
        stub.assert_no_pending_responses()
    assert done.details["restored_identical"] is True
    assert done.status == "RESTORED"


# --------------------------------------------------------------------------- alert delivery


DEFINITION = b"""alertmanager_config: |
  route:
    receiver: default
    routes:
      - matchers: ['severity="silent"']
        receiver: void
  receivers:
    - name: default
      sns_configs: [{topic_arn: 'arn:aws:sns:us-east-1:123456789012:oncall', sigv4: {region: us-east-1}}]
    - name: void
"""


def definition(stub: Stubber, data: bytes | None, code: str = "ACTIVE") -> None:
    if data is None:
        stub.add_client_error("describe_alert_manager_definition", "ResourceNotFoundException",
                              "Alert manager definition not found", 404, expected_params={"workspaceId": WS})
        return
    stub.add_response("describe_alert_manager_definition", {"alertManagerDefinition": {
        "status": {"statusCode": code}, "data": data, "createdAt": NOW, "modifiedAt": NOW}},
        expected_params={"workspaceId": WS})


def alerts(labels: str = "") -> tuple:
    doc = DOC + (f"    labels: {{{labels}}}\n" if labels else "")
    return select_rules([parse_rule_file("r.yml", doc)], lambda m: m == "DCGM_FI_DEV_FB_USED").alerts


@pytest.mark.parametrize(("data", "code", "labels", "expected"), [
    (None, "ACTIVE", "", f"AMP workspace {WS} has no alert manager definition: moved alert FbHigh would page nobody "
                         "(create one with CreateAlertManagerDefinition, or keep the group's alerts on the source)"),
    (DEFINITION, "CREATION_FAILED", "", f"AMP workspace {WS}'s alert manager definition is CREATION_FAILED: moved "
                                        "alert FbHigh would page nobody"),
    (DEFINITION, "ACTIVE", "severity: silent", f"AMP workspace {WS}: alert FbHigh (alertname='FbHigh', "
     "severity='silent') pages nobody: the alert manager definition routes it to receiver 'void', which has no "
     "integration"),
    (b"alertmanager_config: 7", "ACTIVE", "", f"AMP workspace {WS}'s alert manager definition: alertmanager_config "
                                              "is not a mapping"),
    (DEFINITION, "ACTIVE", "severity: page", None),
    (DEFINITION, "UPDATE_FAILED", "", None),  # the previous definition still routes
])
def test_moved_alerts_need_a_definition_that_routes_them(data: bytes | None, code: str, labels: str,
                                                         expected: str | None) -> None:
    ns, stub, _ = stubbed()
    definition(stub, data, code)
    with stub:
        assert ns.alert_delivery_problem(alerts(labels)) == expected
        stub.assert_no_pending_responses()


def test_no_moved_alert_asks_nothing() -> None:
    ns, stub, _ = stubbed()
    with stub:
        assert ns.alert_delivery_problem(()) is None


def test_the_plan_refuses_moving_alerts_to_a_workspace_without_a_definition_before_anything_moves() -> None:
    """RulesMove.plan (the snapshot step, and every later step that rebuilds it) asks before promtool or a deploy."""
    import json

    from promshift.adapters.rules_deploy import RulesMove, RulesSnapshot, SourceRules

    ns, stub, _ = stubbed()
    definition(stub, None)
    source = SourceRules("/nonexistent/prometheus.yml", client=None)  # type: ignore[arg-type]
    snap = RulesSnapshot(DeploySnapshot("rules-source", "/nonexistent/prometheus.yml",
                                        json.dumps({"files": [["r.yml", DOC]]}), {"existed": True}),
                         DeploySnapshot("rules-amp", None, "", {"existed": False}))
    move = RulesMove(source, ns, group_name="gpu-memory", claims=lambda m: m == "DCGM_FI_DEV_FB_USED")
    with stub, pytest.raises(DeployError) as err:
        move.plan(snap)
    assert str(err.value) == (f"AMP workspace {WS} has no alert manager definition: moved alert FbHigh would page "
                              "nobody (create one with CreateAlertManagerDefinition, or keep the group's alerts on "
                              "the source)")
    stub.assert_no_pending_responses()
