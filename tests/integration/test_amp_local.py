"""The local AWS against real servers: `stack up --target amp`, the SigV4-checking front door, the control plane
over moto (through boto3), the vmagent signing relay end to end, and what Debian's Prometheus does with `sigv4:`."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
import yaml
from botocore.exceptions import ClientError

from promshift.local.cli import add_stack_commands
from promshift.local.stack.local import (
    ALERTMANAGER,
    AMP_COMPONENTS,
    COMPONENTS,
    RELAY,
    LocalStack,
    StackConfig,
    find_free_ports,
)
from promshift.local.stack.sigv4 import AwsCredentials, sign_request
from tests.integration.conftest import eventually, running_amp_stack

integration = pytest.mark.integration
METRIC = "DCGM_FI_DEV_GPU_TEMP"


def http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


@pytest.fixture(scope="module")
def amp_stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    """A 2-node AMP stack (1 s scrapes) with no AWS_* variables set, so it makes its own pair up."""
    with running_amp_stack(stack_config_factory) as stack:
        yield stack


def send(stack: LocalStack, method: str, url: str, *, body: bytes = b"", credentials: AwsCredentials | None = None,
         region: str | None = None, service: str = "aps", when: datetime | None = None, sent_body: bytes | None = None,
         headers: dict[str, str] | None = None) -> requests.Response:
    signed = sign_request(method, url, credentials=credentials or stack.aws_credentials(),
                          region=region or stack.config.region, body=body, service=service, when=when,
                          headers=headers)
    return http().request(method, url, data=body if sent_body is None else sent_body, headers=signed, timeout=30)


def signed_query(stack: LocalStack, path: str, params: dict[str, str]) -> dict[str, Any]:
    url = requests.Request("GET", stack.prometheus_endpoint() + path, params=params).prepare().url
    assert url is not None
    response = send(stack, "GET", url)
    assert response.status_code == 200, response.text
    return dict(response.json())


def add_remote_write(stack: LocalStack, entry: dict[str, Any]) -> None:
    config = yaml.safe_load(stack.source_config_path.read_text())
    config.setdefault("remote_write", []).append(entry)
    stack.source_config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    response = http().post(f"{stack.source_url}/-/reload", timeout=60)
    assert response.status_code == 200, response.text


@integration
def test_up_runs_the_local_aws_and_records_it_without_secrets(amp_stack: LocalStack) -> None:
    status = amp_stack.status()
    assert set(status) == set(COMPONENTS) | set(AMP_COMPONENTS) | {ALERTMANAGER}
    assert all(row["alive"] and row["healthy"] for row in status.values()), status
    state = json.loads(amp_stack.state_path.read_text())
    cfg = amp_stack.config
    assert (state["aws_port"], state["frontdoor_port"], state["relay_port"]) == (
        cfg.aws_port, cfg.frontdoor_port, cfg.relay_port)
    assert state["region"] == "us-east-1" and state["workspace_id"].startswith("ws-")
    assert amp_stack.amp_connection_extra() == {
        "region_name": "us-east-1", "workspace_id": state["workspace_id"], "endpoint_url": amp_stack.aws_url,
        "remote_write_url": amp_stack.relay_remote_write_url}
    pair = amp_stack.aws_credentials()
    assert stat.S_IMODE(amp_stack.credentials_path.stat().st_mode) == 0o600
    for name in AMP_COMPONENTS:
        pid = status[name]["pid"]
        assert pair.secret_key.encode() not in open(f"/proc/{pid}/cmdline", "rb").read(), name


@integration
def test_each_bad_signature_is_refused_with_403_and_counted(amp_stack: LocalStack) -> None:
    pair = amp_stack.aws_credentials()
    url = amp_stack.prometheus_endpoint() + "api/v1/query?query=up"
    now = datetime.now(UTC)
    before = amp_stack.sigv4_stats()
    cases: dict[str, Callable[[], requests.Response]] = {
        "missing_authorization": lambda: http().get(url, timeout=10),
        "signature_mismatch": lambda: send(amp_stack, "GET", url,
                                           credentials=AwsCredentials(pair.access_key, "not-the-secret")),
        "unknown_access_key": lambda: send(amp_stack, "GET", url,
                                           credentials=AwsCredentials("AKIAUNKNOWN000000000", pair.secret_key)),
        "expired": lambda: send(amp_stack, "GET", url, when=now - timedelta(minutes=6)),
        "not_yet_valid": lambda: send(amp_stack, "GET", url, when=now + timedelta(minutes=6)),
        "wrong_region": lambda: send(amp_stack, "GET", url, region="eu-west-1"),
        "wrong_service": lambda: send(amp_stack, "GET", url, service="execute-api"),
    }
    for reason, request in cases.items():
        response = request()
        assert response.status_code == 403, (reason, response.text)
        assert response.headers["x-amzn-ErrorType"], reason
        assert response.json()["message"], reason
        assert pair.secret_key not in response.text
    # A tampered body: signed over one query, another sent.
    tampered = send(amp_stack, "POST", amp_stack.prometheus_endpoint() + "api/v1/query", body=b"query=up",
                    sent_body=b"query=vector(666)", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert tampered.status_code == 403 and "signature" in tampered.json()["message"]
    after = amp_stack.sigv4_stats()
    rejected = {k: after["rejected_by_reason"].get(k, 0) - before["rejected_by_reason"].get(k, 0)
                for k in after["rejected_by_reason"]}
    assert rejected == {"missing_authorization": 1, "signature_mismatch": 2, "unknown_access_key": 1,
                        "expired": 1, "not_yet_valid": 1, "wrong_region": 1, "wrong_service": 1}
    assert after["rejected"] - before["rejected"] == 8
    assert after["verified_by_kind"].get("query", 0) == before["verified_by_kind"].get("query", 0)


@integration
def test_a_good_signature_is_forwarded_and_answered_by_the_target(amp_stack: LocalStack) -> None:
    before = amp_stack.sigv4_stats()["verified_by_kind"]
    body = signed_query(amp_stack, "api/v1/query", {"query": 'vector(42) unless on() absent(up{job="x y"})'})
    assert body["status"] == "success" and body["data"]["result"] == []
    # The same question asked of the target directly answers the same: it was forwarded to the real target.
    direct = http().get(f"{amp_stack.target_url}/api/v1/labels", timeout=10).json()
    assert signed_query(amp_stack, "api/v1/labels", {})["data"] == direct["data"]
    posted = send(amp_stack, "POST", amp_stack.prometheus_endpoint() + "api/v1/query", body=b"query=vector(7)",
                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert posted.status_code == 200 and posted.json()["data"]["result"][0]["value"][1] == "7"
    now = time.time()
    ranged = signed_query(amp_stack, "api/v1/query_range",
                          {"query": "vector(3)", "start": str(now - 60), "end": str(now), "step": "15"})
    assert ranged["data"]["resultType"] == "matrix" and len(ranged["data"]["result"][0]["values"]) >= 4
    assert signed_query(amp_stack, "api/v1/series", {"match[]": "up"})["status"] == "success"
    assert signed_query(amp_stack, "api/v1/label/__name__/values", {})["status"] == "success"
    after = amp_stack.sigv4_stats()["verified_by_kind"]
    assert after["query"] - before.get("query", 0) == 2 and after["labels"] - before.get("labels", 0) == 1
    assert after["query_range"] - before.get("query_range", 0) == 1 and after["series"] - before.get("series", 0) == 1
    assert after["label_values"] - before.get("label_values", 0) == 1
    unknown = send(amp_stack, "GET", amp_stack.frontdoor_url + "/workspaces/ws-nope/api/v1/query?query=up")
    assert unknown.status_code == 404 and unknown.headers["x-amzn-ErrorType"] == "ResourceNotFoundException"


@integration
def test_the_control_plane_answers_boto3_and_checks_its_signatures(amp_stack: LocalStack) -> None:
    amp = amp_stack.amp_client()
    workspace = amp_stack.workspace_id
    described = amp.describe_workspace(workspaceId=workspace)["workspace"]
    assert described["status"]["statusCode"] == "ACTIVE"
    assert described["prometheusEndpoint"] == f"{amp_stack.frontdoor_url}/workspaces/{workspace}/"
    configuration = amp.describe_workspace_configuration(workspaceId=workspace)["workspaceConfiguration"]
    assert configuration["retentionPeriodInDays"] == 15 and configuration["status"]["statusCode"] == "ACTIVE"

    created = amp.create_workspace(alias="second")["workspaceId"]
    arn = amp.describe_workspace(workspaceId=created)["workspace"]["arn"]
    amp.tag_resource(resourceArn=arn, tags={"team": "gpu"})  # an ARN in the path, percent-encoded and signed
    assert amp.list_tags_for_resource(resourceArn=arn)["tags"] == {"team": "gpu"}
    assert amp.describe_workspace_configuration(workspaceId=created)["workspaceConfiguration"][
        "retentionPeriodInDays"] == 150  # AMP's default
    update = amp.update_workspace_configuration(workspaceId=created, retentionPeriodInDays=30)
    assert update["status"]["statusCode"] == "UPDATING"
    assert amp.describe_workspace_configuration(workspaceId=created)["workspaceConfiguration"][
        "retentionPeriodInDays"] == 30
    with pytest.raises(ClientError) as missing:
        amp.describe_workspace_configuration(workspaceId="ws-does-not-exist")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
    # botocore's client validates before sending, so a bad value is sent raw (signed) to reach the model check.
    bad_value = send(amp_stack, "PATCH", f"{amp_stack.aws_url}/workspaces/{created}/configuration",
                     body=json.dumps({"retentionPeriodInDays": "long"}).encode(),
                     headers={"Content-Type": "application/json"})
    assert bad_value.status_code == 400 and bad_value.headers["x-amzn-ErrorType"] == "ValidationException"

    before = amp_stack.sigv4_stats("aws")["rejected_by_reason"]
    pair = amp_stack.aws_credentials()
    for secret, key, code in ((pair.secret_key + "x", pair.access_key, "InvalidSignatureException"),
                              (pair.secret_key, "AKIAUNKNOWN000000000", "UnrecognizedClientException")):
        wrong = boto3.client("amp", region_name="us-east-1", endpoint_url=amp_stack.aws_url,
                             aws_access_key_id=key, aws_secret_access_key=secret)
        with pytest.raises(ClientError) as refused:
            wrong.describe_workspace(workspaceId=workspace)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert refused.value.response["Error"]["Code"] == code
    after = amp_stack.sigv4_stats("aws")["rejected_by_reason"]
    assert after.get("signature_mismatch", 0) - before.get("signature_mismatch", 0) == 1
    assert after.get("unknown_access_key", 0) - before.get("unknown_access_key", 0) == 1

    amp_stack.set_aws_faults(errors={"DescribeWorkspace": "ThrottlingException"},
                             workspace_status={created: "CREATING"})
    try:
        with pytest.raises(ClientError) as throttled:
            amp.describe_workspace(workspaceId=workspace)
        assert throttled.value.response["Error"]["Code"] == "ThrottlingException"
        assert amp.list_workspaces()["workspaces"]  # other operations still answer
    finally:
        amp_stack.set_aws_faults(workspace_status={created: "CREATING"})
    assert amp.describe_workspace(workspaceId=created)["workspace"]["status"]["statusCode"] == "CREATING"
    amp_stack.set_aws_faults()
    amp.delete_workspace(workspaceId=created)


@integration
def test_the_relay_signs_the_sources_writes_end_to_end(amp_stack: LocalStack) -> None:
    verified_writes = amp_stack.sigv4_stats()["verified_by_kind"].get("remote_write", 0)
    started = time.monotonic()
    add_remote_write(amp_stack, {
        "url": amp_stack.relay_remote_write_url,
        "name": "relay-test",
        "write_relabel_configs": [{"source_labels": ["__name__"], "regex": METRIC, "action": "keep"}],
    })

    def landed() -> list[dict[str, Any]]:
        return list(signed_query(amp_stack, "api/v1/query", {"query": f'{METRIC}{{cluster="local-gpu-fleet"}}'})
                    ["data"]["result"])

    result = eventually(landed, timeout=60, message="the relayed metric never became queryable via the front door")
    first_seen = time.monotonic() - started
    assert len(result) == 2 * 8  # 2 nodes x 8 GPUs
    lag = float(signed_query(amp_stack, "api/v1/query", {"query": f"time() - max(timestamp({METRIC}))"})
                ["data"]["result"][0]["value"][1])
    print(f"relay: first sample queryable {first_seen:.1f}s after the reload; newest sample {lag:.1f}s old")
    assert lag < 30
    stats = amp_stack.sigv4_stats()
    assert stats["verified_by_kind"]["remote_write"] > verified_writes
    relay_metrics = http().get(f"http://127.0.0.1:{amp_stack.config.relay_port}/metrics", timeout=10).text
    assert 'status_code="2XX"' in relay_metrics


@integration
def test_a_skewed_clock_is_refused_until_it_is_fixed(amp_stack: LocalStack) -> None:
    url = amp_stack.prometheus_endpoint() + "api/v1/query?query=vector%281%29"
    amp_stack.set_aws_faults(clock_skew_s=400)
    try:
        refused = send(amp_stack, "GET", url)
        assert refused.status_code == 403 and refused.json()["message"].startswith("Signature expired")
        with pytest.raises(ClientError) as control_plane:
            amp_stack.amp_client().list_workspaces()
        assert control_plane.value.response["Error"]["Code"] == "InvalidSignatureException"
    finally:
        amp_stack.set_aws_faults()
    assert send(amp_stack, "GET", url).status_code == 200


@integration
def test_debian_prometheus_sends_a_sigv4_entry_unsigned(amp_stack: LocalStack) -> None:
    """Measured: Debian's 2.42 (given AWS credentials, as the stack gives its source) loads `sigv4:` and sends
    without signing; every write is refused and dropped."""
    before = amp_stack.sigv4_stats()["rejected_by_reason"].get("missing_authorization", 0)
    url = amp_stack.prometheus_endpoint() + "api/v1/remote_write"
    add_remote_write(amp_stack, {
        "url": url,
        "name": "direct-sigv4",
        "sigv4": {"region": amp_stack.config.region},
        "write_relabel_configs": [
            {"source_labels": ["__name__"], "regex": "DCGM_FI_DEV_POWER_USAGE", "action": "keep"},
        ],
    })
    eventually(lambda: amp_stack.sigv4_stats()["rejected_by_reason"].get("missing_authorization", 0) > before,
               timeout=60, message="Debian's Prometheus sent nothing to the front door")

    def failed() -> float:
        # The source does not scrape itself: read its own /metrics.
        text = http().get(f"{amp_stack.source_url}/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("prometheus_remote_storage_samples_failed_total{")
                   and 'remote_name="direct-sigv4"' in line)

    eventually(lambda: failed() > 0, timeout=60, message="the refused samples were not counted as failed")
    landed = signed_query(amp_stack, "api/v1/query", {"query": "DCGM_FI_DEV_POWER_USAGE"})["data"]["result"]
    assert landed == []


@integration
def test_debian_prometheus_without_credentials_refuses_a_sigv4_entry(tmp_path: Path) -> None:
    """Measured: promtool accepts `sigv4:`, but the server cannot load it without AWS credentials."""
    (port,) = find_free_ports(1)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"remote_write": [
        {"url": "http://127.0.0.1:9/workspaces/ws-x/api/v1/remote_write", "sigv4": {"region": "us-east-1"}}]}))
    assert subprocess.run(["/usr/bin/promtool", "check", "config", str(config)], capture_output=True).returncode == 0
    # No AWS_* variables, no ~/.aws, no instance metadata: an empty credential chain.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"}
    server = subprocess.run(
        ["/usr/bin/prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert server.returncode != 0
    assert "could not get SigV4 credentials" in server.stderr


@integration
def test_cli_and_a_plain_up_reuse_the_local_aws(
    amp_stack: LocalStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = amp_stack.config
    before = {name: row["pid"] for name, row in amp_stack.status().items()}
    workspace = amp_stack.workspace_id
    env = {"PROMSHIFT_HOME": cfg.home, "PROMSHIFT_NODES": cfg.nodes, "PROMSHIFT_FLEET_PORT": cfg.fleet_port,
           "PROMSHIFT_SOURCE_PORT": cfg.source_port, "PROMSHIFT_TARGET_PORT": cfg.target_port,
           "PROMSHIFT_AWS_PORT": cfg.aws_port, "PROMSHIFT_MOTO_PORT": cfg.moto_port,
           "PROMSHIFT_FRONTDOOR_PORT": cfg.frontdoor_port, "PROMSHIFT_RELAY_PORT": cfg.relay_port}
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    parser = argparse.ArgumentParser(prog="promshift")
    add_stack_commands(parser.add_subparsers(dest="command", required=True))
    for argv in (["stack", "up", "--target", "amp"], ["stack", "status"]):
        args = parser.parse_args(argv)
        assert args.handler(args) == 0, argv
    out = capsys.readouterr().out
    assert f"AMP workspace:     {workspace}" in out and "frontdoor" in out and "relay" in out
    assert amp_stack.aws_credentials().secret_key not in out
    # A plain up (what a DAG task may call) leaves the local AWS and its record alone.
    LocalStack(replace(cfg, target_kind="prometheus")).up(timeout=60)
    assert {name: row["pid"] for name, row in amp_stack.status().items()} == before
    assert amp_stack.workspace_id == workspace
    assert json.loads(amp_stack.state_path.read_text())["target_kind"] == "amp"


@integration
def test_down_stops_the_local_aws(amp_stack: LocalStack) -> None:
    pids = {name: row["pid"] for name, row in amp_stack.status().items()}
    amp_stack.down()
    for name in (*COMPONENTS, *AMP_COMPONENTS, ALERTMANAGER):
        assert not amp_stack.pid_path(name).exists(), name
        assert not os.path.exists(f"/proc/{pids[name]}/cmdline"), name
    assert amp_stack.status()[RELAY]["alive"] is False
    # After every test above: the secret is in the 0600 file and nowhere else under the stack's home
    # (logs, stack.json, configs, the relay's queue, the TSDBs' small files).
    secret = amp_stack.aws_credentials().secret_key.encode()
    scanned = 0
    for path in amp_stack.home.rglob("*"):
        if path.is_file() and path != amp_stack.credentials_path and path.stat().st_size < 20_000_000:
            assert secret not in path.read_bytes(), path
            scanned += 1
    assert scanned > 10
