"""The local stack against real processes: start, scrape, reuse, resize, stop; and its CLI."""

from __future__ import annotations

import argparse
import json
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from promshift.local.cli import add_stack_commands
from promshift.local.stack.local import ALERTMANAGER, COMPONENTS, LocalStack, StackConfig, StackError

integration = pytest.mark.integration


def query(base_url: str, promql: str) -> list[dict[str, Any]]:
    """Instant query; returns the result vector."""
    http = requests.Session()
    http.trust_env = False
    response = http.get(f"{base_url}/api/v1/query", params={"query": promql}, timeout=10)
    response.raise_for_status()
    body = response.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def scalar(base_url: str, promql: str) -> float:
    result = query(base_url, promql)
    return float(result[0]["value"][1]) if result else 0.0


def eventually(check: Callable[[], bool], timeout: float = 30.0, message: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, message or "condition not met in time"
        time.sleep(0.5)


def run_cli(argv: list[str]) -> int:
    """Run the stack commands through a throwaway parser (the main CLI also loads other modules)."""
    parser = argparse.ArgumentParser(prog="promshift")
    add_stack_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


def use_env(monkeypatch: pytest.MonkeyPatch, config: StackConfig) -> None:
    monkeypatch.setenv("PROMSHIFT_HOME", str(config.home))
    monkeypatch.setenv("PROMSHIFT_NODES", str(config.nodes))
    monkeypatch.setenv("PROMSHIFT_FLEET_PORT", str(config.fleet_port))
    monkeypatch.setenv("PROMSHIFT_SOURCE_PORT", str(config.source_port))
    monkeypatch.setenv("PROMSHIFT_TARGET_PORT", str(config.target_port))


def pids(stack: LocalStack) -> dict[str, int]:
    return {name: row["pid"] for name, row in stack.status().items()}


@integration
def test_up_reports_every_component_healthy(local_stack: LocalStack) -> None:
    status = local_stack.status()
    assert set(status) == set(COMPONENTS) | {ALERTMANAGER}  # the target's Alertmanager, Debian's
    for name, row in status.items():
        assert row["alive"] and row["healthy"], (name, row)
        assert isinstance(row["pid"], int)
    assert status["source"]["url"] == local_stack.source_url
    port = local_stack.config.target_port
    assert local_stack.target_url == f"http://127.0.0.1:{port}/workspaces/ws-local"
    assert local_stack.target_remote_write_url == local_stack.target_url + "/api/v1/write"


@integration
def test_source_scrapes_every_gpu_of_every_node(local_stack: LocalStack) -> None:
    nodes = local_stack.config.nodes
    assert scalar(local_stack.source_url, 'count(up{job="dcgm"} == 1)') == nodes
    eventually(
        lambda: scalar(local_stack.source_url, "count(DCGM_FI_DEV_GPU_UTIL)") == nodes * 8,
        message="the source does not hold one GPU_UTIL series per GPU",
    )


@integration
def test_scraped_series_carry_dcgm_exporter_labels(local_stack: LocalStack) -> None:
    result = query(local_stack.source_url, 'DCGM_FI_DEV_GPU_TEMP{instance="gpu-node-0003"}')
    assert len(result) == 8
    for series in result:
        labels = series["metric"]
        for name in ("gpu", "UUID", "device", "modelName", "Hostname", "container", "namespace", "pod"):
            assert labels.get(name), (name, labels)
        assert labels["Hostname"] == labels["instance"] == "gpu-node-0003"
        assert labels["job"] == "dcgm"
        assert 30 <= float(series["value"][1]) <= 85
    # External labels are added on the way out (remote write, federation), not to local series.
    assert "cluster" not in result[0]["metric"]


@integration
def test_target_serves_the_api_and_remote_write_under_the_workspace_prefix(local_stack: LocalStack) -> None:
    assert query(local_stack.target_url, "up") == []
    http = requests.Session()
    http.trust_env = False
    # 400 (not snappy) proves the receiver is enabled; a disabled one answers 404.
    assert http.post(local_stack.target_remote_write_url, data=b"x", timeout=10).status_code == 400


@integration
def test_second_up_reuses_processes_and_keeps_an_edited_source_config(local_stack: LocalStack) -> None:
    before = pids(local_stack)
    config_path = local_stack.source_config_path
    edited = config_path.read_text() + "# edited by a deployer\n"
    config_path.write_text(edited)
    started = time.monotonic()
    local_stack.up(timeout=60)
    assert pids(local_stack) == before
    assert config_path.read_text() == edited
    assert time.monotonic() - started < 10


@integration
def test_status_command_prints_a_table(
    local_stack: LocalStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_env(monkeypatch, local_stack.config)
    assert run_cli(["stack", "status"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["COMPONENT", "PID", "ALIVE", "HEALTHY", "URL"]
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert rows["source"][:3] == [str(pids(local_stack)["source"]), "yes", "yes"]
    assert set(rows) == set(COMPONENTS) | {ALERTMANAGER}


@integration
def test_resize_restarts_only_the_fleet_and_down_stops_everything(
    stack_config_factory: Callable[..., StackConfig],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = stack_config_factory(nodes=2)
    stack = LocalStack(config)
    try:
        stack.up(timeout=60)
        before = pids(stack)
        resized = LocalStack(replace(config, nodes=3))
        resized.up(timeout=60)
        after = pids(resized)
        assert after["fleet"] != before["fleet"]
        assert (after["source"], after["target"]) == (before["source"], before["target"])
        assert len(json.loads(resized.file_sd_path.read_text())) == 3
        assert json.loads(resized.state_path.read_text())["fleet"]["nodes"] == 3
        assert scalar(resized.source_url, 'count(up{job="dcgm"} == 1)') == 3
    finally:
        stack.down()
    for name, pid in after.items():
        assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) still running"
        assert not stack.pid_path(name).exists()
    assert not any(row["alive"] for row in stack.status().values())
    stack.down()  # idempotent
    use_env(monkeypatch, config)
    assert run_cli(["stack", "status"]) == 1
    assert "no" in capsys.readouterr().out


@integration
def test_port_taken_by_another_process_is_named(stack_config_factory: Callable[..., StackConfig]) -> None:
    config = stack_config_factory(nodes=1)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", config.target_port))
        squatter.listen()
        with pytest.raises(StackError, match=f"port {config.target_port} .*PROMSHIFT_TARGET_PORT"):
            LocalStack(config).up(timeout=30)
    # Ports are checked before anything starts, so nothing is left behind.
    assert not any(LocalStack(config).pid_path(name).exists() for name in COMPONENTS)


def test_missing_prometheus_says_how_to_install(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path, prometheus_bin=str(tmp_path / "no-prometheus")))
    with pytest.raises(StackError, match="apt-get install -y prometheus"):
        stack.up()


def test_config_reads_the_environment_then_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("PROMSHIFT_NODES", "12")
    monkeypatch.setenv("PROMSHIFT_SOURCE_PORT", "19090")
    config = StackConfig.from_env(nodes=None, target_port=19091)
    assert config.home == tmp_path / "state"
    assert (config.nodes, config.fleet_port, config.source_port, config.target_port) == (
        12,
        9400,
        19090,
        19091,
    )
    assert StackConfig.from_env(nodes=3).nodes == 3
    monkeypatch.delenv("PROMSHIFT_HOME")
    monkeypatch.chdir(tmp_path)
    assert StackConfig.from_env().home == tmp_path / ".state"
    stack = LocalStack(StackConfig(home=tmp_path))
    assert stack.source_url == "http://127.0.0.1:9090"
    assert stack.target_url == "http://127.0.0.1:9091/workspaces/ws-local"
    assert stack.source_config_path == tmp_path / "source" / "prometheus.yml"
    with pytest.raises(ValueError, match="ports must differ"):
        StackConfig(home=tmp_path, source_port=9091)
