"""ScraperStatusTrigger: serialises its arguments, polls DescribeScraper (a Stubber-checked ``amp`` client) until
the deploy is final, and carries the whole status history and AWS's reason in its event."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
from botocore.stub import Stubber

from promshift.core.deploy import DeployResult, DeployState
from promshift.orchestration.triggers import ScraperStatusTrigger

SCRAPER = "s-0123456789"
ARN = "arn:aws:aps:us-east-1:123456789012:workspace/ws-1"


def described(status: str, reason: str | None = None) -> dict[str, Any]:
    scraper: dict[str, Any] = {
        "scraperId": SCRAPER, "arn": f"arn:aws:aps:us-east-1:123456789012:scraper/{SCRAPER}",
        "roleArn": "arn:aws:iam::123456789012:role/scraper", "status": {"statusCode": status},
        "createdAt": datetime(2026, 12, 3, tzinfo=UTC), "lastModifiedAt": datetime(2026, 12, 3, tzinfo=UTC),
        "scrapeConfiguration": {"configurationBlob": b"global: {}\n"},
        "source": {"eksConfiguration": {"clusterArn": "arn:aws:eks:us-east-1:123456789012:cluster/c",
                                        "subnetIds": ["subnet-1"]}},
        "destination": {"ampConfiguration": {"workspaceArn": ARN}}}
    if reason:
        scraper["statusReason"] = reason
    return {"scraper": scraper}


def started(expect: str = "ACTIVE", *, age_s: float = 0, timeout_s: float = 900) -> dict[str, Any]:
    at = datetime.now(UTC) - timedelta(seconds=age_s)
    result = DeployResult("scraper", "deploy", DeployState.WAITING, details={
        "scraper_id": SCRAPER, "expect": expect, "started_at": at.timestamp(), "timeout_s": timeout_s})
    return result.observed("UPDATING", at, state=DeployState.WAITING).to_dict()


class StubbedTrigger(ScraperStatusTrigger):
    statuses: list[tuple[str, str | None]] = []

    def amp_client(self) -> Any:
        client = boto3.client("amp", region_name="us-east-1", aws_access_key_id="AKIATEST",
                              aws_secret_access_key="test")
        stub = Stubber(client)
        for status, reason in self.statuses:
            stub.add_response("describe_scraper", described(status, reason), {"scraperId": SCRAPER})
        stub.activate()
        return client


async def first_event(trigger: ScraperStatusTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("no event")


def test_serialize_mirrors_init() -> None:
    trigger = ScraperStatusTrigger(target_conn_id="promshift_target", result=started(), poll_interval_s=2)
    path, kwargs = trigger.serialize()
    assert path == "promshift.orchestration.triggers.ScraperStatusTrigger"
    assert ScraperStatusTrigger(**kwargs).serialize() == (path, kwargs)


def test_update_failed_ends_the_wait_with_aws_reason_and_history() -> None:
    StubbedTrigger.statuses = [("UPDATING", None), ("UPDATE_FAILED", "relabel regex does not compile")]
    event = asyncio.run(first_event(StubbedTrigger(target_conn_id="t", result=started(), poll_interval_s=0.01)))
    assert event["status"] == "failed"
    assert event["reason"] == "scraper is UPDATE_FAILED: relabel regex does not compile"
    assert [c["status"] for c in event["result"]["status_history"]] == ["UPDATING", "UPDATE_FAILED"]


def test_active_is_done_and_an_old_pending_deploy_times_out() -> None:
    StubbedTrigger.statuses = [("ACTIVE", None)]
    event = asyncio.run(first_event(StubbedTrigger(target_conn_id="t", result=started(), poll_interval_s=0.01)))
    assert event["status"] == "done" and event["result"]["state"] == "done"
    StubbedTrigger.statuses = [("UPDATING", None)]
    old = started(age_s=120, timeout_s=60)
    event = asyncio.run(first_event(StubbedTrigger(target_conn_id="t", result=old, poll_interval_s=0.01)))
    assert event["status"] == "timeout" and "still UPDATING after 120s" in event["reason"]


def test_three_failed_polls_in_a_row_end_with_error() -> None:
    StubbedTrigger.statuses = []  # the Stubber answers nothing: every poll raises
    event = asyncio.run(first_event(StubbedTrigger(target_conn_id="t", result=started(), poll_interval_s=0.01)))
    assert event["status"] == "error" and "DescribeScraper" in event["reason"]
    assert event["result"]["state"] == "waiting"
