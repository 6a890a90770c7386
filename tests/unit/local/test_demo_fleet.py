"""``SCENARIO=fleet``'s wiring without processes: its four connections (two ``amp`` ones, one per workspace, by
default), where a report says the group went, and what the demo's command line refuses for the scenario."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from promshift.local.demo import main
from promshift.local.demo_fleet import SOURCE_A, SOURCE_B, TARGET_A, TARGET_B, fleet_connections, target_name
from promshift.local.stack.local import RELAY_B, LocalStack, StackConfig
from promshift.local.stack.local import SOURCE_B as SOURCE_B_COMPONENT


def stack_with_two_workspaces(home: Path, target_kind: str = "amp") -> LocalStack:
    stack = LocalStack(StackConfig(home=home, clusters=2, target_kind=target_kind, relay_port=41001))
    home.mkdir(parents=True, exist_ok=True)
    (home / "stack.json").write_text(json.dumps({
        "workspace_id": "ws-a", "workspace_b_id": "ws-b",
        "cluster_b": {"ports": {RELAY_B: 41002, SOURCE_B_COMPONENT: 41003, "target-b": 41004}}}))
    return stack


def test_on_amp_each_workspace_is_its_own_amp_connection_written_through_its_own_relay(tmp_path: Path) -> None:
    stack = stack_with_two_workspaces(tmp_path / "state")
    connections = fleet_connections(stack)
    assert set(connections) == {SOURCE_A, SOURCE_B, TARGET_A, TARGET_B}
    assert connections[SOURCE_B] == {"conn_type": "prometheus", "host": "http://127.0.0.1:41003",
                                     "extra": {"config_path": str(stack.source_b_config_path)}}
    a, b = connections[TARGET_A], connections[TARGET_B]
    assert a["conn_type"] == b["conn_type"] == "amp"
    assert (a["extra"]["workspace_id"], a["extra"]["remote_write_url"]) == (
        "ws-a", "http://127.0.0.1:41001/api/v1/write")
    assert (b["extra"]["workspace_id"], b["extra"]["remote_write_url"]) == (
        "ws-b", "http://127.0.0.1:41002/api/v1/write")
    assert a["extra"]["endpoint_url"] == b["extra"]["endpoint_url"] == stack.aws_url
    # No credential in either: Airflow signs with the pair of its environment.
    assert "login" not in a and "password" not in b and "secret" not in json.dumps(connections).lower()


def test_on_prometheus_the_targets_are_the_two_stand_ins(tmp_path: Path) -> None:
    stack = stack_with_two_workspaces(tmp_path / "state", target_kind="prometheus")
    connections = fleet_connections(stack)
    assert connections[TARGET_B] == {"conn_type": "prometheus", "host": stack.target_b_url,
                                     "extra": {"base_url": stack.target_b_url,
                                               "remote_write_url": stack.target_b_remote_write_url}}


def test_a_report_names_its_workspace_or_its_url() -> None:
    assert target_name({"target": {"kind": "amp", "workspace_id": "ws-b", "region": "us-east-1"}}) == \
        "AMP workspace ws-b (us-east-1)"
    assert target_name({"target": {"kind": "prometheus", "url": "http://t"}}) == "http://t"


def test_the_command_line_refuses_what_the_fleet_scenario_does_not_run(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--scenario", "fleet", "--deploy", "scraper"])
    assert exited.value.code == 2 and "remote_write" in capsys.readouterr().err
    # The default target is amp: a session token (which the local signing relays cannot send) is refused up front.
    monkeypatch.setenv("AWS_SESSION_TOKEN", "made-up")
    with pytest.raises(SystemExit) as exited:
        main(["--scenario", "fleet"])
    assert exited.value.code == 2 and "AWS_SESSION_TOKEN" in capsys.readouterr().err
