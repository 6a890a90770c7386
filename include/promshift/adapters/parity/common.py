"""What every parity layer shares: the two backends, asked at once, and what one layer saw that another uses.

``ParityContext`` holds the group, both clients and the facts found on the way (the group's metric names,
their kinds, the hosts and names of the host label coverage saw); each layer class reads and fills it, so a
layer can run alone (tests) or after the others (``ParityCheck``), and one check asks each question once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from promshift.adapters.parity.sized import Partition, SizedQueries, host_partition
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.catalog import MetricGroup
from promshift.core.golden import either_name_selectors
from promshift.core.parity import HostLabels, edge_allowance, hosts_per_label, metric_kinds, noise_allowance
from promshift.core.promql import Analysis, Selector
from promshift.core.query_limits import UNLIMITED, QueryLimits
from promshift.core.verdicts import Measurement, Verdict

log = logging.getLogger(__name__)


# Source and target are different servers: ask both at once, so the check's wall time is
# the slower backend's time, not the sum. Two workers: one request per backend at a time.
_BOTH = ThreadPoolExecutor(max_workers=2, thread_name_prefix="parity-both")
T = TypeVar("T")


def on_both(source: PrometheusClient, target: PrometheusClient,
            call: Callable[[PrometheusClient], T]) -> tuple[T, T]:
    """``call`` on the source and the target concurrently; the first error is raised."""
    return on_each(lambda: call(source), lambda: call(target))


def on_each(source_call: Callable[[], T], target_call: Callable[[], T]) -> tuple[T, T]:
    """One call per backend (each side its own query), concurrently; the first error is raised."""
    futures = [_BOTH.submit(call) for call in (source_call, target_call)]
    return futures[0].result(), futures[1].result()


def each_side(source_call: Callable[[], T], target_call: Callable[[], T]) -> tuple[T, T]:
    """Two different calls, one per backend, concurrently (e.g. each side asked with its own label names)."""
    futures = [_BOTH.submit(source_call), _BOTH.submit(target_call)]
    return futures[0].result(), futures[1].result()


def group_matcher(group: MetricGroup) -> tuple[str, str, str]:
    """The matcher that keeps a selector to the group's metrics."""
    return ("__name__", "=~", group.name_regex())


def group_selectors_of(group: MetricGroup, source: PrometheusClient, analysis: Analysis, start: float, end: float,
                       names: dict[str, list[str]] | None = None,
                       ) -> tuple[list[Selector], frozenset[Selector], list[Selector]]:
    """A query's selectors that read the group's metrics (offsets and @ dropped), the nameless ones among
    them, and the others.

    A selector without a metric name reads the group's metrics when the source has any of them
    under it in ``start..end`` (one label-values call, cached in ``names``); it is then counted
    restricted to the group's metrics (``restrict``), which is all a per-group dual-write sends.
    """
    names = {} if names is None else names
    found, restrict, others = [], set(), []
    for sel in analysis.selectors:
        if sel.name is not None:
            (found if group.claims(sel.name) else others).append(sel)
            continue
        text = sel.promql()
        if text not in names:
            names[text] = source.label_values("__name__", text, start=start, end=end)
        if any(group.claims(n) for n in names[text]):
            restrict.add(sel)
            found.append(Selector(None, (*sel.matchers, group_matcher(group))))
        else:
            others.append(sel)
    return found, frozenset(restrict), others


def lookback_span(analysis: Analysis, start: float, end: float) -> tuple[float, float]:
    """The time a query evaluated over ``start..end`` reads samples from: its look-back, read-ahead, and ``@``."""
    spans = [(start - analysis.lookback_s, end + analysis.readahead_s)]
    for r in analysis.anchored:
        at = {"start": start, "end": end}.get(r.anchor, r.at)
        if at is not None:
            spans.append((at - r.back_s, at + r.ahead_s))
    return min(s for s, _ in spans), max(e for _, e in spans)


