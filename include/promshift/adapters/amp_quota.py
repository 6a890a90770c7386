"""Quota pre-flight before any deploy: the group's series + the workspace's, against its AMP quotas.

Where each number comes from:

- the group's active series: ``count(<group selector>)`` on the source Prometheus;
- the quotas: Service Quotas, service code ``aps``, quotas named **Active series per workspace** and
  **Ingestion rate per workspace** ("Amazon Managed Service for Prometheus service quotas", AMP user
  guide). They are found by name with ``ListServiceQuotas`` (the name is what AWS documents; pin a
  code with ``quota_codes`` to skip the listing), then read for the workspace with
  ``GetServiceQuota(ContextId=<workspace ARN>)`` (both are resource-level quotas), falling back to
  the listed value when the resource-level read is refused;
- the workspace's current use: the CloudWatch usage metric each quota names in its ``UsageMetric``
  (``AWS/Usage`` / ``ResourceCount``, dimensions ``Service=Prometheus, Type=Resource,
  Resource=ActiveSeries|IngestionRate, Class=None``: "Use CloudWatch metrics to monitor Amazon
  Managed Service for Prometheus resources", AMP user guide). The per-workspace series is found
  with ``ListMetrics`` (the one among those dimensions whose values name the workspace id, else
  the one with exactly those dimensions), read with ``GetMetricData`` (Maximum over 1-minute
  periods, the latest point of the last 15 minutes). With no datapoint, active series fall back
  to ``count({__name__=~".+"})`` on the workspace itself; ingestion rate is then unknown and not checked.

With ``check_capacity`` (what the AMP hook sets), two more checks (``core.quota``):

- the workspace's **current adaptive capacity**: ``core.ingest_limits.adaptive_capacity`` of the quota and the
  active series' average over the last 30 minutes (the same usage metric, ``Average`` over one 30-min period);
  with no datapoint the workspace's current series stand for that average (evidence ``capacity_from`` says so),
  so a fresh, empty workspace takes 2M;
- **Labels per metric series** (found by name like the others; when Service Quotas lists no such quota, AMP's
  documented 70, said so in the evidence) against the group's labels per series at most (the caller's count,
  ``group_label_count``: the label names of the group's series on the source plus the writer's external labels).

The verdict is ``core.quota.assess_quota``. Nothing is deployed when it refuses; an unreadable
quota refuses too (a check without data never passes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from promshift.adapters.amp import CREDENTIAL_ERRORS
from promshift.core.ingest_limits import ADAPTIVE_WINDOW_S, WorkspaceLimits, adaptive_capacity
from promshift.core.query_limits import QueryLimits
from promshift.core.quota import (
    DEFAULT_MAX_SHARE,
    NOTHING_PENDING,
    PendingSeries,
    QuotaAssessment,
    QuotaExceeded,
    assess_quota,
)

log = logging.getLogger(__name__)

SERVICE_CODE = "aps"
ACTIVE_SERIES = "Active series per workspace"
INGESTION_RATE = "Ingestion rate per workspace"
LABELS_PER_SERIES = "Labels per metric series"
USAGE_LOOKBACK = timedelta(minutes=15)


class QuotaUnavailable(RuntimeError):
    """A quota or its usage could not be read; the pre-flight refuses (one line, no secret)."""


@dataclass(frozen=True)
class UsageMetric:
    """The CloudWatch metric that counts a quota's use (a quota's ``UsageMetric``)."""

    namespace: str
    name: str
    dimensions: Mapping[str, str]
    statistic: str = "Maximum"


@dataclass(frozen=True)
class QuotaValue:
    """One quota as Service Quotas answered it."""

    code: str
    name: str
    value: float
    usage: UsageMetric | None
    level: str = field(default="")

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "name": self.name, "value": self.value, "level": self.level}


def _code_of(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str((response.get("Error") or {}).get("Code") or exc.__class__.__name__)


def _unavailable(exc: Exception, what: str) -> QuotaUnavailable:
    code = _code_of(exc)
    if code in CREDENTIAL_ERRORS:
        return QuotaUnavailable(f"quota pre-flight: {what}: AWS refused the credentials' signature ({code})")
    return QuotaUnavailable(f"quota pre-flight: {what}: {code}")


def _quota_value(raw: Mapping[str, Any]) -> QuotaValue:
    usage = raw.get("UsageMetric")
    metric = UsageMetric(str(usage["MetricNamespace"]), str(usage["MetricName"]),
                         dict(usage.get("MetricDimensions") or {}),
                         str(usage.get("MetricStatisticRecommendation") or "Maximum")) if usage else None
    return QuotaValue(code=str(raw["QuotaCode"]), name=str(raw.get("QuotaName") or raw["QuotaCode"]),
                      value=float(raw["Value"]), usage=metric, level=str(raw.get("QuotaAppliedAtLevel") or ""))


def read_quota(client: Any, name: str, *, workspace_arn: str | None = None, code: str | None = None) -> QuotaValue:
    """The ``aps`` quota called ``name`` (or with ``code``), for the workspace when it has its own value."""
    listed: QuotaValue | None = None
    if code is None:
        try:
            for page in client.get_paginator("list_service_quotas").paginate(ServiceCode=SERVICE_CODE):
                for raw in page.get("Quotas") or []:
                    if raw.get("QuotaName") == name:
                        listed = _quota_value(raw)
        except Exception as exc:
            raise _unavailable(exc, f"ListServiceQuotas({SERVICE_CODE})") from None
        if listed is None:
            raise QuotaUnavailable(f"quota pre-flight: Service Quotas has no {SERVICE_CODE} quota named {name!r}")
        code = listed.code
    params: dict[str, str] = {"ServiceCode": SERVICE_CODE, "QuotaCode": code}
    if workspace_arn:
        params["ContextId"] = workspace_arn
    try:
        return _quota_value(client.get_service_quota(**params)["Quota"])
    except Exception as exc:
        if listed is not None:
            log.info("resource-level %s unavailable (%s); using the account's value", name, _code_of(exc))
            return listed
        raise _unavailable(exc, f"GetServiceQuota({SERVICE_CODE}, {code})") from None


def workspace_usage(cloudwatch: Any, metric: UsageMetric, workspace_id: str, now: datetime) -> float | None:
    """The latest value of the usage metric for this workspace over the last 15 minutes, or None."""
    try:
        found: list[list[dict[str, str]]] = []
        filters = [{"Name": k, "Value": v} for k, v in metric.dimensions.items()]
        for page in cloudwatch.get_paginator("list_metrics").paginate(
                Namespace=metric.namespace, MetricName=metric.name, Dimensions=filters):
            found.extend(list(m.get("Dimensions") or []) for m in page.get("Metrics") or [])
    except Exception as exc:
        raise _unavailable(exc, f"ListMetrics({metric.namespace}/{metric.name})") from None
    ours = [dims for dims in found if any(d["Value"] == workspace_id for d in dims)]
    exact = [dims for dims in found if {d["Name"]: d["Value"] for d in dims} == dict(metric.dimensions)]
    chosen = (ours or exact or [None])[0]
    if chosen is None:
        return None
    try:
        answer = cloudwatch.get_metric_data(
            MetricDataQueries=[{"Id": "usage", "ReturnData": True, "MetricStat": {
                "Metric": {"Namespace": metric.namespace, "MetricName": metric.name, "Dimensions": chosen},
                "Period": 60, "Stat": metric.statistic}}],
            # A minute past now: a point published "now" by a clock a little ahead is still in range.
            StartTime=now - USAGE_LOOKBACK, EndTime=now + timedelta(minutes=1), ScanBy="TimestampDescending")
    except Exception as exc:
        raise _unavailable(exc, f"GetMetricData({metric.namespace}/{metric.name})") from None
    for result in answer.get("MetricDataResults") or []:
        points = sorted(zip(result.get("Timestamps") or [], result.get("Values") or [], strict=False))
        if points:
            return float(points[-1][1])
    return None


def workspace_usage_average(cloudwatch: Any, metric: UsageMetric, workspace_id: str, now: datetime) -> float | None:
    """The usage metric's average for this workspace over the last 30 minutes, or None without a datapoint."""
    if workspace_usage(cloudwatch, metric, workspace_id, now) is None:
        return None  # also finds the metric's dimensions; no point at all: nothing to average
    filters = [{"Name": k, "Value": v} for k, v in metric.dimensions.items()]
    try:
        found = [list(m.get("Dimensions") or []) for page in cloudwatch.get_paginator("list_metrics").paginate(
            Namespace=metric.namespace, MetricName=metric.name, Dimensions=filters) for m in page.get("Metrics") or []]
        ours = [dims for dims in found if any(d["Value"] == workspace_id for d in dims)] or found
        answer = cloudwatch.get_metric_data(
            MetricDataQueries=[{"Id": "avg", "ReturnData": True, "MetricStat": {
                "Metric": {"Namespace": metric.namespace, "MetricName": metric.name, "Dimensions": ours[0]},
                "Period": 60, "Stat": "Average"}}],
            StartTime=now - timedelta(seconds=ADAPTIVE_WINDOW_S), EndTime=now + timedelta(minutes=1))
    except Exception as exc:
        raise _unavailable(exc, f"GetMetricData({metric.namespace}/{metric.name}, Average)") from None
    values = [float(v) for result in answer.get("MetricDataResults") or [] for v in result.get("Values") or []]
    # Minutes with no point count as none: the average over the whole 30 min, as AMP's baseline.
    return sum(values) / (ADAPTIVE_WINDOW_S / 60) if values else None


