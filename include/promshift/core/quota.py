"""Quota pre-flight maths: would moving a group push the AMP workspace past a share of its quotas?

Two quotas matter when a group starts writing to a workspace ("Amazon Managed Service for
Prometheus service quotas", AMP user guide): **Active series per workspace** and **Ingestion
rate per workspace** (samples per second). The workspace's current use of each is what AMP
publishes to CloudWatch (``AWS/Usage``, metric ``ResourceCount``, resources ``ActiveSeries`` and
``IngestionRate``: "Use CloudWatch metrics to monitor Amazon Managed Service for Prometheus
resources", AMP user guide). The group adds its own active series (``count(<selector>)`` on the
source) and, scraped every ``scrape_interval_s``, that many samples per interval.

A group is refused when either sum would exceed ``max_share`` of its quota (default 80 %),
so the workspace keeps headroom for growth and for the churn of a rollout. It is refused too when the
active series would outrun the workspace's **current capacity** (AMP's adaptive rule, ``core.ingest_limits.
adaptive_capacity``: double its average of the last 30 min, from 2M up to the quota; a first wave of more
than 2M series onto a fresh workspace is throttled even under its quota), and when the group's series carry
more labels than **Labels per metric series** allows (every such series would be refused). The refusal names
the numbers and how many series the workspace takes now, so a wave can start its groups in steps.

Several groups (from several clusters) may move onto one workspace, in one wave, at once. The
workspace's published usage lags (CloudWatch; a managed collector writes only once it is ACTIVE,
minutes later), so each pre-flight also counts the groups whose pre-flight on the **same
workspace** passed within ``RESERVATION_WINDOW_S`` (their ``quota_reserved`` audit events) and
that have not failed or rolled back since: the sum is per target workspace, not per group. Until
the window ends a reserved group may be counted twice (reserved, and in the usage once it writes):
the error is on the refusing side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from promshift.core.audit import AuditEvent
from promshift.core.events import EventKind

DEFAULT_MAX_SHARE = 0.8
# How long a passed pre-flight keeps its series reserved on the workspace for the pre-flights after it.
RESERVATION_WINDOW_S = 1800.0
# A reservation ends early when its group's deploy failed or was rolled back after it.
_RELEASES = (EventKind.DEPLOY_FAILED, EventKind.ROLLED_BACK, EventKind.ROLLBACK_NOT_NEEDED, EventKind.QUOTA_REFUSED)


class QuotaExceeded(RuntimeError):
    """Moving the group would push the workspace past the allowed share of a quota; nothing was deployed."""

    def __init__(self, assessment: QuotaAssessment, evidence: Mapping[str, Any] | None = None) -> None:
        super().__init__(assessment.reason)
        self.assessment = assessment
        self.evidence = {**assessment.to_dict(), **(evidence or {})}


@dataclass(frozen=True)
class QuotaUse:
    """One quota: what the workspace uses now, what the group adds, and the quota itself."""

    name: str
    current: float
    added: float
    limit: float
    # What other groups reserved on the workspace and its usage may not show yet.
    pending: float = 0.0

    @property
    def share(self) -> float:
        """Share of the quota used once the group is added (0.85 = 85 %)."""
        return (self.current + self.pending + self.added) / self.limit

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "current": self.current, "pending": self.pending, "added": self.added,
                "limit": self.limit, "share": round(self.share, 6)}


@dataclass(frozen=True)
class QuotaAssessment:
    """The pre-flight's answer: ok or not, the one-line reason, and the numbers behind it."""

    ok: bool
    reason: str
    series: QuotaUse
    ingestion: QuotaUse | None
    max_share: float
    pending_groups: tuple[str, ...] = ()
    # The workspace's current adaptive capacity (active series), when known.
    capacity: float | None = None
    # (the group's labels per series at most, the workspace's limit), when known.
    labels: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The audit's ``deploy.quota``: ``{group_series, workspace_series, pending_series, limit, share, ...}``."""
        data: dict[str, Any] = {
            "ok": self.ok, "reason": self.reason, "group_series": int(self.series.added),
            "workspace_series": int(self.series.current), "pending_series": int(self.series.pending),
            "pending_groups": list(self.pending_groups), "limit": self.series.limit,
            "share": round(self.series.share, 6), "max_share": self.max_share,
        }
        if self.ingestion is not None:
            data["ingestion"] = self.ingestion.to_dict()
        if self.capacity is not None:
            data["capacity"] = self.capacity
        if self.labels is not None:
            data["labels_per_series"] = {"group": self.labels[0], "limit": self.labels[1]}
        return data


@dataclass(frozen=True)
class PendingSeries:
    """What other groups reserved on one workspace: their series (in total) and their names."""

    series: int = 0
    groups: tuple[str, ...] = ()


# Nothing reserved by other groups: the default of the pre-flights.
NOTHING_PENDING = PendingSeries()


