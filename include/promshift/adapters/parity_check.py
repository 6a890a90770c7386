"""Parity evidence in layers, fetched from both backends; the maths lives in core.parity.

Layers: coverage (series counts per metric and per host at several instants, computed
in PromQL), per-host window aggregates of every host (sum over the window, in
PromQL: finds a drifted host the sample missed), golden dashboard queries, label parity (label names per metric
after normalization), and raw samples of a deterministic host sample (shardable: each
shard compares some hosts and returns totals a reducer merges). Memory stays bounded: one host's series at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import re2

from promshift.adapters.files import read_user_file
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.catalog import MetricGroup
from promshift.core.errors import ErrorKind
from promshift.core.golden import (
    COMPARED,
    NEEDS_VARIABLE,
    NOT_THIS_GROUP,
    UNSUPPORTED,
    DashboardQuery,
    WindowShortfall,
    dashboard_queries,
    dropped_label_uses,
    either_name_selectors,
    fit_window,
    golden_names,
    read_either_name,
)
from promshift.core.inputs import DASHBOARD, InputRefused, parse_json_bounded
from promshift.core.parity import (
    GoldenInventory,
    GoldenRow,
    GoldenSide,
    HostLabels,
    ParityPlan,
    ParityResult,
    ParityWindow,
    SampleComparison,
    aggregate_measurement,
    assess,
    comparison_step,
    comparison_window,
    count_hosts,
    coverage_measurement,
    credit_edges,
    describe_label_drift,
    edge_allowance,
    engine_tolerance,
    golden_comparison,
    golden_failure,
    hosts_per_label,
    independent_aggregate_measurement,
    label_drift,
    label_renames,
    metric_kinds,
    noise_allowance,
    normalize_labels,
    sample_hosts,
    scrape_interval_of,
    settle_time,
    undeclared_rename_note,
    without_dropped,
)
from promshift.core.promql import (
    Analysis,
    PromQLBudgetError,
    PromQLError,
    Selector,
    analyse,
    functions_used,
    grafana_builtins,
    metric_names,
    promql_string,
    restrict_nameless,
    substitute,
)
from promshift.core.query_budget import QueryBudgetExhausted
from promshift.core.verdicts import Layer, Measurement, Verdict

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


def _rows_at(answer: Any, first: float, step: float, k: int) -> dict[tuple[tuple[str, str], ...], float]:
    """A ``count by`` range answer's rows at its ``k``-th instant, keyed by their sorted labels."""
    return {tuple(sorted(series.labels.items())): v for series in answer.series for ts, v in series.points
            if round((ts - first) / step) == k}


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
                  span: tuple[float, float], renames: Sequence[tuple[str, str]] = ()) -> list[tuple[float, float]]:
    """Per selector, ``(source, target)``: how many series it reads with a sample in ``span``.

    The evidence behind a golden or latency result: a query whose answer has none of the group's
    series behind it (``sum(x) or vector(0)``, ``absent(x)``) proves nothing. ``renames`` (a group's
    declared ``(new, old)`` label renames): a series counts under either name, on both sides, as the
    golden query reads it (``core.golden.read_either_name``).
    """
    counts = []
    for sel in selectors:
        parts = either_name_selectors(sel, renames)

        def count(client: PrometheusClient, parts: list[Selector] = parts) -> float:
            return sum(count_behind(client, p, span) for p in parts)

        counts.append(each_side(lambda c=count: c(source), lambda c=count: c(target)))
    return counts


def count_behind(client: PrometheusClient, selector: Selector, span: tuple[float, float]) -> float:
    """How many series ``selector`` reads on one backend with a sample in ``span``."""
    low, high = span
    res = client.query(f"count(last_over_time({selector.promql()}[{max(1, math.ceil(high - low))}s]))", at=high)
    return sum(s.points[0][1] for s in res.series)


def golden_lookbacks(group: MetricGroup, catalog_dir: Path | None,
                     problems: list[str] | None = None) -> dict[str, float]:
    """Each golden dashboard query that reads the group's metrics, by name, and how far back it reads (seconds).

    Queries that do not parse, or name none of the group's metrics, are left out (the parity check reports
    them); unreadable dashboards too. ``problems``, when given, gets one line per dashboard outside its input
    budget and per query outside the PromQL budget (``core.promql.check_budget``).
    """
    policy = group.parity
    found: dict[str, float] = {}
    for entry in policy.golden_dashboards:
        path = Path(entry) if Path(entry).is_absolute() or catalog_dir is None else catalog_dir / entry
        files = sorted(path.glob("*.json")) if path.is_dir() else [path] if path.is_file() else []
        for file in files:
            try:
                dashboard = parse_json_bounded(read_user_file(file, DASHBOARD), DASHBOARD)
            except InputRefused as exc:
                if problems is not None:
                    problems.append(f"group {group.name!r}: golden dashboard {file.name}: {exc}")
                continue
            if not isinstance(dashboard, dict):
                continue
            for q in dashboard_queries(dashboard, name=file.name):
                sub = substitute(q.expr, dict(policy.golden_variables), builtins=grafana_builtins(policy.step_s,
                                                                                           group.bake.parity_window_s))
                try:
                    analysis = analyse(sub.expr)
                    names = metric_names(sub.expr)
                except PromQLBudgetError as exc:
                    if problems is not None:
                        problems.append(f"group {group.name!r}: golden query {file.name}/{q.panel}: {exc}")
                    continue
                except PromQLError:
                    continue
                if any(group.claims(n) for n in names):
                    found[f"{file.name}/{q.panel}"] = analysis.lookback_s
    return found


