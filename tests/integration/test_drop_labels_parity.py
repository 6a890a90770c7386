"""Declared label drops through the real write path: labeldrop on the group's remote_write, then parity.

A 2-node stack (1 s scrapes). gpu-utilization is dual-written by the local stack's remote write
(``LocalRemoteWrite.dual_write``) with ``drop_labels: [UUID, pci_bus_id, device]``: the source's config is
promtool-checked and reloaded by the file deployer, the target receives every series without those labels,
and parity (plan, shards, reduce, as the DAG runs it) is SUCCESSFUL. The same group with the drops but not
declared FAILS (the target lacks labels the source has). gpu-memory is dual-written with the same drops plus a
planted value difference the other layers cannot see: on one host, GPUs 0 and 1 swap their ``gpu`` label on
the way to the target (same series count, same label names, same per-host sums), so only the raw samples
differ, and parity FAILS on them.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.core.catalog import MetricGroup
from promshift.core.render import add_remote_write, remote_write_entry
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.local.stack.remote_write import LocalRemoteWrite

pytestmark = pytest.mark.integration

DROPS = ("UUID", "pci_bus_id", "device")
HOST = "gpu-node-0000"


def _group(name: str, drops: tuple[str, ...] = DROPS) -> MetricGroup:
    group = load_catalog(profile="demo").get(name)
    # 2 s steps over 1 s scrapes, every host sampled; no golden dashboard (its own layer, tested on its own).
    # skip_recent past remote write's 5 s batch deadline: a newer point may not have reached the target yet.
    parity = dataclasses.replace(group.parity, step_s=2.0, skip_recent_s=7.0, golden_dashboards=(), sample_hosts=2,
                                 hosts_per_shard=2)
    return dataclasses.replace(group, parity=parity, drop_labels=drops)


def _swap_gpus(host: str) -> list[dict[str, Any]]:
    """write_relabel_configs that swap the ``gpu`` label of GPUs 0 and 1 on ``host`` (a value plant)."""
    def move(frm: str, to: str) -> dict[str, Any]:
        return {"source_labels": ["Hostname", "gpu"], "regex": f"{host};{frm}", "target_label": "gpu",
                "replacement": to, "action": "replace"}
    return [move("0", "swapped"), move("1", "0"), move("swapped", "1")]


@dataclasses.dataclass
class Dual:
    stack: LocalStack
    source: PrometheusClient
    target: PrometheusClient
    since: dict[str, float]  # per group: when its entry was live (the deploy had returned)
    config: dict[str, Any]


@pytest.fixture(scope="module")
def dual(stack_config_factory: Callable[..., StackConfig]) -> Iterator[Dual]:
    stack = LocalStack(stack_config_factory(nodes=2, scrape_interval="1s"))
    try:
        stack.up(timeout=90)
        # The planted group: its entry as the deploy renders it, plus the swap, in one promtool-checked reload.
        planted = LocalRemoteWrite(stack, _group("gpu-memory"), timeout_s=30)
        entry = remote_write_entry(group_name="gpu-memory", name_regex=planted.group.name_regex(),
                                   url=stack.target_remote_write_url, drop_labels=DROPS)
        entry["write_relabel_configs"] += _swap_gpus(HOST)
        snapshot = planted.deployer.snapshot()
        planted._deploy(add_remote_write(snapshot.data, entry), snapshot)
        # The clean group, through the stack's own dual-write (waits until the target holds its series).
        LocalRemoteWrite(stack, _group("gpu-utilization"), timeout_s=30).dual_write()
        # Both windows start after the second reload: it may briefly disturb the first entry's queue.
        since = {"gpu-memory": time.time(), "gpu-utilization": time.time()}
        config = yaml.safe_load(stack.source_config_path.read_text())
        time.sleep(max(0.0, max(since.values()) + 17 - time.time()))  # the window: ~3 steps after the settle
        yield Dual(stack, PrometheusClient(stack.source_url, timeout_s=10),
                   PrometheusClient(stack.target_url, timeout_s=10), since, config)
    finally:
        stack.down()


def _parity(d: Dual, group: MetricGroup) -> dict[str, Any]:
    """Plan, shards and reduce, as the DAG runs them; the result with its measurements by name."""
    check = ParityCheck(group, d.source, d.target)
    plan = check.plan(dual_write_since=d.since[group.name], now=time.time()).to_dict()
    result = check.reduce(plan, [ParityCheck(group, d.source, d.target).compare_shard(s)
                                 for s in plan["shards"]]).to_dict()
    result["by_name"] = {m["name"]: m for m in result["measurements"]}
    return result


def test_the_source_runs_the_labeldrop_and_promtool_accepts_it(dual: Dual) -> None:
    entries = {e["name"]: e for e in dual.config["remote_write"]}
    rules = entries["promshift-gpu-utilization"]["write_relabel_configs"]
    assert rules[0]["action"] == "keep" and rules[1] == {"regex": "UUID|pci_bus_id|device", "action": "labeldrop"}
    check = subprocess.run(["/usr/bin/promtool", "check", "config", "--syntax-only",
                            str(dual.stack.source_config_path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # The target really holds the series without the dropped labels, one for one.
    src = dual.source.query("count(DCGM_FI_DEV_GPU_UTIL)").series[0].points[0][1]
    tgt = dual.target.query("count(DCGM_FI_DEV_GPU_UTIL)").series[0].points[0][1]
    assert src == tgt == 16
    assert not dual.target.query('count(DCGM_FI_DEV_GPU_UTIL{UUID!=""})').series


def test_declared_drops_pass_and_undeclared_ones_fail(dual: Dual) -> None:
    result = _parity(dual, _group("gpu-utilization"))
    assert result["verdict"] == "SUCCESSFUL", [(m["name"], m["verdict"], m["reason"], m["numbers"].get("worst"))
                                               for m in result["measurements"]]
    samples = result["by_name"]["samples"]
    assert samples["numbers"]["points_compared"] > 0 and samples["numbers"]["mismatches"] == 0
    undeclared = _parity(dual, _group("gpu-utilization", drops=()))
    assert undeclared["verdict"] == "FAILED"
    assert undeclared["by_name"]["labels"]["verdict"] == "FAILED"
    assert undeclared["by_name"]["samples"]["verdict"] == "FAILED"


def test_a_planted_value_difference_fails_on_the_samples(dual: Dual) -> None:
    result = _parity(dual, _group("gpu-memory"))
    assert result["verdict"] == "FAILED"
    by = result["by_name"]
    for layer in ("coverage", "host_coverage", "labels", "aggregates"):  # the swap is invisible to these
        assert by[layer]["verdict"] == "SUCCESSFUL", (layer, by[layer]["reason"])
    assert by["samples"]["verdict"] == "FAILED" and by["samples"]["numbers"]["mismatches"] > 0
    offenders = by["samples"]["numbers"]["worst"]
    # Only the swapped GPUs of the planted host differ, and none of their series carries a dropped label.
    assert offenders and all(f'Hostname="{HOST}"' in o["series"] and o["problem"] == "values differ"
                             for o in offenders), offenders
    assert not any(label in o["series"] for o in offenders for label in DROPS)


def test_golden_without_a_dropped_label_passes_and_one_that_selects_it_fails(dual: Dual, tmp_path: Any) -> None:
    """Issue 39, item 3: ``max without (UUID, pci_bus_id) (...)`` with those dropped read nothing the target lacks
    (it FAILED as "reads UUID, pci_bus_id" although both sides answered alike); a query grouping by, or matching
    on, a dropped label still FAILS."""
    import json

    exprs = {"without": "max without (UUID, pci_bus_id) (DCGM_FI_DEV_GPU_UTIL)",
             "by": "sum by (UUID) (DCGM_FI_DEV_GPU_UTIL)",
             "matched": 'avg(DCGM_FI_DEV_GPU_UTIL{pci_bus_id=~".+"})'}
    (tmp_path / "d.json").write_text(json.dumps({"panels": [{"title": k, "targets": [{"expr": e}]}
                                                            for k, e in exprs.items()]}))
    group = _group("gpu-utilization")
    group = dataclasses.replace(group, parity=dataclasses.replace(group.parity, golden_dashboards=(str(tmp_path),)))
    check = ParityCheck(group, dual.source, dual.target)
    window = check.window(dual_write_since=dual.since[group.name], now=time.time())
    assert window is not None
    by = {m.name: m for m in check.golden(*window)[0]}
    assert by["golden[without]"].verdict.value == "SUCCESSFUL", by["golden[without]"].reason
    assert by["golden[without]"].numbers["series_compared"] == 16
    assert by["golden[by]"].verdict.value == "FAILED"
    assert by["golden[by]"].reason.startswith("reads UUID (grouped by), which the group drops")
    assert by["golden[matched]"].verdict.value == "FAILED"
    assert by["golden[matched]"].reason.startswith("reads pci_bus_id (matched), which the group drops")
