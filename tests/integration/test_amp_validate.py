"""Bad input on a real local AWS: validate fails in one line, records ``validation_failed``, deploys nothing.

The migration's steps (the DAG's own operators, without Airflow running) against an AMP stack
(moto control plane, SigV4 front door) started with a known credential pair and session token
in the environment, as a team on AWS would give Airflow's workers. Each bad input is made
real: a connection naming another region or a workspace that does not exist, Airflow signing
with another secret, or a fault the local AWS injects (a workspace CREATING or UPDATING,
ThrottlingException or AccessDeniedException from the control plane, a clock skewed past the
5 minutes AWS allows). Each must fail ``validate`` with one clear line, leave a
``validation_failed`` audit event the rollback then names, and leave the source config's
bytes (and the source's live config) untouched. No message or event may hold the secret.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.render import remote_write_name, remote_write_names, sha256_text
from promshift.local.group_dag import build_group_dag
from promshift.local.stack.local import AWS, FRONTDOOR, LocalStack, StackConfig
from promshift.local.stack.sigv4 import make_up_credentials
from tests.fakes import FakeTI, fed
from tests.integration.conftest import running_amp_stack

pytestmark = pytest.mark.integration

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
PROFILE = "demo"
GROUP = "gpu-memory"
RUN_ID = "manual__test-amp-validate"
# Made up for this test; searched for in every message and event.
ACCESS_KEY = "AKIADEMOAMPVALIDATE1"
SECRET = "demoAmpValidateSecret/0123456789abcdefXYZ"
TOKEN = "demo-amp-validate-session-token-0123456789"


def context() -> dict[str, Any]:
    return {"run_id": RUN_ID, "ti": FakeTI(), "dag_run": None}


@pytest.fixture(scope="module")
def amp_stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    """A 2-node AMP stack whose local AWS checks signatures against a known pair with a session token."""
    with running_amp_stack(stack_config_factory, {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                                                  "AWS_SESSION_TOKEN": TOKEN}) as stack:
        yield stack


@pytest.fixture
def env(amp_stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AuditStore]:
    """Airflow's view of the stack: both connections (no credentials in them), the pair in AWS_*, an audit DB."""
    for name, value in amp_stack.aws_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": amp_stack.source_url,
        "extra": {"config_path": str(amp_stack.source_config_path)}}))
    set_target(monkeypatch, amp_stack.amp_connection_extra())
    store = AuditStore()
    try:
        yield store
    finally:
        amp_stack.set_aws_faults()  # whatever a test injected
        store.engine.dispose()


def set_target(monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]) -> None:
    conn = {"conn_type": "amp", "extra": extra}
    assert SECRET not in json.dumps(conn) and TOKEN not in json.dumps(conn)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps(conn))


def dag() -> Any:
    """A fresh DAG (fresh hooks: nothing cached between attempts)."""
    group = load_catalog(CATALOG, profile=PROFILE).get(GROUP)
    return build_group_dag(group, catalog_path=CATALOG, profile=PROFILE)


def source_state(stack: LocalStack) -> tuple[bytes, list[str]]:
    """The source config file's bytes and the remote_write entries of the config the source has loaded."""
    return stack.source_config_path.read_bytes(), remote_write_names(PrometheusClient(stack.source_url).config_text())


def fails_validate(stack: LocalStack, audit: AuditStore) -> tuple[BaseException, dict[str, Any]]:
    """Run validate (it must fail) and the rollback after it; return the error and the validation event."""
    before = source_state(stack)
    run = dag()
    with pytest.raises(Exception) as excinfo:  # noqa: B017 - each test names what it expects
        run.get_task("validate").execute(context())
    rollback = fed(run, "rollback").execute(context())  # validate failed: no snapshot
    message = str(excinfo.value)
    events = audit.events(group=GROUP, run_id=RUN_ID)
    # The rollback tells the group's owners (no SMTP connection here: recorded as not sent), then publishes the report.
    assert [e.kind for e in events] == ["validation_failed", "rollback_not_needed", "notified", "report_published"]
    assert events[2].evidence_data["sent"] is False
    failed = events[0].evidence_data
    # One line, the same in the task's error, the audit event and the rollback's reason.
    assert "\n" not in message and failed["reason"] == message
    assert rollback == {"performed": False, "restored_identical": None, "reason": f"validation failed: {message}",
                        "detail": "no snapshot was taken, so nothing was deployed"}
    # Nothing deployed: the source config's bytes and the live config are what they were.
    assert source_state(stack) == before
    assert remote_write_name(GROUP) not in before[1]
    assert failed["source_config_sha256"] == sha256_text(before[0].decode())
    assert audit.stage_of(GROUP).value == "planned"
    for text in (message, repr(excinfo.value), *(e.evidence for e in events)):
        assert SECRET not in text and TOKEN not in text and "Signature=" not in text
    return excinfo.value, failed


def workspace(stack: LocalStack) -> str:
    ws = stack.workspace_id
    assert ws
    return ws