@dataclass
class ParityCheck:
    """Every parity layer for one group over one window."""

    group: MetricGroup
    source: PrometheusClient
    target: PrometheusClient
    # Relative dashboard paths in the catalog resolve against the catalog's folder.
    catalog_dir: Path | None = None
    _names: list[str] | None = None
    _hosts_at_end: list[str] | None = None
    # Per side, the declared names of the host label its series use (seen by coverage): the samples
    # layer selects on those only, so a side that uses one name gets one plain selector.
    _host_names_in_use: tuple[list[str], list[str]] | None = None
    # Per metric, its kind and where it came from (``core.parity.metric_kinds``): decided once per
    # check from the source's metadata, carried to the shards by the plan.
    _kinds: dict[str, dict[str, str]] | None = None
    # Seen by coverage: per side, hosts per name of the host label, and hosts only under an undeclared name.
    _hosts_per_name: dict[str, dict[str, int]] | None = None
    _undeclared: tuple[dict[str, set[str]], dict[str, set[str]]] | None = None
    # The source's scrape interval for the group's jobs (read by the plan, carried to the shards).
    _scrape_interval: float | None = None

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

    def window(self, *, dual_write_since: float, now: float,
               scrape_interval_s: float | None = None) -> tuple[float, float] | None:
        # Two steps, and at least one scrape interval and a step: the first instant reads a sample scraped after
        # dual-write began on both sides (``core.parity.settle_time``).
        return comparison_window(dual_write_since=dual_write_since, now=now, skip_recent_s=self.policy.skip_recent_s,
                                 step=self.policy.step_s, settle_s=settle_time(self.policy.step_s, scrape_interval_s))

    def source_scrape_interval(self, start: float, end: float) -> tuple[float, str]:
        """The source's configured scrape interval for the jobs of the group's series, and where it came from.

        Its loaded config (``/api/v1/status/config``) and the ``job`` values of the group's series; when the
        source answers but not with them (no status API, a config it will not show), the catalog's
        ``scrape_interval`` (said so). A source that does not answer at all raises: parity is an ERROR then."""
        try:
            jobs = self.source.label_values("job", self.group.selector(), start=start, end=end)
            return scrape_interval_of(self.source.config_text(), jobs)
        except PrometheusError as exc:
            if exc.kind in (ErrorKind.UNREACHABLE, ErrorKind.TIMEOUT):
                raise
            return self._catalog_interval(exc)
        except ValueError as exc:
            return self._catalog_interval(exc)

    def _catalog_interval(self, exc: Exception) -> tuple[float, str]:
        log.warning("parity %s: source config not read (%s); the catalog's scrape_interval", self.group.name, exc)
        return self.group.scrape_interval_s, (f"the catalog's scrape_interval {self.group.scrape_interval_s:g}s "
                                              f"(source config not read: {str(exc)[:160]})")

    def _use_step(self, step: float) -> None:
        if step != self.policy.step_s:
            self.group = dataclasses.replace(self.group, parity=dataclasses.replace(self.policy, step_s=step))

    # -- layer 1: coverage ---------------------------------------------------------------
    def coverage(self, start: float, end: float) -> list[Measurement]:
        """Series counts per metric and per host at the window's start, middle and end.

        One ``count by (__name__, host)`` per side, evaluated at the three instants by one range
        query, serves both measurements: each query touches every series of the group, so
        asking twice costs twice.
        """
        hosts = self.host_labels
        expr = f"count by (__name__, {', '.join(hosts.names)}) ({self.group.selector()})"
        instants = sorted({start, (start + end) / 2, end})
        per_metric, per_host = [], []
        # Per side: undeclared name of the host label -> hosts found only under it, at any instant.
        under: tuple[dict[str, set[str]], dict[str, set[str]]] = ({}, {})
        in_use: tuple[set[str], set[str]] = (set(), set())
        # Per side: every name of the host label -> the hosts sending it (a host mid-rename is under both).
        per_name: tuple[dict[str, set[str]], dict[str, set[str]]] = ({}, {})
        # One range query per side evaluates every instant: each series is read once, not once per
        # instant (at 2,000 nodes x 4 metrics: 4.9-6.1 s of server time against 12.7-13.4 s for three instant queries).
        step = (instants[-1] - instants[0]) / (len(instants) - 1) if len(instants) > 1 else 1.0
        queries = [expr]
        credited = 0
        try:
            ranged = on_both(self.source, self.target,
                             lambda c: c.query_range(expr, start=instants[0], end=instants[-1], step=step))
            edges = self._edges(start, end)
            wide = None
            if edges:
                # independent_scraper: also the series with a sample within the edge allowance of each instant
                # (``last_over_time`` keeps the metric name), so an outage's edge seen apart is not a missing host.
                reach = edges["edge_s"]
                wide_expr = (f"count by (__name__, {', '.join(hosts.names)}) (last_over_time({self.group.selector()}"
                             f"[{math.ceil((self._scrape_interval or self.policy.step_s) + 2 * reach)}s]))")
                queries.append(f"{wide_expr} at each instant + {reach:g}s")
                wide = on_both(self.source, self.target, lambda c: c.query_range(
                    wide_expr, start=instants[0] + reach, end=instants[-1] + reach, step=step))
            for k, t in enumerate(instants):
                metric_sides: list[dict[str, float]] = [{}, {}]
                host_sides: list[dict[str, float]] = [{}, {}]
                at_k = [_rows_at(answer, instants[0], step, k) for answer in ranged]
                if wide is not None:
                    src_rows, tgt_rows, gained = credit_edges((at_k[0], at_k[1]),
                                                              (_rows_at(wide[0], instants[0] + reach, step, k),
                                                               _rows_at(wide[1], instants[0] + reach, step, k)))
                    at_k, credited = [src_rows, tgt_rows], credited + gained
                for i in range(2):
                    rows = [(dict(key), v) for key, v in at_k[i].items() if v]
                    for labels, n in rows:
                        name = labels.get("__name__", "")
                        metric_sides[i][name] = metric_sides[i].get(name, 0.0) + n
                    host_sides[i], variants = count_hosts(rows, hosts)
                    in_use[i].update(n for n in hosts.declared if any(labels.get(n) for labels, _ in rows))
                    for labels, _ in rows:
                        for n in hosts.names:
                            if labels.get(n):
                                per_name[i].setdefault(n, set()).add(labels[n])
                    for variant, found in variants.items():
                        under[i].setdefault(variant, set()).update(found)
                per_metric.append((t, metric_sides[0], metric_sides[1]))
                per_host.append((t, host_sides[0], host_sides[1]))
        except PrometheusError as exc:
            return [Measurement(name, Verdict.ERROR, str(exc), tuple(queries))
                    for name in ("coverage", "host_coverage")]
        # The source's hosts at the window's end are also the population the sample is drawn from.
        self._hosts_at_end = [h for h in per_host[-1][1] if h]
        self._host_names_in_use = ([n for n in hosts.declared if n in in_use[0]] or [hosts.name],
                                   [n for n in hosts.declared if n in in_use[1]] or [hosts.name])
        self._undeclared = under
        self._hosts_per_name = {side: {n: len(found) for n, found in names.items()}
                                for side, names in zip(("source", "target"), per_name, strict=True)}
        limit = self.policy.max_missing_series_ratio
        host = coverage_measurement(per_host, max_missing_ratio=limit, queries=queries, name="host_coverage",
                                    key="host", key_label=hosts.name, under_variants=under)
        both = [coverage_measurement(per_metric, max_missing_ratio=limit, queries=queries, name="coverage",
                                     key="metric"), self._with_hosts_per_name(host)]
        if wide is not None:
            for m in both:
                m.numbers["edge_credited_series"] = credited
        return both

    def _with_hosts_per_name(self, m: Measurement) -> Measurement:
        """``m`` with how many hosts each side sends under each name of the host label (declared ones always)."""
        if self._hosts_per_name is None:
            return m
        text = hosts_per_label(self._hosts_per_name, self.host_labels.declared)
        return dataclasses.replace(m, reason=f"{m.reason} ({text})",
                                   numbers={**m.numbers, "hosts_per_label": self._hosts_per_name})

    # -- layer 1b: per-host aggregates of every host --------------------------------------
    def aggregates(self, start: float, end: float, *, explained: Sequence[str] = ()) -> Measurement:
        """Per host over the whole window, per metric, computed in PromQL.

        ``dual_write``: ``sum_over_time`` — the same samples on both sides, so a value drift and a
        gap both change the sum. ``independent_scraper``: each side scraped on its own clock, so
        the sample counts differ; gauges compare as ``avg_over_time`` and counters as ``rate``
        over the window (reset-aware), within the tolerance. One query per metric and side
        (range functions drop the metric name, so metrics cannot share a query).
        """
        hosts = self.host_labels
        span = f"{max(1, int(end - start))}s"
        by = ", ".join(hosts.names)
        independent = self.policy.mode != "dual_write"
        rows = []
        queries = []
        # independent_scraper: per metric and host, the variance of the window aggregate each side's own samples
        # give it (the source's, counted for both sides): the noise model's floor of expected difference.
        model_var: dict[str, dict[str, float]] = {}
        edge_share: dict[str, dict[str, float]] = {}
        reads: dict[str, dict[str, float]] = {}
        try:
            for metric in self._metric_names(start, end):
                fn = "sum_over_time"
                sel = f"{{__name__={promql_string(metric)}}}"
                noise_expr = None
                if independent:
                    step = max(1, int(self.policy.step_s))
                    if self.metric_kinds(start, end)[metric]["kind"] == "counter":
                        fn = "rate"
                        # The window's rate moves with what each scraper's first and last samples hold: each
                        # end is off by about one scrape's increment (its spread: idelta's), over the window.
                        # A host's GPUs are read in one scrape, so their errors add up, not in quadrature.
                        noise_expr = (f"(sum by ({by}) (stddev_over_time(idelta({sel}[{2 * step}s])[{span}:{step}s]))"
                                      f" / {max(1, int(end - start))}) ^ 2")
                    else:
                        fn = "avg_over_time"
                        noise_expr = (f"sum by ({by}) (stddev_over_time({sel}[{span}]) ^ 2 "
                                      f"/ count_over_time({sel}[{span}]))")
                expr = f"sum by ({by}) ({fn}({sel}[{span}]))"
                queries.append(expr)
                answers = on_both(self.source, self.target, lambda c, e=expr: c.query(e, at=end))
                # A host under an undeclared name is left out: host_coverage names it as renamed.
                sides = [count_hosts(((s.labels, s.points[0][1]) for s in a.series), hosts)[0] for a in answers]
                rows.append((f"{fn} {metric}", sides[0], sides[1]))
                if noise_expr is not None:
                    queries.append(noise_expr)
                    own = count_hosts(((s.labels, s.points[0][1]) for s in self.source.query(noise_expr, at=end)
                                       .series), hosts)[0]
                    model_var[f"{fn} {metric}"] = {h: 2 * v for h, v in own.items() if math.isfinite(v)}
                if independent:
                    count_expr = f"avg by ({by}) (count_over_time({sel}[{span}]))"
                    queries.append(count_expr)
                    counts = count_hosts(((s.labels, s.points[0][1]) for s in self.source.query(count_expr, at=end)
                                          .series), hosts)[0]
                    reads[f"{fn} {metric}"] = counts
                    if fn == "rate":
                        edge_share[f"{fn} {metric}"] = {h: 2 / c for h, c in counts.items() if c > 1}
        except PrometheusError as exc:
            return Measurement("aggregates", Verdict.ERROR, str(exc), tuple(queries))
        if independent:
            return independent_aggregate_measurement(rows, model_var=model_var, edge_share=edge_share, reads=reads,
                                                     abs_tol=self.policy.abs_tolerance,
                                                     rel_tol=self.policy.rel_tolerance, queries=queries,
                                                     explained=explained)
        # Sums over thousands of series may add in a different order on each side: allow float noise.
        return aggregate_measurement(rows, abs_tol=self.policy.abs_tolerance,
                                     rel_tol=max(self.policy.rel_tolerance, 1e-9), queries=queries,
                                     explained=explained)

    # -- layer 4: golden dashboard queries -------------------------------------------------
    def golden(self, start: float, end: float) -> tuple[list[Measurement], GoldenInventory]:
        """The group's dashboard queries, each over its own look-back-aware window, and the inventory.

        ``start`` is the first settled instant of dual-write, ``end`` the last instant old enough
        to read. Every dashboard expression is listed in the inventory with its disposition:
        compared, not this group's metrics, needs variable X, or unsupported (why).
        """
        policy = self.policy
        rows: list[GoldenRow] = []
        measurements: list[Measurement] = []
        queries: list[DashboardQuery] = []
        for path in self._dashboard_files(measurements):
            try:
                dashboard = parse_json_bounded(read_user_file(path, DASHBOARD), DASHBOARD)
            except (OSError, ValueError) as exc:
                measurements.append(Measurement("golden", Verdict.ERROR, f"dashboard {path.name} unreadable: {exc}"))
                continue
            queries.extend(dashboard_queries(dashboard, name=path.name))
        names: dict[str, list[str]] = {}
        for q, name in zip(queries, golden_names(queries), strict=True):
            disposition, detail, m = self._golden_query(name, q, start, end, names)
            rows.append(GoldenRow(q.dashboard, q.panel, q.expr, disposition, detail, q.ref_id, m.name if m else None))
            if m is not None:
                measurements.append(m)
        counts = Counter(row.disposition for row in rows)
        summary = ", ".join(f"{n} {d}" for d, n in counts.items()) or "no dashboard queries"
        if not any(m.layer == Layer.GOLDEN and m.name != "golden" for m in measurements):
            if policy.golden_required:
                measurements.append(Measurement("golden", Verdict.INCONCLUSIVE,
                                                "no golden query reads this group's metrics (parity.golden_required)"))
            elif not policy.golden_dashboards:
                summary = "no golden layer: no dashboard configured (parity.golden_dashboards)"
            else:
                summary = "no golden layer: no dashboard query reads this group's metrics" + (
                    f" ({summary})" if queries else "")
        return measurements, GoldenInventory(tuple(policy.golden_dashboards), policy.golden_required, tuple(rows),
                                             summary)

    def _dashboard_files(self, problems: list[Measurement]) -> list[Path]:
        files: list[Path] = []
        for entry in self.policy.golden_dashboards:
            path = Path(entry)
            if not path.is_absolute() and self.catalog_dir is not None:
                path = self.catalog_dir / path
            if path.is_dir():
                files.extend(sorted(path.glob("*.json")))
            elif path.is_file():
                files.append(path)
            else:
                problems.append(Measurement("golden", Verdict.ERROR, f"dashboard {entry} not found ({path})"))
        return files

    def _golden_query(self, name: str, q: DashboardQuery, start: float, end: float,
                      names: dict[str, list[str]]) -> tuple[str, str, Measurement | None]:
        """Disposition, detail and (for this group's queries) the measurement of one dashboard expression."""
        values = dict(self.policy.golden_variables)
        sub = substitute(q.expr, values, builtins=grafana_builtins(self.policy.step_s, end - start))
        needs = ", ".join(f"${v}" for v in sub.unknown)
        hint = ", ".join(f"parity.golden_variables.{v}" for v in sub.unknown)
        try:
            analysis = analyse(sub.expr)
        except PromQLError as exc:
            if not any(self.group.claims(n) for n in metric_names(sub.expr)):
                return NOT_THIS_GROUP, "names none of this group's metrics", None
            if sub.unknown:
                return (f"{NEEDS_VARIABLE} {needs}", f"set {hint}",
                        Measurement(name, Verdict.INCONCLUSIVE, f"needs variable {needs} (set {hint})", (sub.expr,)))
            return (UNSUPPORTED, str(exc),
                    Measurement(name, Verdict.INCONCLUSIVE, f"unsupported: {exc}", (sub.expr,)))
        try:
            group_selectors, restrict, others = group_selectors_of(self.group, self.source, analysis, start, end,
                                                                   names)
        except PrometheusError as exc:
            return COMPARED, "selector names unknown", Measurement(name, Verdict.ERROR, str(exc), (sub.expr,))
        if not group_selectors:
            shown = sorted({s.name or s.promql() for s in analysis.selectors})
            return NOT_THIS_GROUP, "reads " + (", ".join(shown) or "no series"), None
        if sub.unknown:
            return (f"{NEEDS_VARIABLE} {needs}", f"set {hint}",
                    Measurement(name, Verdict.INCONCLUSIVE, f"needs variable {needs} (set {hint})", (sub.expr,)))
        m = self._golden_one(name, q.expr, group_selectors, start, end, restrict=restrict, others=others)
        return COMPARED, m.verdict.value, m

    @property
    def _group_matcher(self) -> tuple[str, str, str]:
        return group_matcher(self.group)

    def _golden_one(self, name: str, raw: str, group_selectors: Sequence[Selector], start: float, end: float, *,
                    restrict: frozenset[Selector] = frozenset(), others: Sequence[Selector] = ()) -> Measurement:
        """One golden query over its own window: what both backends did, the data behind it, the answers."""
        step = self.policy.step_s
        values = dict(self.policy.golden_variables)
        try:
            fit = fit_window(raw, values, earliest=start, latest=end, step=step)
        except PromQLError as exc:
            return Measurement(name, Verdict.INCONCLUSIVE, f"unsupported: {exc}", (raw,))
        if isinstance(fit, WindowShortfall):
            return Measurement(name, Verdict.INCONCLUSIVE, fit.reason, (raw,), {"wait_s": fit.wait_s})
        read = dropped_label_uses(fit.expr, self.group.drop_labels)
        if read:
            how = ", ".join(f"{label} ({use})" for label, use in read.items())
            return Measurement(name, Verdict.FAILED, f"reads {how}, which the group drops (drop_labels): "
                               f"the target has no such label, so this query cannot answer as on the source",
                               (fit.expr,), {"dropped_labels_read": list(read)})
        # A declared rename: a fleet may be part-way through it, so each side reads every series under either
        # name, normalised to one (the dashboard's), and the same query is asked of both.
        renames = tuple(self.policy.rename_labels)
        try:
            expr = restrict_nameless(fit.expr, self._group_matcher, restrict.__contains__) if restrict else fit.expr
            asked = read_either_name(expr, renames) if renames else expr
        except PromQLError as exc:
            return Measurement(name, Verdict.INCONCLUSIVE, f"unsupported: {exc}", (fit.expr,))
        queries = asked
        edges = self._edges(fit.start, fit.end)  # independent_scraper: read past the window to see its gaps
        low, high = edges["grid"][:2] if edges else (fit.start, fit.end)

        def answer(client: PrometheusClient, asked: str) -> GoldenSide:
            try:
                res = client.query_range(asked, start=low, end=high, step=step)
            except PrometheusError as exc:
                text = str(exc).removeprefix(f"{exc.base_url}: ")
                return GoldenSide(error=text, http_status=exc.http_status, kind=exc.kind)
            rename = dict(self.policy.rename_labels)
            series = {normalize_labels(s.labels, ignore=self.policy.ignore_labels, rename=rename): s.points
                      for s in res.series}
            if client is self.source:  # declared drops: the target's answer has the source's without them
                series = without_dropped(series, self.group.drop_labels)
            return GoldenSide(series=series, warnings=res.warnings)

        source, target = each_side(lambda: answer(self.source, asked), lambda: answer(self.target, asked))
        failed = golden_failure(name, queries, source, target)
        if failed is not None:
            return failed
        warnings = [*source.warnings, *target.warnings]
        if warnings:
            return Measurement(name, Verdict.INCONCLUSIVE, f"backend warnings (partial data): {'; '.join(warnings)}",
                               (queries,))
        try:
            counts = series_behind(self.source, self.target, [*group_selectors, *others],
                                   lookback_span(fit.analysis, fit.start, fit.end), renames)
        except PrometheusError as exc:
            return Measurement(name, Verdict.ERROR, f"counting the series behind the query failed: {exc}", (queries,))
        behind = (sum(c[0] for c in counts[:len(group_selectors)]), sum(c[1] for c in counts[:len(group_selectors)]))
        # A pair declared as different engines: the query's function family may round differently (said so).
        rel_tol, widened = engine_tolerance(functions_used(fit.expr), engines=self.policy.engines,
                                            rel_tol=max(self.policy.rel_tolerance, 1e-9))
        m = golden_comparison(name, queries, source.series or {}, target.series or {}, behind=behind,
                              abs_tol=self.policy.abs_tolerance, rel_tol=rel_tol,
                              answers_without_series=fit.analysis.answers_without_series, noise_k=self.noise_k,
                              **edges,
                              numbers={"window": fit.to_dict(), "selectors": [s.promql() for s in group_selectors],
                                       **({"tolerance": widened} if widened else {})})
        lacking = [sel.promql() for sel, (src, tgt) in zip(others, counts[len(group_selectors):], strict=True)
                   if src and not tgt]
        note = undeclared_rename_note(self._undeclared, self.group.host_label) if self._undeclared else None
        if m.verdict == Verdict.FAILED and note:
            # The answers differ because hosts send the host label under another name: say so first.
            m = dataclasses.replace(m, reason=f"{note}; {m.reason}",
                                    numbers={**m.numbers, "undeclared_rename": {
                                        side: {v: sorted(h) for v, h in found.items()}
                                        for side, found in zip(("source", "target"), self._undeclared, strict=True)}})
        if m.verdict == Verdict.FAILED and lacking:
            # Another group's metrics the target was never sent: the difference says nothing about this group.
            return Measurement(name, Verdict.INCONCLUSIVE, f"answers differ, but the query also reads "
                               f"{', '.join(lacking)} (not this group's metrics), which the target does not have",
                               m.queries, {**m.numbers, "not_on_target": lacking})
        return m

    # -- layer 2: label parity -----------------------------------------------------------
    def labels(self, start: float, end: float) -> Measurement:
        """Label names per metric on both sides, after ignore/rename rules; drift is named."""
        queries = []
        try:
            metrics = self._metric_names(start, end)
            names: list[dict[str, list[str]]] = [{}, {}]
            for metric in metrics:
                match = f"{{__name__={promql_string(metric)}}}"
                queries.append(f"labels {match}")
                names[0][metric], names[1][metric] = on_both(
                    self.source, self.target, lambda c, m=match: c.label_names(m, start=start, end=end))
        except PrometheusError as exc:
            return Measurement("labels", Verdict.ERROR, str(exc), tuple(queries))
        if not metrics:
            return Measurement("labels", Verdict.INCONCLUSIVE, "the source has no metric of this group in the window",
                               tuple(queries))
        drift = label_drift(names[0], names[1], ignore=self.policy.ignore_labels,
                            rename=dict(self.policy.rename_labels), dropped=self.group.drop_labels)
        numbers: dict[str, Any] = {"metrics": len(metrics), "drift": drift,
                                   "labels": sorted({n for ns in names[0].values() for n in ns})}
        if drift:
            try:
                hosts = self._hosts_under_renames(drift, start, end, queries)
            except PrometheusError as exc:
                return Measurement("labels", Verdict.ERROR, str(exc), tuple(queries), numbers)
            if hosts:
                numbers["renamed_hosts"] = hosts
            return self._with_hosts_per_name(Measurement(
                "labels", Verdict.FAILED, "label drift: " + describe_label_drift(drift, hosts), tuple(queries),
                numbers))
        return self._with_hosts_per_name(Measurement(
            "labels", Verdict.SUCCESSFUL, f"label names of {len(metrics)} metrics match after normalization",
            tuple(queries), numbers))

    def _hosts_under_renames(self, drift: dict[str, Any], start: float, end: float,
                             queries: list[str]) -> dict[str, list[str]]:
        """For each suspected rename, the hosts whose series carry the renamed name (on that side).

        The values of the name itself when it is a name of the host label (``hostname``), else the
        hosts of the series that carry it. One label-values call per name, only when drift is found.
        """
        hosts = self.host_labels
        out: dict[str, list[str]] = {}
        for (frm, _to), side in sorted(label_renames(drift).items()):
            client = self.target if side == "target" else self.source
            match = f"{{__name__=~{promql_string(self.group.name_regex())}, {frm}!=\"\"}}"
            found: set[str] = set()
            for label in ([frm] if frm in hosts.names else list(hosts.declared)):
                queries.append(f"label values {label} on the {side} {match}")
                found.update(client.label_values(label, match, start=start, end=end))
            out[frm] = sorted(found)
        return out

    # -- layer 3: raw samples ------------------------------------------------------------
    def sample_plan(self, start: float, end: float) -> list[str]:
        """The deterministic host sample for this group and window (seeded by both)."""
        hosts = self._hosts_at_end
        if hosts is None:
            names = self.host_labels
            expr = f"count by ({', '.join(names.declared)}) ({self.group.selector()})"
            rows = ((s.labels, s.points[0][1]) for s in self.source.query(expr, at=end).series)
            hosts = list(count_hosts(rows, names)[0])
        seed = self.policy.seed or f"{self.group.name}:{start:.0f}:{end:.0f}"
        return sample_hosts((h for h in hosts if h), self.policy.sample_hosts, seed)

    def compare_hosts(self, hosts: Sequence[str], start: float, end: float,
                      host_names: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
        """Compare every series of ``hosts`` point by point; returns mergeable totals.

        ``host_names`` (source, target): the declared names of the host label each side's series
        use (the plan's coverage saw them); default every declared name on both sides.
        Consecutive query errors up to the policy's limit skip a host (named in the result);
        beyond it the shard reports an error.
        """
        step = self.policy.step_s
        if host_names is None:
            host_names = (self.host_labels.declared, self.host_labels.declared)
        comparison = SampleComparison(abs_tol=self.policy.abs_tolerance, rel_tol=self.policy.rel_tolerance,
                                      noise_k=self.noise_k, host_labels=self.host_labels.declared,
                                      **self._edges(start, end))
        rename = dict(self.policy.rename_labels)
        errors: list[str] = []
        consecutive = 0
        # One range query per side for the whole shard (memory stays bounded by the shard size);
        # if it fails, each host is tried on its own so one bad host does not sink the shard.
        hosts_left = list(hosts)
        if len(hosts_left) > 1:
            try:
                self._compare_batch(hosts_left, start, end, step, rename, host_names, comparison)
                hosts_left = []
            except PrometheusError as exc:
                errors.append(f"shard {list(hosts)}: {exc}")
        for host in hosts_left:
            try:
                self._compare_batch([host], start, end, step, rename, host_names, comparison)
            except PrometheusError as exc:
                consecutive += 1
                errors.append(f"{host}: {exc}")
                if consecutive >= self.policy.consecutive_error_limit:
                    break
                continue
            consecutive = 0
        log.info("parity %s: hosts %s compared (%s series, %s points)", self.group.name, list(hosts),
                 comparison.series_compared, comparison.points_compared)
        out = {**comparison.to_dict(), "hosts": list(hosts), "errors": errors,
               "error_limit_hit": consecutive >= self.policy.consecutive_error_limit > 0}
        if self.policy.mode != "dual_write" and self._kinds is not None:
            out["metric_kinds"] = dict(self._kinds)
        return out

    def _compare_batch(self, hosts: list[str], start: float, end: float, step: float, rename: dict[str, str],
                       host_names: Sequence[Sequence[str]], comparison: SampleComparison) -> None:
        # Each side gets its own queries (its own names of the host label), normalized as they arrive.
        queries = [self.host_queries(hosts, start, end, names) for names in host_names]

        def fetch(client: PrometheusClient, exprs: list[str]) -> dict[Any, Any]:
            side: dict[Any, Any] = {}
            # independent_scraper: read past the window by the edge allowance, so a gap just outside it is seen.
            low, high = comparison.grid[:2] if comparison.grid else (start, end)
            for expr in exprs:
                res = client.query_range(expr, start=low, end=high, step=step)
                side.update({normalize_labels(s.labels, ignore=self.policy.ignore_labels, rename=rename): s.points
                             for s in res.series})
            return side

        source, target = on_each(lambda: fetch(self.source, queries[0]), lambda: fetch(self.target, queries[1]))
        # Declared drops: the target holds the source's series without those labels (summed where two would merge).
        comparison.add(without_dropped(source, self.group.drop_labels), target)

    def host_queries(self, hosts: str | Sequence[str], start: float, end: float,
                     host_names: Sequence[str] | None = None) -> list[str]:
        """What to compare for one host, by parity mode.

        ``dual_write``: the raw series — the same Prometheus wrote both sides, so every
        sample must match. ``independent_scraper``: a managed collector scraped separately,
        so timestamps differ; compare per step bucket instead — gauges as
        ``avg_over_time`` over the step, counters as ``rate`` over two steps (reset-aware) —
        within the catalog's tolerance.

        One set of queries per name of the host label in ``host_names`` (default: the host label and
        its declared aliases), each a plain selector: a side with part of its fleet under a declared
        ``hostname`` gets a second query, not an ``or`` — binary operators leave Prometheus' raw-range
        fast path and cost ~10x the server time (measured at 200 nodes).
        """
        if isinstance(hosts, str):
            hosts = [hosts]
        if len(hosts) == 1:
            value = f"={promql_string(hosts[0])}"
        else:
            value = f"=~{promql_string('|'.join(re2.escape(h) for h in hosts))}"
        on_host = [f"{label}{value}" for label in (host_names or self.host_labels.declared)]
        if self.policy.mode == "dual_write":
            name = f"__name__=~{promql_string(self.group.name_regex())}"
            return [f"{{{name}, {h}}}" for h in on_host]
        step = int(self.policy.step_s)
        out = []
        for metric in self._metric_names(start, end):
            for h in on_host:
                sel = f"{{__name__={promql_string(metric)}, {h}}}"
                if self.metric_kinds(start, end)[metric]["kind"] == "counter":
                    inner, tag = f"rate({sel}[{2 * step}s])", f"{metric}:rate{2 * step}s"
                else:
                    inner, tag = f"avg_over_time({sel}[{step}s])", f"{metric}:avg{step}s"
                # The functions drop the metric name; put a tagged one back so series stay distinct.
                out.append(f'label_replace({inner}, "__name__", {promql_string(tag)}, "", "")')
        return out

    def _edges(self, start: float, end: float) -> dict[str, Any]:
        """independent_scraper: the window's grid and how near a gap a point may be missing on the other side."""
        if self.policy.mode == "dual_write":
            return {}
        step = self.policy.step_s
        edge = edge_allowance(self._scrape_interval or step, step)
        pad = math.ceil(edge / step) * step
        return {"grid": (start - pad, end + pad, step), "span": (start, end), "edge_s": edge}

    @property
    def noise_k(self) -> float:
        """``independent_scraper``: points may also differ by the series' own jitter (``core.parity``); else 0."""
        return noise_allowance(self.policy.mode)

    def _metric_names(self, start: float, end: float) -> list[str]:
        if self._names is None:
            self._names = self.source.label_values("__name__", self.group.selector(), start=start, end=end)
        return self._names

    def metric_kinds(self, start: float, end: float) -> dict[str, dict[str, str]]:
        """Counter or gauge per metric of the group: the source's ``/api/v1/metadata`` first (one call per
        metric), dcgm-exporter's list for a metric the source has no type for. A metadata call that fails
        leaves that metric to the list (logged); the answer is recorded in the samples evidence."""
        names = self._metric_names(start, end)
        if self._kinds is None or not set(names) <= self._kinds.keys():
            from promshift.adapters.settings import dcgm_counters

            metadata: dict[str, list[dict[str, str]]] = {}
            for name in names:
                try:
                    metadata.update(self.source.metadata(name))
                except PrometheusError as exc:
                    log.warning("parity %s: no metadata for %s from the source (%s); using the DCGM list",
                                self.group.name, name, exc)
            fallback = {c.name: c.kind for c in dcgm_counters() if c.kind != "label"}
            self._kinds = {**(self._kinds or {}), **metric_kinds(names, metadata, fallback)}
        return self._kinds

    def samples_measurement(self, shards: Sequence[dict[str, Any]], hosts_total: int) -> Measurement:
        """Merge shard totals into the samples measurement."""
        comparison = SampleComparison(abs_tol=self.policy.abs_tolerance, rel_tol=self.policy.rel_tolerance,
                                      noise_k=self.noise_k, host_labels=self.host_labels.declared)
        errors: list[str] = []
        hosts: list[str] = []
        for shard in shards:
            comparison.merge(shard)
            errors.extend(shard.get("errors", []))
            hosts.extend(shard.get("hosts", []))
        if any(s.get("error_limit_hit") for s in shards):
            return Measurement("samples", Verdict.ERROR,
                               f"{len(errors)} query errors, {self.policy.consecutive_error_limit} in a row: "
                               + "; ".join(errors[:3]), (), {"errors": errors})
        m = comparison.measurement([f"range query per sampled host ({len(hosts)} hosts)"])
        m.numbers.update({"hosts_sampled": sorted(hosts), "hosts_total": hosts_total, "errors": errors})
        kinds = next((s["metric_kinds"] for s in shards if s.get("metric_kinds")), None)
        if kinds:
            m.numbers["metric_kinds"] = kinds
        return m

    # -- all layers ----------------------------------------------------------------------
    def plan(self, *, dual_write_since: float, now: float) -> ParityPlan:
        """Window, the count and label layers, and the host shards for the samples layer.

        A workspace query budget spent on the way (``QueryBudgetExhausted``) ends the plan INCONCLUSIVE with the
        budget named (no window: no layer is judged on half its queries)."""
        started = time.perf_counter()
        before = [c.ledger.snapshot() for c in (self.source, self.target)]
        try:
            return self._plan(dual_write_since=dual_write_since, now=now, started=started, before=before)
        except QueryBudgetExhausted as exc:
            log.warning("parity: %s", exc)
            return ParityPlan(None, (Measurement("window", Verdict.INCONCLUSIVE, str(exc)),),
                              cost=self._cost(started, before))

    def _plan(self, *, dual_write_since: float, now: float, started: float, before: list[dict[str, float]]
              ) -> ParityPlan:
        try:
            interval, interval_from = self.source_scrape_interval(dual_write_since, now)
        except PrometheusError as exc:
            return ParityPlan(None, (Measurement("window", Verdict.ERROR, f"the source's scrape interval: {exc}"),),
                              cost=self._cost(started, before))
        self._scrape_interval = interval
        step, step_note = comparison_step(self.policy.step_s, interval)
        self._use_step(step)
        window = self.window(dual_write_since=dual_write_since, now=now, scrape_interval_s=interval)
        if window is None:
            m = Measurement("window", Verdict.INCONCLUSIVE,
                            f"dual-write too short: nothing older than {self.policy.skip_recent_s:.0f}s to compare")
            return ParityPlan(None, (m,), cost=self._cost(started, before))
        start, end = window
        coverage = self.coverage(start, end)
        short_hosts = next((m.numbers.get("short_keys", []) for m in coverage if m.layer == Layer.HOST_COVERAGE), [])
        measurements = list(coverage)
        measurements.append(self.aggregates(start, end, explained=short_hosts))
        measurements.append(self.labels(start, end))
        golden, golden_inventory = self.golden(start, end)
        measurements.extend(golden)
        shards: list[dict[str, Any]] = []
        hosts: list[str] = []
        try:
            hosts = self.sample_plan(start, end)
        except PrometheusError as exc:
            measurements.append(Measurement("samples", Verdict.ERROR, str(exc)))
        size = self.policy.hosts_per_shard
        names = self._host_names_in_use
        kinds = None
        if hosts and self.policy.mode != "dual_write":
            try:
                kinds = self.metric_kinds(start, end)
            except PrometheusError as exc:
                measurements.append(Measurement("samples", Verdict.ERROR, str(exc)))
                hosts = []
        for i in range(0, len(hosts), size):
            shard: dict[str, Any] = {"hosts": hosts[i:i + size], "start": start, "end": end, "step": step,
                                     "scrape_interval_s": interval}
            if names is not None:
                shard["host_names"] = [list(names[0]), list(names[1])]
            if kinds is not None:
                shard["metric_kinds"] = kinds
            shards.append(shard)
        return ParityPlan(ParityWindow(start, end, step, interval, interval_from, step_note), tuple(measurements),
                          tuple(shards),
                          len(hosts), self._cost(started, before), golden_inventory)

    def compare_shard(self, shard: dict[str, Any]) -> dict[str, Any]:
        """One mapped task's work: compare the shard's hosts; returns totals and what it cost."""
        started = time.perf_counter()
        before = [c.ledger.snapshot() for c in (self.source, self.target)]
        if shard.get("step"):
            self._use_step(float(shard["step"]))
        if shard.get("scrape_interval_s"):
            self._scrape_interval = float(shard["scrape_interval_s"])
        if shard.get("metric_kinds"):
            self._kinds = {name: dict(kind) for name, kind in shard["metric_kinds"].items()}
        try:
            out = self.compare_hosts(shard["hosts"], shard["start"], shard["end"], shard.get("host_names"))
        except QueryBudgetExhausted as exc:
            log.warning("parity shard: %s", exc)
            out = {"budget_spent": str(exc)}  # ``reduce`` makes the samples layer INCONCLUSIVE with it
        out["cost"] = self._cost(started, before)
        return out

    def reduce(self, plan: ParityPlan | Mapping[str, Any], shards: Sequence[dict[str, Any]],
               extra: Sequence[Measurement] = ()) -> ParityResult:
        """Merge the plan's layers and every shard into the parity result (``plan``: typed, or its XCom form);
        ``extra``: layers measured elsewhere (the rules layer, when the group's rules move with it)."""
        if not isinstance(plan, ParityPlan):
            plan = ParityPlan.from_dict(plan)
        measurements = [*plan.measurements, *extra]
        spent = next((str(s["budget_spent"]) for s in shards if s.get("budget_spent")), None)
        if plan.window is not None and spent and not any(m.layer == Layer.SAMPLES for m in measurements):
            measurements.append(Measurement("samples", Verdict.INCONCLUSIVE, f"samples not compared: {spent}"))
        elif plan.window is not None and not any(m.layer == Layer.SAMPLES for m in measurements):
            measurements.append(self.samples_measurement(shards, hosts_total=plan.hosts_total))
        costs = [plan.cost, *(s.get("cost", {}) for s in shards)]
        return self.result(measurements, plan.window, costs, shards=len(shards), golden=plan.golden)

    def run(self, *, dual_write_since: float, now: float) -> ParityResult:
        """Every layer in one process; the DAG runs the same plan / shards / reduce as mapped tasks."""
        plan = self.plan(dual_write_since=dual_write_since, now=now)
        return self.reduce(plan, [self.compare_shard(dict(shard)) for shard in plan.shards])

    def _cost(self, started: float, before: list[dict[str, float]]) -> dict[str, float]:
        after = [c.ledger.snapshot() for c in (self.source, self.target)]
        return {"wall_s": time.perf_counter() - started,
                "backend_query_s": sum(a["server_s"] - b["server_s"] for a, b in zip(after, before, strict=True)),
                "queries": sum(a["queries"] - b["queries"] for a, b in zip(after, before, strict=True))}

    def result(self, measurements: list[Measurement], window: ParityWindow | None,
               costs: Sequence[Mapping[str, float]], *, shards: int,
               golden: GoldenInventory | None = None) -> ParityResult:
        samples = next((m for m in measurements if m.layer == Layer.SAMPLES), None)
        nums = samples.numbers if samples else {}
        verdict = assess(measurements, failure_limit=self.policy.failure_limit,
                         inconclusive_limit=self.policy.inconclusive_limit)
        return ParityResult(
            verdict=verdict, measurements=tuple(measurements), window=window,
            hosts_sampled=tuple(nums.get("hosts_sampled", ())),
            **{k: int(nums.get(k, 0)) for k in ("series_compared", "points_compared", "mismatches", "missing_series",
                                                 "missing_points", "extra_series")},
            shards=shards,
            wall_s=sum(c.get("wall_s", 0.0) for c in costs),
            backend_query_s=sum(c.get("backend_query_s", 0.0) for c in costs),
            queries_sent=int(sum(c.get("queries", 0) for c in costs)),
            golden=golden)
