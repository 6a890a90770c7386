"""AMP's data-plane limits as pure rules: what a workspace refuses on write and on query, and its adaptive capacity.

The numbers and the refusal texts are AMP's documented ones ("Amazon Managed Service for Prometheus service
quotas", "Troubleshoot Amazon Managed Service for Prometheus errors" and "Configure your workspace", AMP user
guide; the table with each source is in docs/local-stack.md). Each discard has a ``reason``: the name AMP's
Cortex-based ingestion gives it, the key of the ``DiscardedSamples`` counts (``REASONS``).

Used twice: by the lab's strict workspace (``promshift.local.stack.amp_ingest``), which refuses what AMP refuses,
and by the quota pre-flight (``core.quota``), which refuses a group the workspace would throttle. No clock here:
every time is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# Discard reasons (Cortex's ``discarded_samples_total{reason}`` names, which AMP's DiscardedSamples carries), and
# the words a verdict uses for each.
TOO_OLD = "sample-out-of-bounds"
OUT_OF_ORDER = "sample-out-of-order"
DUPLICATE = "new-value-for-timestamp"
TOO_MANY_LABELS = "max_label_names_per_series"
LABEL_NAME_TOO_LONG = "label_name_too_long"
LABEL_VALUE_TOO_LONG = "label_value_too_long"
RATE_LIMITED = "rate_limited"
SERIES_LIMIT = "per_user_series_limit"
LABEL_SET_LIMIT = "per_labelset_series_limit"
REQUEST_TOO_LARGE = "request_too_large"
TOO_MANY_HA_CLUSTERS = "too_many_ha_clusters"
REASONS = {
    TOO_OLD: "too old (older than the newest sample by more than the out-of-order window and the 1 h head)",
    OUT_OF_ORDER: "out of order",
    DUPLICATE: "duplicate timestamp with another value",
    TOO_MANY_LABELS: "too many labels per series",
    LABEL_NAME_TOO_LONG: "label name too long",
    LABEL_VALUE_TOO_LONG: "label value too long",
    RATE_LIMITED: "ingestion rate limit",
    SERIES_LIMIT: "active series limit",
    LABEL_SET_LIMIT: "label-set series limit",
    REQUEST_TOO_LARGE: "request too large",
    TOO_MANY_HA_CLUSTERS: "too many HA clusters",
}
# HA pairs ("Deduplicating high availability metrics sent to Amazon Managed Service for Prometheus", AMP user
# guide): series labelled ``cluster`` + ``__replica__`` are deduplicated; one replica per cluster is kept (the
# leader), the others' samples dropped (not discarded: accepted and not stored), and another replica takes over
# once the leader has sent nothing for HA_FAILOVER_S. ``__replica__`` is not stored.
HA_CLUSTER_LABEL, HA_REPLICA_LABEL = "cluster", "__replica__"
HA_FAILOVER_S = 30.0

MB = 1024 * 1024
# How far behind the workspace's newest sample an in-order sample may still be appended (the TSDB head's
# appendable window: half its 2 h block range).
HEAD_WINDOW_S = 3600.0
# "A series is active if a sample has been reported in the past 2 hours" (AMP_quotas).
ACTIVE_SERIES_WINDOW_S = 7200.0
# "Capacity from 2M to <quota> is automatically adjusted based on the last 30 min of usage" (AMP_quotas).
ADAPTIVE_FLOOR = 2_000_000.0
ADAPTIVE_WINDOW_S = 1800.0
ADAPTIVE_GROWTH = 2.0


@dataclass(frozen=True)
class WorkspaceLimits:
    """One workspace's data-plane limits; the defaults are AMP's documented defaults (docs/local-stack.md)."""

    active_series: float = 10_000_000.0  # Service Quotas "Active series per workspace"
    ingestion_rate: float = 170_000.0  # "Ingestion rate per workspace", samples/s
    ingestion_burst: float = 1_000_000.0  # "Ingestion burst size per workspace", samples
    labels_per_series: int = 70  # "Labels per metric series"
    label_name_length: int = 1024
    label_value_length: int = 2048
    request_bytes: int = MB  # "Remote write request size" (the uncompressed WriteRequest)
    out_of_order_window_s: float = 60.0  # workspace configuration outOfOrderTimeWindowInSeconds (default 60 s)
    query_samples: int = 50_000_000  # "Query samples" per query
    query_series: int = 12_000_000  # series fetched per query (documented; not enforced locally, docs/local-stack.md)
    query_range_s: float = 32 * 86400.0  # "Query time range"
    query_timeout_s: float = 60.0  # "a query past about a minute answered 422" (issue 35; AMP-troubleshooting, 422)
    ha_clusters: int = 500  # "Maximum HA clusters" (AMP_quotas), not adjustable
    # The adaptive capacity's floor: "from 2M" (AMP_quotas); tests set a small one.
    series_floor: float = 2_000_000.0
    # The workspace configuration's limitsPerLabelSet: ((label set, maxSeries), ...); maxSeries 0 = no limit.
    label_set_limits: tuple[tuple[tuple[tuple[str, str], ...], int], ...] = ()

    def with_values(self, values: Mapping[str, Any]) -> WorkspaceLimits:
        """These limits with the known keys of ``values`` replaced (a Service Quotas / configuration answer)."""
        known = {k: type(getattr(self, k))(v) for k, v in values.items()
                 if k in self.__dataclass_fields__ and k != "label_set_limits" and v is not None}
        return replace(self, **known)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "label_set_limits"} | {
            "label_set_limits": [{"labelSet": dict(ls), "maxSeries": n} for ls, n in self.label_set_limits]}


def label_set_limits(entries: Iterable[Mapping[str, Any]]) -> tuple[tuple[tuple[tuple[str, str], ...], int], ...]:
    """``limitsPerLabelSet`` of a workspace configuration as WorkspaceLimits keeps it."""
    out = []
    for entry in entries:
        labels = tuple(sorted((str(k), str(v)) for k, v in (entry.get("labelSet") or {}).items()))
        out.append((labels, int((entry.get("limits") or {}).get("maxSeries") or 0)))
    return tuple(out)


def adaptive_capacity(quota: float, average_30min: float, *, floor: float = ADAPTIVE_FLOOR) -> float:
    """Active series the workspace takes now: double its average of the last 30 min, at least 2M, at most the quota.

    AMP_quotas, "Active series default": capacity adapts from 2M up to the quota on the last 30 minutes of
    usage, up to double the previous baseline; growth past double that baseline within 30 min is throttled."""
    if quota <= 0:
        raise ValueError(f"the active-series quota must be > 0, got {quota}")
    return min(float(quota), max(min(floor, float(quota)), ADAPTIVE_GROWTH * max(0.0, float(average_30min))))


def series_text(labels: Sequence[tuple[str, str]]) -> str:
    """``name{a="b", ...}`` of a label list (for messages and a verdict's sample series)."""
    name = next((v for k, v in labels if k == "__name__"), "")
    rest = ", ".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
    return f"{name}{{{rest}}}"


def label_problem(labels: Sequence[tuple[str, str]], limits: WorkspaceLimits) -> tuple[str, str] | None:
    """(reason, AMP's message) when a series' labels are refused, else None (validated as AMP's distributor does)."""
    if len(labels) > limits.labels_per_series:
        return TOO_MANY_LABELS, (f"series has too many labels (actual: {len(labels)}, limit: "
                                 f"{limits.labels_per_series}) series: '{series_text(labels)}'")
    metric = next((v for k, v in labels if k == "__name__"), "")
    for name, value in labels:
        if len(name) > limits.label_name_length:
            return LABEL_NAME_TOO_LONG, f"label name too long: {name[:200]!r} metric: {metric[:200]!r}"
        if len(value) > limits.label_value_length:
            return LABEL_VALUE_TOO_LONG, (f"label value too long: {value[:200]!r} label: {name[:200]!r} "
                                          f"metric: {metric[:200]!r}")
    return None


@dataclass
class HaTracker:
    """The elected replica per HA cluster and when it last sent (``ha_judge``)."""

    leaders: dict[str, tuple[str, float]] = field(default_factory=dict)


def ha_judge(labels: Sequence[tuple[str, str]], tracker: HaTracker, now: float, limits: WorkspaceLimits
             ) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(``keep`` | ``dedupe`` | ``too_many``, the labels to store) of a series: series without both HA labels are
    kept as they are; the leader's are kept without ``__replica__``; another replica's are dropped while the leader
    sends, and take over once it has been silent for HA_FAILOVER_S."""
    have = dict(labels)
    cluster, replica = have.get(HA_CLUSTER_LABEL), have.get(HA_REPLICA_LABEL)
    if cluster is None or replica is None:
        return "keep", tuple(labels)
    stored = tuple(kv for kv in labels if kv[0] != HA_REPLICA_LABEL)
    leader = tracker.leaders.get(cluster)
    if leader is None and len(tracker.leaders) >= limits.ha_clusters:
        return "too_many", stored
    if leader is None or leader[0] == replica or now - leader[1] > HA_FAILOVER_S:
        tracker.leaders[cluster] = (replica, now)
        return "keep", stored
    return "dedupe", stored


@dataclass(frozen=True)
class SampleVerdict:
    """One sample against its series' last sample: accepted, ignored (an identical duplicate) or refused."""

    accepted: bool
    reason: str = ""
    message: str = ""
    ignored: bool = False


def judge_sample(t_ms: int, value: float, *, last: tuple[int, float] | None, newest_ms: int | None,
                 limits: WorkspaceLimits) -> SampleVerdict:
    """A sample at ``t_ms`` of a series whose last accepted sample is ``last`` (t, value), in a workspace whose newest
    sample is at ``newest_ms``.

    - the same timestamp: the same value is ignored (Prometheus's TSDB), another value is refused (duplicate);
    - older than the series' last sample: accepted within the out-of-order window behind ``newest_ms``, else refused
      (out of order);
    - newer: refused when more than max(the out-of-order window, the 1 h head) behind ``newest_ms`` (too old)."""
    window_ms = int(limits.out_of_order_window_s * 1000)
    if last is not None and t_ms == last[0]:
        if value == last[1] or (value != value and last[1] != last[1]):
            return SampleVerdict(True, ignored=True)
        return SampleVerdict(False, DUPLICATE, "duplicate sample for timestamp")
    if last is not None and t_ms < last[0]:
        if window_ms > 0 and newest_ms is not None and t_ms >= newest_ms - window_ms:
            return SampleVerdict(True)
        return SampleVerdict(False, OUT_OF_ORDER, "out of order sample")
    bound_ms = max(window_ms, int(HEAD_WINDOW_S * 1000))
    if newest_ms is not None and t_ms < newest_ms - bound_ms:
        return SampleVerdict(False, TOO_OLD, "out of bounds")
    return SampleVerdict(True)


@dataclass
class TokenBucket:
    """Ingestion rate and burst: ``rate`` samples/s refill, at most ``burst`` held; a request takes all it needs
    or nothing (AMP refuses the whole request with 429)."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float = 0.0

    def take(self, n: int, now: float) -> bool:
        if self.tokens < 0:
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        if n > self.tokens:
            return False
        self.tokens -= n
        return True


def rate_limit_message(rate: float, samples: int, metadata: int = 0) -> str:
    return f"ingestion rate limit ({rate:g}) exceeded while adding {samples} samples and {metadata} metadata"


def series_limit_message(limit: float) -> str:
    return f"per-user series limit of {limit:.0f} exceeded, please contact administrator to raise it"


def label_set_limit_message(labels: Sequence[tuple[str, str]], limit: int) -> str:
    shown = ", ".join(f'{k}="{v}"' for k, v in labels)
    return f"per-labelset series limit of {limit} exceeded (labelSet: {{{shown}}}), please contact administrator"


@dataclass(frozen=True)
class QueryProblem:
    """A query AMP answers 422, with its message."""

    reason: str
    message: str


def query_range_problem(start_s: float, end_s: float, limits: WorkspaceLimits) -> QueryProblem | None:
    length = end_s - start_s
    if length > limits.query_range_s:
        return QueryProblem("query_range", f"the query time range exceeds the limit (query length: "
                                           f"{length / 3600:.0f}h, limit: {limits.query_range_s / 3600:.0f}h)")
    return None


def query_samples_problem(samples: float, limits: WorkspaceLimits) -> QueryProblem | None:
    if samples > limits.query_samples:
        return QueryProblem("query_samples", "query processing would load too many samples into memory in query "
                                             f"execution ({samples:.0f} samples, limit {limits.query_samples})")
    return None


def query_timeout_problem(elapsed_s: float, limits: WorkspaceLimits) -> QueryProblem | None:
    if elapsed_s > limits.query_timeout_s:
        return QueryProblem("query_timeout", "query timed out in query execution")
    return None


@dataclass
class DiscardCounts:
    """Discarded samples by reason and one example series per reason (what AMP's DiscardedSamples counts)."""

    counts: dict[str, float] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, n: float, example: str = "") -> None:
        self.counts[reason] = self.counts.get(reason, 0.0) + n
        if example and reason not in self.examples:
            self.examples[reason] = example

    def total(self) -> float:
        return sum(self.counts.values())


def describe_discards(counts: Mapping[str, float], example: str = "") -> str:
    """One line: ``12 too old (sample-out-of-bounds), 3 out of order (sample-out-of-order); e.g. series X``."""
    parts = [f"{n:,.0f} {REASONS.get(reason, reason)} ({reason})"
             for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n > 0]
    return ", ".join(parts) + (f"; e.g. series {example}" if example and parts else "")
