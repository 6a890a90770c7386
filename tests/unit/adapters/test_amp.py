"""The AMP control plane as promshift reads it, with botocore's Stubber (it checks every call against the
real ``amp`` model): workspaces by id or alias, statuses, AWS errors as one-line messages, retention."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from promshift.adapters.amp import (
    AmpError,
    AmpTarget,
    active_workspace,
    amp_target_from_extra,
    workspace_retention,
)
from promshift.local.stack.local import find_free_ports

REGION = "us-east-1"
WS = "ws-0123abcd-4567-89ef-0123-456789abcdef"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # noqa: S105 - a test value, checked for leaks
TOKEN = "IQoJb3JpZ2luX2VjEXAMPLETOKEN"  # noqa: S105


def client(**kwargs: Any) -> Any:
    return boto3.client("amp", region_name=REGION, aws_access_key_id="AKIDTEST", aws_secret_access_key=SECRET,
                        **kwargs)


def described(status: str = "ACTIVE", *, region: str = REGION, ws: str = WS, alias: str = "gpu-fleet") -> dict:
    return {"workspace": {"workspaceId": ws, "alias": alias, "status": {"statusCode": status},
                          "arn": f"arn:aws:aps:{region}:123456789012:workspace/{ws}",
                          "prometheusEndpoint": f"https://aps-workspaces.{region}.amazonaws.com/workspaces/{ws}/",
                          "createdAt": datetime(2026, 1, 1, tzinfo=UTC)}}


def listed(*aliases: str) -> dict:
    return {"workspaces": [{"workspaceId": f"ws-{i}", "alias": a, "arn": f"arn:aws:aps:{REGION}:1:workspace/ws-{i}",
                            "status": {"statusCode": "ACTIVE"}, "createdAt": datetime(2026, 1, 1, tzinfo=UTC)}
                           for i, a in enumerate(aliases)]}


BY_ID = AmpTarget(region=REGION, workspace_id=WS)
BY_ALIAS = AmpTarget(region=REGION, workspace_alias="gpu-fleet")


# -- the connection's extra ---------------------------------------------------------------------------


def test_extra_names_region_and_exactly_one_workspace() -> None:
    target = amp_target_from_extra({"region_name": "eu-west-1", "workspace_alias": " gpu-fleet ",
                                    "role_arn": "arn:aws:iam::123456789012:role/r", "endpoint_url": "http://x"})
    assert target == AmpTarget(region="eu-west-1", workspace_alias="gpu-fleet",
                               role_arn="arn:aws:iam::123456789012:role/r")
    with pytest.raises(AmpError, match=r"^connection 'tgt' needs extra.region_name"):
        amp_target_from_extra({"workspace_id": WS}, conn_id="tgt")
    for extra in ({"region_name": REGION}, {"region_name": REGION, "workspace_id": WS, "workspace_alias": "a"}):
        with pytest.raises(AmpError, match="exactly one of extra.workspace_id or extra.workspace_alias"):
            amp_target_from_extra(extra)


# -- DescribeWorkspace / ListWorkspaces ----------------------------------------------------------------


def test_active_workspace_by_id_gives_query_and_write_urls() -> None:
    c = client()
    with Stubber(c) as stub:
        stub.add_response("describe_workspace", described(), {"workspaceId": WS})
        ws = active_workspace(c, BY_ID)
    assert ws.query_url == f"https://aps-workspaces.us-east-1.amazonaws.com/workspaces/{WS}"
    assert ws.remote_write_url == ws.query_url + "/api/v1/remote_write"
    assert (ws.status, ws.alias, ws.arn_region) == ("ACTIVE", "gpu-fleet", REGION)


def test_alias_is_matched_exactly_among_prefix_matches() -> None:
    c = client()
    with Stubber(c) as stub:
        stub.add_response("list_workspaces", listed("gpu-fleet-old", "gpu-fleet", "gpu-fleet-2"),
                          {"alias": "gpu-fleet"})
        stub.add_response("describe_workspace", described(ws="ws-1"), {"workspaceId": "ws-1"})
        assert active_workspace(c, BY_ALIAS).workspace_id == "ws-1"
        stub.assert_no_pending_responses()


@pytest.mark.parametrize(("aliases", "message"), [
    (("gpu-fleet-old",), "no AMP workspace with alias 'gpu-fleet' in region us-east-1"),
    (("gpu-fleet", "gpu-fleet"), "2 AMP workspaces have alias 'gpu-fleet' in region us-east-1 (ws-0, ws-1); "
                                 "name one by extra.workspace_id"),
])
def test_alias_without_exactly_one_match_is_a_clear_error(aliases: tuple[str, ...], message: str) -> None:
    c = client()
    with Stubber(c) as stub:
        stub.add_response("list_workspaces", listed(*aliases), {"alias": "gpu-fleet"})
        with pytest.raises(AmpError) as excinfo:
            active_workspace(c, BY_ALIAS)
    assert str(excinfo.value).startswith(message)


@pytest.mark.parametrize(("status", "message", "retryable"), [
    ("CREATING", f"AMP workspace {WS} is CREATING, not ACTIVE: wait until it is ACTIVE", True),
    ("UPDATING", f"AMP workspace {WS} is UPDATING, not ACTIVE: wait until it is ACTIVE", True),
    ("DELETING", f"AMP workspace {WS} is DELETING, not ACTIVE: it cannot be migrated onto", False),
    ("CREATION_FAILED", f"AMP workspace {WS} is CREATION_FAILED, not ACTIVE: it cannot be migrated onto", False),
])
def test_a_workspace_not_active_is_refused_naming_its_status(status: str, message: str, retryable: bool) -> None:
    c = client()
    with Stubber(c) as stub:
        stub.add_response("describe_workspace", described(status), {"workspaceId": WS})
        with pytest.raises(AmpError) as excinfo:
            active_workspace(c, BY_ID)
    assert str(excinfo.value) == message
    assert excinfo.value.retryable is retryable


def test_a_workspace_in_another_region_is_refused() -> None:
    c = client()
    with Stubber(c) as stub:
        stub.add_response("describe_workspace", described(region="eu-west-1"), {"workspaceId": WS})
        with pytest.raises(AmpError, match=f"^AMP workspace {WS} is in region eu-west-1, but the connection's "
                                           "region_name is us-east-1$"):
            active_workspace(c, BY_ID)


@pytest.mark.parametrize(("code", "status", "message", "retryable"), [
    ("ResourceNotFoundException", 404, f"DescribeWorkspace: no AMP workspace {WS} in us-east-1 (check "
     "extra.workspace_id and that extra.region_name is the workspace's region)", False),
    ("ThrottlingException", 429, f"DescribeWorkspace on AMP workspace {WS} in us-east-1: ThrottlingException "
     "from the AMP control plane; retry later", True),
    ("AccessDeniedException", 403, f"DescribeWorkspace on AMP workspace {WS} in us-east-1: access denied "
     "(AccessDeniedException); the credentials need aps:DescribeWorkspace", False),
    ("InvalidSignatureException", 403, f"DescribeWorkspace on AMP workspace {WS} in us-east-1: AWS refused the "
     "credentials' signature (InvalidSignatureException)", False),
])
def test_aws_errors_are_one_line_and_hold_no_secret(code: str, status: int, message: str, retryable: bool) -> None:
    c = client()
    # What AWS says about a bad signature can echo the canonical request, session token included.
    server_message = f"The request signature we calculated does not match.\n\nx-amz-security-token:{TOKEN}\n"
    with Stubber(c) as stub:
        stub.add_client_error("describe_workspace", service_error_code=code, service_message=server_message,
                              http_status_code=status, expected_params={"workspaceId": WS})
        with pytest.raises(AmpError) as excinfo:
            active_workspace(c, BY_ID)
    err = excinfo.value
    assert str(err) == message
    assert (err.code, err.retryable) == (code, retryable)
    assert err.__cause__ is None and err.__suppress_context__  # no chained AWS traceback
    assert TOKEN not in str(err) and SECRET not in str(err) and "\n" not in str(err)


@pytest.mark.parametrize(("server_message", "hint"), [
    ("Signature expired: 20260101T000000Z is now earlier than 20260101T000100Z (20260101T000600Z - 5 min.)",
     "the signature's time is more than 5 minutes off AWS's clock (check this host's clock)"),
    ("Signature not yet current: 20260101T001000Z is still later than 20260101T000500Z",
     "the signature's time is more than 5 minutes off AWS's clock (check this host's clock)"),
    ("Credential should be scoped to a valid region, not 'us-east-1'.",
     "signed for region us-east-1, which is not the endpoint's region (check extra.region_name)"),
])
def test_signature_refusals_with_a_known_cause_say_what_to_check(server_message: str, hint: str) -> None:
    c = client()
    with Stubber(c) as stub:
        stub.add_client_error("describe_workspace", service_error_code="InvalidSignatureException",
                              service_message=server_message + f"\nx-amz-security-token:{TOKEN}",
                              http_status_code=403, expected_params={"workspaceId": WS})
        with pytest.raises(AmpError) as excinfo:
            active_workspace(c, BY_ID)
    assert str(excinfo.value) == (f"DescribeWorkspace on AMP workspace {WS} in us-east-1: AWS refused the "
                                  f"credentials' signature (InvalidSignatureException): {hint}")
    assert TOKEN not in str(excinfo.value) and "20260101" not in str(excinfo.value)  # the message is not echoed


def test_list_workspaces_errors_name_the_call() -> None:
    c = client()
    with Stubber(c) as stub:
        stub.add_client_error("list_workspaces", service_error_code="AccessDeniedException", http_status_code=403)
        with pytest.raises(AmpError, match="^ListWorkspaces on AMP workspace alias 'gpu-fleet' in us-east-1: "
                                           "access denied .* aps:ListWorkspaces$"):
            active_workspace(c, BY_ALIAS)


def test_an_unreachable_control_plane_names_the_region() -> None:
    port = find_free_ports(1)[0]  # nothing listens here
    c = client(endpoint_url=f"http://127.0.0.1:{port}",
               config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2))
    with pytest.raises(AmpError) as excinfo:
        active_workspace(c, BY_ID)
    assert str(excinfo.value) == (f"DescribeWorkspace on AMP workspace {WS} in us-east-1: cannot reach the AMP "
                                  "control plane for region us-east-1 (check extra.region_name and "
                                  "extra.endpoint_url)")
    assert excinfo.value.retryable


# -- DescribeWorkspaceConfiguration ----------------------------------------------------------------------


def test_retention_comes_from_the_workspace_configuration() -> None:
    c = client()
    with Stubber(c) as stub:
        stub.add_response("describe_workspace_configuration", {"workspaceConfiguration": {
            "status": {"statusCode": "ACTIVE"}, "retentionPeriodInDays": 150}}, {"workspaceId": WS})
        assert workspace_retention(c, BY_ID, WS) == (150 * 86_400.0,
                                                     "from the workspace configuration (150 days)")


def test_retention_unavailable_is_a_reason_not_an_error() -> None:
    c = client()
    with Stubber(c) as stub:
        # moto 5.2.5 answers this call with a bare HTML 404.
        stub.add_client_error("describe_workspace_configuration", service_error_code="404",
                              service_message="<!doctype html>\n<title>404 Not Found</title>", http_status_code=404)
        stub.add_response("describe_workspace_configuration", {"workspaceConfiguration": {
            "status": {"statusCode": "ACTIVE"}}}, {"workspaceId": WS})
        value, why = workspace_retention(c, BY_ID, WS)
        assert value is None
        assert why == (f"unavailable (DescribeWorkspaceConfiguration on AMP workspace {WS} in us-east-1: 404: "
                       "<!doctype html>)")
        assert workspace_retention(c, BY_ID, WS) == (
            None, "unavailable (the workspace configuration has no retentionPeriodInDays)")


def test_the_out_of_order_window_comes_from_the_workspace_configuration_or_its_documented_default() -> None:
    from promshift.adapters.amp import workspace_out_of_order_window

    c = client()
    with Stubber(c) as stub:
        stub.add_response("describe_workspace_configuration", {"workspaceConfiguration": {
            "status": {"statusCode": "ACTIVE"}, "outOfOrderTimeWindowInSeconds": 300}}, {"workspaceId": WS})
        stub.add_response("describe_workspace_configuration", {"workspaceConfiguration": {
            "status": {"statusCode": "ACTIVE"}, "outOfOrderTimeWindowInSeconds": 0}}, {"workspaceId": WS})
        stub.add_response("describe_workspace_configuration", {"workspaceConfiguration": {
            "status": {"statusCode": "ACTIVE"}, "retentionPeriodInDays": 150}}, {"workspaceId": WS})
        assert workspace_out_of_order_window(c, BY_ID, WS) == (
            300.0, f"outOfOrderTimeWindowInSeconds of AMP workspace {WS}")
        assert workspace_out_of_order_window(c, BY_ID, WS)[0] == 0.0  # set to 0: disabled, a swap is refused
        # Not named: "All workspaces have a default out-of-order time window of 60 seconds" (the AMP user guide).
        assert workspace_out_of_order_window(c, BY_ID, WS) == (
            60.0, "AMP's documented default: the workspace configuration names no outOfOrderTimeWindowInSeconds")


def test_an_unavailable_out_of_order_window_is_unknown_never_a_default() -> None:
    from promshift.adapters.amp import workspace_out_of_order_window

    c = client()
    with Stubber(c) as stub:
        stub.add_client_error("describe_workspace_configuration", service_error_code="AccessDeniedException",
                              service_message="User is not authorized", http_status_code=403)
        value, why = workspace_out_of_order_window(c, BY_ID, WS)
    assert value is None
    assert why == (f"unavailable: DescribeWorkspaceConfiguration on AMP workspace {WS} in us-east-1: access denied "
                   "(AccessDeniedException); the credentials need aps:DescribeWorkspaceConfiguration")
