"""GroupMigration's steps against the real local stack: validate, snapshot, dual-write, warm-up, parity, rollback.

The stack (``local_stack``) is shared by the session, so this module migrates a group no
other test touches (``gpu-memory``) and always leaves the source config as it found it:
the rollback does that, and a fixture restores the original bytes if a step fails first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.deploy import ConfigSnapshot, DeployError, FileConfigDeployer
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, default_catalog_path, load_catalog
from promshift.core.catalog import MetricGroup
from promshift.core.render import (
    add_remote_write,
    remote_write_entry,
    remote_write_name,
    remote_write_names,
    sha256_bytes,
)
from promshift.core.stages import Stage
from promshift.core.verdicts import Layer, Verdict
from promshift.core.warmup import WarmupObservation
from promshift.local.stack.local import LocalStack
from promshift.orchestration.compose import compose_migration
from promshift.orchestration.triggers import WarmupTrigger
from promshift.steps.migration import Backends, GroupMigration, observe_warmup

pytestmark = pytest.mark.integration

GROUP = "gpu-memory"
RUN_ID = "manual__test-migration-steps"
WARMUP_DEADLINE_S = 40.0


def small_group() -> MetricGroup:
    """The catalog's gpu-memory group (demo profile) with a parity grid fit for a 2 s scrape."""
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP)
    return dataclasses.replace(group, parity=dataclasses.replace(group.parity, step_s=2.0, skip_recent_s=4.0))


def backends_for(stack: LocalStack, *, target_url: str | None = None) -> Backends:
    return Backends(source=PrometheusClient(stack.source_url, timeout_s=30),
                    target=PrometheusClient(target_url or stack.target_url, timeout_s=30),
                    source_config_path=str(stack.source_config_path),
                    target_remote_write_url=stack.target_remote_write_url)


def make_migration(stack: LocalStack, tmp_path: Path, audit: AuditStore, *,
                   target_url: str | None = None) -> GroupMigration:
    return compose_migration(small_group(), backends_for(stack, target_url=target_url), audit=audit,
                          routing=RoutingStore(audit.url), snapshots_dir=tmp_path / "snapshots",
                          run_id=RUN_ID, catalog_dir=default_catalog_path().parent)


def now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.engine.dispose()


@pytest.fixture
def source_config_guard(local_stack: LocalStack) -> Iterator[bytes]:
    """The source config's bytes before the test; restored (and reloaded) if the test left them changed."""
    path = local_stack.source_config_path
    original = path.read_bytes()
    yield original
    if path.read_bytes() != original:
        FileConfigDeployer(path, PrometheusClient(local_stack.source_url)).restore(ConfigSnapshot.of(path, original))


