"""Signed reads, checked by a server that recomputes every SigV4 signature with botocore.

The verifier (``sigv4_verifier``) refuses anything it cannot verify and forwards verified
requests to the local stack's real source Prometheus, so the answers compared here are real.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.credentials import Credentials, RefreshableCredentials
from botocore.stub import Stubber

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.adapters.sigv4 import AwsSigV4Auth
from promshift.local.group_dag import build_group_dag
from promshift.local.stack.local import LocalStack
from promshift.local.stack.sigv4 import SIGNATURE_MISMATCH
from promshift.orchestration.compose import compose_migration
from tests.integration.sigv4_verifier import SigV4Verifier, VerifyingServer

pytestmark = pytest.mark.integration

ACCESS_KEY = "AKIDPROMSHIFTTEST01"
SECRET = "s3cr3t-Promshift-Test-Key/never+logged"  # noqa: S105 - a test pair, checked for leaks below
REGION = "us-east-1"
WS_ID = "ws-test"
CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
GROUP = "gpu-memory"


@pytest.fixture
def verifier(local_stack: LocalStack) -> Iterator[VerifyingServer]:
    v = SigV4Verifier(upstream=local_stack.source_url, region=REGION, keys={ACCESS_KEY: (SECRET, None)})
    with VerifyingServer(v, WS_ID) as server:
        yield server


def signed_client(server: VerifyingServer, credentials: Any, region: str = REGION) -> PrometheusClient:
    return PrometheusClient(server.endpoint, timeout_s=15, auth=AwsSigV4Auth(credentials, region))


def test_signed_post_and_get_are_verified_and_answer_like_the_backend(verifier: VerifyingServer,
                                                                      local_stack: LocalStack) -> None:
    client = signed_client(verifier, Credentials(ACCESS_KEY, SECRET))
    direct = PrometheusClient(local_stack.source_url)
    # Spaces, quotes, braces and regex characters in a POST form body and in a GET query string.
    expr = 'count by (Hostname) (DCGM_FI_DEV_FB_USED{Hostname=~"gpu-node-00[0-3].*"})'
    signed = client.query(expr)
    assert signed.series and sorted(s.labels["Hostname"] for s in signed.series) == sorted(
        s.labels["Hostname"] for s in direct.query(expr).series)
    now = datetime.now(UTC).timestamp()
    match = '{__name__=~"DCGM_FI_DEV_FB_.*", Hostname!=""}'
    values = client.label_values("Hostname", match, start=now - 60, end=now)
    assert values and values == direct.label_values("Hostname", match, start=now - 60, end=now)
    assert client.scalar("vector(1)") == 1.0
    v = verifier.verifier
    assert v.rejected == {}
    assert len(v.verified_keys) == 3
    assert any(b"query=count+by" in b or b"query=count%20by" in b for b in v.bodies)  # the form body was signed


def test_a_wrong_secret_is_refused_and_the_error_holds_no_secret(verifier: VerifyingServer) -> None:
    client = signed_client(verifier, Credentials(ACCESS_KEY, SECRET + "x"))
    with pytest.raises(PrometheusError) as excinfo:
        client.query("vector(1)")
    assert excinfo.value.http_status == 403
    assert "The request signature we calculated does not match" in str(excinfo.value)
    assert SECRET not in str(excinfo.value) and "Signature=" not in str(excinfo.value)
    assert verifier.verifier.rejected == {SIGNATURE_MISMATCH: 1}
    assert verifier.verifier.verified_keys == []


def test_wrong_region_and_unsigned_requests_are_refused(verifier: VerifyingServer) -> None:
    with pytest.raises(PrometheusError, match="Credential should be scoped to a valid region, not 'eu-west-1'"):
        signed_client(verifier, Credentials(ACCESS_KEY, SECRET), region="eu-west-1").query("vector(1)")
    with pytest.raises(PrometheusError, match="Missing Authentication Token"):
        PrometheusClient(verifier.endpoint).query("vector(1)")
    assert verifier.verifier.verified_keys == []


def test_expiring_credentials_are_refreshed_not_reused(verifier: VerifyingServer) -> None:
    """Each refresh issues a new pair and revokes the previous one at the verifier, as STS expiry would."""
    counter = itertools.count(1)
    issued: list[str] = []

    def refresh() -> dict[str, str]:
        n = next(counter)
        key, secret, token = f"ASIAROTATING{n:04d}", f"rotating-secret-{n}", f"token-{n}"
        verifier.verifier.keys.clear()  # the previous pair no longer works
        verifier.verifier.keys[key] = (secret, token)
        issued.append(key)
        # Inside botocore's mandatory refresh window (10 min): every use refreshes first.
        expiry = datetime.now(UTC) + timedelta(minutes=5)
        return {"access_key": key, "secret_key": secret, "token": token, "expiry_time": expiry.isoformat()}

    creds = RefreshableCredentials.create_from_metadata(refresh(), refresh_using=refresh, method="test-rotation")
    client = signed_client(verifier, creds)
    for _ in range(3):
        assert client.scalar("vector(1)") == 1.0
    assert verifier.verifier.rejected == {}
    assert len(set(verifier.verifier.verified_keys)) == 3  # a new pair for every request
    assert verifier.verifier.verified_keys == issued[-3:]


# -- AmpHook end to end: control plane stubbed (the real `amp` model), queries signed and verified ---------


@pytest.fixture
def amp_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_stack: LocalStack) -> Path:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": local_stack.source_url,
        "extra": {"config_path": str(local_stack.source_config_path)}}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "amp", "login": ACCESS_KEY, "password": SECRET,
        "extra": {"region_name": REGION, "workspace_alias": "gpu-fleet",
                  "remote_write_url": "http://127.0.0.1:1/api/v1/write"}}))
    return tmp_path


def describe_answer(endpoint: str, status: str = "ACTIVE") -> dict[str, Any]:
    return {"workspace": {"workspaceId": WS_ID, "alias": "gpu-fleet", "status": {"statusCode": status},
                          "arn": f"arn:aws:aps:{REGION}:123456789012:workspace/{WS_ID}",
                          "prometheusEndpoint": endpoint, "createdAt": datetime(2026, 1, 1, tzinfo=UTC)}}


def stub_resolution(stubber: Stubber, endpoint: str, status: str = "ACTIVE") -> None:
    stubber.add_response("list_workspaces", {"workspaces": [
        {"workspaceId": "ws-other", "alias": "gpu-fleet-old", "arn": "arn:aws:aps:us-east-1:1:workspace/ws-other",
         "status": {"statusCode": "ACTIVE"}, "createdAt": datetime(2026, 1, 1, tzinfo=UTC)},
        {"workspaceId": WS_ID, "alias": "gpu-fleet", "arn": f"arn:aws:aps:us-east-1:1:workspace/{WS_ID}",
         "status": {"statusCode": "ACTIVE"}, "createdAt": datetime(2026, 1, 1, tzinfo=UTC)}]},
        {"alias": "gpu-fleet"})
    stubber.add_response("describe_workspace", describe_answer(endpoint, status), {"workspaceId": WS_ID})


def test_amp_hook_test_connection_and_validate_through_the_verifier(amp_env: Path,
                                                                    verifier: VerifyingServer) -> None:
    group = load_catalog(CATALOG, profile="demo").get(GROUP)
    dag = build_group_dag(group, catalog_path=CATALOG, profile="demo")
    op = dag.get_task("validate")
    hook = op.target_hook
    assert type(hook).__name__ == "AmpHook"
    with Stubber(hook.conn) as stubber:
        stub_resolution(stubber, verifier.endpoint)                                       # test_connection
        stub_resolution(stubber, verifier.endpoint)                                       # hook.workspace
        stub_resolution(stubber, verifier.endpoint)                                       # validate's readiness
        ok, message = hook.test_connection()
        assert ok, message
        assert message == f"AMP workspace alias 'gpu-fleet' in {REGION} is ACTIVE and answers signed queries"
        backends = op.backends()
        assert backends.target.base_url == verifier.endpoint.rstrip("/")
        assert backends.target_sigv4 == {"region": REGION}
        assert backends.target_remote_write_url == "http://127.0.0.1:1/api/v1/write"  # the local relay
        audit = AuditStore()
        migration = compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url),
                                   snapshots_dir=amp_env / "snapshots", run_id="manual__amp")
        evidence = migration.validate(datetime.now(UTC))
        stubber.assert_no_pending_responses()
    assert evidence["target_backend"] == {"kind": "amp", "workspace_id": WS_ID, "region": REGION}
    assert evidence["source_series"] > 0
    assert verifier.verifier.rejected == {}
    assert set(verifier.verifier.verified_keys) == {ACCESS_KEY} and len(verifier.verifier.verified_keys) == 2
    stored = json.dumps([e.evidence_data for e in audit.events()])
    assert SECRET not in stored and SECRET not in json.dumps(evidence)
    audit.engine.dispose()


def test_amp_readiness_names_a_creating_workspace_and_a_refused_signature(amp_env: Path,
                                                                           verifier: VerifyingServer) -> None:
    from promshift.orchestration.amp_hook import AmpHook

    hook = AmpHook()
    with Stubber(hook.conn) as stubber:
        stub_resolution(stubber, verifier.endpoint, status="CREATING")
        ok, message = hook.test_connection()
    assert not ok
    assert message == f"AMP workspace {WS_ID} is CREATING, not ACTIVE: wait until it is ACTIVE"
    verifier.verifier.keys[ACCESS_KEY] = ("another-secret", None)  # the target no longer accepts our pair
    with Stubber(hook.conn) as stubber:
        stub_resolution(stubber, verifier.endpoint)
        ok, message = hook.test_connection()
    assert not ok
    assert message.startswith(f"AMP workspace {WS_ID}: signed query failed: ")
    assert "HTTP 403" in message and "The request signature we calculated does not match" in message
    assert SECRET not in message and "\n" not in message


def test_prometheus_hook_test_connection(local_stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    from promshift.orchestration.hooks import PrometheusHook

    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({"conn_type": "prometheus",
                                                                    "host": local_stack.source_url}))
    ok, message = PrometheusHook().test_connection()
    assert (ok, message) == (True, f"{local_stack.source_url} is ready and answers queries")


def test_the_warmup_trigger_builds_signed_clients_from_connection_ids(
        amp_env: Path, verifier: VerifyingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger is serialised with connection ids only; on the triggerer it signs every target poll."""
    import asyncio

    import promshift.orchestration.amp_hook as amp_hook
    from promshift.adapters.amp import AmpTarget, Workspace
    from promshift.orchestration.triggers import WarmupTrigger

    def control_plane(client: Any, target: AmpTarget) -> Workspace:  # DescribeWorkspace is tested elsewhere
        assert target == AmpTarget(region=REGION, workspace_alias="gpu-fleet",
                                   remote_write_url="http://127.0.0.1:1/api/v1/write")
        return Workspace(workspace_id=WS_ID, status="ACTIVE", prometheus_endpoint=verifier.endpoint)

    monkeypatch.setattr(amp_hook, "active_workspace", control_plane)
    group = load_catalog(CATALOG, profile="demo").get(GROUP)
    trigger = WarmupTrigger(group_name=GROUP, selector=group.selector(), source_conn_id="promshift_source",
                            target_conn_id="promshift_target", started_at=datetime.now(UTC).timestamp() - 5,
                            min_duration_s=1.0, timeout_s=8.0, max_lag_s=30.0, poll_interval_s=1.0)
    path, kwargs = trigger.serialize()
    assert path == "promshift.orchestration.triggers.WarmupTrigger"
    assert {kwargs["source_conn_id"], kwargs["target_conn_id"]} == {"promshift_source", "promshift_target"}
    assert "http" not in json.dumps(kwargs) and SECRET not in json.dumps(kwargs)

    async def first() -> dict[str, Any]:
        async for event in WarmupTrigger(**kwargs).run():
            return dict(event.payload)
        raise AssertionError("no event")

    event = asyncio.run(asyncio.wait_for(first(), timeout=30))
    # The verifier forwards to the source, so the "target" holds every series; the group's own queue
    # does not exist on the source, so the trigger keeps waiting for lag and ends on its timeout.
    assert event["status"] == "timeout", event
    assert event["observation"]["target_series"] == event["observation"]["source_series"] > 0, event
    assert verifier.verifier.rejected == {}
    assert len(verifier.verifier.verified_keys) >= 1 and set(verifier.verifier.verified_keys) == {ACCESS_KEY}
    assert SECRET not in json.dumps(event)