def series_behind(source: PrometheusClient, target: PrometheusClient, selectors: Sequence[Selector],
                  span: tuple[float, float], renames: Sequence[tuple[str, str]] = (), *,
                  sized: SizedQueries | None = None, partition: Partition | None = None) -> list[tuple[float, float]]:
    """Per selector, ``(source, target)``: how many series it reads with a sample in ``span``.

    The evidence behind a golden or latency result: a query whose answer has none of the group's
    series behind it (``sum(x) or vector(0)``, ``absent(x)``) proves nothing. ``renames`` (a group's
    declared ``(new, old)`` label renames): a series counts under either name, on both sides, as the
    golden query reads it (``core.golden.read_either_name``). ``sized``: counted in shards of the series
    (``partition``) when the workspace refuses the whole count for size; the shards' counts add up.
    """
    counts = []
    for sel in selectors:
        parts = either_name_selectors(sel, renames)

        def count(client: PrometheusClient, parts: list[Selector] = parts) -> float:
            return sum(count_behind(client, p, span, sized=sized, partition=partition) for p in parts)

        counts.append(each_side(lambda c=count: c(source), lambda c=count: c(target)))
    return counts


def count_behind(client: PrometheusClient, selector: Selector, span: tuple[float, float], *,
                 sized: SizedQueries | None = None, partition: Partition | None = None) -> float:
    """How many series ``selector`` reads on one backend with a sample in ``span``."""
    low, high = span
    seconds = max(1, math.ceil(high - low))
    if sized is None:
        res = client.query(f"count(last_over_time({selector.promql()}[{seconds}s]))", at=high)
        return sum(s.points[0][1] for s in res.series)
    text = selector.promql()

    def build(duration: str, extra: str) -> str:
        shard = f"{text[:-1]}{extra}}}" if text.endswith("}") else f"{text}{{{extra.removeprefix(', ')}}}"
        return f"count(last_over_time({shard if extra else text}[{duration}]))"

    # A series is counted once however many samples it has: shards of the series add up, parts of time do not.
    rows = sized.window(client, build, end=high, span_s=seconds, op="sum", series=None, samples_per_series=1,
                        partition=partition, time_split=False)
    return sum(v for _, v in rows)