@pytest.fixture
def connections(local_stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Airflow connections the warm-up trigger reads (as the triggerer would)."""
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({"conn_type": "prometheus",
                                                                    "host": local_stack.source_url}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": local_stack.target_url,
        "extra": {"remote_write_url": local_stack.target_remote_write_url}}))


async def first_event(trigger: WarmupTrigger, timeout_s: float) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return await asyncio.wait_for(first(), timeout=timeout_s)


def wait_for_target(group: MetricGroup, backends: Backends, since: float) -> WarmupObservation:
    """Poll like the warm-up trigger until the target holds every series of the group the source has."""
    deadline = time.monotonic() + WARMUP_DEADLINE_S
    while True:
        obs = observe_warmup(group_name=group.name, selector=group.selector(), source=backends.source,
                             target=backends.target, elapsed_s=time.time() - since)
        if obs.source_series > 0 and obs.target_series >= obs.source_series and obs.lag_s is not None:
            return obs
        assert time.monotonic() < deadline, f"target never caught up within {WARMUP_DEADLINE_S:.0f}s: {obs}"
        time.sleep(1.0)


# -- validate -------------------------------------------------------------------------------------


def test_validate_reports_both_backends_and_the_groups_series(local_stack: LocalStack, tmp_path: Path,
                                                              audit: AuditStore) -> None:
    migration = make_migration(local_stack, tmp_path, audit)
    evidence = migration.validate(now())
    assert evidence["stage"] == "planned"
    assert evidence["source_series"] == local_stack.config.nodes * 8 * 3  # 3 FB metrics per GPU
    assert (evidence["source"], evidence["target"]) == (local_stack.source_url, local_stack.target_url)
    assert evidence["selector"] == migration.group.selector()
    [ev] = audit.events(group=GROUP)
    assert (ev.kind, ev.stage_to) == ("validated", None)


def test_validate_names_an_unreachable_target_and_changes_nothing(
        local_stack: LocalStack, tmp_path: Path, audit: AuditStore, source_config_guard: bytes,
        free_ports: Callable[[int], list[int]]) -> None:
    dead = f"http://127.0.0.1:{free_ports(1)[0]}/workspaces/ws-local"  # free a moment ago: nothing listens
    migration = make_migration(local_stack, tmp_path, audit, target_url=dead)
    mtime = local_stack.source_config_path.stat().st_mtime_ns
    with pytest.raises(RuntimeError) as excinfo:
        migration.validate(now())
    assert str(excinfo.value) == f"target {dead} is unreachable or not ready"
    assert local_stack.source_config_path.read_bytes() == source_config_guard
    assert local_stack.source_config_path.stat().st_mtime_ns == mtime
    # The refusal itself is audited (validation_failed, with the reason); nothing else is written.
    assert [(e.kind, e.evidence_data["reason"]) for e in audit.events()] == [
        ("validation_failed", f"target {dead} is unreachable or not ready")]
    assert audit.stage_of("gpu-memory").value == "planned"
    assert not (tmp_path / "snapshots").exists()


# -- the dual-write round trip --------------------------------------------------------------------


def test_dual_write_warms_up_passes_parity_and_rolls_back_byte_for_byte(
        local_stack: LocalStack, tmp_path: Path, audit: AuditStore, source_config_guard: bytes,
        connections: None) -> None:
    migration = make_migration(local_stack, tmp_path, audit)
    group, backends = migration.group, migration.backends
    entry = remote_write_name(GROUP)
    assert entry not in remote_write_names(backends.source.config_text()), "a previous test left dual-write on"

    migration.validate(now())
    snap = migration.snapshot(now())
    snapshot_bytes = Path(snap["snapshot_path"]).read_bytes()
    assert snapshot_bytes == source_config_guard
    assert snap["sha256"] == sha256_bytes(source_config_guard)

    deployed = migration.deploy_dual_write(snap, now())
    live = remote_write_names(backends.source.config_text())
    assert entry in live and entry in deployed["live_remote_writes"]
    assert deployed["config_before_sha256"] == snap["sha256"] != deployed["config_after_sha256"]
    assert local_stack.source_config_path.read_bytes() != snapshot_bytes
    since = float(deployed["dual_write_since"])

    migration.start_warmup(now())
    obs = wait_for_target(group, backends, since)
    assert obs.target_series == obs.source_series == local_stack.config.nodes * 8 * 3

    # The deferrable trigger, run as the triggerer would (from connection ids), sees the same thing.
    trigger = WarmupTrigger(group_name=GROUP, selector=group.selector(), source_conn_id="promshift_source",
                            target_conn_id="promshift_target", started_at=since, min_duration_s=1.0,
                            timeout_s=30.0, max_lag_s=30.0, poll_interval_s=1.0)
    event = asyncio.run(first_event(trigger, timeout_s=35.0))
    assert event["status"] == "ready", event
    assert event["observation"]["target_series"] >= event["observation"]["source_series"] > 0
    migration.finish_warmup(event, now())

    # Parity needs a window older than skip_recent (4 s) and past the settle time (2 steps).
    ready_at = since + 2 * group.parity.step_s + group.parity.skip_recent_s + 3 * group.parity.step_s
    time.sleep(max(0.0, ready_at - time.time()))
    parity = migration.parity(dual_write_since=since, now=now())
    assert parity.verdict == Verdict.SUCCESSFUL, parity
    assert parity.points_compared > 0
    assert parity.series_compared > 0
    assert (parity.mismatches, parity.missing_series, parity.missing_points) == (0, 0, 0)
    assert len(parity.hosts_sampled) == group.parity.sample_hosts
    golden = {m.name: m for m in parity.measurements if m.layer == Layer.GOLDEN}
    assert set(golden) == {"golden[GPU Framebuffer Mem Used]"}  # the dashboard's one FB panel
    assert golden["golden[GPU Framebuffer Mem Used]"].verdict == Verdict.SUCCESSFUL
    assert 'instance=~"gpu-node-000[0-3]"' in golden["golden[GPU Framebuffer Mem Used]"].queries[0]

    rolled = migration.rollback(snap, reason="test: end of the round trip", now=now())
    assert rolled["performed"] is True
    assert rolled["method"] == "snapshot"
    assert rolled["restored_identical"] is True
    assert rolled["remote_write_still_live"] is False
    assert local_stack.source_config_path.read_bytes() == snapshot_bytes == source_config_guard
    assert entry not in remote_write_names(backends.source.config_text())
    assert migration.routing.read_from(GROUP) == "source"

    events = audit.events(group=GROUP)
    assert [(e.stage_from, e.stage_to) for e in events if e.stage_to] == [
        ("planned", "dual_writing"), ("dual_writing", "warming"), ("warming", "rolled_back")]
    assert [e.kind for e in events] == ["validated", "snapshot_taken", "dual_write_deployed", "warmup_started",
                                        "warmup_ready", "rolled_back"]
    assert audit.stage_of(GROUP) == Stage.ROLLED_BACK
    assert audit.verify().ok


# Regression: rollback once compared entry names as substrings of the whole config text.
def test_rollback_is_identical_while_a_prefix_named_group_keeps_dual_writing(
        local_stack: LocalStack, tmp_path: Path, audit: AuditStore, source_config_guard: bytes) -> None:
    # An earlier wave's group, cut over and still dual-writing (a keep-filter matching nothing scraped).
    other_group = dataclasses.replace(small_group(), name=f"{GROUP}-ecc", metrics=("promshift_test_unscraped",),
                                      metric_regex=None)
    other = compose_migration(other_group, backends_for(local_stack), audit=audit,
                           routing=RoutingStore(audit.url), snapshots_dir=tmp_path / "snapshots",
                           run_id="manual__earlier-wave")
    other.deploy_dual_write(other.snapshot(now()), now())

    migration = make_migration(local_stack, tmp_path, audit)
    snap = migration.snapshot(now())
    migration.deploy_dual_write(snap, now())
    rolled = migration.rollback(snap, reason="test: prefix-named neighbour", now=now())
    live = remote_write_names(migration.backends.source.config_text())
    assert remote_write_name(GROUP) not in live and remote_write_name(other_group.name) in live
    assert Path(snap["config_path"]).read_text() == Path(snap["snapshot_path"]).read_text()
    assert rolled["remote_write_still_live"] is False
    assert rolled["restored_identical"] is True


def test_warmup_trigger_times_out_on_a_selector_matching_nothing(local_stack: LocalStack, connections: None) -> None:
    trigger = WarmupTrigger(group_name="no-such-group", selector='{__name__="promshift_no_such_metric"}',
                            source_conn_id="promshift_source", target_conn_id="promshift_target",
                            started_at=time.time(), min_duration_s=1.0, timeout_s=3.0, max_lag_s=30.0,
                            poll_interval_s=1.0)
    started = time.monotonic()
    event = asyncio.run(first_event(trigger, timeout_s=15.0))
    assert event["status"] == "timeout", event
    assert "not ready after 3s" in event["reason"]
    assert "the source has no series of this group" in event["reason"]
    assert event["observation"]["source_series"] == 0
    assert time.monotonic() - started < 10


# -- retried steps (issue 12): a crash around the audit append, then Airflow's retry ----------------


class Crash(RuntimeError):
    """The task died at this point."""


def crash_once(monkeypatch: pytest.MonkeyPatch, audit: AuditStore, kind: str, *, after_append: bool) -> None:
    """The next append of ``kind`` fails once: before it is written, or right after it is committed."""
    real, crashed = audit.append, []

    def append(**kw: Any) -> Any:
        if kw["kind"] == kind and not crashed:
            crashed.append(kind)
            if after_append:
                real(**kw)
            raise Crash(kind)
        return real(**kw)

    monkeypatch.setattr(audit, "append", append)


def entries_in_file(stack: LocalStack) -> list[str]:
    return [n for n in remote_write_names(stack.source_config_path.read_bytes()) if n == remote_write_name(GROUP)]


@pytest.mark.parametrize("after_append", [False, True], ids=["crash-before-event", "crash-after-event"])
def test_retried_dual_write_and_rollback_end_as_a_run_without_a_crash(
        local_stack: LocalStack, tmp_path: Path, audit: AuditStore, source_config_guard: bytes,
        monkeypatch: pytest.MonkeyPatch, after_append: bool) -> None:
    migration = make_migration(local_stack, tmp_path, audit)
    entry = remote_write_name(GROUP)
    snap = migration.snapshot(now())

    deployed_bytes = add_remote_write(source_config_guard, remote_write_entry(
        group_name=GROUP, name_regex=migration.group.name_regex(), url=migration.backends.target_remote_write_url))
    crash_once(monkeypatch, audit, "dual_write_deployed", after_append=after_append)
    with pytest.raises(Crash):
        migration.deploy_dual_write(snap, now())
    if after_append:
        assert local_stack.source_config_path.read_bytes() == deployed_bytes  # the side effect happened, recorded
        assert entries_in_file(local_stack) == [entry]
    else:
        # The append failed (an error, not a kill: see test_faults for SIGKILL): nothing stays deployed
        # without its audit event, so the snapshot went back before the error was raised.
        assert local_stack.source_config_path.read_bytes() == source_config_guard
        assert entry not in remote_write_names(migration.backends.source.config_text())

    deployed = migration.deploy_dual_write(snap, now())  # the retry
    assert local_stack.source_config_path.read_bytes() == deployed_bytes  # edited once
    assert entries_in_file(local_stack) == [entry]
    assert entry in remote_write_names(migration.backends.source.config_text())
    assert deployed["config_before_sha256"] == snap["sha256"]
    assert deployed["config_after_sha256"] == sha256_bytes(deployed_bytes)
    assert "resumed" not in deployed  # a recorded deploy is returned as recorded; an undone one deploys afresh
    again = migration.deploy_dual_write(snap, now())  # a retry after the event was recorded adds nothing
    assert again["dual_write_since"] == deployed["dual_write_since"]
    assert [e.kind for e in audit.events(group=GROUP)] == ["snapshot_taken", "dual_write_deployed"]
    assert audit.stage_of(GROUP) == Stage.DUAL_WRITING

    crash_once(monkeypatch, audit, "rolled_back", after_append=after_append)
    with pytest.raises(Crash):
        migration.rollback(snap, reason="test: retried rollback", now=now())
    rolled = migration.rollback(snap, reason="test: retried rollback", now=now())
    assert rolled["restored_identical"] is True
    assert rolled.get("already_rolled_back", False) is after_append
    if after_append:
        assert rolled["found"] == {"config_sha256": snap["sha256"], "identical_to_snapshot": True,
                                   "remote_write_live": False, "read_from": "source"}
    n = len(audit.events())
    assert migration.rollback(snap, reason="test: retried rollback", now=now())["already_rolled_back"] is True
    assert len(audit.events()) == n
    assert local_stack.source_config_path.read_bytes() == source_config_guard
    assert entry not in remote_write_names(migration.backends.source.config_text())
    assert [(e.kind, e.stage_from, e.stage_to) for e in audit.events(group=GROUP)] == [
        ("snapshot_taken", None, None), ("dual_write_deployed", "planned", "dual_writing"),
        ("rolled_back", "dual_writing", "rolled_back")]
    assert audit.verify().ok


def test_a_deploy_killed_before_its_reload_is_reloaded_and_recorded_on_retry(
        local_stack: LocalStack, tmp_path: Path, audit: AuditStore, source_config_guard: bytes) -> None:
    migration = make_migration(local_stack, tmp_path, audit)
    entry = remote_write_name(GROUP)
    snap = migration.snapshot(now())
    # What a killed attempt leaves: the new bytes written, Prometheus not reloaded, no event.
    wanted = add_remote_write(source_config_guard, remote_write_entry(
        group_name=GROUP, name_regex=migration.group.name_regex(),
        url=migration.backends.target_remote_write_url))
    local_stack.source_config_path.write_bytes(wanted)
    assert entry not in remote_write_names(migration.backends.source.config_text())

    deployed = migration.deploy_dual_write(snap, now())
    assert entry in remote_write_names(migration.backends.source.config_text())
    assert local_stack.source_config_path.read_bytes() == wanted
    assert entries_in_file(local_stack) == [entry]
    assert "resumed" in deployed
    assert [e.kind for e in audit.events(group=GROUP) if e.stage_to] == ["dual_write_deployed"]
    migration.rollback(snap, reason="test: end", now=now())
    assert local_stack.source_config_path.read_bytes() == source_config_guard


def test_another_runs_entry_in_the_config_is_not_taken_for_ours(
        local_stack: LocalStack, tmp_path: Path, audit: AuditStore, source_config_guard: bytes) -> None:
    migration = make_migration(local_stack, tmp_path, audit)
    snap = migration.snapshot(now())
    # Someone else's edit since the snapshot (not this deploy's bytes): still refused, nothing recorded.
    local_stack.source_config_path.write_bytes(source_config_guard + b"# edited by hand\n")
    with pytest.raises(DeployError, match="changed since the snapshot"):
        migration.deploy_dual_write(snap, now())
    # The refusal is audited (deploy_failed, the reason), with no stage change.
    assert [e.kind for e in audit.events(group=GROUP)] == ["snapshot_taken", "deploy_failed"]
    failed = audit.events(group=GROUP)[-1].evidence_data
    assert "changed since the snapshot" in failed["reason"]
    assert failed["config_sha256"] == sha256_bytes(source_config_guard + b"# edited by hand\n") != failed[
        "snapshot_sha256"]
    assert audit.stage_of(GROUP) == Stage.PLANNED
