"""The catalog's typed, immutable models and the error that lists every problem."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import re2

from promshift.core.catalog.regex import _compile_re2
from promshift.core.promql import promql_string

ParityMode = Literal["dual_write", "independent_scraper"]
PARITY_MODES: tuple[str, ...] = ("dual_write", "independent_scraper")
# Whether the source and the target compute PromQL with the same engine (Prometheus and AMP, which runs
# Prometheus' engine) or not (e.g. VictoriaMetrics): different engines round some functions differently.
PARITY_ENGINES: tuple[str, ...] = ("same", "different")
# What the latency probe asks for in Accept-Encoding: "identity" times the query (engine,
# JSON, transfer) and not the server's gzip; "gzip" times what Grafana sees, compression included.
PROBE_ENCODINGS: tuple[str, ...] = ("identity", "gzip")
# How a group's owners are told that a human is needed (approval) or that a run rolled back.
# "none" (the default) sends nothing; "smtp" and "ses" mail ``to``; "sns" publishes to ``topic_arn``;
# "slack" posts to the incoming webhook of ``slack_conn`` (an Airflow connection, else the deployment's).
NOTIFY_CHANNELS: tuple[str, ...] = ("none", "smtp", "sns", "slack", "ses")

CATALOG_VERSION = 1
# The Airflow connections a group reads from and writes to when the catalog names none: one source
# Prometheus and one target workspace for every group, as before per-group connections.
DEFAULT_SOURCE_CONN = "promshift_source"
DEFAULT_TARGET_CONN = "promshift_target"
# An Airflow connection id (airflow.utils.helpers.validate_key's characters); at most 90 characters so
# the DAG tags ``source:<id>`` and ``target:<id>`` fit Airflow's 100-character tag limit.
CONN_ID_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
CONN_ID_MAX_LENGTH = 100 - len("source:") - 3
# One migration DAG per target workspace connection: its latency probes share that workspace's pool.
MIGRATION_DAG_PREFIX = "promshift__migrate__"


def migration_dag_id(target_conn_id: str) -> str:
    """The DAG migrating every group whose target is connection ``target_conn_id`` (its characters are a DAG
    id's: ``CONN_ID_PATTERN``)."""
    return MIGRATION_DAG_PREFIX + target_conn_id


GROUP_NAME_PATTERN = r"[a-z][a-z0-9-]*"
METRIC_NAME_PATTERN = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_NAME_PATTERN = r"[a-zA-Z_][a-zA-Z0-9_]*"

_GROUP_NAME_RE = re.compile(GROUP_NAME_PATTERN)
_METRIC_NAME_RE = re.compile(METRIC_NAME_PATTERN)
_LABEL_NAME_RE = re.compile(LABEL_NAME_PATTERN)
_CONN_ID_RE = re.compile(CONN_ID_PATTERN)


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class WarmupPolicy:
    """How long a group dual-writes before parity runs, and when to give up.

    The warm-up lasts ``duration_s``; it fails if remote-write lag has not
    stayed under ``max_lag_s`` by ``timeout_s``. Lag is polled every
    ``poll_interval_s`` from a deferred trigger (no worker slot held).
    """

    duration_s: float = 1800.0
    timeout_s: float = 7200.0
    max_lag_s: float = 60.0
    poll_interval_s: float = 30.0


@dataclass(frozen=True)
class ParityPolicy:
    """How the source and target copies of a group are compared.

    ``dual_write`` (same Prometheus writes both sides) must match to ~1e-9;
    ``independent_scraper`` (a managed collector scrapes on its own clock)
    needs step-grid alignment and looser tolerances. Raw samples are compared
    on ``sample_hosts`` hosts picked deterministically from ``seed`` (None
    lets the caller derive one, e.g. from the group and the window). Samples
    newer than ``skip_recent_s`` are skipped for ingestion lag.
    ``ignore_labels``/``rename_labels`` normalise external labels;
    ``rename_labels`` is a tuple of (from, to) pairs. The limits follow Argo
    Rollouts: a check fails once more than ``failure_limit`` measurements
    failed, is inconclusive beyond ``inconclusive_limit``, and errors after
    more than ``consecutive_error_limit`` errors in a row.
    """

    mode: ParityMode = "dual_write"
    # "different": the pair's engines round some function families differently (``core.parity.ENGINE_ROUNDING``).
    engines: str = "same"
    sample_hosts: int = 5
    # Hosts compared per mapped task: more workers share a large check.
    hosts_per_shard: int = 8
    seed: str | None = None
    skip_recent_s: float = 120.0
    step_s: float = 30.0
    abs_tolerance: float = 1e-9
    rel_tolerance: float = 1e-9
    ignore_labels: tuple[str, ...] = ("cluster", "__replica__", "prometheus_replica")
    rename_labels: tuple[tuple[str, str], ...] = ()
    # Grafana dashboards (files or folders of *.json, relative to the catalog file) whose queries
    # on this group are compared result by result, with template variables from golden_variables.
    golden_dashboards: tuple[str, ...] = ()
    golden_variables: tuple[tuple[str, str], ...] = ()
    # Without any golden query a group has no golden layer (reported as such); required: INCONCLUSIVE.
    golden_required: bool = False
    max_missing_series_ratio: float = 0.0
    failure_limit: int = 0
    inconclusive_limit: int = 0
    consecutive_error_limit: int = 3


@dataclass(frozen=True)
class LatencyWindow:
    """One query range (``seconds`` long) and the p95 latency it must meet."""

    name: str
    seconds: float
    slo_p95_s: float


@dataclass(frozen=True)
class LatencyPolicy:
    """Golden queries timed on both sides over each window.

    Each query runs ``repeats`` source/target pairs per round per window with a
    ``timeout_s`` budget (timeouts, 422/429 and partial results count as
    failures, not slow successes). The target's p95 must meet each window's
    SLO and be at most ``max_slowdown_ratio`` times the source's p95, each
    judged by a bootstrap interval at ``confidence``; a window whose interval
    straddles gets another round, up to ``max_rounds`` (the probe budget, with
    ``deadline_s``), then stays INCONCLUSIVE.
    """

    repeats: int = 5
    confidence: float = 0.95
    max_rounds: int = 4
    timeout_s: float = 60.0
    max_slowdown_ratio: float = 1.2
    # Below this absolute difference a slower target is noise, not a regression
    # (millisecond queries jitter by more than 20 %).
    slowdown_floor_s: float = 0.25
    # The whole probe (every window, query and repeat) stops here; what is left is INCONCLUSIVE.
    deadline_s: float = 900.0
    # At most this many probe queries in flight on each backend at once (1 = strictly sequential,
    # the most faithful timing; more finishes sooner but the queries then compete for the backend).
    max_concurrency: int = 1
    accept_encoding: str = "identity"
    # For the query-cost projection: every viewer's dashboard re-runs the golden queries this often.
    dashboard_refresh_s: float = 60.0
    dashboard_viewers: int = 5
    # The target's retention (AMP's default): storage cost, and the longest window the probe asks
    # of a target that does not report its own retention (AMP has no status/runtimeinfo).
    retention_s: float = 150 * 86_400.0
    # A probe answer bigger than this (bytes, decompressed) is a failed run, refused while it streams in.
    max_answer_bytes: int = 64 * 2**20
    windows: tuple[LatencyWindow, ...] = ()
    queries: tuple[str, ...] = ()


@dataclass(frozen=True)
class BakePolicy:
    """How a cut-over group is watched before it may be decommissioned (the ``promshift__bake_watch`` DAG).

    Every ``interval_s`` the group's target copy is checked: the newest sample is at most
    ``max_staleness_s`` old, the source's remote-write lag for the group's queue is at most
    ``max_lag_s``, the target holds the source's series count within ``series_tolerance`` (a ratio),
    and a parity window of ``parity_window_s`` on the golden queries passes. After ``period_s`` of clean
    checks the group is ``baked``; one failed check returns its reads to the source (``rolled_back_reads``).
    """

    interval_s: float = 900.0
    period_s: float = 86400.0
    max_staleness_s: float = 300.0
    max_lag_s: float = 120.0
    series_tolerance: float = 0.01
    parity_window_s: float = 600.0


@dataclass(frozen=True)
class NotifyPolicy:
    """Where a group's notifications go (approval needed, rolled back): the channel and its address.

    ``channel`` "none" is off. ``to`` (email addresses) is what "smtp" and "ses" send to; ``topic_arn``
    (an SNS topic) is what "sns" publishes to; ``slack_conn`` (an Airflow connection id of conn type
    ``slackwebhook``: one incoming webhook, one Slack channel) is where "slack" posts, None for the
    deployment's default. The other channels' keys, if a layer set them, are ignored, so a group can
    switch channel over a default without unsetting anything. Which SMTP server, AWS account or Slack
    webhook sends is deployment configuration (Airflow connections), not catalog.
    """

    channel: str = "none"
    to: tuple[str, ...] = ()
    topic_arn: str | None = None
    slack_conn: str | None = None

    @property
    def enabled(self) -> bool:
        return self.channel != "none"

    @property
    def recipients(self) -> tuple[str, ...]:
        """Who receives a message on the chosen channel (the topic counts as one)."""
        if self.channel in ("smtp", "ses"):
            return self.to
        if self.channel == "sns" and self.topic_arn:
            return (self.topic_arn,)
        if self.channel == "slack":
            return (f"slack:{self.slack_conn or 'default'}",)  # the webhook's channel counts as one
        return ()


@dataclass(frozen=True)
class ReplicaPolicy:
    """The group's source runs as an HA pair (or more replicas) that all write the group (``replicas:``).

    ``replica_label`` is the source's external label naming its replica (prometheus-operator's
    ``prometheus_replica``); empty: one replica, nothing to de-duplicate. ``cluster_label`` names the pair's
    cluster. Every write path then carries AMP's dedup labels (``cluster`` + ``__replica__``, ``core.ha``), so
    the workspace keeps one replica's samples per cluster. ``sources`` maps each replica (its label value) to
    the Airflow connection of that replica's Prometheus: parity compares the target with the replica the
    target's dedup kept (``core.ha.elect``).
    """

    replica_label: str = ""
    cluster_label: str = "cluster"
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.replica_label)


