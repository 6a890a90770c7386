"""Decommission against the real local stack: the drop is checked by promtool, reloaded and verified live.

The local target has no writer of its own (the source's remote_write feeds it), which is exactly the
case the decommission must never leave in place: the drop goes live, the source stops returning the
group's series, the target receives nothing new, and the drop is undone byte for byte.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.routing import RoutingStore
from promshift.core.deploy_kinds import deploy_of
from promshift.core.scrape_drop import drop_is_loaded, drop_rule
from promshift.core.stages import Stage
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.orchestration.compose import compose_migration
from promshift.steps.lifecycle import Decommission, DecommissionFailed
from tests.integration.test_migration_steps import backends_for, small_group

pytestmark = pytest.mark.integration

GROUP = "gpu-memory"
BAKED = [Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER, Stage.BAKING, Stage.BAKED]


@pytest.fixture(scope="module")
def local_stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    """This module's own running stack, not the session's shared one: a module that dual-wrote gpu-memory there
    leaves the group's recent samples on the target (no staleness markers), which the decommission would read as
    the target still receiving; the order of modules on an xdist worker is not alphabetical."""
    stack = LocalStack(stack_config_factory())
    try:
        stack.up(timeout=90)
        yield stack
    finally:
        stack.down()


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.engine.dispose()


def test_a_decommission_the_target_does_not_survive_is_undone_byte_for_byte(
        local_stack: LocalStack, audit: AuditStore, tmp_path: Path) -> None:
    original = local_stack.source_config_path.read_bytes()
    current = Stage.PLANNED
    for stage in BAKED:
        audit.append(group=GROUP, run_id="manual__earlier", kind=f"seed_{stage.value}", actor="test",
                     at=datetime.now(UTC), evidence={}, stage_from=current, stage_to=stage)
        current = stage
    group = small_group()
    migration = compose_migration(group, backends_for(local_stack), audit=audit, routing=RoutingStore(audit.url),
                               snapshots_dir=tmp_path / "snapshots", run_id="manual__decommission")
    # Claimed independent writer (deploy 'scraper'), but nothing else writes the local target.
    decommission = Decommission(migration, deploy=deploy_of("scraper"), verify_s=20, poll_s=1)
    started = time.monotonic()
    try:
        with pytest.raises(DecommissionFailed, match="target still receiving: False"):
            decommission.decommission(datetime.now(UTC), approval={"by": "oncall-bob"})
    finally:
        if local_stack.source_config_path.read_bytes() != original:  # never leave the shared stack edited
            local_stack.source_config_path.write_bytes(original)
            migration.backends.source.reload()
    print(f"decommission attempt and undo took {time.monotonic() - started:.1f}s")
    assert local_stack.source_config_path.read_bytes() == original
    loaded = migration.backends.source.config_text()
    rule = drop_rule(group.name_regex())
    [ev] = [e for e in audit.events(group=GROUP) if e.kind == "decommission_failed"]
    data = ev.evidence_data
    assert data["loaded"] is True  # the drop was live (promtool-checked, reloaded, seen in status/config)
    assert data["source_stopped"] is True  # and the source stopped returning the group's series
    assert data["target_still_receiving"] is False
    assert data["undone"] == {"restored_identical": True}
    assert not any(drop_is_loaded(loaded, job, rule) for job in data["jobs"])
    freed = data["freed"]
    assert freed["series"] > 0 and freed["samples_per_s"] > 0 and sum(freed["series_by_job"].values()) == freed[
        "series"]
    assert audit.stage_of(GROUP) == Stage.BAKED
    # The source scrapes the group again (every target at its next scrape).
    deadline = time.monotonic() + 30
    while (migration.backends.source.scalar(f"count({group.selector()})") != freed["series"]
           and time.monotonic() < deadline):
        time.sleep(1)
    assert migration.backends.source.scalar(f"count({group.selector()})") == freed["series"]


def test_the_newest_sample_of_a_group_of_several_metrics_is_one_answer(local_stack: LocalStack) -> None:
    """gpu-memory's metrics share every label but the name: timestamp() alone makes duplicate label sets (422),
    which once made every bake check of the group ERROR and its decommission never see the target receiving."""
    from promshift.adapters.prometheus import PrometheusError
    from promshift.core.promql import newest_sample_expr

    source = backends_for(local_stack).source
    selector = small_group().selector()
    assert "|" in selector  # several metrics
    with pytest.raises(PrometheusError, match="same labelset"):
        source.scalar(f"max(timestamp({selector}))")
    newest = source.scalar(newest_sample_expr(selector))
    assert newest is not None and time.time() - 60 < newest <= time.time() + 1
