"""AmpHook against moto's AMP control plane in server mode (moto[server] 5.2.5) on a free 127.0.0.1 port.

moto answers workspaces (created ACTIVE) and STS AssumeRole; it answers a bare 404 for the workspace
configuration, which promshift must treat as "unavailable, use the catalog's retention".
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import requests

from promshift.adapters.amp import AmpError
from promshift.adapters.settings import REPO_ROOT
from promshift.local.stack.local import find_free_ports
from promshift.orchestration.amp_hook import AmpHook

pytestmark = pytest.mark.integration

REGION = "us-east-1"
ACCESS_KEY = "AKIDMOTOTEST"
SECRET = "moto-test-secret-never-logged"  # noqa: S105
ROLE = "arn:aws:iam::123456789012:role/promshift"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    port = find_free_ports(1)[0]
    proc = subprocess.Popen([str(REPO_ROOT / ".venv" / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url + "/moto-api/", timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def workspace(moto_url: str) -> dict[str, Any]:
    amp = boto3.client("amp", region_name=REGION, endpoint_url=moto_url, aws_access_key_id=ACCESS_KEY,
                       aws_secret_access_key=SECRET)
    created = amp.create_workspace(alias="gpu-fleet")
    amp.create_workspace(alias="gpu-fleet-canary")  # a prefix neighbour the alias lookup must not pick
    return amp.describe_workspace(workspaceId=created["workspaceId"])["workspace"]


def connect(monkeypatch: pytest.MonkeyPatch, moto_url: str, region: str = REGION, **extra: Any) -> AmpHook:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "amp", "login": ACCESS_KEY, "password": SECRET,
        "extra": {"region_name": region, "endpoint_url": moto_url, **extra}}))
    return AmpHook()


@pytest.mark.parametrize("by", ["workspace_id", "workspace_alias"])
def test_the_workspace_by_id_or_alias_gives_the_urls(monkeypatch: pytest.MonkeyPatch, moto_url: str,
                                                     workspace: dict[str, Any], by: str) -> None:
    ref = workspace["workspaceId"] if by == "workspace_id" else "gpu-fleet"
    hook = connect(monkeypatch, moto_url, **{by: ref})
    endpoint = workspace["prometheusEndpoint"]
    assert endpoint.endswith(f"/workspaces/{workspace['workspaceId']}/")
    assert hook.workspace.workspace_id == workspace["workspaceId"]
    assert hook.base_url == endpoint.rstrip("/")
    assert hook.remote_write_url == endpoint + "api/v1/remote_write"
    assert hook.identity() == {"kind": "amp", "workspace_id": workspace["workspaceId"], "region": REGION}


def test_an_unknown_workspace_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, moto_url: str,
                                               workspace: dict[str, Any]) -> None:
    hook = connect(monkeypatch, moto_url, workspace_id="ws-does-not-exist")
    with pytest.raises(AmpError) as excinfo:
        hook.base_url  # noqa: B018 - resolving the workspace is the point
    assert str(excinfo.value) == ("DescribeWorkspace: no AMP workspace ws-does-not-exist in us-east-1 (check "
                                  "extra.workspace_id and that extra.region_name is the workspace's region)")
    ok, message = connect(monkeypatch, moto_url, workspace_alias="no-such-alias").test_connection()
    assert (ok, message) == (False, "no AMP workspace with alias 'no-such-alias' in region us-east-1 "
                                    "(check extra.workspace_alias and extra.region_name)")


def test_the_same_workspace_in_another_region_is_not_found(monkeypatch: pytest.MonkeyPatch, moto_url: str,
                                                           workspace: dict[str, Any]) -> None:
    hook = connect(monkeypatch, moto_url, region="eu-west-1", workspace_id=workspace["workspaceId"])
    ok, message = hook.test_connection()
    assert not ok
    assert message.startswith(f"DescribeWorkspace: no AMP workspace {workspace['workspaceId']} in eu-west-1")


def test_retention_unavailable_from_moto_is_logged_and_left_to_the_catalog(
        monkeypatch: pytest.MonkeyPatch, moto_url: str, workspace: dict[str, Any],
        caplog: pytest.LogCaptureFixture) -> None:
    hook = connect(monkeypatch, moto_url, workspace_id=workspace["workspaceId"])
    with caplog.at_level(logging.INFO, logger="promshift.adapters.amp"):
        value, why = hook.retention()
    assert value is None
    assert why.startswith(f"unavailable (DescribeWorkspaceConfiguration on AMP workspace {workspace['workspaceId']} "
                          "in us-east-1: 404")
    assert "AMP retention unavailable: DescribeWorkspaceConfiguration" in caplog.text


def test_the_role_is_assumed_as_the_amazon_provider_does(monkeypatch: pytest.MonkeyPatch, moto_url: str,
                                                         workspace: dict[str, Any]) -> None:
    hook = connect(monkeypatch, moto_url, workspace_id=workspace["workspaceId"], role_arn=ROLE,
                   service_config={"sts": {"endpoint_url": moto_url}})
    assert hook.workspace.status == "ACTIVE"  # the control plane was reached with the assumed role
    frozen = hook.credentials.get_frozen_credentials()
    assert frozen.access_key != ACCESS_KEY and frozen.token  # temporary credentials from STS
    assert type(hook.credentials).__name__ == "RefreshableCredentials"  # renewed before they expire
    assert hook.sigv4 == {"region": REGION}  # the control-plane role stays promshift's; the writer signs as itself
    assert hook.prometheus_client().auth.credentials is hook.credentials