def external_labels(config_text: str) -> dict[str, str]:
    """The writer's ``global.external_labels`` (Prometheus adds them to every remote-written series)."""
    from promshift.core.inputs import CONFIG, parse_yaml_bounded

    document = parse_yaml_bounded(config_text, CONFIG) or {}
    labels = ((document.get("global") or {}) if isinstance(document, dict) else {}).get("external_labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def group_label_count(label_names: list[str], external_labels: Mapping[str, str], drop_labels: tuple[str, ...] = ()
                      ) -> int:
    """Labels per series at most that the group's writes carry: the label names of its series on the source (their
    union: an upper bound) less the dropped ones, plus the writer's external labels it does not already have."""
    names = {n for n in label_names if n not in drop_labels} | set(external_labels)
    return len(names)


@dataclass
class QuotaPreflight:
    """Reads the numbers (see the module docstring) and asks ``core.quota.assess_quota``."""

    quotas: Any  # boto3 ``service-quotas`` client
    cloudwatch: Any  # boto3 ``cloudwatch`` client
    workspace_id: str
    workspace_arn: str
    # ``count({__name__=~".+"})`` on the workspace, used when CloudWatch has no datapoint yet.
    workspace_series_query: Callable[[], float | None] | None = None
    max_share: float = DEFAULT_MAX_SHARE
    quota_codes: Mapping[str, str] = field(default_factory=dict)
    # The workspace's current adaptive capacity and labels per series are checked too (module docstring).
    check_capacity: bool = False

    def _labels_limit(self, evidence: dict[str, Any]) -> int:
        try:
            quota = read_quota(self.quotas, LABELS_PER_SERIES, workspace_arn=self.workspace_arn,
                               code=self.quota_codes.get("labels_per_series"))
        except QuotaUnavailable as exc:
            if "has no aps quota named" not in str(exc):
                raise
            evidence["labels_limit_from"] = "AMP's documented default (Service Quotas lists no such quota)"
            return WorkspaceLimits().labels_per_series
        evidence["quotas"].append(quota.to_dict())
        evidence["labels_limit_from"] = "service quotas"
        return int(quota.value)

    def _capacity(self, quota: QuotaValue, current: float, now: datetime, evidence: dict[str, Any]) -> float:
        average = workspace_usage_average(self.cloudwatch, quota.usage, self.workspace_id, now) \
            if quota.usage else None
        evidence["capacity_from"] = "cloudwatch 30-min average"
        if average is None:
            average = current
            evidence["capacity_from"] = "no CloudWatch average: the workspace's current series taken as its average"
        evidence["series_average_30min"] = average
        return adaptive_capacity(quota.value, average)

    def assess(self, *, group_series: int, scrape_interval_s: float, now: datetime,
               pending: PendingSeries = NOTHING_PENDING, group_labels: int | None = None
               ) -> tuple[QuotaAssessment, dict[str, Any]]:
        """The assessment and its evidence (quota codes, where each usage number came from).

        ``pending``: what other groups reserved on this workspace (``core.quota.pending_on_workspace``).
        """
        series_quota = read_quota(self.quotas, ACTIVE_SERIES, workspace_arn=self.workspace_arn,
                                  code=self.quota_codes.get("active_series"))
        ingestion_quota = read_quota(self.quotas, INGESTION_RATE, workspace_arn=self.workspace_arn,
                                     code=self.quota_codes.get("ingestion_rate"))
        evidence: dict[str, Any] = {"quotas": [series_quota.to_dict(), ingestion_quota.to_dict()],
                                    "workspace_id": self.workspace_id}
        series = workspace_usage(self.cloudwatch, series_quota.usage, self.workspace_id, now) \
            if series_quota.usage else None
        evidence["workspace_series_from"] = "cloudwatch"
        if series is None and self.workspace_series_query is not None:
            series = self.workspace_series_query()
            evidence["workspace_series_from"] = "workspace query count({__name__=~\".+\"})"
            series = 0.0 if series is None else series  # an empty workspace answers no series at all
        if series is None:
            raise QuotaUnavailable(f"quota pre-flight: no usage of {ACTIVE_SERIES!r} for workspace "
                                   f"{self.workspace_id} in CloudWatch and no workspace query to fall back on")
        rate = workspace_usage(self.cloudwatch, ingestion_quota.usage, self.workspace_id, now) \
            if ingestion_quota.usage else None
        evidence["workspace_ingestion_rate_from"] = "cloudwatch" if rate is not None else "unknown (not checked)"
        capacity = self._capacity(series_quota, series, now, evidence) if self.check_capacity else None
        labels = (group_labels, self._labels_limit(evidence)) \
            if self.check_capacity and group_labels is not None else None
        assessment = assess_quota(group_series=group_series, workspace_series=series,
                                  series_limit=series_quota.value, scrape_interval_s=scrape_interval_s,
                                  workspace_ingestion_rate=rate, ingestion_limit=ingestion_quota.value,
                                  max_share=self.max_share, pending=pending, series_capacity=capacity, labels=labels)
        return assessment, evidence

    def require(self, *, group_series: int, scrape_interval_s: float, now: datetime,
                pending: PendingSeries = NOTHING_PENDING, group_labels: int | None = None) -> dict[str, Any]:
        """The audit's ``deploy.quota`` when the group fits; QuotaExceeded (nothing deployed) when it does not."""
        assessment, evidence = self.assess(group_series=group_series, scrape_interval_s=scrape_interval_s, now=now,
                                           pending=pending, group_labels=group_labels)
        if not assessment.ok:
            raise QuotaExceeded(assessment, evidence)
        return {**assessment.to_dict(), **evidence}


