"""After cut-over: the bake watch's outcomes on a real audit store and routing table (observations injected).

The HTTP side of ``GroupLifecycle.observe`` is exercised by the operator tests below with unreachable
backends (every observation an error: the bake fails and reads return to the source).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.bake import BakeObservation
from promshift.core.stages import Stage
from promshift.core.verdicts import Verdict
from promshift.orchestration.compose import compose_migration
from promshift.steps.lifecycle import DEFAULT_READ_RESTORERS, GroupLifecycle, RestoreReadsFailed
from promshift.steps.migration import Backends, GroupMigration

GROUP = "gpu-memory"
T0 = datetime(2026, 12, 1, tzinfo=UTC)
UP_TO_CUT_OVER = [Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER]
CLEAN = BakeObservation(target_newest_age_s=4, lag_s=1.5, failed_samples=0, source_series=24, target_series=24,
                        parity=Verdict.SUCCESSFUL, parity_reason="96 points compared")


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.engine.dispose()


def lifecycle(tmp_path: Path, audit: AuditStore, run_id: str = "scheduled__bake", **kw: Any) -> GroupLifecycle:
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP)
    unused = PrometheusClient("http://127.0.0.1:9")
    backends = Backends(source=PrometheusClient("http://source.example:9090"), target=unused,
                        source_config_path=str(tmp_path / "prometheus.yml"), target_remote_write_url="")
    m = compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url), snapshots_dir=tmp_path,
                       run_id=run_id)
    return GroupLifecycle(m, **kw)


def cut_over(audit: AuditStore) -> None:
    """A group cut over by a real run: its history, and reads routed to the target."""
    current = Stage.PLANNED
    for stage in UP_TO_CUT_OVER:
        audit.append(group=GROUP, run_id="manual__migrate", kind=f"seed_{stage.value}", actor="test", at=T0,
                     evidence={}, stage_from=current, stage_to=stage)
        current = stage
    RoutingStore(audit.url).route(GROUP, read_from="target", url="http://amp.example", at=T0, run_id="manual__migrate")


def test_a_clean_bake_period_makes_the_group_baked(tmp_path: Path, audit: AuditStore) -> None:
    cut_over(audit)
    policy = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP).bake
    steps = int(policy.period_s // policy.interval_s)
    outcomes = []
    for i in range(steps + 1):
        now = T0 + timedelta(seconds=60 + i * policy.interval_s)
        outcomes.append(lifecycle(tmp_path, audit, run_id=f"scheduled__{i}").bake_check(now, CLEAN)["outcome"])
    assert outcomes == ["baking"] * steps + ["baked"]
    kinds = [e.kind for e in audit.events(group=GROUP)[len(UP_TO_CUT_OVER):]]
    assert kinds == ["bake_started"] + ["bake_check"] * (steps + 1) + ["baked"]
    assert audit.stage_of(GROUP) == Stage.BAKED
    [baked] = [e for e in audit.events(group=GROUP) if e.kind == "baked"]
    assert (baked.stage_from, baked.stage_to) == ("baking", "baked")
    assert baked.evidence_data["checks"] == steps + 1 and baked.evidence_data["period_s"] == policy.period_s
    # Reads stay on the target; a baked group is no longer watched.
    assert RoutingStore(audit.url).read_from(GROUP) == "target"
    assert lifecycle(tmp_path, audit).bake_check(T0 + timedelta(hours=1), CLEAN)["outcome"] == "not_watched"
    assert audit.verify().ok


def test_an_inconclusive_check_restarts_the_bake_clock(tmp_path: Path, audit: AuditStore) -> None:
    cut_over(audit)
    inconclusive = dataclasses.replace(CLEAN, parity=None, parity_reason="dual-write too short")
    seen = []
    policy = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP).bake
    assert policy.interval_s == 60  # one check a minute below
    clean_after = int(policy.period_s // 60) + 1  # checks in a streak covering the period
    for i, obs in enumerate([CLEAN, CLEAN, inconclusive, *[CLEAN] * clean_after]):
        seen.append(lifecycle(tmp_path, audit).bake_check(T0 + timedelta(minutes=1 + i), obs)["outcome"])
    # Two clean minutes before the inconclusive check do not count: the streak restarts after it.
    assert seen == ["baking"] * (2 + clean_after) + ["baked"]


def test_a_failed_check_returns_reads_to_the_source_and_keeps_dual_write(tmp_path: Path, audit: AuditStore) -> None:
    cut_over(audit)
    config = tmp_path / "prometheus.yml"
    config.write_text("remote_write: [{name: promshift-gpu-memory, url: http://amp.example}]\n")
    before = config.read_bytes()
    lifecycle(tmp_path, audit).bake_check(T0 + timedelta(minutes=1), CLEAN)
    stale = dataclasses.replace(CLEAN, target_newest_age_s=900)
    out = lifecycle(tmp_path, audit).bake_check(T0 + timedelta(minutes=2), stale)
    assert out["outcome"] == "rolled_back_reads"
    assert out["reason"].startswith("bake check FAILED: freshness FAILED: newest sample on the target is 15m old")
    assert audit.stage_of(GROUP) == Stage.ROLLED_BACK_READS
    route = RoutingStore(audit.url).get(GROUP)
    assert route is not None and (route["read_from"], route["url"]) == ("source", "http://source.example:9090")
    [ev] = [e for e in audit.events(group=GROUP) if e.kind == "reads_rolled_back"]
    assert (ev.stage_from, ev.stage_to) == ("baking", "rolled_back_reads")
    assert ev.evidence_data["restored"]["routing"]["changed"] is True
    assert ev.evidence_data["dual_write"] == "kept on"
    assert config.read_bytes() == before  # the source config (and its remote_write) untouched
    # The failed check itself is the evidence, recorded first.
    checks = [e for e in audit.events(group=GROUP) if e.kind == "bake_check"]
    assert [c.evidence_data["verdict"] for c in checks] == ["SUCCESSFUL", "FAILED"]
    assert checks[-1].evidence_data["observation"]["target_newest_age_s"] == 900


def test_restore_reads_is_a_hook_every_read_path_adapter_joins(tmp_path: Path, audit: AuditStore) -> None:
    cut_over(audit)
    calls: list[tuple[str, str]] = []

    def restore_rules(migration: GroupMigration, *, reason: str, now: datetime) -> dict[str, Any]:
        calls.append((migration.group.name, reason))
        return {"rule_groups": ["gpu-memory.rules"], "moved_to": "source"}

    lc = lifecycle(tmp_path, audit, read_restorers=[*DEFAULT_READ_RESTORERS, ("rules", restore_rules)])
    lc.bake_check(T0 + timedelta(minutes=1), dataclasses.replace(CLEAN, target_series=0))
    assert calls == [(GROUP, "bake check FAILED: series FAILED: target 0 of 24 source series (100.00%, limit 1.00%)")]
    [ev] = [e for e in audit.events(group=GROUP) if e.kind == "reads_rolled_back"]
    assert set(ev.evidence_data["restored"]) == {"routing", "rules"}


def test_a_failed_restore_is_recorded_and_its_retry_restores_without_checking_again(
        tmp_path: Path, audit: AuditStore) -> None:
    cut_over(audit)

    def broken(migration: GroupMigration, *, reason: str, now: datetime) -> dict[str, Any]:
        raise OSError("rules API unreachable")

    run = "scheduled__retry"
    failing = lifecycle(tmp_path, audit, run_id=run, read_restorers=[*DEFAULT_READ_RESTORERS, ("rules", broken)])
    with pytest.raises(RestoreReadsFailed, match="rules: OSError: rules API unreachable"):
        failing.bake_check(T0 + timedelta(minutes=1), dataclasses.replace(CLEAN, lag_s=600))
    assert audit.stage_of(GROUP) == Stage.BAKING  # no move while a restorer failed
    assert audit.events(group=GROUP)[-1].kind == "restore_reads_failed"
    # The task's retry: even with a clean observation now, it finishes the restore it owes.
    out = lifecycle(tmp_path, audit, run_id=run).bake_check(T0 + timedelta(minutes=2), CLEAN)
    assert out["outcome"] == "rolled_back_reads" and out["reason"].startswith("bake check FAILED: lag FAILED")
    assert [e.kind for e in audit.events(group=GROUP)].count("bake_check") == 1
    assert audit.stage_of(GROUP) == Stage.ROLLED_BACK_READS
