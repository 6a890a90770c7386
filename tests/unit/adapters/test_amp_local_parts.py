"""The local AWS's parts that need no server: routing by botocore's amp model, model validation, counters,
front-door paths, and where the stack's credential pair comes from."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from botocore.exceptions import ParamValidationError

from promshift.local.stack.aws_http import SigV4Stats, credentials_from_env
from promshift.local.stack.controlplane import amp_model, match_operation, validate_shape
from promshift.local.stack.frontdoor import api_kind
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.local.stack.sigv4 import Verdict


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/workspaces", ("CreateWorkspace", {})),
        ("GET", "/workspaces", ("ListWorkspaces", {})),
        ("GET", "/workspaces/ws-1", ("DescribeWorkspace", {"workspaceId": "ws-1"})),
        ("GET", "/workspaces/ws-1/configuration", ("DescribeWorkspaceConfiguration", {"workspaceId": "ws-1"})),
        ("PATCH", "/workspaces/ws-1/configuration", ("UpdateWorkspaceConfiguration", {"workspaceId": "ws-1"})),
        ("POST", "/tags/arn%3Aaws%3Aaps%3Aus-east-1%3A1%3Aworkspace%2Fws-1",
         ("TagResource", {"resourceArn": "arn:aws:aps:us-east-1:1:workspace/ws-1"})),
        ("PATCH", "/workspaces/ws-1", None),
        ("GET", "/nothing", None),
    ],
)
def test_operations_are_named_from_botocores_amp_model(method: str, path: str, expected: object) -> None:
    assert match_operation(method, path) == expected


def test_requests_and_answers_are_validated_against_the_model() -> None:
    update = amp_model().operation_model("UpdateWorkspaceConfiguration")
    validate_shape({"workspaceId": "ws-1", "retentionPeriodInDays": 30}, update, "input")
    for bad in ({"workspaceId": "ws-1", "retentionPeriodInDays": "long"},
                {"workspaceId": "ws-1", "retentionPeriodInDays": 0},
                {"workspaceId": "ws-1", "retention": 30},
                {"retentionPeriodInDays": 30}):
        with pytest.raises(ParamValidationError):
            validate_shape(bad, update, "input")
    validate_shape({"status": {"statusCode": "UPDATING"}}, update, "output")
    with pytest.raises(ParamValidationError, match="not one of"):
        validate_shape({"status": {"statusCode": "DONE"}}, update, "output")
    describe = amp_model().operation_model("DescribeWorkspaceConfiguration")
    with pytest.raises(ParamValidationError):
        validate_shape({"workspaceConfiguration": {"retentionPeriodInDays": 15}}, describe, "output")


def test_front_door_paths_and_counters() -> None:
    assert api_kind("/workspaces/ws-1/api/v1/query_range") == "query_range"
    assert api_kind("/workspaces/ws-1/api/v1/label/__name__/values") == "label_values"
    assert api_kind("/workspaces/ws-1/api/v1/remote_write") == "remote_write"
    assert api_kind("/workspaces/ws-1/api/v1/status/config") == "other"
    assert api_kind("/api/v1/query") == "other"
    stats = SigV4Stats()
    stats.record(Verdict(True), "query")
    stats.record(Verdict(False, "expired"), "query")
    stats.record(Verdict(False, "expired"), "remote_write")
    assert stats.snapshot() == {"verified": 1, "rejected": 2, "rejected_by_reason": {"expired": 2},
                                "verified_by_kind": {"query": 1}}


def test_the_pair_comes_from_the_environment_and_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMENV000000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-from-env")
    stack = LocalStack(StackConfig(home=tmp_path, target_kind="amp"))
    pair = stack.aws_credentials()
    assert (pair.access_key, pair.secret_key, pair.session_token) == (
        "AKIAFROMENV000000000", "secret-from-env", "token-from-env")
    assert stack.aws_env()["AWS_SESSION_TOKEN"] == "token-from-env"
    assert credentials_from_env() == pair
    assert not stack.credentials_path.exists()


def test_without_environment_a_pair_is_made_up_once_and_kept_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    stack = LocalStack(StackConfig(home=tmp_path, target_kind="amp"))
    first = stack.aws_credentials()
    assert stack.aws_credentials() == first == LocalStack(StackConfig(home=tmp_path)).aws_credentials()
    assert stat.S_IMODE(stack.credentials_path.stat().st_mode) == 0o600
    assert json.loads(stack.credentials_path.read_text())["aws_secret_access_key"] == first.secret_key
    with pytest.raises(SystemExit, match="AWS_ACCESS_KEY_ID"):
        credentials_from_env({})


def test_amp_ports_must_differ_and_the_kind_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ports must differ"):
        StackConfig(home=tmp_path, target_kind="amp", relay_port=9090)
    with pytest.raises(ValueError, match="target kind"):
        StackConfig(home=tmp_path, target_kind="amq")
    StackConfig(home=tmp_path, relay_port=9090)  # a plain stack does not use the AWS ports


def test_alert_manager_definitions_route_by_the_model_and_configure_the_local_alertmanager(tmp_path: Path) -> None:
    from promshift.local.stack.alert_definitions import NO_DEFINITION_RECEIVER, AlertDefinitions, local_config

    for method, name in (("POST", "CreateAlertManagerDefinition"), ("GET", "DescribeAlertManagerDefinition"),
                         ("PUT", "PutAlertManagerDefinition"), ("DELETE", "DeleteAlertManagerDefinition")):
        assert match_operation(method, "/workspaces/ws-1/alertmanager/definition") == (name, {"workspaceId": "ws-1"})
    assert api_kind("/workspaces/ws-1/alertmanager/api/v2/alerts") == "alertmanager_alerts"
    data = b"""alertmanager_config: |
  route:
    receiver: oncall
    routes: [{matchers: ['severity="page"'], receiver: pager, mute_time_intervals: [nights]}]
  receivers:
    - {name: oncall, sns_configs: [{topic_arn: 'arn:aws:sns:us-east-1:123456789012:a', sigv4: {region: us-east-1}}]}
    - {name: pager, sns_configs: [{topic_arn: 'arn:aws:sns:us-east-1:123456789012:b', sigv4: {region: us-east-1}}]}
  mute_time_intervals: [{name: nights, time_intervals: [{times: [{start_time: '00:00', end_time: '06:00'}]}]}]
"""
    config = local_config(data)
    # the route tree as written (with short group timings), every receiver by name only: SNS is not reachable here
    assert config["route"]["routes"] == [{"matchers": ['severity="page"'], "receiver": "pager",
                                          "mute_time_intervals": ["nights"]}]
    assert (config["route"]["group_wait"], config["route"]["group_interval"]) == ("1s", "5s")
    assert config["receivers"] == [{"name": "oncall"}, {"name": "pager"}]
    assert [i["name"] for i in config["mute_time_intervals"]] == ["nights"]
    assert local_config(None)["route"]["receiver"] == NO_DEFINITION_RECEIVER
    # kept under the state dir (no Alertmanager given: nothing configured), a bad one refused in one line
    store = AlertDefinitions(tmp_path)
    store.put("ws-1", data, "ZGF0YQ==")
    assert store.get("ws-1")["data"] == "ZGF0YQ==" and AlertDefinitions(tmp_path).get("ws-1") is not None
    assert store.delete("ws-1") and store.get("ws-1") is None and not store.delete("ws-1")
    with pytest.raises(ValueError, match="has no route$"):
        store.check(b"alertmanager_config: |\n  receivers: []\n")