def test_good_credentials_validate_through_the_front_door(amp_stack: LocalStack, env: AuditStore) -> None:
    """The control: the same setup with nothing wrong validates, signed, and records the AMP target."""
    before = amp_stack.sigv4_stats(FRONTDOOR)["verified"]
    evidence = dag().get_task("validate").execute(context())
    assert evidence["target_backend"] == {"kind": "amp", "workspace_id": workspace(amp_stack),
                                          "region": amp_stack.config.region}
    assert evidence["source_series"] > 0
    assert amp_stack.sigv4_stats(FRONTDOOR)["verified"] > before  # the readiness query went through it, signed
    assert [e.kind for e in env.events(group=GROUP)] == ["validated"]


def test_another_secret_is_refused_by_the_control_plane(amp_stack: LocalStack, env: AuditStore,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", make_up_credentials().secret_key)
    rejected = amp_stack.sigv4_stats(AWS)["rejected"]
    error, failed = fails_validate(amp_stack, env)
    assert str(error) == (f"DescribeWorkspace on AMP workspace {workspace(amp_stack)} in us-east-1: AWS refused "
                          "the credentials' signature (InvalidSignatureException)")
    assert type(error).__name__ == "AirflowFailException" and failed["retryable"] is False
    assert failed["code"] == "InvalidSignatureException"
    assert amp_stack.sigv4_stats(AWS)["rejected"] > rejected


def test_a_wrong_region_is_named(amp_stack: LocalStack, env: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Locally the connection's endpoint_url reaches the same control plane, which refuses the scope (on AWS the
    other region's endpoint answers ResourceNotFoundException, named as for an unknown workspace)."""
    set_target(monkeypatch, {**amp_stack.amp_connection_extra(), "region_name": "eu-west-1"})
    error, failed = fails_validate(amp_stack, env)
    assert str(error) == (f"DescribeWorkspace on AMP workspace {workspace(amp_stack)} in eu-west-1: AWS refused "
                          "the credentials' signature (InvalidSignatureException): signed for region eu-west-1, "
                          "which is not the endpoint's region (check extra.region_name)")
    assert type(error).__name__ == "AirflowFailException" and failed["retryable"] is False


def test_an_unknown_workspace_is_named(amp_stack: LocalStack, env: AuditStore,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = "ws-00000000-0000-4000-8000-000000000000"
    set_target(monkeypatch, {**amp_stack.amp_connection_extra(), "workspace_id": unknown})
    error, failed = fails_validate(amp_stack, env)
    assert str(error) == (f"DescribeWorkspace: no AMP workspace {unknown} in us-east-1 (check extra.workspace_id "
                          "and that extra.region_name is the workspace's region)")
    assert type(error).__name__ == "AirflowFailException" and failed["code"] == "ResourceNotFoundException"


@pytest.mark.parametrize("status", ["CREATING", "UPDATING"])
def test_a_workspace_not_active_yet_is_retried_and_named(amp_stack: LocalStack, env: AuditStore, status: str) -> None:
    amp_stack.set_aws_faults(workspace_status={workspace(amp_stack): status})
    error, failed = fails_validate(amp_stack, env)
    assert str(error) == f"AMP workspace {workspace(amp_stack)} is {status}, not ACTIVE: wait until it is ACTIVE"
    assert type(error).__name__ == "AmpError" and failed["retryable"] is True  # Airflow retries the task


@pytest.mark.parametrize(("code", "message", "retryable"), [
    ("ThrottlingException", "ThrottlingException from the AMP control plane; retry later", True),
    ("AccessDeniedException", "access denied (AccessDeniedException); the credentials need aps:DescribeWorkspace",
     False),
])
def test_control_plane_errors_are_named(amp_stack: LocalStack, env: AuditStore, code: str, message: str,
                                        retryable: bool) -> None:
    amp_stack.set_aws_faults(errors={"DescribeWorkspace": code})
    error, failed = fails_validate(amp_stack, env)
    assert str(error) == f"DescribeWorkspace on AMP workspace {workspace(amp_stack)} in us-east-1: {message}"
    assert failed["retryable"] is retryable and failed["code"] == code


def test_a_clock_skew_the_front_door_refuses_is_named(amp_stack: LocalStack, env: AuditStore) -> None:
    amp_stack.set_aws_faults(clock_skew_s=400)
    refused = amp_stack.sigv4_stats(AWS)["rejected_by_reason"].get("expired", 0)
    error, failed = fails_validate(amp_stack, env)
    assert str(error) == (f"DescribeWorkspace on AMP workspace {workspace(amp_stack)} in us-east-1: AWS refused "
                          "the credentials' signature (InvalidSignatureException): the signature's time is more "
                          "than 5 minutes off AWS's clock (check this host's clock)")
    assert type(error).__name__ == "AirflowFailException" and failed["retryable"] is False
    assert amp_stack.sigv4_stats(AWS)["rejected_by_reason"].get("expired", 0) > refused
