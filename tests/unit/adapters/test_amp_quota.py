"""The quota pre-flight adapter: Service Quotas through botocore's Stubber (requests checked against the
model), CloudWatch usage in moto's CloudWatch (PutMetricData, then the adapter's ListMetrics/GetMetricData)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from promshift.adapters.amp_quota import ACTIVE_SERIES, INGESTION_RATE, QuotaPreflight, QuotaUnavailable
from promshift.core.quota import QuotaExceeded

WS = "ws-11111111-2222-3333-4444-555555555555"
WS_ARN = f"arn:aws:aps:us-east-1:123456789012:workspace/{WS}"
NOW = datetime.now(UTC).replace(microsecond=0)
CODES = {ACTIVE_SERIES: "L-AAAA1111", INGESTION_RATE: "L-BBBB2222"}
RESOURCE = {ACTIVE_SERIES: "ActiveSeries", INGESTION_RATE: "IngestionRate"}


def quota(name: str, value: float) -> dict[str, Any]:
    return {"ServiceCode": "aps", "ServiceName": "Amazon Managed Service for Prometheus", "QuotaCode": CODES[name],
            "QuotaName": name, "Value": value, "Unit": "None", "Adjustable": True, "GlobalQuota": False,
            "QuotaAppliedAtLevel": "RESOURCE",
            "UsageMetric": {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
                            "MetricDimensions": {"Service": "Prometheus", "Type": "Resource",
                                                 "Resource": RESOURCE[name], "Class": "None"},
                            "MetricStatisticRecommendation": "Maximum"}}


@pytest.fixture
def cloudwatch() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("cloudwatch", region_name="us-east-1")


def publish(cw: Any, resource: str, value: float, workspace: str = WS) -> None:
    dims = [{"Name": "Service", "Value": "Prometheus"}, {"Name": "Type", "Value": "Resource"},
            {"Name": "Resource", "Value": resource}, {"Name": "Class", "Value": "None"},
            {"Name": "ResourceId", "Value": workspace}]
    for minutes, scale in ((5, 0.5), (1, 1.0)):
        cw.put_metric_data(Namespace="AWS/Usage", MetricData=[{
            "MetricName": "ResourceCount", "Dimensions": dims, "Value": value * scale,
            "Timestamp": NOW - timedelta(minutes=minutes)}])


def stubbed_quotas(series_limit: float, ingestion_limit: float) -> tuple[Any, Stubber]:
    client = boto3.client("service-quotas", region_name="us-east-1", aws_access_key_id="AKIATEST",
                          aws_secret_access_key="test")
    stub = Stubber(client)
    for name, value in ((ACTIVE_SERIES, series_limit), (INGESTION_RATE, ingestion_limit)):
        stub.add_response("list_service_quotas", {"Quotas": [quota(ACTIVE_SERIES, series_limit),
                                                             quota(INGESTION_RATE, ingestion_limit)]},
                          {"ServiceCode": "aps"})
        stub.add_response("get_service_quota", {"Quota": quota(name, value)},
                          {"ServiceCode": "aps", "QuotaCode": CODES[name], "ContextId": WS_ARN})
    stub.activate()
    return client, stub


def test_the_group_fits_and_the_evidence_names_every_source(cloudwatch: Any) -> None:
    publish(cloudwatch, "ActiveSeries", 500_000)
    publish(cloudwatch, "ActiveSeries", 9_000_000, workspace="ws-other")  # another workspace's usage
    publish(cloudwatch, "IngestionRate", 20_000)
    quotas, stub = stubbed_quotas(1_000_000, 70_000)
    evidence = QuotaPreflight(quotas, cloudwatch, WS, WS_ARN).require(group_series=100_000, scrape_interval_s=30,
                                                                      now=NOW)
    stub.assert_no_pending_responses()
    assert evidence["workspace_series"] == 500_000 and evidence["group_series"] == 100_000
    assert evidence["limit"] == 1_000_000 and evidence["share"] == pytest.approx(0.6)
    assert evidence["workspace_series_from"] == "cloudwatch"
    assert evidence["ingestion"]["current"] == 20_000 and evidence["ingestion"]["limit"] == 70_000
    assert [q["code"] for q in evidence["quotas"]] == ["L-AAAA1111", "L-BBBB2222"]


def test_crossing_80_percent_is_refused_with_the_numbers(cloudwatch: Any) -> None:
    publish(cloudwatch, "ActiveSeries", 700_000)
    quotas, _ = stubbed_quotas(1_000_000, 70_000)
    with pytest.raises(QuotaExceeded) as caught:
        QuotaPreflight(quotas, cloudwatch, WS, WS_ARN).require(group_series=150_000, scrape_interval_s=30, now=NOW)
    assert str(caught.value).startswith("quota pre-flight refused: active series would reach 85.0%")
    assert caught.value.evidence["workspace_series"] == 700_000 and caught.value.evidence["share"] == 0.85
    assert caught.value.evidence["workspace_ingestion_rate_from"] == "unknown (not checked)"


def test_without_cloudwatch_data_the_workspace_is_counted_and_an_unreadable_quota_refuses(cloudwatch: Any) -> None:
    quotas, _ = stubbed_quotas(1_000, 70_000)
    preflight = QuotaPreflight(quotas, cloudwatch, WS, WS_ARN, workspace_series_query=lambda: 750.0)
    with pytest.raises(QuotaExceeded) as caught:
        preflight.require(group_series=100, scrape_interval_s=30, now=NOW)
    assert caught.value.evidence["workspace_series_from"].startswith("workspace query")

    client = boto3.client("service-quotas", region_name="us-east-1", aws_access_key_id="AKIATEST",
                          aws_secret_access_key="test")
    with Stubber(client) as stub:
        stub.add_client_error("list_service_quotas", service_error_code="AccessDeniedException",
                              service_message="User: arn:aws:iam::1:user/x is not authorized", http_status_code=403)
        refused = r"^quota pre-flight: ListServiceQuotas\(aps\): AccessDeniedException$"
        with pytest.raises(QuotaUnavailable, match=refused):
            QuotaPreflight(client, cloudwatch, WS, WS_ARN).require(group_series=1, scrape_interval_s=30, now=NOW)


def test_no_usage_and_no_fallback_is_not_a_pass(cloudwatch: Any) -> None:
    quotas, _ = stubbed_quotas(1_000_000, 70_000)
    with pytest.raises(QuotaUnavailable, match="no usage of 'Active series per workspace'"):
        QuotaPreflight(quotas, cloudwatch, WS, WS_ARN).require(group_series=1, scrape_interval_s=30, now=NOW)
