"""The pre-flight against the workspace's current adaptive capacity and its labels per series (core.quota,
adapters.amp_quota): a first wave of more than 2M series onto a fresh workspace is refused with the numbers."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from promshift.adapters.amp_quota import (
    ACTIVE_SERIES,
    INGESTION_RATE,
    LABELS_PER_SERIES,
    QuotaPreflight,
    external_labels,
    group_label_count,
)
from promshift.core.quota import QuotaExceeded, assess_quota

WS = "ws-11111111-2222-3333-4444-555555555555"
NOW = datetime.now(UTC).replace(microsecond=0)


def test_a_first_wave_past_2m_onto_a_fresh_workspace_is_refused_with_the_numbers() -> None:
    refused = assess_quota(group_series=2_500_000, workspace_series=0, series_limit=10_000_000,
                           scrape_interval_s=30, series_capacity=2_000_000)
    assert not refused.ok
    assert refused.reason == (
        "quota pre-flight refused: active series would reach 2,500,000, past the workspace's current capacity of "
        "2,000,000 (AMP's adaptive capacity: double its 30-min average, from 2M up to the quota of 10,000,000); it "
        "takes 2,000,000 more series now: start the wave's groups in steps, or wait for the capacity to grow")
    assert refused.to_dict()["capacity"] == 2_000_000
    ok = assess_quota(group_series=1_500_000, workspace_series=0, series_limit=10_000_000, scrape_interval_s=30,
                      series_capacity=2_000_000, labels=(14, 70))
    assert ok.ok and ok.reason.endswith("; 1,500,000 of a current capacity of 2,000,000 series; up to 14 of 70 "
                                        "labels per series")


def test_too_many_labels_per_series_is_refused() -> None:
    refused = assess_quota(group_series=10, workspace_series=0, series_limit=1e7, scrape_interval_s=30,
                           labels=(71, 70))
    assert not refused.ok and "carry up to 71 labels" in refused.reason and "70 labels per series" in refused.reason
    assert refused.to_dict()["labels_per_series"] == {"group": 71, "limit": 70}


def test_group_label_count_adds_external_labels_and_drops_dropped_ones() -> None:
    config = "global:\n  external_labels:\n    cluster: a\n    replica: r1\n"
    assert external_labels(config) == {"cluster": "a", "replica": "r1"}
    assert external_labels("scrape_configs: []\n") == {}
    assert group_label_count(["__name__", "gpu", "instance", "pod", "cluster"], {"cluster": "a", "replica": "r1"},
                             ("pod",)) == 5


class Quotas:
    """Service Quotas answering the three aps quotas (``labels``: None lists no labels quota)."""

    def __init__(self, series: float, labels: float | None) -> None:
        self.values = {ACTIVE_SERIES: series, INGESTION_RATE: 170_000.0}
        if labels is not None:
            self.values[LABELS_PER_SERIES] = labels

    def _quota(self, name: str) -> dict[str, Any]:
        resource = {ACTIVE_SERIES: "ActiveSeries", INGESTION_RATE: "IngestionRate"}.get(name)
        usage = {"UsageMetric": {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
                                 "MetricDimensions": {"Service": "Prometheus", "Type": "Resource",
                                                      "Resource": resource, "Class": "None"}}} if resource else {}
        return {"QuotaCode": f"L-{name[:6]}", "QuotaName": name, "Value": self.values[name], **usage}

    def get_paginator(self, name: str) -> Any:
        quotas = [self._quota(n) for n in self.values]

        class Pages:
            def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
                return [{"Quotas": quotas}]
        return Pages()

    def get_service_quota(self, **kwargs: Any) -> dict[str, Any]:
        name = next(n for n in self.values if f"L-{n[:6]}" == kwargs["QuotaCode"])
        return {"Quota": self._quota(name)}


@pytest.fixture
def cloudwatch() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("cloudwatch", region_name="us-east-1")


def publish(cw: Any, values: list[tuple[int, float]]) -> None:
    dims = [{"Name": "Service", "Value": "Prometheus"}, {"Name": "Type", "Value": "Resource"},
            {"Name": "Resource", "Value": "ActiveSeries"}, {"Name": "Class", "Value": "None"},
            {"Name": "ResourceId", "Value": WS}]
    for minutes_ago, value in values:
        cw.put_metric_data(Namespace="AWS/Usage", MetricData=[{
            "MetricName": "ResourceCount", "Dimensions": dims, "Value": value,
            "Timestamp": NOW - timedelta(minutes=minutes_ago)}])


def preflight(cw: Any, labels: float | None = 70) -> QuotaPreflight:
    return QuotaPreflight(quotas=Quotas(10_000_000, labels), cloudwatch=cw, workspace_id=WS,
                          workspace_arn=f"arn:aws:aps:us-east-1:123456789012:workspace/{WS}",
                          workspace_series_query=lambda: 0.0, max_share=1.0, check_capacity=True)


def test_the_capacity_is_double_the_cloudwatch_30_min_average(cloudwatch: Any) -> None:
    publish(cloudwatch, [(m, 1_500_000.0) for m in range(1, 31)])  # a steady 1.5M for the last 30 minutes
    check = preflight(cloudwatch)
    assessment, evidence = check.assess(group_series=1_400_000, scrape_interval_s=60, now=NOW, group_labels=20)
    assert assessment.ok, assessment.reason
    assert assessment.capacity == 3_000_000 and evidence["capacity_from"] == "cloudwatch 30-min average"
    assert evidence["labels_limit_from"] == "service quotas"
    with pytest.raises(QuotaExceeded, match="past the workspace's current capacity of 3,000,000"):
        check.require(group_series=1_600_000, scrape_interval_s=60, now=NOW, group_labels=20)


def test_a_fresh_workspace_takes_2m_and_labels_default_to_amps_70(cloudwatch: Any) -> None:
    check = preflight(cloudwatch, labels=None)
    assessment, evidence = check.assess(group_series=2_100_000, scrape_interval_s=60, now=NOW, group_labels=71)
    assert not assessment.ok and "carry up to 71 labels" in assessment.reason
    assert evidence["labels_limit_from"].startswith("AMP's documented default")
    assert evidence["capacity_from"].startswith("no CloudWatch average")
    refused, _ = check.assess(group_series=2_100_000, scrape_interval_s=60, now=NOW, group_labels=12)
    assert not refused.ok and "current capacity of 2,000,000" in refused.reason
