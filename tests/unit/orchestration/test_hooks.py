"""The two backend hooks: chosen by conn_type, read their connections as the amazon provider does,
answer the UI's Test button, and are registered with Airflow as connection types."""

from __future__ import annotations

import json
import warnings
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest
from botocore.stub import Stubber

from promshift.local.stack.local import find_free_ports
from promshift.orchestration.amp_hook import AmpHook
from promshift.orchestration.hooks import PrometheusHook, backend_hook
from promshift.orchestration.provider_info import get_provider_info

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # noqa: S105 - a test value, checked for leaks
WS = "ws-0123abcd"


def amp_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str = "promshift_target", **extra: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": "amp", "login": "AKIDTEST", "password": SECRET,
        "extra": {"region_name": "eu-west-1", "workspace_id": WS, **extra}}))


def described(status: str = "ACTIVE") -> dict[str, Any]:
    return {"workspace": {"workspaceId": WS, "status": {"statusCode": status},
                          "arn": f"arn:aws:aps:eu-west-1:123456789012:workspace/{WS}",
                          "prometheusEndpoint": f"https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/{WS}/",
                          "createdAt": datetime(2026, 1, 1, tzinfo=UTC)}}


def test_backend_hook_chooses_by_conn_type(monkeypatch: pytest.MonkeyPatch) -> None:
    amp_conn(monkeypatch)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({"conn_type": "prometheus",
                                                                    "host": "http://127.0.0.1:9090"}))
    target, source = backend_hook("promshift_target"), backend_hook("promshift_source")
    assert isinstance(target, AmpHook) and target.aws_conn_id == "promshift_target"
    assert isinstance(source, PrometheusHook) and source.base_url == "http://127.0.0.1:9090"
    assert source.sigv4 is None and source.retention_lookup is None
    assert source.identity() == {"kind": "prometheus", "url": "http://127.0.0.1:9090"}


def test_amp_hook_reads_its_connection_as_an_aws_one(monkeypatch: pytest.MonkeyPatch) -> None:
    amp_conn(monkeypatch, role_arn="arn:aws:iam::123456789012:role/promshift")
    hook = AmpHook()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the provider warns on a non-'aws' conn_type; ours is read as one
        config = hook.conn_config
    assert (config.conn_type, config.region_name, config.role_arn) == (
        "aws", "eu-west-1", "arn:aws:iam::123456789012:role/promshift")
    assert (config.aws_access_key_id, config.aws_secret_access_key) == ("AKIDTEST", SECRET)
    # The role itself is assumed through STS when a session is made (tests/integration/test_amp_moto.py).
    assert hook.client_type == "amp"
    # promshift's role is never the writer's: the sigv4 block signs with the writer's own identity
    assert hook.sigv4 == {"region": "eu-west-1"}


def test_the_writer_role_is_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    writer = "arn:aws:iam::123456789012:role/promshift-source-writer"
    amp_conn(monkeypatch, role_arn="arn:aws:iam::123456789012:role/promshift", writer_role_arn=writer)
    assert AmpHook().sigv4 == {"region": "eu-west-1", "role_arn": writer}


def test_amp_urls_come_from_the_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    amp_conn(monkeypatch)
    hook = AmpHook()
    with Stubber(hook.conn) as stub:
        stub.add_response("describe_workspace", described(), {"workspaceId": WS})
        client = hook.prometheus_client(stats=True)
        endpoint = f"https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/{WS}"
        assert client.base_url == endpoint and client.always_stats
        assert hook.remote_write_url == endpoint + "/api/v1/remote_write"
        assert hook.identity() == {"kind": "amp", "workspace_id": WS, "region": "eu-west-1"}
        assert repr(client.auth) == "AwsSigV4Auth(service='aps', region='eu-west-1')"
        assert client.auth.credentials.get_frozen_credentials().access_key == "AKIDTEST"
        assert hook.conn.meta.region_name == "eu-west-1"
        assert SECRET not in repr(client.auth) and SECRET not in repr(client.__dict__.get("auth"))


@pytest.mark.parametrize(("setup", "message"), [
    (lambda s: s.add_response("describe_workspace", described("UPDATING"), {"workspaceId": WS}),
     f"AMP workspace {WS} is UPDATING, not ACTIVE: wait until it is ACTIVE"),
    (lambda s: s.add_client_error("describe_workspace", "ResourceNotFoundException", http_status_code=404),
     f"DescribeWorkspace: no AMP workspace {WS} in eu-west-1 (check extra.workspace_id and that "
     "extra.region_name is the workspace's region)"),
    (lambda s: s.add_client_error("describe_workspace", "ThrottlingException", http_status_code=429),
     f"DescribeWorkspace on AMP workspace {WS} in eu-west-1: ThrottlingException from the AMP control plane; "
     "retry later"),
])
def test_amp_test_connection_fails_with_the_reason(monkeypatch: pytest.MonkeyPatch, setup: Any,
                                                   message: str) -> None:
    amp_conn(monkeypatch)
    hook = AmpHook()
    with Stubber(hook.conn) as stub:
        setup(stub)
        assert hook.test_connection() == (False, message)


def test_amp_test_connection_names_a_bad_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({"conn_type": "amp",
                                                                    "extra": {"region_name": "eu-west-1"}}))
    assert AmpHook().test_connection() == (
        False, "connection 'promshift_target' needs exactly one of extra.workspace_id or extra.workspace_alias")


def test_prometheus_test_connection_fails_on_a_closed_port(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{find_free_ports(1)[0]}"
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({"conn_type": "prometheus", "host": url}))
    assert PrometheusHook().test_connection() == (False, f"{url} is unreachable or not ready")


# -- registration with Airflow -----------------------------------------------------------------------------


def test_ui_field_behaviour_is_the_declared_one_and_valid_for_airflow() -> None:
    from importlib.resources import files

    schema = json.loads(files("airflow").joinpath("customized_form_field_behaviours.schema.json").read_text())
    declared = {c["connection-type"]: c for c in get_provider_info()["connection-types"]}
    for hook in (PrometheusHook, AmpHook):
        behaviour = hook.get_ui_field_behaviour()
        jsonschema.validate(behaviour, schema)
        ui = declared[hook.conn_type]["ui-field-behaviour"]
        assert behaviour == {"hidden_fields": ui["hidden-fields"], "relabeling": ui["relabeling"],
                             "placeholders": ui["placeholders"]}
    assert "region_name" in json.loads(AmpHook.get_ui_field_behaviour()["placeholders"]["extra"])


def test_providers_manager_sees_our_connection_types() -> None:
    """Needs the package installed (the entry point lives in its metadata): `make venv` does that."""
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooks = manager.hooks
    assert "promshift" in manager.providers
    for conn_type, cls in (("prometheus", PrometheusHook), ("amp", AmpHook)):
        info = hooks[conn_type]
        assert info is not None, conn_type
        assert info.hook_class_name == f"{cls.__module__}.{cls.__name__}"
        assert info.connection_testable
        assert manager.field_behaviours[conn_type]["hidden_fields"] == cls.get_ui_field_behaviour()["hidden_fields"]
    widgets = manager.connection_form_widgets
    assert {"extra__amp__region_name", "extra__amp__workspace_id", "extra__amp__workspace_alias",
            "extra__amp__role_arn", "extra__prometheus__config_path"} <= set(widgets)