@dataclass
class ParityContext:
    """One check's group, backends and shared findings (filled by the layers as they run)."""

    group: MetricGroup
    source: PrometheusClient
    target: PrometheusClient
    # Relative dashboard paths in the catalog resolve against the catalog's folder.
    catalog_dir: Path | None = None
    names: list[str] | None = None
    # The source's hosts at the window's end (coverage): the population the sample is drawn from.
    hosts_at_end: list[str] | None = None
    # Per side, the declared names of the host label its series use (seen by coverage): the samples
    # layer selects on those only, so a side that uses one name gets one plain selector.
    host_names_in_use: tuple[list[str], list[str]] | None = None
    # Per metric, its kind and where it came from (``core.parity.metric_kinds``): decided once per
    # check from the source's metadata, carried to the shards by the plan.
    kinds: dict[str, dict[str, str]] | None = None
    # Seen by coverage: per side, hosts per name of the host label, and hosts only under an undeclared name.
    hosts_per_name: dict[str, dict[str, int]] | None = None
    undeclared: tuple[dict[str, set[str]], dict[str, set[str]]] | None = None
    # The target's per-query limits (read once per run); every layer's queries are sized to them.
    limits: QueryLimits = UNLIMITED
    # Seen by coverage: per metric, the most series either side had at any instant (sizes the other layers).
    series_per_metric: dict[str, float] | None = None
    # Set on a shard from its plan (the shard runs where coverage did not).
    per_host: float | None = None
    # The source's scrape interval for the group's jobs (read by the plan, carried to the shards).
    scrape_interval: float | None = None

    def sizer(self) -> SizedQueries:
        """A fresh counter of one layer's splits and refusals, sized to the target's limits."""
        return SizedQueries(self.limits)

    def samples_per_series(self, span_s: float) -> int:
        """Samples one series holds over ``span_s`` at the source's scrape interval (else the step, which is at
        least the interval: the estimate is then low for a faster scrape, and a refusal splits further)."""
        return int(span_s / max(1.0, float(self.scrape_interval or self.policy.step_s))) + 1

    def edges(self, start: float, end: float) -> dict[str, Any]:
        """independent_scraper: the window's grid and how near a gap a point may be missing on the other side."""
        if self.policy.mode == "dual_write":
            return {}
        step = self.policy.step_s
        edge = edge_allowance(self.scrape_interval or step, step)
        pad = math.ceil(edge / step) * step
        return {"grid": (start - pad, end + pad, step), "span": (start, end), "edge_s": edge}

    def series_per_host(self) -> float | None:
        """The group's series per host (coverage's count over its hosts), carried to the shards by the plan."""
        if self.per_host is not None:
            return self.per_host
        total, hosts = self.series_of(), len(self.hosts_at_end or ())
        return None if total is None or not hosts else total / hosts

    def series_of(self, metric: str | None = None) -> int | None:
        """Series of one metric (or of the group) coverage saw, or None before coverage ran."""
        if self.series_per_metric is None:
            return None
        if metric is None:
            return int(sum(self.series_per_metric.values()))
        return int(self.series_per_metric.get(metric, 0))

    def host_partition(self) -> Partition | None:
        """Shards of the group's series by host (the hosts coverage saw at the window's end), or None."""
        return host_partition(self.host_labels.name, self.hosts_at_end) if self.hosts_at_end else None

    @property
    def policy(self) -> Any:
        return self.group.parity

    @property
    def host_labels(self) -> HostLabels:
        """The host label, the names the group's renames declare for it, and its likely undeclared names.

        Every host-keyed query groups by all of them, on both sides, so a host is the same host
        under ``Hostname`` or a declared ``hostname``, and one under an undeclared ``hostname`` is
        named as renamed, not as missing. Grouping by a label a side lacks costs nothing.
        """
        return HostLabels.for_group(self.group.host_label, dict(self.policy.rename_labels))

    @property
    def noise_k(self) -> float:
        """``independent_scraper``: points may also differ by the series' own jitter (``core.parity``); else 0."""
        return noise_allowance(self.policy.mode)

    def metric_names(self, start: float, end: float) -> list[str]:
        if self.names is None:
            self.names = self.source.label_values("__name__", self.group.selector(), start=start, end=end)
        return self.names

    def metric_kinds(self, start: float, end: float) -> dict[str, dict[str, str]]:
        """Counter or gauge per metric of the group: the source's ``/api/v1/metadata`` first (one call per
        metric), dcgm-exporter's list for a metric the source has no type for. A metadata call that fails
        leaves that metric to the list (logged); the answer is recorded in the samples evidence."""
        names = self.metric_names(start, end)
        if self.kinds is None or not set(names) <= self.kinds.keys():
            from promshift.adapters.settings import dcgm_counters

            metadata: dict[str, list[dict[str, str]]] = {}
            for name in names:
                try:
                    metadata.update(self.source.metadata(name))
                except PrometheusError as exc:
                    log.warning("parity %s: no metadata for %s from the source (%s); using the DCGM list",
                                self.group.name, name, exc)
            fallback = {c.name: c.kind for c in dcgm_counters() if c.kind != "label"}
            self.kinds = {**(self.kinds or {}), **metric_kinds(names, metadata, fallback)}
        return self.kinds

    def with_hosts_per_name(self, m: Measurement) -> Measurement:
        """``m`` with how many hosts each side sends under each name of the host label (declared ones always)."""
        if self.hosts_per_name is None:
            return m
        text = hosts_per_label(self.hosts_per_name, self.host_labels.declared)
        return dataclasses.replace(m, reason=f"{m.reason} ({text})",
                                   numbers={**m.numbers, "hosts_per_label": self.hosts_per_name})


@dataclass
class ParityLayer:
    """A parity layer: the shared context, and the policy and backends it reads through it."""

    ctx: ParityContext

    @property
    def group(self) -> MetricGroup:
        return self.ctx.group

    @property
    def policy(self) -> Any:
        return self.ctx.group.parity

    @property
    def source(self) -> PrometheusClient:
        return self.ctx.source

    @property
    def target(self) -> PrometheusClient:
        return self.ctx.target


def with_sizing(m: Measurement, sized: SizedQueries) -> Measurement:
    """``m`` with what sizing its queries to the workspace took (nothing added when nothing was split)."""
    evidence = sized.evidence()
    return dataclasses.replace(m, numbers={**m.numbers, "query_sizing": evidence}) if evidence else m


def refused_for_size(name: str, exc: Exception, queries: Sequence[str] = ()) -> Measurement:
    """A layer whose query no split keeps inside the workspace's limits: INCONCLUSIVE, never a difference."""
    return Measurement(name, Verdict.INCONCLUSIVE, f"not compared: the workspace refuses its queries for size "
                       f"and no split fits ({exc})", tuple(queries))