def pending_on_workspace(events: Iterable[AuditEvent], *, workspace: str, group: str, now: datetime,
                         window_s: float = RESERVATION_WINDOW_S) -> PendingSeries:
    """The series other groups reserved on ``workspace`` (their last ``quota_reserved``) in the ``window_s``
    before ``now``, unless their deploy failed or rolled back after it. ``events``: the audit log, any order."""
    latest: dict[str, AuditEvent] = {}
    released: dict[str, datetime] = {}
    for event in events:
        if event.group == group:
            continue
        if event.kind == EventKind.QUOTA_RESERVED:
            data = event.evidence_data or {}
            if data.get("workspace_id") != workspace:
                continue
            if event.group not in latest or event.at >= latest[event.group].at:
                latest[event.group] = event
        elif event.kind in _RELEASES:
            released[event.group] = max(event.at, released.get(event.group, event.at))
    total, names = 0, []
    for name, event in sorted(latest.items()):
        age_s = (now - event.at).total_seconds()
        if age_s > window_s or (name in released and released[name] >= event.at):
            continue
        total += int((event.evidence_data or {}).get("group_series") or 0)
        names.append(name)
    return PendingSeries(total, tuple(names))


def assess_quota(*, group_series: int, workspace_series: float, series_limit: float, scrape_interval_s: float,
                 workspace_ingestion_rate: float | None = None, ingestion_limit: float | None = None,
                 max_share: float = DEFAULT_MAX_SHARE, pending: PendingSeries = NOTHING_PENDING,
                 series_capacity: float | None = None, labels: tuple[int, int] | None = None) -> QuotaAssessment:
    """Refuse the group when the workspace would use more than ``max_share`` of either quota.

    ``pending``: series other groups reserved on the same workspace (``pending_on_workspace``), added
    to its current use. Ingestion is checked only when both its current rate and its quota are known.
    A group with no series is refused too: there is nothing to move, and a check without data never passes.
    ``series_capacity``: the active series the workspace takes now (``adaptive_capacity``); ``labels``: the
    group's labels per series at most and the workspace's limit. Each is checked when given.
    """
    if not 0 < max_share <= 1:
        raise ValueError(f"max_share must be in (0, 1], got {max_share}")
    if series_limit <= 0:
        raise ValueError(f"the active-series quota must be > 0, got {series_limit}")
    if scrape_interval_s <= 0:
        raise ValueError(f"scrape_interval_s must be > 0, got {scrape_interval_s}")
    if workspace_series < 0 or group_series < 0:
        raise ValueError("series counts cannot be negative")
    if pending.series < 0:
        raise ValueError("pending series cannot be negative")
    series = QuotaUse("active series", float(workspace_series), float(group_series), float(series_limit),
                      float(pending.series))
    ingestion = None
    if workspace_ingestion_rate is not None and ingestion_limit is not None:
        if ingestion_limit <= 0:
            raise ValueError(f"the ingestion-rate quota must be > 0, got {ingestion_limit}")
        ingestion = QuotaUse("ingestion rate (samples/s)", float(workspace_ingestion_rate),
                             group_series / scrape_interval_s, float(ingestion_limit),
                             pending.series / scrape_interval_s)
    extra = {"capacity": series_capacity, "labels": labels}
    if group_series == 0:
        return QuotaAssessment(False, "the group has no active series on the source; nothing to check or move",
                               series, ingestion, max_share, pending.groups, **extra)
    if labels is not None and labels[0] > labels[1]:
        return QuotaAssessment(False, f"quota pre-flight refused: the group's series carry up to {labels[0]} labels "
                                      f"(with the writer's external labels), over the workspace's {labels[1]} labels "
                                      "per series: AMP would refuse every such series; drop labels or raise the quota",
                               series, ingestion, max_share, pending.groups, **extra)
    total = series.current + series.pending + series.added
    if series_capacity is not None and total > series_capacity:
        room = max(0.0, series_capacity - series.current - series.pending)
        return QuotaAssessment(False, f"quota pre-flight refused: active series would reach {total:,.0f}, past the "
                                      f"workspace's current capacity of {series_capacity:,.0f} (AMP's adaptive "
                                      f"capacity: double its 30-min average, from 2M up to the quota of "
                                      f"{series.limit:,.0f}); it takes {room:,.0f} more series now: start the "
                                      "wave's groups in steps, or wait for the capacity to grow",
                               series, ingestion, max_share, pending.groups, **extra)
    for use in (series, ingestion):
        if use is not None and use.share > max_share:
            others = (f" + {use.pending:,.0f} reserved by {', '.join(pending.groups)} on this workspace"
                      if use.pending else "")
            reason = (f"quota pre-flight refused: {use.name} would reach {use.share:.1%} of the workspace quota "
                      f"({use.current:,.0f} now{others} + {use.added:,.0f} for the group > {max_share:.0%} of "
                      f"{use.limit:,.0f}); raise the quota or move a smaller group")
            return QuotaAssessment(False, reason, series, ingestion, max_share, pending.groups, **extra)
    parts = [f"{use.name} {use.share:.1%}" for use in (series, ingestion) if use is not None]
    also = f", counting {', '.join(pending.groups)} reserved on this workspace" if pending.groups else ""
    text = f"quota pre-flight passed: {', '.join(parts)} of quota (limit {max_share:.0%}{also})"
    if series_capacity is not None:
        text += f"; {total:,.0f} of a current capacity of {series_capacity:,.0f} series"
    if labels is not None:
        text += f"; up to {labels[0]} of {labels[1]} labels per series"
    return QuotaAssessment(True, text, series, ingestion, max_share, pending.groups, **extra)
