"""Ingestion health of a group on its target: what the workspace discarded, by reason, and a series the target lacks.

- The workspace's discards: CloudWatch ``AWS/Prometheus`` ``DiscardedSamples`` (Sum), one metric per
  ``Reason`` with the workspace's id among its dimensions (as AMP vends it; "Use CloudWatch metrics to monitor
  Amazon Managed Service for Prometheus resources", AMP user guide), summed from the dual-write's start to now.
  A workspace that discarded nothing has no such metric: an answered ListMetrics with none is "no discards";
  a refused or failed read raises ``DiscardsUnavailable`` (a check without data never passes).
- A sample series: CloudWatch names no series, so one series of the group that the source holds and the target
  lacks is found with bounded instant queries (``count by (__name__, instance)`` on both sides, then the
  series of the first short (metric, instance) on both, by ``last_over_time``). Refused samples of series the
  target does hold (out of order, duplicates) leave none to name.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from promshift.adapters.prometheus import PrometheusClient
from promshift.core.warmup import missing_series_example

NAMESPACE, METRIC = "AWS/Prometheus", "DiscardedSamples"


class DiscardsUnavailable(ValueError):
    """The workspace's discards could not be read (one line, no secret; a ValueError, as other unreadable answers)."""


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str((response.get("Error") or {}).get("Code") or type(exc).__name__)


def workspace_discards(cloudwatch: Any, workspace_id: str, *, since: datetime, now: datetime) -> dict[str, float]:
    """Samples the workspace discarded between ``since`` and ``now``, by reason ({} when none)."""
    try:
        found: list[list[dict[str, str]]] = []
        for page in cloudwatch.get_paginator("list_metrics").paginate(Namespace=NAMESPACE, MetricName=METRIC):
            found.extend(list(m.get("Dimensions") or []) for m in page.get("Metrics") or [])
    except Exception as exc:
        raise DiscardsUnavailable(f"ListMetrics({NAMESPACE}/{METRIC}): {_code(exc)}") from None
    ours = [dims for dims in found if any(d.get("Value") == workspace_id for d in dims)]
    if not ours:
        return {}
    queries = [{"Id": f"d{i}", "ReturnData": True, "MetricStat": {
        "Metric": {"Namespace": NAMESPACE, "MetricName": METRIC, "Dimensions": dims}, "Period": 60, "Stat": "Sum"}}
        for i, dims in enumerate(ours[:100])]
    try:
        answer = cloudwatch.get_metric_data(MetricDataQueries=queries, StartTime=since - timedelta(minutes=1),
                                            EndTime=now + timedelta(minutes=1))
    except Exception as exc:
        raise DiscardsUnavailable(f"GetMetricData({NAMESPACE}/{METRIC}): {_code(exc)}") from None
    out: dict[str, float] = {}
    for result in answer.get("MetricDataResults") or []:
        dims = ours[int(str(result["Id"])[1:])]
        reason = next((d["Value"] for d in dims if d.get("Name") == "Reason"), "unknown")
        total = sum(float(v) for v in result.get("Values") or [])
        if total > 0:
            out[reason] = out.get(reason, 0.0) + total
    return out


def with_ingestion_health(obs: Any, *, read_discards: Any, source: PrometheusClient, target: PrometheusClient,
                          selector: str, since: datetime, now: datetime) -> Any:
    """``obs`` (a ``core.warmup.WarmupObservation``) with the workspace's discards since ``since`` and, once the
    target refused anything, a series of the group it lacks. ``read_discards(since, now)``: None when the target
    publishes no discards (a self-hosted Prometheus); then only the writer's failed samples are judged."""
    from dataclasses import replace

    from promshift.core.warmup import ingestion_refusal

    if read_discards is not None:
        try:
            obs = replace(obs, discarded=read_discards(since, now), discards_expected=True)
        except DiscardsUnavailable as exc:
            obs = replace(obs, discarded=None, discards_expected=True, discards_error=str(exc))
    if ingestion_refusal(obs):
        obs = replace(obs, example_series=missing_series_example(source, target, selector, at=now.timestamp()))
    return obs
