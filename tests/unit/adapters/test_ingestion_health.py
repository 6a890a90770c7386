"""Ingestion health in the verdicts: warm-up and bake fail on any refusal, naming it; unknown is never "none"."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from promshift.adapters.ingest_health import DiscardsUnavailable, workspace_discards
from promshift.core.bake import BakeObservation, judge
from promshift.core.catalog import BakePolicy
from promshift.core.ingest_limits import OUT_OF_ORDER, TOO_MANY_LABELS, TOO_OLD
from promshift.core.verdicts import Verdict
from promshift.core.warmup import WarmupObservation, assess_warmup

KW: dict[str, Any] = {"min_duration_s": 60, "timeout_s": 300, "max_lag_s": 10}
READY = WarmupObservation(70, 1600, 1600, 2.0, 0.0, discarded={}, discards_expected=True)


def test_a_clean_warmup_with_known_zero_discards_is_ready() -> None:
    assert assess_warmup(READY, **KW).state == "ready"


def test_the_writers_failed_samples_fail_warmup_at_once_even_before_the_minimum() -> None:
    status = assess_warmup(dataclasses.replace(READY, elapsed_s=5, failed_samples=12.0), **KW)
    assert status.state == "failed"
    assert status.reason.startswith("ingestion refused: the writer failed 12 samples")


def test_workspace_discards_fail_warmup_naming_reason_and_series() -> None:
    obs = dataclasses.replace(READY, discarded={TOO_OLD: 40.0, OUT_OF_ORDER: 2.0},
                              example_series='gpu_temp{gpu="0", instance="n1"}')
    status = assess_warmup(obs, **KW)
    assert status.state == "failed"
    assert status.reason == ("ingestion refused: the workspace discarded 40 too old (older than the newest sample "
                             "by more than the out-of-order window and the 1 h head) (sample-out-of-bounds), 2 out of "
                             "order (sample-out-of-order) (DiscardedSamples); e.g. series "
                             'gpu_temp{gpu="0", instance="n1"}')


def test_unknown_discards_where_expected_never_pass() -> None:
    unknown = dataclasses.replace(READY, discarded=None, discards_error="GetMetricData: AccessDenied")
    waiting = assess_warmup(unknown, **KW)
    assert waiting.state == "waiting" and "discarded samples unknown (GetMetricData: AccessDenied)" in waiting.reason
    assert assess_warmup(dataclasses.replace(unknown, elapsed_s=301), **KW).state == "timeout"
    # a self-hosted target publishes none: not expected, not required
    assert assess_warmup(dataclasses.replace(unknown, discards_expected=False), **KW).state == "ready"
    # the queue reports lag but no failed-sample count: unknown, not zero
    no_count = dataclasses.replace(READY, failed_samples=None)
    assert "failed-sample count unknown" in assess_warmup(no_count, **KW).reason


POLICY = BakePolicy()
CLEAN = BakeObservation(target_newest_age_s=4, lag_s=1.5, failed_samples=0, source_series=240, target_series=240,
                        parity=Verdict.SUCCESSFUL, discarded={}, discards_expected=True)


def ingestion(obs: BakeObservation) -> tuple[str, str]:
    found = [m for m in judge(obs, POLICY).measurements if m.name == "ingestion"]
    return (found[0].verdict.value, found[0].reason) if found else ("", "")


def test_bake_ingestion_measurement() -> None:
    assert ingestion(CLEAN) == ("SUCCESSFUL", "no failed samples in the group's queue; no samples discarded by the "
                                              "workspace")
    verdict, reason = ingestion(dataclasses.replace(CLEAN, discarded={TOO_MANY_LABELS: 5.0}, example_series="m{}"))
    assert verdict == "FAILED" and "5 too many labels per series (max_label_names_per_series)" in reason
    assert reason.endswith("e.g. series m{}")
    assert judge(dataclasses.replace(CLEAN, discarded={TOO_MANY_LABELS: 5.0}), POLICY).failed
    assert ingestion(dataclasses.replace(CLEAN, discarded=None))[0] == "INCONCLUSIVE"
    unread = judge(dataclasses.replace(CLEAN, discarded=None, errors=(("discards", "ListMetrics: Throttling"),)),
                   POLICY)
    assert [(m.verdict.value, m.reason) for m in unread.measurements if m.name == "ingestion"] == [
        ("ERROR", "discards: ListMetrics: Throttling")]
    # the managed-scraper path with no AMP discards: nothing to judge, no measurement
    assert ingestion(dataclasses.replace(CLEAN, queue_expected=False, discards_expected=False,
                                         discarded=None)) == ("", "")


class FakeCloudWatch:
    def __init__(self, metrics: list[list[dict[str, str]]], values: dict[str, list[float]], fail: str = "") -> None:
        self.metrics, self.values, self.fail = metrics, values, fail

    def get_paginator(self, name: str) -> Any:
        outer = self

        class Pages:
            def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
                if outer.fail:
                    raise RuntimeError(outer.fail)
                assert kwargs == {"Namespace": "AWS/Prometheus", "MetricName": "DiscardedSamples"}
                return [{"Metrics": [{"Dimensions": d} for d in outer.metrics]}]
        return Pages()

    def get_metric_data(self, **kwargs: Any) -> dict[str, Any]:
        out = []
        for query in kwargs["MetricDataQueries"]:
            reason = next(d["Value"] for d in query["MetricStat"]["Metric"]["Dimensions"] if d["Name"] == "Reason")
            out.append({"Id": query["Id"], "Values": self.values.get(reason, [])})
        return {"MetricDataResults": out}


def test_workspace_discards_sum_by_reason_for_this_workspace_only() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    dims = [[{"Name": "Workspace", "Value": ws}, {"Name": "Reason", "Value": r}]
            for ws, r in (("ws-1", TOO_OLD), ("ws-2", OUT_OF_ORDER), ("ws-1", OUT_OF_ORDER))]
    cw = FakeCloudWatch(dims, {TOO_OLD: [3.0, 4.0], OUT_OF_ORDER: [0.0]})
    assert workspace_discards(cw, "ws-1", since=now - timedelta(minutes=5), now=now) == {TOO_OLD: 7.0}
    assert workspace_discards(FakeCloudWatch([], {}), "ws-1", since=now, now=now) == {}
    with pytest.raises(DiscardsUnavailable, match=r"^ListMetrics\(AWS/Prometheus/DiscardedSamples\): RuntimeError$"):
        workspace_discards(FakeCloudWatch([], {}, fail="denied"), "ws-1", since=now, now=now)
