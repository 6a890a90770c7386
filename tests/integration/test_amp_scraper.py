"""The managed-collector path against the local AWS: ScraperDeployer on the control plane's scraper API,
statuses and injected failures, the collector behind an ACTIVE scraper writing to the workspace, parity in
``independent_scraper`` mode, and the quota pre-flight on Service Quotas + the workspace."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from promshift.adapters.amp_quota import QuotaPreflight
from promshift.adapters.amp_scraper import ScraperDeployer, scraper_source_from_extra, wait_for
from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import default_catalog_path, load_catalog
from promshift.adapters.sigv4 import AwsSigV4Auth
from promshift.core.catalog import MetricGroup
from promshift.core.deploy import DeployError, DeployState
from promshift.core.quota import QuotaExceeded
from promshift.core.scraper_config import render_scraper_config
from promshift.core.verdicts import Verdict
from promshift.local.stack.local import AWS, LocalStack, StackConfig
from promshift.local.stack.scrapers import collector_processes
from tests.integration.conftest import running_amp_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    """A 2-node AMP stack (1 s scrapes) with its own made-up pair."""
    with running_amp_stack(stack_config_factory) as local:
        yield local


@pytest.fixture(autouse=True)
def clean_faults(stack: LocalStack) -> Iterator[None]:
    stack.set_aws_faults(scraper={"delay_s": 1, "collector_scrape_interval_s": 1})
    yield
    stack.set_aws_faults()


def group(name: str = "gpu-utilization") -> MetricGroup:
    return load_catalog(profile="demo").get(name)


def deployer(stack: LocalStack, g: MetricGroup, *, interval_s: float = 30, timeout_s: float = 60,
             blob: str | None = None) -> ScraperDeployer:
    amp = stack.amp_client()
    arn = amp.describe_workspace(workspaceId=stack.workspace_id)["workspace"]["arn"]
    return ScraperDeployer(amp, group_name=g.name,
                           blob=blob or render_scraper_config(name_regex=g.name_regex(), scrape_interval_s=interval_s),
                           workspace_arn=arn, source=scraper_source_from_extra({"scraper": stack.scraper_extra()}),
                           timeout_s=timeout_s)


def now() -> datetime:
    return datetime.now(UTC)


def workspace_client(stack: LocalStack) -> PrometheusClient:
    pair = stack.aws_credentials()
    session = boto3.Session(aws_access_key_id=pair.access_key, aws_secret_access_key=pair.secret_key,
                            region_name=stack.config.region)
    return PrometheusClient(stack.prometheus_endpoint().rstrip("/"), timeout_s=30,
                            auth=AwsSigV4Auth(session.get_credentials(), stack.config.region))


def settle(d: ScraperDeployer, result: Any) -> Any:
    return wait_for(d, result, poll_s=0.3)


def test_create_goes_active_data_flows_parity_passes_and_restore_deletes(stack: LocalStack) -> None:
    g = group()
    d = deployer(stack, g)
    snapshot = d.snapshot()
    assert not snapshot.existed
    started = d.deploy(snapshot, now())
    assert started.state is DeployState.WAITING and started.status == "CREATING"
    result = settle(d, started)
    assert result.state is DeployState.DONE, result.reason
    assert [c.status for c in result.status_history] == ["CREATING", "ACTIVE"]
    active_at = time.time()
    scraper_id = result.details["scraper_id"]
    assert collector_processes(stack.amp_dir / "scrapers", scraper_id), "no collector runs behind the ACTIVE scraper"

    # The collector writes the group, and only the group, to the workspace (SigV4-checked front door).
    target, source = workspace_client(stack), PrometheusClient(stack.source_url, timeout_s=30)
    selector = g.selector()
    deadline = time.time() + 30
    while (target.scalar(f"count({selector})") or 0) < (source.scalar(f"count({selector})") or 1):
        assert time.time() < deadline, "the collector's data did not reach the workspace"
        time.sleep(0.5)
    assert not target.query('count({__name__="DCGM_FI_DEV_FB_USED"})').series  # another group's metric

    # Parity in independent_scraper mode: timestamps differ from the source's, values agree per step.
    time.sleep(30)
    # No blanket tolerance: the catalog's (~1e-9) is the floor, the two scrapers' own noise the allowance.
    independent = dataclasses.replace(g, parity=dataclasses.replace(
        g.parity, mode="independent_scraper", skip_recent_s=2, step_s=5))
    check = ParityCheck(independent, source, target, catalog_dir=default_catalog_path().parent)
    parity = check.run(dual_write_since=active_at, now=time.time())
    failing = [m for m in parity.measurements if m.verdict != Verdict.SUCCESSFUL]
    assert parity.verdict == Verdict.SUCCESSFUL, failing
    assert parity.points_compared > 0 and parity.series_compared > 0

    # Rollback of a scraper the deploy created: it is deleted and its collector stops.
    restored = settle(d, d.restore(snapshot, now()))
    assert restored.state is DeployState.DONE and restored.status == "DELETED", restored.reason
    assert d.snapshot().existed is False
    deadline = time.time() + 20
    while collector_processes(stack.amp_dir / "scrapers", scraper_id):
        assert time.time() < deadline, "the deleted scraper's collector still runs"
        time.sleep(0.3)


def test_update_failed_surfaces_the_aws_reason_and_restore_puts_the_old_blob_back(stack: LocalStack) -> None:
    g = group("gpu-memory")
    first = deployer(stack, g)
    created = settle(first, first.deploy(first.snapshot(), now()))
    assert created.state is DeployState.DONE, created.reason
    try:
        wider = render_scraper_config(name_regex=g.name_regex(), scrape_interval_s=60)
        second = deployer(stack, g, blob=wider)
        before = second.snapshot()
        assert before.existed and "scrape_interval: 30s" in before.content
        stack.set_aws_faults(scraper={"delay_s": 1, "fail_update": "Unable to reach the cluster's API server"})
        failed = settle(second, second.deploy(before, now()))
        assert failed.state is DeployState.FAILED
        assert failed.reason == "scraper is UPDATE_FAILED: Unable to reach the cluster's API server"
        assert [c.status for c in failed.status_history] == ["UPDATING", "UPDATE_FAILED"]
        assert second.snapshot().content == before.content  # the failed update left the old configuration

        stack.set_aws_faults(scraper={"delay_s": 1})
        restored = settle(second, second.restore(before, now()))
        assert restored.state is DeployState.DONE and restored.status == "ACTIVE"
        assert second.snapshot().content == before.content
    finally:
        settle(first, first.restore(dataclasses.replace(first.snapshot(), meta={"existed": False}, ref=None),
                                    now()))


def test_creating_past_its_deadline_times_out_and_restore_deletes_it(stack: LocalStack) -> None:
    stack.set_aws_faults(scraper={"stuck": True})
    d = deployer(stack, group("gpu-clocks"), timeout_s=1.5)
    snapshot = d.snapshot()
    result = settle(d, d.deploy(snapshot, now()))
    assert result.state is DeployState.TIMEOUT
    assert result.reason.startswith("scraper still CREATING after") and "(deadline 2s)" in result.reason
    stack.set_aws_faults(scraper={"delay_s": 0.5})
    restored = settle(d, d.restore(snapshot, now()))
    assert restored.state is DeployState.DONE and restored.status == "DELETED"
    assert d.snapshot().existed is False


def test_creation_failed_is_a_failure_with_its_reason(stack: LocalStack) -> None:
    stack.set_aws_faults(scraper={"delay_s": 0.5, "fail_create": "Subnet subnet-0local0000000000a not found"})
    d = deployer(stack, group("gpu-power-thermal"))
    snapshot = d.snapshot()
    result = settle(d, d.deploy(snapshot, now()))
    assert result.state is DeployState.FAILED
    assert result.reason == "scraper is CREATION_FAILED: Subnet subnet-0local0000000000a not found"
    settle(d, d.restore(snapshot, now()))
    assert d.snapshot().existed is False


def test_a_blob_breaking_a_limit_is_refused_before_any_api_call(stack: LocalStack) -> None:
    g = group()
    d = deployer(stack, g, blob=render_scraper_config(name_regex=g.name_regex(), scrape_interval_s=30)
                 + "remote_write:\n- url: http://example.invalid/api/v1/write\n")
    fast = deployer(stack, g, interval_s=10)
    snapshot = d.snapshot()
    before = stack.sigv4_stats(AWS)["verified"]
    with pytest.raises(DeployError, match="unsupported top-level section.s. remote_write"):
        d.deploy(snapshot, now())
    assert stack.sigv4_stats(AWS)["verified"] == before  # not even a ListScrapers
    with pytest.raises(DeployError, match="below the managed collector's minimum of 30s"):
        fast.deploy(snapshot, now())
    assert stack.sigv4_stats(AWS)["verified"] == before


def test_the_control_plane_refuses_what_the_model_or_aws_would(stack: LocalStack) -> None:
    amp = stack.amp_client()
    arn = amp.describe_workspace(workspaceId=stack.workspace_id)["workspace"]["arn"]
    eks = {"eksConfiguration": {"clusterArn": stack.scraper_extra()["cluster_arn"], "subnetIds": ["subnet-1"]}}
    with pytest.raises(amp.exceptions.ValidationException, match="file_sd_configs"):
        amp.create_scraper(scrapeConfiguration={"configurationBlob": b"scrape_configs:\n- job_name: x\n"
                                                                     b"  file_sd_configs: [{files: [a.json]}]\n"},
                           source=eks, destination={"ampConfiguration": {"workspaceArn": arn}})
    with pytest.raises(amp.exceptions.ValidationException, match="does not exist"):
        amp.create_scraper(scrapeConfiguration={"configurationBlob": b"scrape_configs: [{job_name: x}]\n"},
                           source=eks, destination={"ampConfiguration": {
                               "workspaceArn": arn.rsplit("/", 1)[0] + "/ws-00000000-0000-0000-0000-000000000000"}})
    with pytest.raises(amp.exceptions.ResourceNotFoundException):
        amp.describe_scraper(scraperId="s-missing")
    default = amp.get_default_scraper_configuration()["configuration"].decode()
    assert "kubernetes_sd_configs" in default and "scrape_interval: 30s" in default


def aws_client(stack: LocalStack, service: str) -> Any:
    pair = stack.aws_credentials()
    return boto3.client(service, region_name=stack.config.region, endpoint_url=stack.aws_url,
                        aws_access_key_id=pair.access_key, aws_secret_access_key=pair.secret_key)


def test_a_quota_crossing_is_refused_and_nothing_is_deployed(stack: LocalStack) -> None:
    g = group("gpu-utilization")
    source = PrometheusClient(stack.source_url, timeout_s=30)
    group_series = int(source.scalar(f"count({g.selector()})") or 0)
    assert group_series == 2 * 8 * 4
    workspace_arn = stack.amp_client().describe_workspace(workspaceId=stack.workspace_id)["workspace"]["arn"]
    quotas, cloudwatch = aws_client(stack, "service-quotas"), aws_client(stack, "cloudwatch")
    # AMP's usage metric for this workspace, seeded as AMP vends it (through the local AWS into moto's CloudWatch).
    published = stack.publish_usage()["active_series"]
    preflight = QuotaPreflight(quotas, cloudwatch, str(stack.workspace_id), workspace_arn)
    evidence = preflight.require(group_series=group_series, scrape_interval_s=30, now=now())
    assert evidence["workspace_series_from"] == "cloudwatch" and evidence["limit"] == 10_000_000
    workspace_series = evidence["workspace_series"]
    assert workspace_series >= published

    limit = workspace_series + group_series  # the group would fill the quota: 100 % > 80 %
    stack.set_aws_faults(aps_quotas={"active_series": limit})
    d = deployer(stack, g)
    snapshot = d.snapshot()
    with pytest.raises(QuotaExceeded) as caught:
        preflight.require(group_series=group_series, scrape_interval_s=30, now=now())
        d.deploy(snapshot, now())  # never reached: the pre-flight comes first
    assert str(caught.value) == (
        f"quota pre-flight refused: active series would reach 100.0% of the workspace quota ({workspace_series:,} "
        f"now + 64 for the group > 80% of {limit:,}); raise the quota or move a smaller group")
    assert caught.value.evidence["share"] == 1.0
    assert d.snapshot().existed is False
    assert stack.sigv4_stats(AWS)["verified_by_kind"]["GetServiceQuota"] >= 4


def test_the_hook_builds_both_and_the_trigger_follows_the_scraper_by_connection_id(
        stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import json

    from promshift.orchestration.amp_hook import AmpHook
    from promshift.orchestration.triggers import ScraperStatusTrigger

    pair = stack.aws_credentials()
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "amp", "login": pair.access_key, "password": pair.secret_key,
        "extra": {**stack.amp_connection_extra(), "scraper": stack.scraper_extra(), "quota": {"max_share": 0.5}}}))
    g = group("gpu-memory")
    hook = AmpHook()
    preflight = hook.quota_preflight()
    assert preflight.max_share == 0.5
    evidence = preflight.require(group_series=48, scrape_interval_s=30, now=now())
    assert evidence["limit"] == 10_000_000 and evidence["group_series"] == 48

    async def follow(result: dict[str, Any]) -> dict[str, Any]:
        trigger = ScraperStatusTrigger(target_conn_id="promshift_target", result=result, poll_interval_s=0.3)
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    d = hook.scraper_deployer(g.name, g.name_regex())
    snapshot = d.snapshot()
    event = asyncio.run(follow(d.deploy(snapshot, now()).to_dict()))
    assert event["status"] == "done", event
    assert [c["status"] for c in event["result"]["status_history"]] == ["CREATING", "ACTIVE"]
    assert pair.secret_key not in json.dumps(event)
    event = asyncio.run(follow(d.restore(snapshot, now()).to_dict()))
    assert event["status"] == "done" and event["result"]["status_history"][-1]["status"] == "DELETED"
