"""Two AMP workspaces on one local AWS (`stack up --target amp --clusters 2`), against real servers.

One control plane over moto holds both workspaces; one front door serves ``/workspaces/<id>/api/v1/...`` for both,
checking every request's SigV4 signature before it routes by the workspace id to the Prometheus behind that
workspace (target, target-b); each workspace has its own signing relay (vmagent). Checked here: both workspaces
exist and describe their own endpoint; a bad or missing signature, a signature made for the other workspace's path
and an unknown workspace are refused; what each relay writes lands in its own workspace's Prometheus and nowhere
else; the quota pre-flight (through two ``amp`` connections, as Airflow's tasks build it) reads each workspace's
own usage and quota.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
import yaml

from promshift.adapters.prometheus import PrometheusClient
from promshift.core.quota import QuotaExceeded
from promshift.local.stack.local import (
    AMP_WORKSPACE_ALIAS_B,
    AWS,
    CLUSTER_B_COMPONENTS,
    FRONTDOOR,
    RELAY,
    RELAY_B,
    LocalStack,
    StackConfig,
)
from promshift.local.stack.sigv4 import make_up_credentials, sign_request
from tests.integration.conftest import eventually, running_amp_stack

pytestmark = pytest.mark.integration

METRIC_TO_A = "DCGM_FI_DEV_GPU_TEMP"  # source-b -> relay -> workspace A
METRIC_TO_B = "DCGM_FI_DEV_POWER_USAGE"  # source-b -> relay-b -> workspace B


def http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


@pytest.fixture(scope="module")
def stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    """2 + 1 nodes (1 s scrapes), two sources, two workspaces; the stack makes its own pair up."""
    with running_amp_stack(stack_config_factory, clusters=2) as running:
        yield running


def query_url(stack: LocalStack, workspace: str, query: str) -> str:
    url = requests.Request("GET", stack.prometheus_endpoint(workspace) + "api/v1/query",
                           params={"query": query}).prepare().url
    assert url is not None
    return url


def signed_get(stack: LocalStack, url: str, *, sign_url: str | None = None, **sign: Any) -> requests.Response:
    headers = sign_request("GET", sign_url or url, credentials=sign.pop("credentials", stack.aws_credentials()),
                           region=sign.pop("region", stack.config.region))
    return http().get(url, headers=headers, timeout=30)


def series(stack: LocalStack, workspace: str, metric: str) -> list[dict[str, Any]]:
    response = signed_get(stack, query_url(stack, workspace, metric))
    assert response.status_code == 200, response.text
    return list(response.json()["data"]["result"])


def now() -> datetime:
    return datetime.now(UTC)


def test_up_creates_two_workspaces_each_with_its_endpoint_relay_and_prometheus(stack: LocalStack) -> None:
    status = stack.status()
    assert {RELAY, RELAY_B, FRONTDOOR, AWS, *CLUSTER_B_COMPONENTS} <= set(status)
    assert all(row["alive"] and row["healthy"] for row in status.values()), status
    ws_a, ws_b = stack.workspace_id, stack.workspace_b_id
    assert ws_a and ws_b and ws_a != ws_b
    amp = stack.amp_client()
    listed = {w["workspaceId"]: w.get("alias") for w in amp.list_workspaces()["workspaces"]}
    assert listed[ws_a] == stack.config.workspace_alias and listed[ws_b] == AMP_WORKSPACE_ALIAS_B
    for ws in (ws_a, ws_b):  # one front door, the workspace in the path, as AMP's regional endpoint
        described = amp.describe_workspace(workspaceId=ws)["workspace"]
        assert described["status"]["statusCode"] == "ACTIVE"
        assert described["prometheusEndpoint"] == f"{stack.frontdoor_url}/workspaces/{ws}/"
    state = json.loads(stack.state_path.read_text())
    assert state["workspace_b_id"] == ws_b and state["relay_b_remote_write_url"] == stack.relay_b_remote_write_url
    assert stack.amp_connection_extra(second=True) == {
        "region_name": stack.config.region, "workspace_id": ws_b, "endpoint_url": stack.aws_url,
        "remote_write_url": stack.relay_b_remote_write_url}
    # The pair is in no process's argv.
    secret = stack.aws_credentials().secret_key.encode()
    for name in (RELAY_B, FRONTDOOR):
        assert secret not in open(f"/proc/{status[name]['pid']}/cmdline", "rb").read(), name
    # Only the first workspace has an alert manager definition: the one Alertmanager is its.
    amp.describe_alert_manager_definition(workspaceId=ws_a)
    with pytest.raises(amp.exceptions.ResourceNotFoundException):
        amp.describe_alert_manager_definition(workspaceId=ws_b)


def test_the_front_door_checks_the_signature_and_the_workspace_before_routing(stack: LocalStack) -> None:
    ws_a, ws_b = str(stack.workspace_id), str(stack.workspace_b_id)
    before = stack.sigv4_stats(FRONTDOOR)["rejected_by_reason"]
    url_b = query_url(stack, ws_b, "vector(1)")
    assert signed_get(stack, url_b).status_code == 200
    unsigned = http().get(url_b, timeout=30)
    assert unsigned.status_code == 403 and unsigned.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
    wrong_secret = signed_get(stack, url_b, credentials=make_up_credentials())
    assert wrong_secret.status_code == 403
    wrong_region = signed_get(stack, url_b, region="eu-west-1")
    assert wrong_region.status_code == 403 and "eu-west-1" in wrong_region.json()["message"]
    # A request signed for workspace A's path, sent to workspace B's: the path is signed, so it is refused.
    crossed = signed_get(stack, url_b, sign_url=query_url(stack, ws_a, "vector(1)"))
    assert crossed.status_code == 403 and crossed.headers["x-amzn-ErrorType"] == "InvalidSignatureException"
    # A workspace nobody created: signed correctly, then refused as AMP does.
    unknown = signed_get(stack, query_url(stack, "ws-00000000-0000-0000-0000-000000000000", "vector(1)"))
    assert unknown.status_code == 404 and unknown.headers["x-amzn-ErrorType"] == "ResourceNotFoundException"
    assert unknown.json()["resourceType"] == "Workspace"
    after = stack.sigv4_stats(FRONTDOOR)["rejected_by_reason"]
    grew = {reason for reason, n in after.items() if n > before.get(reason, 0)}
    assert {"missing_authorization", "unknown_access_key", "wrong_region", "signature_mismatch"} <= grew


def add_remote_writes(config_path: Any, source_url: str, entries: list[dict[str, Any]]) -> None:
    config = yaml.safe_load(config_path.read_text())
    config.setdefault("remote_write", []).extend(entries)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    response = http().post(f"{source_url}/-/reload", timeout=60)
    assert response.status_code == 200, response.text


def test_each_workspaces_writes_land_in_its_own_prometheus_only(stack: LocalStack) -> None:
    ws_a, ws_b = str(stack.workspace_id), str(stack.workspace_b_id)
    writes_before = stack.sigv4_stats(FRONTDOOR)["verified_by_kind"].get("remote_write", 0)

    def keep(metric: str) -> list[dict[str, Any]]:
        return [{"source_labels": ["__name__"], "regex": metric, "action": "keep"}]

    # The second cluster writes one metric into each workspace, each through that workspace's relay.
    add_remote_writes(stack.source_b_config_path, stack.source_b_url, [
        {"url": stack.relay_remote_write_url, "name": "to-a", "write_relabel_configs": keep(METRIC_TO_A)},
        {"url": stack.relay_b_remote_write_url, "name": "to-b", "write_relabel_configs": keep(METRIC_TO_B)},
    ])
    gpus = stack.fleet_b.nodes * 8
    eventually(lambda: len(series(stack, ws_b, METRIC_TO_B)) == gpus, timeout=90,
               message="workspace B never held the metric written to it")
    eventually(lambda: len(series(stack, ws_a, METRIC_TO_A)) == gpus, timeout=90,
               message="workspace A never held the metric written to it")
    assert {s["metric"]["cluster"] for s in series(stack, ws_b, METRIC_TO_B)} == {"local-gpu-fleet-b"}
    time.sleep(3)  # a few more flushes: what went to one workspace must still be absent from the other
    assert series(stack, ws_a, METRIC_TO_B) == [] and series(stack, ws_b, METRIC_TO_A) == []
    # Behind the front door: each workspace is its own Prometheus.
    target_a, target_b = PrometheusClient(stack.target_url), PrometheusClient(stack.target_b_url)
    assert target_b.scalar(f"count({METRIC_TO_B})") == gpus and target_b.scalar(f"count({METRIC_TO_A})") is None
    assert target_a.scalar(f"count({METRIC_TO_A})") == gpus and target_a.scalar(f"count({METRIC_TO_B})") is None
    assert stack.sigv4_stats(FRONTDOOR)["verified_by_kind"]["remote_write"] > writes_before


def test_the_quota_preflight_reads_each_workspaces_own_usage_and_quota(
        stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    from promshift.orchestration.amp_hook import AmpHook

    ws_a, ws_b = str(stack.workspace_id), str(stack.workspace_b_id)
    for name, value in stack.aws_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps(
        {"conn_type": "amp", "extra": stack.amp_connection_extra()}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET_B", json.dumps(
        {"conn_type": "amp", "extra": stack.amp_connection_extra(second=True)}))
    # Give workspace A series of its own first, so the two usages differ.
    add_remote_writes(stack.source_config_path, stack.source_url, [
        {"url": stack.relay_remote_write_url, "name": "a-all",
         "write_relabel_configs": [{"source_labels": ["__name__"], "regex": "DCGM_.+", "action": "keep"}]}])
    eventually(lambda: len(series(stack, ws_a, "DCGM_FI_DEV_GPU_UTIL")) > 0, timeout=90,
               message="workspace A never received the first cluster's series")
    usage = {ws: stack.publish_usage(ws)["active_series"] for ws in (ws_a, ws_b)}
    assert usage[ws_a] > usage[ws_b], usage
    limit_b = usage[ws_b] + 100  # workspace B alone is nearly full
    stack.set_aws_faults(aps_quotas_by_workspace={ws_b: {"active_series": limit_b}})
    try:
        hook_a, hook_b = AmpHook("promshift_target"), AmpHook("promshift_target_b")
        assert (hook_a.workspace.workspace_id, hook_b.workspace.workspace_id) == (ws_a, ws_b)
        fits = hook_a.quota_preflight().require(group_series=100, scrape_interval_s=30, now=now())
        assert fits["workspace_id"] == ws_a and fits["workspace_series_from"] == "cloudwatch"
        assert fits["workspace_series"] == int(usage[ws_a]) and fits["limit"] == 10_000_000
        with pytest.raises(QuotaExceeded) as refused:
            hook_b.quota_preflight().require(group_series=100, scrape_interval_s=30, now=now())
        evidence = refused.value.evidence
        assert evidence["workspace_id"] == ws_b and evidence["workspace_series"] == int(usage[ws_b])
        assert evidence["limit"] == limit_b
    finally:
        stack.set_aws_faults()


def test_each_workspaces_rule_namespaces_are_evaluated_by_its_own_prometheus(stack: LocalStack) -> None:
    ws_a, ws_b = str(stack.workspace_id), str(stack.workspace_b_id)
    amp = stack.amp_client()
    data = (b"groups:\n  - name: only-b\n    interval: 1s\n    rules:\n"
            b"      - record: promshift:workspace_b:one\n        expr: vector(1)\n")
    created = amp.create_rule_groups_namespace(workspaceId=ws_b, name="only-b", data=data)
    assert created["status"]["statusCode"] == "ACTIVE"
    try:
        assert (stack.home / "target-b" / "amp-rules" / f"amp-{ws_b}-only-b.yml").read_bytes() == data
        assert not (stack.amp_rules_dir / f"amp-{ws_b}-only-b.yml").exists()

        def rule_groups(workspace: str) -> set[str]:
            url = stack.prometheus_endpoint(workspace) + "api/v1/rules"
            response = signed_get(stack, url)
            assert response.status_code == 200, response.text
            return {g["name"] for g in response.json()["data"]["groups"]}

        assert "only-b" in rule_groups(ws_b) and "only-b" not in rule_groups(ws_a)
        eventually(lambda: series(stack, ws_b, "promshift:workspace_b:one"), timeout=30,
                   message="workspace B's Prometheus never evaluated its namespace")
        assert series(stack, ws_a, "promshift:workspace_b:one") == []
    finally:
        amp.delete_rule_groups_namespace(workspaceId=ws_b, name="only-b")
    assert not (stack.home / "target-b" / "amp-rules" / f"amp-{ws_b}-only-b.yml").exists()