@dataclass(frozen=True)
class TenantPolicy:
    """The group's tenant in the workspace (``tenant:``): its label set and the active series it may hold.

    The migration sets ``limitsPerLabelSet`` (UpdateWorkspaceConfiguration) for ``label_set`` to
    ``max_series``, so a cardinality spike of this group is throttled alone. Empty label set: no tenant.
    """

    label_set: tuple[tuple[str, str], ...] = ()
    max_series: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.label_set)


# Recorded operations a group's aggregation may name, by family: what a read re-aggregates (core.aggregation).
AGGREGATION_OPERATIONS: tuple[str, ...] = ("sum", "count", "min", "max")
AGGREGATION_FAMILY = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}


@dataclass(frozen=True)
class Aggregate:
    """One metric the group ships aggregated (``aggregations:``, issue 40): recording rules on the source.

    ``operations`` of ``metric`` by ``by`` (read through ``rate`` over ``rate_s`` for a counter, raw for a gauge)
    are recorded on the source under Prometheus' ``level:metric:operations`` names (``core.aggregation``); the
    group's keep filter ships those and not the raw metric, which stays on the source. At read cut-over every
    read of the metric is rewritten to read the recorded series; parity compares each original read on the source
    with its rewritten read on the target.
    """

    metric: str
    by: tuple[str, ...] = ()
    operations: tuple[str, ...] = ("sum",)
    rate_s: float = 0.0

    @property
    def level(self) -> tuple[str, ...]:
        return tuple(sorted(self.by))

    @property
    def family(self) -> str:
        return AGGREGATION_FAMILY[self.operations[0]] if self.operations else ""

    def rules(self) -> tuple[tuple[str, str], ...]:
        """(record, expr) of each recording rule, in ``operations`` order."""
        from promshift.core.aggregation import recording_rules

        return recording_rules(self.metric, self.level, self.operations, self.rate_s)

    @property
    def recorded(self) -> tuple[str, ...]:
        return tuple(record for record, _ in self.rules())

    def aggregation(self) -> Any:
        """The ``core.aggregation.Aggregation`` the reads are rewritten with."""
        from promshift.core.aggregation import aggregation_of

        return aggregation_of(self)


