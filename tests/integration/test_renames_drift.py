"""Declared and undeclared renames of the host label through every parity layer, on a real local stack.

The renames are planted with ``python -m promshift.local stack drift`` (write_relabel_configs on the group's own
remote_write entry), so the source keeps ``Hostname`` and the target receives ``hostname`` for the
chosen hosts, exactly as a real dual-write would carry them; ``stack dual-write`` is tested too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.core.catalog import MetricGroup
from promshift.core.render import remote_write_names, sha256_text
from promshift.local.cli import add_stack_commands
from promshift.local.stack.local import LocalStack, StackConfig, find_free_ports

pytestmark = pytest.mark.integration

HALF = "gpu-node-000[01]"  # two of the four nodes


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="promshift")
    add_stack_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


def env_for(config: StackConfig) -> dict[str, str]:
    return {"PROMSHIFT_HOME": str(config.home), "PROMSHIFT_NODES": str(config.nodes),
            "PROMSHIFT_FLEET_PORT": str(config.fleet_port), "PROMSHIFT_SOURCE_PORT": str(config.source_port),
            "PROMSHIFT_TARGET_PORT": str(config.target_port), "PROMSHIFT_PROFILE": "demo"}


@dataclasses.dataclass
class DriftStack:
    stack: LocalStack
    source: PrometheusClient
    target: PrometheusClient
    planted_at: float  # after the last plant returned (the target already held the renamed series)


@pytest.fixture(scope="module")
def drift_stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[DriftStack]:
    """A 4-node stack (1 s scrapes): gpu-memory renamed on half the hosts, gpu-clocks on all of them."""
    config = stack_config_factory(nodes=4, scrape_interval="1s")
    stack = LocalStack(config)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env_for(config).items():
            mp.setenv(k, v)
        try:
            stack.up(timeout=90)
            # Neither group is dual-written yet: drift adds each entry with the rename from the start,
            # so the target never holds these hosts under `Hostname`.
            assert run_cli(["stack", "drift", "gpu-memory", "--rename-label", "Hostname=hostname",
                            "--hosts", HALF]) == 0
            assert run_cli(["stack", "drift", "gpu-clocks", "--rename-label", "Hostname=hostname",
                            "--hosts", ".*"]) == 0
            yield DriftStack(stack, PrometheusClient(stack.source_url, timeout_s=10),
                             PrometheusClient(stack.target_url, timeout_s=10), time.time())
        finally:
            stack.down()


@pytest.fixture
def stack_env(drift_stack: DriftStack, monkeypatch: pytest.MonkeyPatch) -> DriftStack:
    for k, v in env_for(drift_stack.stack.config).items():
        monkeypatch.setenv(k, v)
    return drift_stack


def hosts_by_label(client: PrometheusClient, metric: str) -> dict[str, set[str]]:
    rows = client.query(f"count by (Hostname, hostname) ({metric})").series
    return {label: {s.labels[label] for s in rows if s.labels.get(label)} for label in ("Hostname", "hostname")}


def policy_for_test(group: MetricGroup, **changes: Any) -> MetricGroup:
    # 2 s steps over 1 s scrapes; no golden dashboard (another layer, tested on its own).
    parity = dataclasses.replace(group.parity, **{"step_s": 2.0, "skip_recent_s": 3.0, "golden_dashboards": (),
                                                  "sample_hosts": 4, "hosts_per_shard": 2, **changes})
    return dataclasses.replace(group, parity=parity)


def run_parity(drift: DriftStack, group_name: str, **changes: Any) -> dict[str, Any]:
    """Plan, shards and reduce, as the DAG runs them; the result plus its layers by name and the shards' host names."""
    # Planting edits a live entry, which restarts its queue (DESIGN.md: ~8 % of a scrape lost), and a loaded
    # machine stretches that restart: compare from RESTART_MARGIN_S after the plant, and wait until the
    # window (two steps later, up to skip_recent ago) holds ~5 steps.
    since = drift.planted_at + RESTART_MARGIN_S
    time.sleep(max(0.0, since + 4 + 3 + 10 - time.time()))
    group = policy_for_test(load_catalog(profile="demo").get(group_name), **changes)
    check = ParityCheck(group, drift.source, drift.target)
    # Through XCom's form, as the DAG's tasks hand them on.
    plan = check.plan(dual_write_since=since, now=time.time()).to_dict()
    result = check.reduce(plan, [ParityCheck(group, drift.source, drift.target).compare_shard(shard)
                                 for shard in plan["shards"]]).to_dict()
    result["by_name"] = {m["name"]: m for m in result["measurements"]}
    names = {json.dumps(shard.get("host_names")) for shard in plan["shards"]}
    assert len(names) == 1, names
    result["shard_host_names"] = json.loads(names.pop())
    return result


