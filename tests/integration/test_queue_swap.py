"""Bounded write queues on real servers: three cut-over groups merged into one entry with no gap, one leaves it.

A 2-node lab stack (Debian's Prometheus 2.42 as the source, a second one receiving remote writes as the
target with an out-of-order window, 1 s scrapes). Every gap is counted on the target: the samples it holds of
each metric over the whole window against the source's own count. A target without the window (the source
itself, a plain 2.42) refuses a merge before any edit.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.deploy import ConfigSnapshot, FileConfigDeployer
from promshift.adapters.file_edits import FileEditDeployment
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.queue_probe import PrometheusQueueProbe, target_out_of_order_window
from promshift.adapters.routing import RoutingStore
from promshift.core.catalog import MetricGroup
from promshift.core.queues import QueueCapError, plan_merge, promshift_queues, with_added
from promshift.core.render import add_remote_write, remote_write_entry, remote_write_names, remove_remote_write
from promshift.core.stages import Stage
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.orchestration.compose import compose_migration, queue_cap
from promshift.steps.migration import Backends
from promshift.steps.queues import QueueSwap, SwapFailed
from tests.integration.conftest import eventually

# slow: run by make e2e (.ci/run), which keeps make test inside its 15-minute budget
pytestmark = [pytest.mark.integration, pytest.mark.slow]

GROUPS = {"gpu-util": ("DCGM_FI_DEV_GPU_UTIL",), "fb": ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"),
          "power": ("DCGM_FI_DEV_POWER_USAGE",)}
DROPS = {"fb": ("modelName",)}
BATCH_DEADLINE_S = 5  # Prometheus' remote_write queue_config.batch_send_deadline default


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, free_ports: Callable[[int], list[int]]) -> Iterator[LocalStack]:
    fleet, source, target = free_ports(3)
    s = LocalStack(StackConfig(home=tmp_path_factory.mktemp("queues"), nodes=2, fleet_port=fleet, source_port=source,
                               target_port=target, scrape_interval="1s"))
    try:
        s.up(timeout=90)
        # The target ingests out of order within a window, as AMP does (60 s by default): the swap's overlap sends
        # each sample twice, and a plain Prometheus receiver refuses a whole batch holding an older duplicate (HTTP
        # 400), so a merged queue's batch straddling the removal would lose its newer samples (measured: 48 of 464).
        # Without it the swap is not started (test_a_target_without_an_out_of_order_window_refuses_the_merge...).
        config = yaml.safe_load(s.target_config_path.read_text())
        config["storage"] = {"tsdb": {"out_of_order_time_window": "1h"}}
        s.target_config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        requests.post(f"{s.target_url}/-/reload", timeout=30).raise_for_status()
        yield s
    finally:
        s.down()


def clients(stack: LocalStack) -> tuple[PrometheusClient, PrometheusClient]:
    return PrometheusClient(stack.source_url), PrometheusClient(stack.target_url)


def deploy_groups(stack: LocalStack, deployer: FileConfigDeployer, groups: list[str]) -> float:
    snap = deployer.snapshot()
    data = snap.data
    for g in groups:
        data = add_remote_write(data, remote_write_entry(group_name=g, name_regex="|".join(GROUPS[g]),
                                                         url=stack.target_remote_write_url,
                                                         drop_labels=DROPS.get(g, ())))
    deployer.deploy(data, snapshot=snap, expect_remote_writes={f"promshift-{g}" for g in groups})
    return time.time()


def samples(client: PrometheusClient, metric: str, start: float, end: float) -> int:
    return int(client.scalar(f"sum(count_over_time({metric}[{int(end - start)}s]))", at=end) or 0)


def assert_no_gap(source: PrometheusClient, target: PrometheusClient, groups: list[str], start: float,
                  end: float) -> dict[str, int]:
    counted = {}
    for g in groups:
        for metric in GROUPS[g]:
            held, got = samples(source, metric, start, end), samples(target, metric, start, end)
            assert held > 0, f"no samples of {metric} on the source: the check has no data"
            assert got == held, f"{metric}: target holds {got} samples of the source's {held} over the swap"
            counted[metric] = got
    return counted


def swap_step(stack: LocalStack, deployer: FileConfigDeployer, events: list[tuple[Any, ...]],
              *, target_matchers: str = "", deadline_s: float = 60.0) -> QueueSwap:
    source, target = clients(stack)
    return QueueSwap(deployer_for=lambda change: FileEditDeployment(deployer, change),
                     probe=PrometheusQueueProbe(source, target, target_matchers=target_matchers),
                     record=lambda kind, now, evidence: events.append((kind, dict(evidence))),
                     out_of_order_window=lambda: target_out_of_order_window(target), scrape_interval_s=1.0,
                     proof_deadline_s=deadline_s, poll_s=1.0)


def now() -> datetime:
    return datetime.now(UTC)


def test_three_groups_merge_into_one_entry_with_no_gap_then_one_leaves(stack: LocalStack) -> None:
    source, target = clients(stack)
    deployer = FileConfigDeployer(stack.source_config_path, source)
    original = stack.source_config_path.read_bytes()
    joined = deploy_groups(stack, deployer, list(GROUPS))
    start = joined + 3  # a new entry starts at its reload (no WAL history): count from wholly after it
    eventually(lambda: all(int(target.scalar(f"count({m})") or 0) == int(source.scalar(f"count({m})") or 0) > 0
                           for g in GROUPS for m in GROUPS[g]), 60, "the per-group entries never delivered")
    events: list[tuple[Any, ...]] = []
    swaps = swap_step(stack, deployer, events)
    swap = swaps.plan_merge(url=stack.target_remote_write_url, cut_over=list(GROUPS))
    assert swap is not None and len(swap.remove) == 3
    outcome = swaps.run(swap, clock=now, wait=time.sleep)
    assert outcome.state == "done"
    live = remote_write_names(source.config_text())
    assert [n for n in live if n.startswith("promshift-")] == [swap.added_name]
    assert [q.groups() for q in promshift_queues(stack.source_config_path.read_bytes())] == [tuple(sorted(GROUPS))]
    assert [e[0].value for e in events] == ["queue_swap_added", "queue_swap_done"]
    # The window the overlap relied on, read from the target's loaded config (Prometheus 2.42's status/config).
    assert events[0][1]["target_out_of_order"] == {
        "window_s": 3600.0, "origin": f"storage.tsdb.out_of_order_time_window of {stack.target_url}",
        "needed_s": 30.0, "scrape_interval_s": 1.0, "covered": True}
    assert set(events[1][1]["proof"]["per_group"]) == set(GROUPS)
    # A queue sends a partial batch after batch_send_deadline (5 s): count up to a time every sample has reached.
    time.sleep(BATCH_DEADLINE_S + 4)
    end = time.time() - BATCH_DEADLINE_S - 2
    assert_no_gap(source, target, list(GROUPS), start, end)
    # The fb group's own drop still applies, to its series only.
    fresh = f"[{int(time.time() - end) + 3}s]"
    assert int(target.scalar(f'count(last_over_time(DCGM_FI_DEV_FB_USED{{modelName!=""}}{fresh}))') or 0) == 0
    assert int(target.scalar(f'count(last_over_time(DCGM_FI_DEV_GPU_UTIL{{modelName!=""}}{fresh}))') or 0) > 0

    # fb rolls back: it leaves the merged entry by one more swap; the others go on without a gap.
    leave = swaps.plan_leave(group="fb")
    assert leave is not None
    left_at = time.time()
    swaps.run(leave, clock=now, wait=time.sleep)
    assert [q.groups() for q in promshift_queues(stack.source_config_path.read_bytes())] == [("gpu-util", "power")]
    assert events[-1][1]["swap"]["leaving"] == "fb"
    time.sleep(BATCH_DEADLINE_S + 4)
    end = time.time() - BATCH_DEADLINE_S - 2
    assert end > left_at
    assert_no_gap(source, target, ["gpu-util", "power"], start, end)
    assert eventually(lambda: int(target.scalar("count(count_over_time(DCGM_FI_DEV_FB_USED[3s]))") or 0) == 0,
                      20, "fb still written after leaving")
    # The last members leave too: the source config is its original bytes again.
    for group in ("gpu-util", "power"):
        last = swaps.plan_leave(group=group)
        assert last is not None
        swaps.run(last, clock=now, wait=time.sleep)
    assert stack.source_config_path.read_bytes() == original


def test_a_swap_never_proven_is_undone_byte_for_byte(stack: LocalStack) -> None:
    source, _ = clients(stack)
    deployer = FileConfigDeployer(stack.source_config_path, source)
    deploy_groups(stack, deployer, ["gpu-util", "power"])
    before = stack.source_config_path.read_bytes()
    events: list[tuple[Any, ...]] = []
    # A target selector nothing matches: the proof cannot pass, so nothing is removed and the add is undone.
    swaps = swap_step(stack, deployer, events, target_matchers=',nowhere="x"', deadline_s=5)
    swap = swaps.plan_merge(url=stack.target_remote_write_url, cut_over=["gpu-util", "power"])
    assert swap is not None
    with pytest.raises(SwapFailed, match="not proven in 5s"):
        swaps.run(swap, clock=now, wait=time.sleep)
    assert stack.source_config_path.read_bytes() == before
    assert swap.added_name not in remote_write_names(source.config_text())
    assert events[-1][0].value == "queue_swap_undone" and events[-1][1]["restored_identical"] is True


def test_promtool_accepts_a_source_with_a_merged_entry(stack: LocalStack, tmp_path: Path) -> None:
    config = stack.source_config_path.read_bytes()
    for g in GROUPS:
        if f"promshift-{g}" not in remote_write_names(config):
            config = add_remote_write(config, remote_write_entry(group_name=g, name_regex="|".join(GROUPS[g]),
                                                                 url=stack.target_remote_write_url,
                                                                 drop_labels=DROPS.get(g, ())))
    swap = plan_merge(config, url=stack.target_remote_write_url, cut_over=list(GROUPS))
    assert swap is not None
    path = tmp_path / "prometheus.yml"
    path.write_bytes(with_added(config, swap))
    done = subprocess.run(["promtool", "check", "config", "--syntax-only", str(path)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


class CutOver:
    """The audit as the merge reads it: every group has cut over."""

    def stage_of(self, name: str) -> Stage:
        return Stage.CUT_OVER


def test_a_target_without_an_out_of_order_window_refuses_the_merge_before_any_edit(stack: LocalStack) -> None:
    """The source is a plain Prometheus 2.42 (no storage.tsdb.out_of_order_time_window): as a merge's target it
    would refuse the overlap's older duplicates, so a deploy past the cap is refused in one line and the source
    config is not touched (no swap event)."""
    path = stack.source_config_path
    source, _ = clients(stack)
    deployer = FileConfigDeployer(path, source)
    if strip_promshift(path.read_bytes()) != path.read_bytes():  # what earlier tests here left
        deployer.restore(ConfigSnapshot.of(path, strip_promshift(path.read_bytes())))
    original = path.read_bytes()
    try:
        deploy_groups(stack, deployer, list(GROUPS))
        at_cap = path.read_bytes()
        assert target_out_of_order_window(source) == (0.0, f"storage.tsdb.out_of_order_time_window of "
                                                            f"{stack.source_url}")
        backends = Backends(source=source, target=source, source_config_path=str(path),
                            target_remote_write_url=stack.target_remote_write_url)
        group = MetricGroup(name="clocks", metrics=("DCGM_FI_DEV_SM_CLOCK",), owners=("o",), approvers=("p",),
                            max_queues=3, scrape_interval_s=1.0)
        events: list[tuple[Any, ...]] = []
        queues = queue_cap(group, backends, audit=CutOver(), proof_deadline_s=60, poll_s=1.0)
        with pytest.raises(QueueCapError) as refused:
            queues.preflight(group="clocks", record=lambda kind, at, evidence: events.append((kind, evidence)),
                             now=now(), merge=True)
        line = str(refused.value)
        assert "\n" not in line and "carries 3 promshift remote_write queues (cap 3)" in line
        assert "the target accepts no out-of-order samples" in line and "at least 30s" in line
        assert path.read_bytes() == at_cap
        assert [n for n in remote_write_names(source.config_text()) if n.startswith("promshift-")] == [
            f"promshift-{g}" for g in GROUPS]
        assert [e[0].value for e in events] == ["queue_cap_refused"]
    finally:
        if path.read_bytes() != original:
            deployer.restore(ConfigSnapshot.of(path, original))


def strip_promshift(data: bytes) -> bytes:
    """The config without any promshift entry: what every swap and rollback must leave byte for byte."""
    for name in remote_write_names(data):
        if name.startswith("promshift-"):
            data = remove_remote_write(data, name)
    return data


def test_the_deploy_step_merges_three_cut_over_groups_then_one_rolls_back_out_of_the_merged_entry(
        stack: LocalStack, tmp_path: Path) -> None:
    """The production path: a fourth group's snapshot step finds the source at its cap (3) and merges the three
    cut-over groups first (add, prove on the target, remove), with no gap; then fb's rollback leaves the merged
    entry by one more swap before its own restore, audited, and the rest of the file is byte for byte the same."""
    path = stack.source_config_path
    source, target = clients(stack)
    deployer = FileConfigDeployer(path, source)
    if strip_promshift(path.read_bytes()) != path.read_bytes():  # what earlier tests here left
        deployer.restore(ConfigSnapshot.of(path, strip_promshift(path.read_bytes())))
    original = path.read_bytes()
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    backends = Backends(source=PrometheusClient(stack.source_url, timeout_s=30),
                        target=PrometheusClient(stack.target_url, timeout_s=30),
                        source_config_path=str(path), target_remote_write_url=stack.target_remote_write_url)
    metrics = {**GROUPS, "clocks": ("DCGM_FI_DEV_SM_CLOCK",)}

    def migration(name: str) -> Any:
        group = MetricGroup(name=name, metrics=metrics[name], drop_labels=DROPS.get(name, ()), owners=("o",),
                            approvers=("p",), max_queues=3)
        return compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url),
                                 run_id=f"manual__{name}", snapshots_dir=tmp_path / "snapshots",
                                 queues=queue_cap(group, backends, audit=audit, proof_deadline_s=60, poll_s=1.0))

    def deploy(name: str) -> tuple[Any, dict[str, Any]]:
        m = migration(name)
        info = m.snapshot(now())
        m.deploy_dual_write(info, now())
        return m, info

    try:
        runs = {g: deploy(g) for g in GROUPS}
        start = time.time() + 3
        eventually(lambda: all(int(target.scalar(f"count({m})") or 0) == int(source.scalar(f"count({m})") or 0) > 0
                               for g in GROUPS for m in GROUPS[g]), 60, "the per-group entries never delivered")
        for m, _ in runs.values():  # cut over (the stages the bake watch reads; reads stay where they are)
            for kind, stage in (("warmup_started", Stage.WARMING), ("gate_passed", Stage.VERIFIED),
                                ("approved", Stage.APPROVED), ("cut_over", Stage.CUT_OVER)):
                m.record(kind, now(), {}, to=stage)

        merged_at = time.monotonic()
        clocks, clocks_info = deploy("clocks")  # at the cap: the three are merged first
        merge_s = time.monotonic() - merged_at
        assert [q.groups() for q in promshift_queues(path.read_bytes())] == [("fb", "gpu-util", "power"), ("clocks",)]
        assert [e.kind for e in audit.events(group="clocks")] == [
            "queue_swap_added", "queue_swap_done", "snapshot_taken", "dual_write_deployed"]
        assert clocks_info["queues"]["merged_first"]["remove"] == [f"promshift-{g}" for g in GROUPS]
        assert audit.events(group="clocks")[0].evidence_data["target_out_of_order"]["window_s"] == 3600.0
        assert strip_promshift(path.read_bytes()) == original
        time.sleep(BATCH_DEADLINE_S + 4)
        assert_no_gap(source, target, list(GROUPS), start, time.time() - BATCH_DEADLINE_S - 2)

        # fb's bake failed: its rollback leaves the merged entry first, then restores its own (gone) entry.
        m_fb, info_fb = runs["fb"]
        left_at, t0 = time.time(), time.monotonic()
        rolled = m_fb.rollback(info_fb, reason="bake failed", now=now())
        leave_s = time.monotonic() - t0
        assert [q.groups() for q in promshift_queues(path.read_bytes())] == [("clocks",), ("gpu-util", "power")]
        assert rolled["left_merged_entry"]["leaving"] == "fb" and rolled["performed"] is True
        assert [e.kind for e in audit.events(group="fb")][-3:] == ["queue_swap_added", "queue_swap_done", "rolled_back"]
        assert audit.stage_of("fb") is Stage.ROLLED_BACK
        assert strip_promshift(path.read_bytes()) == original  # byte for byte on the rest of the file
        time.sleep(BATCH_DEADLINE_S + 4)
        end = time.time() - BATCH_DEADLINE_S - 2
        assert end > left_at
        assert_no_gap(source, target, ["gpu-util", "power"], start, end)
        eventually(lambda: int(target.scalar("count(count_over_time(DCGM_FI_DEV_FB_USED[3s]))") or 0) == 0,
                   20, "fb still written after its rollback")
        # Retried: the recorded rollback comes back, no second swap.
        again = m_fb.rollback(info_fb, reason="bake failed", now=now())
        assert again["already_rolled_back"] is True
        assert [e.kind for e in audit.events(group="fb")].count("queue_swap_done") == 1
        print(f"merge through the snapshot step {merge_s:.1f}s, leave through the rollback {leave_s:.1f}s")
    finally:
        if path.read_bytes() != original:
            deployer.restore(ConfigSnapshot.of(path, original))
        audit.engine.dispose()