# Bounded write queues (``core.queues``): the default cap, and the most a catalog or connection may set.
DEFAULT_QUEUE_CAP = 4
MAX_QUEUE_CAP = 64


@dataclass(frozen=True)
class MetricGroup:
    """A set of metric names that migrates, is verified and is cut over as one unit.

    A group claims the explicit ``metrics`` plus every name ``metric_regex``
    matches (RE2, fully anchored as in Prometheus relabelling). ``host_label``
    is the label that identifies a node, used to sample hosts for parity.
    ``drop_labels`` are removed on the write path (``labeldrop``), never the host label.
    """

    name: str
    description: str = ""
    owners: tuple[str, ...] = ()
    approvers: tuple[str, ...] = ()
    wave: int = 1
    depends_on: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    metric_regex: str | None = None
    host_label: str = "Hostname"
    # Labels the group's remote_write entry removes (a ``labeldrop`` after the keep filter): the target
    # holds each series without them, and parity compares it with the source's series stripped of them.
    drop_labels: tuple[str, ...] = ()
    # An unanswered approval fails (and so rolls back) after this long.
    approval_timeout_s: float = 86400.0
    # The source's scrape interval: a warm-up must last at least one scrape.
    scrape_interval_s: float = 30.0
    # True lets metric_regex match Prometheus' own series (up, prometheus_*): refused by default.
    allow_match_all: bool = False
    warmup: WarmupPolicy = WarmupPolicy()
    parity: ParityPolicy = ParityPolicy()
    latency: LatencyPolicy = LatencyPolicy()
    notify: NotifyPolicy = NotifyPolicy()
    bake: BakePolicy = BakePolicy()
    replicas: ReplicaPolicy = ReplicaPolicy()
    tenant: TenantPolicy = TenantPolicy()
    # Metrics shipped as recording rules' aggregates (each listed in ``metrics``): the raw metric stays behind.
    aggregations: tuple[Aggregate, ...] = ()
    # Waves the catalog holds back (``defaults.paused_waves``): a group in one does not start.
    paused_waves: tuple[int, ...] = ()
    # The promshift remote_write queues a source carries at most (``defaults.max_queues``; a source connection's
    # ``extra.max_queues`` overrides it for that source): ``core.queues``.
    max_queues: int = DEFAULT_QUEUE_CAP
    # The Airflow connections of the group's source Prometheus (its cluster) and target (its workspace):
    # from the group, else its wave (``waves:``), else ``defaults:``, else promshift_source/promshift_target.
    source: str = DEFAULT_SOURCE_CONN
    target: str = DEFAULT_TARGET_CONN

    @property
    def pair(self) -> tuple[str, str]:
        """(source connection id, target connection id): with the group's name, the key of its route."""
        return (self.source, self.target)

    @property
    def wave_paused(self) -> bool:
        return self.wave in self.paused_waves

    def name_regex(self) -> str:
        """Return the RE2 regex for ``__name__`` in a ``write_relabel_configs`` keep rule.

        Explicit names (escaped) and ``metric_regex`` form one alternation. A metric of ``aggregations`` is
        shipped as its recorded series instead (the catalog refuses one ``metric_regex`` matches).
        No ``^...$``: Prometheus anchors relabel regexes itself. The regex
        comes last so an inline flag such as ``(?i)`` in it cannot reach the
        explicit names.
        """
        aggregated = {a.metric for a in self.aggregations}
        alternatives = [re2.escape(metric) for metric in self.metrics if metric not in aggregated]
        alternatives += [re2.escape(record) for a in self.aggregations for record in a.recorded]
        if self.metric_regex is not None:
            alternatives.append(self.metric_regex)
        return "|".join(alternatives)

    def selector(self) -> str:
        """Return the PromQL selector for every series of this group.

        e.g. ``{__name__=~"DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_USED"}``.
        """
        return "{__name__=~" + promql_string(self.name_regex()) + "}"

    def claims(self, metric_name: str) -> bool:
        """Tell whether the keep rule for this group would keep ``metric_name``."""
        return _compile_re2(self.name_regex()).fullmatch(metric_name) is not None

    def shipped_series_query(self) -> str:
        """PromQL counting on the source the series the group's keep filter will ship, before anything is deployed:
        its metrics shipped raw, plus per aggregation one series per value of its level and operation (counted
        from the raw metric: the recorded series do not exist until dual-write deploys their rules)."""
        if not self.aggregations:
            return f"count({self.selector()})"
        aggregated = {a.metric for a in self.aggregations}
        raw = [re2.escape(metric) for metric in self.metrics if metric not in aggregated]
        if self.metric_regex is not None:
            raw.append(self.metric_regex)
        parts = [f"count({{__name__=~{promql_string('|'.join(raw))}}})"] if raw else []
        for a in self.aggregations:
            by = f"by ({', '.join(a.level)}) " if a.level else ""
            parts.append(f"count(count {by}({a.metric})) * {len(a.operations)}")
        return " + ".join(f"({part} or vector(0))" for part in parts)

    def aggregate_of(self, metric_name: str) -> Aggregate | None:
        """The group's aggregation of ``metric_name`` (its raw series stay on the source), or None."""
        return next((a for a in self.aggregations if a.metric == metric_name), None)

    def reads(self, metric_name: str) -> bool:
        """Whether a read of ``metric_name`` is this group's: a metric it ships, or one it ships aggregated."""
        return self.claims(metric_name) or self.aggregate_of(metric_name) is not None

    @property
    def dag_id(self) -> str:
        """The Airflow DAG that migrates this group: its target workspace's, e.g. ``promshift__migrate__amp``
        (the group is chosen in that DAG's trigger form)."""
        return migration_dag_id(self.target)


@dataclass(frozen=True)
class Catalog:
    """The validated metric groups in file order, with the profile that was applied."""

    groups: tuple[MetricGroup, ...]
    profile: str | None = None

    def get(self, name: str) -> MetricGroup:
        """Return the group called ``name``; KeyError lists the known names."""
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(f"unknown metric group {name!r}; known groups: {', '.join(self.names()) or '(none)'}")

    def names(self) -> tuple[str, ...]:
        """Return the group names in file order."""
        return tuple(group.name for group in self.groups)


class CatalogError(ValueError):
    """The catalog is invalid; ``problems`` lists every problem found, one per entry."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        count = len(self.problems)
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(
            f"invalid metric-group catalog ({count} problem{'s' if count != 1 else ''}):\n{lines}"
        )

    def __reduce__(self) -> tuple[type[CatalogError], tuple[tuple[str, ...]]]:
        # The default would re-create the error from the rendered message.
        return (CatalogError, (self.problems,))
