"""The quota pre-flight sums per target workspace: what other groups reserved there (``quota_reserved``) counts,
whichever cluster they come from; other workspaces, old reservations and released ones do not."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from promshift.adapters.amp_quota import QuotaPreflight
from promshift.adapters.audit_store import AuditStore
from promshift.core.events import EventKind
from promshift.core.quota import (
    RESERVATION_WINDOW_S,
    PendingSeries,
    QuotaExceeded,
    assess_quota,
    pending_on_workspace,
)
from tests.unit.adapters.test_amp_quota import WS, WS_ARN, publish, stubbed_quotas

NOW = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
WS_B = "ws-bbbbbbbb-2222-3333-4444-555555555555"


@pytest.fixture
def audit(tmp_path: Path) -> AuditStore:
    return AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")


def reserve(audit: AuditStore, group: str, workspace: str, series: int, at: datetime, *, source: str = "a") -> None:
    audit.append(group=group, run_id=f"run-{group}", kind=EventKind.QUOTA_RESERVED, actor="promshift", at=at,
                 evidence={"workspace_id": workspace, "group_series": series,
                           "connections": {"source": source, "target": f"amp_{workspace}"}},
                 stage_from=None, stage_to=None)


def test_reservations_on_the_same_workspace_add_up_across_clusters(audit: AuditStore) -> None:
    reserve(audit, "util-a", WS, 1000, NOW - timedelta(minutes=5), source="cluster_a")
    reserve(audit, "memory-b", WS, 300, NOW - timedelta(minutes=1), source="cluster_b")
    reserve(audit, "thermal-b", WS_B, 5000, NOW - timedelta(minutes=1), source="cluster_b")  # another workspace
    reserve(audit, "clocks", WS, 7000, NOW - timedelta(seconds=RESERVATION_WINDOW_S + 1))  # too old
    reserve(audit, "memory-b", WS, 400, NOW - timedelta(seconds=30))  # a retry: its latest reservation counts
    pending = pending_on_workspace(audit.events(), workspace=WS, group="new-group", now=NOW)
    assert pending == PendingSeries(1400, ("memory-b", "util-a"))
    # The group's own earlier reservation is not pending for itself.
    assert pending_on_workspace(audit.events(), workspace=WS, group="util-a", now=NOW) == PendingSeries(400,
                                                                                                      ("memory-b",))
    assert pending_on_workspace(audit.events(), workspace=WS_B, group="x", now=NOW) == PendingSeries(5000,
                                                                                                   ("thermal-b",))


def test_a_failed_or_rolled_back_deploy_releases_its_reservation(audit: AuditStore) -> None:
    reserve(audit, "util-a", WS, 1000, NOW - timedelta(minutes=5))
    reserve(audit, "memory-b", WS, 300, NOW - timedelta(minutes=4))
    audit.append(group="util-a", run_id="run-util-a", kind=EventKind.DEPLOY_FAILED, actor="promshift",
                 at=NOW - timedelta(minutes=3), evidence={"reason": "scraper CREATION_FAILED"},
                 stage_from=None, stage_to=None)
    assert pending_on_workspace(audit.events(), workspace=WS, group="g", now=NOW) == PendingSeries(300,
                                                                                                 ("memory-b",))
    # A new reservation after the failure counts again.
    reserve(audit, "util-a", WS, 900, NOW - timedelta(minutes=1))
    assert pending_on_workspace(audit.events(), workspace=WS, group="g", now=NOW).series == 1200


def test_each_group_fits_alone_but_not_together_on_one_workspace() -> None:
    alone = assess_quota(group_series=300_000, workspace_series=400_000, series_limit=1_000_000,
                         scrape_interval_s=30)
    assert alone.ok
    together = assess_quota(group_series=300_000, workspace_series=400_000, series_limit=1_000_000,
                            scrape_interval_s=30, pending=PendingSeries(150_000, ("memory-b",)))
    assert not together.ok
    assert together.reason == (
        "quota pre-flight refused: active series would reach 85.0% of the workspace quota (400,000 now + 150,000 "
        "reserved by memory-b on this workspace + 300,000 for the group > 80% of 1,000,000); raise the quota or "
        "move a smaller group")
    data = together.to_dict()
    assert data["pending_series"] == 150_000 and data["pending_groups"] == ["memory-b"]
    passed = assess_quota(group_series=100_000, workspace_series=400_000, series_limit=1_000_000,
                          scrape_interval_s=30, pending=PendingSeries(150_000, ("memory-b",)))
    assert passed.ok and passed.reason.endswith("counting memory-b reserved on this workspace)")
    with pytest.raises(ValueError, match="pending series cannot be negative"):
        assess_quota(group_series=1, workspace_series=0, series_limit=10, scrape_interval_s=30,
                     pending=PendingSeries(-1))


def test_pending_series_count_in_the_ingestion_rate_too() -> None:
    result = assess_quota(group_series=30_000, workspace_series=0, series_limit=10_000_000, scrape_interval_s=30,
                          workspace_ingestion_rate=50_000, ingestion_limit=70_000,
                          pending=PendingSeries(300_000, ("util-a",)))
    # 50,000 + 10,000 pending + 1,000 for the group = 61,000 samples/s: 87 % of 70,000.
    assert not result.ok and "ingestion rate (samples/s) would reach 87.1%" in result.reason


@pytest.fixture
def cloudwatch() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("cloudwatch", region_name="us-east-1")


def test_the_adapter_adds_what_is_pending_and_names_the_workspace(cloudwatch: Any) -> None:
    from tests.unit.adapters.test_amp_quota import NOW as PUBLISHED

    publish(cloudwatch, "ActiveSeries", 500_000)
    quotas, _ = stubbed_quotas(1_000_000, 70_000)
    evidence = QuotaPreflight(quotas, cloudwatch, WS, WS_ARN).require(
        group_series=100_000, scrape_interval_s=30, now=PUBLISHED, pending=PendingSeries(100_000, ("util-a",)))
    assert evidence["workspace_id"] == WS and evidence["pending_series"] == 100_000
    assert evidence["share"] == pytest.approx(0.7)
    quotas, _ = stubbed_quotas(1_000_000, 70_000)
    with pytest.raises(QuotaExceeded, match="reserved by util-a on this workspace"):
        QuotaPreflight(quotas, cloudwatch, WS, WS_ARN).require(
            group_series=100_000, scrape_interval_s=30, now=PUBLISHED, pending=PendingSeries(250_000, ("util-a",)))