# The workspace's per-query limits ("AMP_quotas": the query limits; "AMP-troubleshooting": a query over them is
# answered 422). Found by these names in Service Quotas' ``aps`` listing when it lists them; a limit it does not
# list comes from the connection's ``extra.query_limits``, else the documented default below. A configured value
# wins: it is the operator's word (e.g. the query-samples-processed error threshold they set on the workspace).
QUERY_LIMIT_QUOTAS = {
    "max_samples": "Query samples per query",
    "max_series": "Query series fetched per query",
    "max_chunks": "Query chunks fetched per query",
    "max_range_s": "Query time range",
}
# AMP's documented defaults (user guide ``AMP_quotas``; DESIGN.md's "facts for the field conditions"): 50M
# samples per query (Prometheus' engine default, which AMP keeps), 20M chunks per query, 32 days of time range,
# a query past about a minute answered 422.
AMP_QUERY_DEFAULTS: dict[str, float] = {"max_samples": 50_000_000, "max_chunks": 20_000_000,
                                        "max_range_s": 32 * 86_400.0, "timeout_s": 60.0}


def read_query_limits(client: Any, *, configured: Mapping[str, Any] | None = None,
                      defaults: Mapping[str, float] = AMP_QUERY_DEFAULTS,
                      names: Mapping[str, str] = QUERY_LIMIT_QUOTAS) -> QueryLimits:
    """The workspace's per-query limits: configured, else Service Quotas (by name), else AMP's defaults; each
    with where it came from. An unreadable listing leaves the configured and default values (a refusal for size
    is still split and asked again, so a limit read too high costs a retry, never a verdict)."""
    configured = dict(configured or {})
    unknown = set(configured) - {"max_samples", "max_series", "max_chunks", "max_range_s", "timeout_s"}
    if unknown:
        raise ValueError(f"query_limits: unknown keys {sorted(unknown)}")
    listed: dict[str, float] = {}
    why = "service quotas"
    if client is not None:
        try:
            wanted = {name: key for key, name in names.items()}
            for page in client.get_paginator("list_service_quotas").paginate(ServiceCode=SERVICE_CODE):
                for raw in page.get("Quotas") or []:
                    if raw.get("QuotaName") in wanted:
                        listed[wanted[raw["QuotaName"]]] = float(raw["Value"])
        except Exception as exc:
            why = f"AMP default (Service Quotas unreadable: {_code_of(exc)})"
            log.info("query limits: %s", why)
    values: dict[str, Any] = {}
    source: dict[str, str] = {}
    for key in ("max_samples", "max_series", "max_chunks", "max_range_s", "timeout_s"):
        for origin, found in (("configuration", configured), ("service quotas", listed), ("AMP default", defaults)):
            if found.get(key) is not None:
                values[key], source[key] = float(found[key]), origin if origin != "AMP default" else (
                    why if why != "service quotas" else origin)
                break
    ints = {k: int(values[k]) if k in values else None for k in ("max_samples", "max_series", "max_chunks")}
    return QueryLimits(**ints, max_range_s=values.get("max_range_s"), timeout_s=values.get("timeout_s"),
                       source=source)
