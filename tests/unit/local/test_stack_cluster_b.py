"""The local stack's second cluster (``clusters=2``), without starting it: configs, ports, refusals, reset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from promshift.local.stack.local import (
    CLUSTER_B_COMPONENTS,
    EXTERNAL_LABELS_B,
    FLEET_B,
    FRONTDOOR,
    RELAY_B,
    SOURCE_B,
    TARGET_B,
    LocalStack,
    StackConfig,
)


def test_only_one_or_two_clusters(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="clusters must be 1 or 2, got 3"):
        StackConfig(home=tmp_path, clusters=3)


def test_with_amp_the_second_target_backs_a_second_workspace_behind_the_one_front_door(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path, clusters=2, target_kind="amp", relay_b_port=40005))
    (tmp_path / "stack.json").write_text(json.dumps({
        "workspace_id": "ws-a", "workspace_b_id": "ws-b", "cluster_b": {"ports": {TARGET_B: 40003}}}))
    assert RELAY_B in stack._names() and set(CLUSTER_B_COMPONENTS) <= set(stack._names())
    components = stack._components()
    front = components[FRONTDOOR].argv
    assert front[front.index("--workspace-id") + 1] == "ws-a"
    assert "--workspace-target=ws-b=http://127.0.0.1:40003/workspaces/ws-local-b" in front
    relay_b = components[RELAY_B]
    assert relay_b.port == 40005 and f"-httpListenAddr=127.0.0.1:{relay_b.port}" in relay_b.argv
    assert f"-remoteWrite.url={stack.frontdoor_url}/workspaces/ws-b/api/v1/remote_write" in relay_b.argv
    # Each workspace's connection writes through its own relay.
    assert stack.amp_connection_extra()["remote_write_url"] == stack.relay_remote_write_url
    second = stack.amp_connection_extra(second=True)
    assert second["workspace_id"] == "ws-b" and second["remote_write_url"] == "http://127.0.0.1:40005/api/v1/write"
    # A stack of one workspace has no second one to name.
    one = LocalStack(StackConfig(home=tmp_path / "one", target_kind="amp"))
    assert RELAY_B not in one._names()
    with pytest.raises(Exception, match="--target amp --clusters 2"):
        one.amp_connection_extra(second=True)


def test_ports_come_from_the_environment_else_from_what_up_recorded(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path))
    monkeypatch.setenv("PROMSHIFT_SOURCE_B_PORT", "31212")
    stack = LocalStack(StackConfig.from_env(clusters=2))
    assert stack.cluster_b_ports() == {FLEET_B: 0, SOURCE_B: 31212, TARGET_B: 0, RELAY_B: 0}
    (tmp_path / "stack.json").write_text(json.dumps({"cluster_b": {"ports": {FLEET_B: 40001, TARGET_B: 40003}}}))
    assert stack.cluster_b_ports() == {FLEET_B: 40001, SOURCE_B: 31212, TARGET_B: 40003, RELAY_B: 0}
    assert stack.target_b_url == "http://127.0.0.1:40003/workspaces/ws-local-b"
    assert stack.target_b_remote_write_url.endswith("/workspaces/ws-local-b/api/v1/write")
    # Another process (``stack down``, with no --clusters) still finds and names them.
    plain = LocalStack(StackConfig.from_env())
    components = plain._components()
    assert [components[n].port for n in CLUSTER_B_COMPONENTS] == [40001, 40003, 31212]
    assert components[FLEET_B].argv[-4:] == ("--port", "40001", "--seed", "1")


def test_the_second_source_scrapes_its_own_fleet_with_its_own_cluster_label(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path, nodes=12, clusters=2))
    stack._write_configs()
    config = yaml.safe_load(stack.source_b_config_path.read_text())
    assert config["global"]["external_labels"] == EXTERNAL_LABELS_B
    assert config["scrape_configs"][0]["file_sd_configs"] == [{"files": [str(stack.file_sd_b_path)]}]
    assert yaml.safe_load((tmp_path / TARGET_B / "prometheus.yml").read_text())["scrape_configs"] == []
    assert stack.fleet_b.nodes == 6 and stack.fleet_b.seed == 1
    # The first cluster's files are as without a second cluster.
    assert "source-b" not in stack.source_config_path.read_text()
    stack.reset()
    assert not (tmp_path / SOURCE_B).exists() and not (tmp_path / TARGET_B).exists()


def test_one_cluster_writes_nothing_of_the_second(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path))
    stack._write_configs()
    assert not stack.source_b_config_path.exists()
    assert set(stack._names()).isdisjoint(CLUSTER_B_COMPONENTS)