RESTART_MARGIN_S = 10.0
DECLARED = {"rename_labels": (("hostname", "Hostname"),)}
LAYERS = ("coverage", "host_coverage", "aggregates", "labels", "samples")


# -- the stack commands -------------------------------------------------------------------------


def test_drift_renames_only_the_matching_hosts_on_the_target(drift_stack: DriftStack) -> None:
    assert hosts_by_label(drift_stack.source, "DCGM_FI_DEV_FB_USED") == {
        "Hostname": {f"gpu-node-000{i}" for i in range(4)}, "hostname": set()}
    assert hosts_by_label(drift_stack.target, "DCGM_FI_DEV_FB_USED") == {
        "Hostname": {"gpu-node-0002", "gpu-node-0003"}, "hostname": {"gpu-node-0000", "gpu-node-0001"}}
    assert hosts_by_label(drift_stack.target, "DCGM_FI_DEV_SM_CLOCK") == {
        "Hostname": set(), "hostname": {f"gpu-node-000{i}" for i in range(4)}}
    live = remote_write_names(drift_stack.source.config_text())
    assert {"promshift-gpu-memory", "promshift-gpu-clocks"} <= set(live)


def test_drift_again_is_a_no_op(stack_env: DriftStack, capsys: pytest.CaptureFixture[str]) -> None:
    path = stack_env.stack.source_config_path
    before = sha256_text(path.read_text())
    assert run_cli(["stack", "drift", "gpu-memory", "--rename-label", "Hostname=hostname", "--hosts", HALF]) == 0
    assert "already planted Hostname -> hostname for 2 hosts (gpu-node-0000, gpu-node-0001)" in capsys.readouterr().out
    assert sha256_text(path.read_text()) == before


