"""ScraperDeployer on a retried task (issue 12): what an attempt killed after its AWS call left is followed, not
refused; what someone else did is still refused. A fake ``amp`` client records the writes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from promshift.adapters.amp_scraper import ScraperDeployer, ScraperSource
from promshift.core.deploy import DeployError, DeployState
from promshift.core.scraper_config import render_scraper_config, scraper_alias

GROUP = "gpu-utilization"
WORKSPACE = "arn:aws:aps:us-east-1:123456789012:workspace/ws-1"
OLD = render_scraper_config(name_regex="DCGM_FI_DEV_GPU_TEMP", scrape_interval_s=30.0)
NOW = datetime(2026, 12, 3, tzinfo=UTC)


class FakeAmp:
    def __init__(self) -> None:
        self.scrapers: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []

    def add(self, blob: str, status: str = "ACTIVE", workspace: str = WORKSPACE) -> str:
        scraper_id = f"s-{len(self.scrapers) + 1}"
        self.scrapers[scraper_id] = {
            "scraperId": scraper_id, "alias": scraper_alias(GROUP), "arn": f"arn:scraper/{scraper_id}",
            "status": {"statusCode": status}, "scrapeConfiguration": {"configurationBlob": blob.encode()},
            "destination": {"ampConfiguration": {"workspaceArn": workspace}}}
        return scraper_id

    def get_paginator(self, name: str) -> Any:
        assert name == "list_scrapers"
        fake = self

        class Pages:
            def paginate(self, **kw: Any) -> list[dict[str, Any]]:
                return [{"scrapers": [dict(s) for s in fake.scrapers.values()]}]

        return Pages()

    def describe_scraper(self, scraperId: str) -> dict[str, Any]:  # noqa: N803 (boto3's spelling)
        return {"scraper": dict(self.scrapers[scraperId])}

    def create_scraper(self, **kw: Any) -> dict[str, Any]:
        self.writes.append("create")
        return {"scraperId": self.add(kw["scrapeConfiguration"]["configurationBlob"].decode(), "CREATING"),
                "status": {"statusCode": "CREATING"}}

    def update_scraper(self, scraperId: str, **kw: Any) -> dict[str, Any]:  # noqa: N803
        self.writes.append("update")
        return {"scraperId": scraperId, "status": {"statusCode": "UPDATING"}}

    def delete_scraper(self, scraperId: str) -> dict[str, Any]:  # noqa: N803
        self.writes.append("delete")
        self.scrapers[scraperId]["status"] = {"statusCode": "DELETING"}
        return {"scraperId": scraperId, "status": {"statusCode": "DELETING"}}


def deployer(client: FakeAmp) -> ScraperDeployer:
    blob = render_scraper_config(name_regex="DCGM_FI_DEV_GPU_UTIL", scrape_interval_s=30.0)
    return ScraperDeployer(client, group_name=GROUP, blob=blob, workspace_arn=WORKSPACE,
                           source=ScraperSource("arn:aws:eks:us-east-1:123456789012:cluster/c", ("subnet-1",)))


def test_a_deploy_retried_after_its_create_follows_that_scraper() -> None:
    client = FakeAmp()
    d = deployer(client)
    snap = d.snapshot()
    first = d.deploy(snap, NOW)
    assert client.writes == ["create"] and not first.details.get("resumed")
    again = d.deploy(snap, NOW)  # the retry, with the task's original snapshot
    assert client.writes == ["create"]  # no second scraper
    assert again.state is DeployState.WAITING and again.details["resumed"] is True
    assert again.details["scraper_id"] == first.details["scraper_id"] and again.details["created"] is True
    assert again.status == "CREATING"


def test_a_deploy_retried_after_its_update_follows_it() -> None:
    client = FakeAmp()
    scraper_id = client.add(OLD)
    d = deployer(client)
    snap = d.snapshot()
    d.deploy(snap, NOW)
    assert client.writes == ["update"]
    client.scrapers[scraper_id]["scrapeConfiguration"] = {"configurationBlob": d.blob.encode()}  # the update landed
    again = d.deploy(snap, NOW)
    assert client.writes == ["update"] and again.details["resumed"] is True and again.details["created"] is False


def test_someone_elses_scraper_is_still_refused() -> None:
    client = FakeAmp()
    d = deployer(client)
    snap = d.snapshot()
    client.add(d.blob, workspace="arn:aws:aps:us-east-1:123456789012:workspace/ws-other")  # not our destination
    with pytest.raises(DeployError, match="changed since the snapshot"):
        d.deploy(snap, NOW)
    client2 = FakeAmp()
    scraper_id = client2.add(OLD)
    d2 = deployer(client2)
    snap2 = d2.snapshot()
    client2.scrapers[scraper_id]["scrapeConfiguration"] = {"configurationBlob": b"someone: else\n"}
    with pytest.raises(DeployError, match="another configuration than the snapshot"):
        d2.deploy(snap2, NOW)
    assert client.writes == client2.writes == []


def test_a_restore_retried_after_its_delete_follows_the_delete() -> None:
    client = FakeAmp()
    d = deployer(client)
    snap = d.snapshot()
    d.deploy(snap, NOW)
    first = d.restore(snap, NOW)
    assert client.writes == ["create", "delete"] and first.details["expect"] == "DELETED"
    again = d.restore(snap, NOW)  # the retry while the scraper is DELETING
    assert client.writes == ["create", "delete"]
    assert again.state is DeployState.WAITING and again.details["resumed"] is True
    assert again.details["expect"] == "DELETED" and again.status == "DELETING"
