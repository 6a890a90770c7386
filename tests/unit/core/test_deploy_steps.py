"""The deploy steps over the seam, against the in-memory fakes and the on-disk snapshot store: the quota
pre-flight comes first and a refusal deploys nothing; the evidence has the report's shape."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from promshift.adapters.snapshot_store import FileSnapshotStore
from promshift.core.deploy import DeployError, DeployResult, DeployState, InMemoryConfigDeployer, InMemorySnapshotStore
from promshift.core.quota import QuotaExceeded, assess_quota
from promshift.steps.deploy import deploy_evidence, restore, start_deploy, take_snapshot

T0 = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)


def refusing_quota() -> dict[str, object]:
    raise QuotaExceeded(assess_quota(group_series=300, workspace_series=600, series_limit=1000,
                                     scrape_interval_s=30))


def passing_quota() -> dict[str, object]:
    return assess_quota(group_series=64, workspace_series=100, series_limit=1000, scrape_interval_s=30).to_dict()


def test_a_quota_refusal_deploys_nothing() -> None:
    deployer, store = InMemoryConfigDeployer(None, "blob", kind="scraper"), InMemorySnapshotStore()
    info = take_snapshot(deployer, store, group="gpu-memory", run_id="r1")
    with pytest.raises(QuotaExceeded, match="active series would reach 90.0%"):
        start_deploy(deployer, store, info, now=T0, quota=refusing_quota)
    assert deployer.calls == ["snapshot"] and deployer.live is None


def test_deploy_then_follow_then_evidence_in_the_report_shape(tmp_path: Path) -> None:
    deployer = InMemoryConfigDeployer(None, "blob", kind="scraper", statuses=(
        ("CREATING", DeployState.WAITING), ("ACTIVE", DeployState.DONE)))
    store = FileSnapshotStore(tmp_path)
    info = take_snapshot(deployer, store, group="gpu-memory", run_id="manual__2026-12-03T08:00")
    assert json.loads(json.dumps(info)) == info and info["existed"] is False
    started = start_deploy(deployer, store, info, now=T0, quota=passing_quota)
    assert started["deploy"]["state"] == "waiting"
    done = deployer.verify(DeployResult.from_dict(started["deploy"]), T0 + timedelta(seconds=5))
    evidence = deploy_evidence(done, started["quota"])
    assert evidence == {"kind": "scraper", "state": "done", "reason": "scraper is ACTIVE", "status_history": [
        {"status": "CREATING", "at": T0.isoformat()},
        {"status": "ACTIVE", "at": (T0 + timedelta(seconds=5)).isoformat()}],
        "quota": {"group_series": 64, "workspace_series": 100, "pending_series": 0, "pending_groups": [],
                  "limit": 1000.0, "share": 0.164}}
    back = restore(deployer, store, info, now=T0)
    assert back.state is DeployState.DONE and deployer.live is None


def test_an_edited_snapshot_on_disk_is_refused(tmp_path: Path) -> None:
    deployer = InMemoryConfigDeployer("old", "new")
    store = FileSnapshotStore(tmp_path)
    info = take_snapshot(deployer, store, group="g", run_id="r")
    path = Path(info["snapshot_ref"])
    path.write_text(path.read_text().replace('"old"', '"tampered"'))
    with pytest.raises(DeployError, match="does not match its recorded sha256"):
        start_deploy(deployer, store, info, now=T0)
    assert deployer.live == "old"