def test_dual_write_adds_the_entry_once_then_drift_edits_it(stack_env: DriftStack,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = stack_env.stack.source_config_path
    assert run_cli(["stack", "dual-write", "gpu-power-thermal"]) == 0
    out = capsys.readouterr().out
    assert "promshift-gpu-power-thermal: dual-writing gpu-power-thermal" in out
    assert "promshift-gpu-power-thermal" in remote_write_names(stack_env.source.config_text())
    assert (stack_env.target.scalar('count(DCGM_FI_DEV_GPU_TEMP{cluster="local-gpu-fleet"})') or 0) == 4 * 8
    after = sha256_text(path.read_text())
    assert run_cli(["stack", "dual-write", "gpu-power-thermal"]) == 0
    assert "already dual-writing" in capsys.readouterr().out
    assert sha256_text(path.read_text()) == after
    # A rename of another label on an entry that is already live: matched on the host label.
    assert run_cli(["stack", "drift", "gpu-power-thermal", "--rename-label", "UUID=uuid",
                    "--hosts", "gpu-node-0003"]) == 0
    renamed = stack_env.target.query('count by (Hostname) (DCGM_FI_DEV_GPU_TEMP{uuid!="", UUID=""})').series
    assert {s.labels["Hostname"] for s in renamed} == {"gpu-node-0003"}
    assert (stack_env.source.scalar('count(DCGM_FI_DEV_GPU_TEMP{uuid!=""})') or 0) == 0


@pytest.mark.parametrize("argv,needle", [
    (["dual-write", "gpu-nope"], "unknown metric group 'gpu-nope'"),
    (["drift", "gpu-memory", "--rename-label", "Hostname", "--hosts", "x"], "must be FROM=TO"),
    (["drift", "gpu-memory", "--rename-label", "Hostname=host-name", "--hosts", "x"], "'host-name' is not a label"),
    (["drift", "gpu-memory", "--rename-label", "Hostname=hostname", "--hosts", "gpu-node-(0"],
     "not a valid RE2 regex: missing ): gpu-node-(0"),
    (["drift", "gpu-memory", "--rename-label", "Hostname=hostname", "--hosts", "node-9"],
     "--hosts 'node-9' matches none of the 4 hosts of gpu-memory"),
    (["drift", "gpu-memory", "--rename-label", "nolabel=x", "--hosts", ".*"], "carries label 'nolabel'"),
])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(stack_env: DriftStack, capsys: pytest.CaptureFixture[str],
                                                          argv: list[str], needle: str) -> None:
    path = stack_env.stack.source_config_path
    before = path.read_text()
    assert run_cli(["stack", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err, err
    assert err.startswith(f"python -m promshift.local stack {argv[0]}: ")
    assert path.read_text() == before


def test_a_stack_that_is_not_up_is_named_and_left_alone(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    fleet, source, target = find_free_ports(3)
    config = StackConfig(home=tmp_path / "down", nodes=4, fleet_port=fleet, source_port=source, target_port=target)
    for k, v in env_for(config).items():
        monkeypatch.setenv(k, v)
    for argv in (["dual-write", "gpu-memory"], ["drift", "gpu-memory", "--rename-label", "a=b", "--hosts", ".*"]):
        assert run_cli(["stack", *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert err == (f"python -m promshift.local stack {argv[0]}: the local stack at {config.home} is not up "
                       f"(source, target "
                       f"down); run `python -m promshift.local stack up` first")
    assert not (tmp_path / "down").exists()


# -- parity over the planted renames ---------------------------------------------------------------


def test_declared_rename_on_every_host_passes_every_layer(drift_stack: DriftStack) -> None:
    result = run_parity(drift_stack, "gpu-clocks", **DECLARED)
    by_name = result["by_name"]
    assert {n: by_name[n]["verdict"] for n in LAYERS} == dict.fromkeys(LAYERS, "SUCCESSFUL"), \
        {n: by_name[n]["reason"] for n in LAYERS}
    assert result["verdict"] == "SUCCESSFUL"
    # Backed by the group's own series, on every host: 4 hosts x 8 GPUs x 2 clocks.
    assert result["series_compared"] == 64 and result["points_compared"] >= 64 * 4
    assert by_name["aggregates"]["numbers"]["aggregates_compared"] == 4 * 2
    assert by_name["host_coverage"]["numbers"]["keys"] == 4
    # Each side is asked with its own name of the host label: one plain selector each, no `or`.
    assert result["shard_host_names"] == [["Hostname"], ["hostname"]]


def test_undeclared_rename_on_every_host_reads_as_a_rename_not_loss(drift_stack: DriftStack) -> None:
    result = run_parity(drift_stack, "gpu-clocks")
    by_name = result["by_name"]
    assert result["verdict"] == "FAILED"
    assert by_name["coverage"]["verdict"] == "SUCCESSFUL"  # every series is there, under another label
    host = by_name["host_coverage"]
    assert host["verdict"] == "FAILED"
    assert host["reason"] == ("4 hosts (gpu-node-0000, gpu-node-0001, gpu-node-0002, gpu-node-0003) present under "
                              "`hostname` on the target, not `Hostname`: renamed? add "
                              "`parity.rename_labels: {hostname: Hostname}` if intended (hosts per label name: "
                              "source Hostname 4; target Hostname 0, hostname 4)"), host["reason"]
    assert "`Hostname` only on source and `hostname` only on target" in by_name["labels"]["reason"]


GOLDEN = ["avg by (Hostname) (DCGM_FI_DEV_FB_USED)",
          "max by (Hostname) (max_over_time(DCGM_FI_DEV_FB_FREE[4s]))",
          'sum(DCGM_FI_DEV_FB_USED{Hostname="gpu-node-0000"})']


def golden_dashboard(tmp_path: Path) -> tuple[str, ...]:
    panels = [{"title": f"p{i}", "targets": [{"refId": "A", "expr": e}]} for i, e in enumerate(GOLDEN)]
    (tmp_path / "mixed.json").write_text(json.dumps({"panels": panels}))
    return (str(tmp_path / "mixed.json"),)


def test_undeclared_rename_on_half_the_hosts_fails_naming_them_and_the_hint(drift_stack: DriftStack,
                                                                            tmp_path: Path) -> None:
    result = run_parity(drift_stack, "gpu-memory", golden_dashboards=golden_dashboard(tmp_path))
    golden = {n: m for n, m in result["by_name"].items() if n.startswith("golden[")}
    assert [g["verdict"] for g in golden.values()] == ["FAILED"] * 3, {n: g["reason"] for n, g in golden.items()}
    for g in golden.values():
        assert g["reason"].startswith("`hostname` instead of `Hostname` on 2 hosts (gpu-node-0000, gpu-node-0001) "
                                      "of the target: renamed? add `parity.rename_labels: {hostname: Hostname}`"), \
            g["reason"]
    by_name = result["by_name"]
    assert result["verdict"] == "FAILED"
    labels = by_name["labels"]
    assert labels["verdict"] == "FAILED"
    assert labels["reason"] == (
        "label drift: DCGM_FI_DEV_FB_FREE, DCGM_FI_DEV_FB_RESERVED, DCGM_FI_DEV_FB_USED: `hostname` only on target; "
        "`hostname` on 2 hosts (gpu-node-0000, gpu-node-0001) of the target: renamed? add "
        "`parity.rename_labels: {hostname: Hostname}` if intended (hosts per label name: source Hostname 4; "
        "target Hostname 2, hostname 2)"), labels["reason"]
    assert labels["numbers"]["renamed_hosts"] == {"hostname": ["gpu-node-0000", "gpu-node-0001"]}
    host = by_name["host_coverage"]
    assert host["verdict"] == "FAILED"
    assert host["reason"].startswith("2 hosts (gpu-node-0000, gpu-node-0001) present under `hostname` on the "
                                     "target, not `Hostname`"), host["reason"]
    assert "misses" not in host["reason"]
    # The other half is compared and matches; the renamed hosts are the coverage layer's finding.
    assert by_name["aggregates"]["verdict"] == "SUCCESSFUL"
    assert by_name["aggregates"]["numbers"]["aggregates_compared"] == 2 * 3


def test_declared_rename_on_half_the_hosts_passes_every_layer(drift_stack: DriftStack, tmp_path: Path) -> None:
    result = run_parity(drift_stack, "gpu-memory", golden_dashboards=golden_dashboard(tmp_path), **DECLARED)
    by_name = result["by_name"]
    assert {n: by_name[n]["verdict"] for n in LAYERS} == dict.fromkeys(LAYERS, "SUCCESSFUL"), \
        {n: by_name[n]["reason"] for n in LAYERS}
    # Golden reads every host under either name: the same answers as the source, per host and in total.
    golden = {n: m for n, m in by_name.items() if n.startswith("golden[")}
    assert {n: g["verdict"] for n, g in golden.items()} == dict.fromkeys(
        ("golden[p0]", "golden[p1]", "golden[p2]"), "SUCCESSFUL"), {n: g["reason"] for n, g in golden.items()}
    assert golden["golden[p0]"]["numbers"]["series_compared"] == 4
    for layer in ("host_coverage", "labels"):
        assert by_name[layer]["numbers"]["hosts_per_label"] == {"source": {"Hostname": 4},
                                                                "target": {"Hostname": 2, "hostname": 2}}
        assert by_name[layer]["reason"].endswith(
            "(hosts per label name: source Hostname 4, hostname 0; target Hostname 2, hostname 2)")
    assert result["verdict"] == "SUCCESSFUL"
    assert result["series_compared"] == 4 * 8 * 3 and result["points_compared"] >= 96 * 4
    assert by_name["aggregates"]["numbers"]["aggregates_compared"] == 4 * 3
    assert sorted(result["hosts_sampled"]) == [f"gpu-node-000{i}" for i in range(4)]
    assert result["shard_host_names"] == [["Hostname"], ["Hostname", "hostname"]]
