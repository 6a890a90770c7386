"""Decommission refusals: decided before any backend is asked, recorded, nothing changed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.core.stages import Stage
from promshift.lifecycle import Decommission, DecommissionRefused
from promshift.migration import Backends, GroupMigration
from promshift.settings import REPO_ROOT, load_catalog

GROUP = "gpu-memory"
UP_TO_BAKING = [Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER, Stage.BAKING]


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.engine.dispose()


def decommission(tmp_path: Path, audit: AuditStore, history: list[Stage], deploy_kind: str) -> Decommission:
    current = Stage.PLANNED
    for stage in history:
        audit.append(group=GROUP, run_id="manual__m", kind=f"seed_{stage.value}", actor="test",
                     at=datetime.now(UTC), evidence={}, stage_from=current, stage_to=stage)
        current = stage
    config = tmp_path / "prometheus.yml"
    config.write_text("scrape_configs:\n  - job_name: fleet\n")
    unused = PrometheusClient("http://127.0.0.1:9")  # nothing listens: a refusal must not need it
    m = GroupMigration(load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP),
                       Backends(unused, unused, str(config), ""), audit=audit, routing=RoutingStore(audit.url),
                       snapshots_dir=tmp_path / "snapshots", run_id="manual__decommission")
    return Decommission(m, deploy_kind=deploy_kind)


@pytest.mark.parametrize(("history", "kind", "message"), [
    (UP_TO_BAKING, "scraper", "is baking; a decommission starts only from baked, recommissioned"),
    ([*UP_TO_BAKING, Stage.BAKED], "remote_write", "the source is the target's only writer"),
    ([*UP_TO_BAKING, Stage.ROLLED_BACK_READS], "scraper", "is rolled_back_reads"),
])
def test_a_refused_decommission_changes_nothing_and_is_recorded(
        tmp_path: Path, audit: AuditStore, history: list[Stage], kind: str, message: str) -> None:
    d = decommission(tmp_path, audit, history, kind)
    before = (tmp_path / "prometheus.yml").read_bytes()
    with pytest.raises(DecommissionRefused, match=message):
        d.decommission(datetime.now(UTC), approval={"by": "oncall-bob", "decision": "Approve"})
    ev = audit.events(group=GROUP)[-1]
    assert (ev.kind, ev.stage_to) == ("decommission_refused", None)
    assert message in ev.evidence_data["reason"] and ev.evidence_data["approval"]["by"] == "oncall-bob"
    assert (tmp_path / "prometheus.yml").read_bytes() == before
    assert audit.stage_of(GROUP) == history[-1]
    assert not (tmp_path / "snapshots").exists()


def test_recommission_needs_a_decommissioned_group(tmp_path: Path, audit: AuditStore) -> None:
    d = decommission(tmp_path, audit, [*UP_TO_BAKING, Stage.BAKED], "scraper")
    with pytest.raises(DecommissionRefused, match="is baked, not decommissioned"):
        d.recommission(datetime.now(UTC), reason="test")
