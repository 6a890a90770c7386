"""The bake watch moves what the horizon held back once it is ready; decommission waits for the longest read."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.deploy_kinds import deploy_of
from promshift.core.events import EventKind
from promshift.core.horizon import Horizon
from promshift.core.stages import Stage
from promshift.orchestration.compose import compose_migration
from promshift.steps.lifecycle import Decommission, GroupLifecycle
from promshift.steps.migration import Backends, GroupMigration

GROUP = "gpu-memory"
T0 = datetime(2026, 12, 1, tzinfo=UTC)
DAY = (T0 + timedelta(hours=24)).isoformat()


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.engine.dispose()


def migration(tmp_path: Path, audit: AuditStore) -> GroupMigration:
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP)
    refused = PrometheusClient("http://127.0.0.1:9", timeout_s=2)
    return compose_migration(group, Backends(refused, refused, str(tmp_path / "prometheus.yml"), ""), audit=audit,
                          routing=RoutingStore(audit.url), snapshots_dir=tmp_path, run_id="scheduled__bake")


def history(audit: AuditStore) -> None:
    audit.append(group=GROUP, run_id="manual__m", kind=EventKind.DUAL_WRITE_DEPLOYED, actor="t", at=T0,
                 evidence={}, stage_to=Stage.DUAL_WRITING)
    audit.append(group=GROUP, run_id="manual__m", kind=EventKind.HORIZON_WAITING, actor="t",
                 at=T0 + timedelta(minutes=10), evidence={"what": "read_path", "waiting": [
                     {"path": "panels[2]", "title": "day", "horizon": {"reach_s": 86400.0, "ready_at": DAY}}]})


def test_the_bake_watch_hands_each_mover_the_group_horizon_only_while_something_waits(
        tmp_path: Path, audit: AuditStore) -> None:
    calls: list[tuple[Horizon, datetime]] = []

    def mover(m: Any, horizon: Horizon, now: datetime) -> dict[str, Any]:
        calls.append((horizon, now))
        return {"switched": []}

    life = GroupLifecycle(migration(tmp_path, audit), horizon_moves=[mover])
    assert life.move_when_ready(T0 + timedelta(hours=1)) == []  # nothing waits: no mover called
    history(audit)
    now = T0 + timedelta(hours=25)
    assert life.move_when_ready(now) == [{"switched": []}]
    assert calls[0][0].dual_write_since == T0 and calls[0][0].now == now and calls[0][1] == now


def test_the_lab_clock_advance_reaches_the_bake_watch_movers_and_their_records(tmp_path: Path,
                                                                              audit: AuditStore) -> None:
    seen: list[Horizon] = []
    life = GroupLifecycle(migration(tmp_path, audit), horizon_moves=[lambda m, h, now: seen.append(h)],
                          horizon_clock_ahead_s=86400.0)
    history(audit)
    now = T0 + timedelta(minutes=12)
    life.move_when_ready(now)
    (horizon,) = seen
    assert horizon.now == now and horizon.lab_clock_ahead_s == 86400.0
    assert horizon.split([]).ready == () and horizon.to_dict()["counted_now"] == (now + timedelta(days=1)).isoformat()
    # without the setting the movers count by the wall clock (the default everywhere but the lab's demo)
    GroupLifecycle(migration(tmp_path, audit), horizon_moves=[lambda m, h, now: seen.append(h)]).move_when_ready(now)
    assert seen[-1].lab_clock_ahead_s == 0.0 and "lab_clock_ahead_s" not in seen[-1].to_dict()


def test_decommission_waits_for_the_longest_read_or_its_own_acceptance(tmp_path: Path, audit: AuditStore) -> None:
    m = migration(tmp_path, audit)
    history(audit)
    for kind, to in ((EventKind.WARMUP_STARTED, Stage.WARMING), (EventKind.GATE_PASSED, Stage.VERIFIED),
                     (EventKind.APPROVED, Stage.APPROVED), (EventKind.CUT_OVER, Stage.CUT_OVER),
                     (EventKind.BAKE_STARTED, Stage.BAKING), (EventKind.BAKED, Stage.BAKED)):
        audit.append(group=GROUP, run_id="x", kind=kind, actor="t", at=T0 + timedelta(hours=1), evidence={},
                     stage_from=audit.stage_of(GROUP), stage_to=to)
    refusal = Decommission(m, deploy=deploy_of("scraper")).refusal()
    assert refusal is not None and "ready at " + DAY in refusal and "'day'" in refusal
    # the prepare task asks only what no approver can accept: the loss goes to the approver's form instead
    assert Decommission(m, deploy=deploy_of("scraper")).refusal(history=False) is None
    assert Decommission(m, deploy=deploy_of("remote_write")).refusal(history=False) is not None
    accepting = Decommission(m, deploy=deploy_of("scraper"), accept_history_loss=True)
    assert accepting.refusal() is None
    loss = accepting.history_loss(T0 + timedelta(hours=2))
    assert loss["short_by_s"] == 22 * 3600 and loss["accepted"] is True and loss["waiting"][0]["name"] == "day"
