"""Plan a migration from real usage: inventory, who reads what, groups, safe label drops, AMP cost.

Pure: the adapter (``adapters/usage.py``) reads the source and hands over parsed answers, one
metric's series at a time, so a fleet of a million series never sits in memory at once.

- **Inventory** (:class:`MetricStats`): per metric its series, samples per second (series / the
  job's scrape interval), type (``/api/v1/metadata``), jobs, and each label's distinct values
  and cardinality share (distinct values / series).
- **Usage** (:class:`UsageCollector`): every expression (dashboard panel, rule, query-log line)
  is parsed once with the PromQL parser of ``core/promql.py``; per metric and per label it
  records who reads it, how often and when last. A label counts as read when an expression
  names it: a matcher, ``by``/``without``, ``on``/``ignoring``/``group_left``/``group_right``,
  ``label_replace``/``label_join`` source labels, or a panel's ``{{legend}}``. Labels named in
  grouping count for every metric the expression reads (conservative). A binary operation
  between two vectors without ``on(...)`` matches on *all* labels: its metrics are recorded as a
  join, and a label may not be dropped from one side of a join only.
- **Drops** (:class:`DropCheck`): a label may be dropped (``labeldrop``) only when it is never
  read and the series that remain still differ from each other, checked against the source's
  series (not guessed), for the group's labels together: a ``labeldrop`` applies to the whole
  group's remote-write entry, so a label goes only if every metric of the group stays unique.
- **Recommendations** (:func:`recommend`): groups by job and exporter prefix, a keep-filter
  regex each, wave order (small, read-heavy groups first), metrics nobody read left behind with
  their cost, and each group's AMP cost before and after trimming (``core/cost.py`` prices).
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import promql_parser

from promshift.core.aggregation import level_series
from promshift.core.catalog.regex import prometheus_fullmatch
from promshift.core.cost import MONTH_S, AmpPrices, project_monthly_cost
from promshift.core.promql import PromQLError, Selector, _is_scalar, analyse, parse, substitute

__all__ = [
    "DropBasis",
    "DropCheck",
    "ExprUsage",
    "GroupPlan",
    "LabelReads",
    "MetricStats",
    "Plan",
    "Reader",
    "UsageCollector",
    "check_drops",
    "diff_plans",
    "expression_usage",
    "label_reads",
    "metric_stats",
    "recommend",
]

# Series Prometheus makes itself for every target, and its own metrics: never a migration group.
_SELF_METRICS = re.compile(r"up|scrape_.*|prometheus_.*|go_.*|process_.*|promhttp_.*|net_conntrack_.*")
_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# Functions whose string arguments at these positions (0-based) name labels they read.
_LABEL_SOURCES = {"label_replace": lambda i: i == 3, "label_join": lambda i: i >= 3}


# --------------------------------------------------------------------------- usage


@dataclass(frozen=True)
class Reader:
    """Who reads: ``kind`` is ``dashboard``, ``rule`` or ``query_log``; ``name`` says which one."""

    kind: str
    name: str

    def text(self) -> str:
        return f"{self.kind}: {self.name}"


@dataclass(frozen=True)
class ExprUsage:
    """What one expression reads: metrics with the labels named for each, and its all-label joins.

    ``nameless`` are selectors without a metric name (resolved against the inventory later);
    ``labels`` are labels named for every metric of the expression (grouping, ``on``,
    ``label_replace`` sources); ``joins`` are sets of metrics matched on all their labels.
    """

    metrics: Mapping[str, frozenset[str]]
    nameless: tuple[Selector, ...]
    labels: frozenset[str]
    joins: tuple[frozenset[str], ...]
    widest_range_s: float


def _walk(node: Any, out: dict[str, Any]) -> set[str]:
    """Collect reads into ``out``; return the metric names under ``node`` (nameless as '')."""
    if isinstance(node, promql_parser.MatrixSelector):
        out["ranges"].append(node.range.total_seconds() if node.range else 0.0)
        return _walk(node.vector_selector, out)
    if isinstance(node, promql_parser.VectorSelector):
        from promshift.core.promql import _selector

        sel = _selector(node)
        if sel.name:
            out["metrics"].setdefault(sel.name, set()).update(label for label, _, _ in sel.matchers)
            return {sel.name}
        out["nameless"].append(sel)
        return {""}
    if isinstance(node, promql_parser.SubqueryExpr):
        out["ranges"].append(node.range.total_seconds() if node.range else 0.0)
        return _walk(node.expr, out)
    if isinstance(node, promql_parser.AggregateExpr):
        if node.modifier is not None:
            out["labels"].update(node.modifier.labels)
        names = _walk(node.expr, out)
        if isinstance(node.param, promql_parser.Expr):
            names |= _walk(node.param, out)
        return names
    if isinstance(node, promql_parser.BinaryExpr):
        left, right = _walk(node.lhs, out), _walk(node.rhs, out)
        mod = node.modifier
        matching = mod.matching if mod is not None else None
        if mod is not None:
            out["labels"].update(mod.group_labels or ())
        if matching is not None:
            out["labels"].update(matching.labels)
        on = matching is not None and str(matching.type).endswith("Include")
        if not on and not _is_scalar(node.lhs) and not _is_scalar(node.rhs):
            joined = frozenset(n for n in left | right if n)
            if len(joined) > 1:
                out["joins"].append(joined)
        return left | right
    if isinstance(node, promql_parser.Call):
        pick = _LABEL_SOURCES.get(node.func.name)
        names: set[str] = set()
        for i, arg in enumerate(node.args):
            if pick and pick(i) and isinstance(arg, promql_parser.StringLiteral):
                out["labels"].add(arg.val)
            elif isinstance(arg, promql_parser.Expr):
                names |= _walk(arg, out)
        return names
    if isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr)):
        return _walk(node.expr, out)
    return set()


def expression_usage(expr: str) -> ExprUsage:
    """What ``expr`` reads (see :class:`ExprUsage`); PromQLError when it does not parse."""
    out: dict[str, Any] = {"metrics": {}, "nameless": [], "labels": set(), "joins": [], "ranges": []}
    _walk(parse(expr), out)
    return ExprUsage(metrics={k: frozenset(v) for k, v in out["metrics"].items()}, nameless=tuple(out["nameless"]),
                     labels=frozenset(out["labels"]), joins=tuple(out["joins"]),
                     widest_range_s=max(out["ranges"], default=0.0))


@dataclass
class _Reads:
    count: int = 0
    points: float = 0.0  # evaluation points (a range query has one per step)
    last_seen: float | None = None


@dataclass
class UsageCollector:
    """Usage over a period: every expression parsed once, reads counted per reader.

    ``add`` takes one read of ``expr`` by ``reader`` (``count`` times, at ``seen`` unix seconds,
    ``points`` evaluation points in all). Expressions that do not parse are counted in
    ``unparsable`` (first error kept) and never guessed at.
    """

    exprs: dict[str, ExprUsage | None] = field(default_factory=dict)
    reads: dict[tuple[str, Reader], _Reads] = field(default_factory=dict)
    legend_labels: dict[tuple[str, Reader], frozenset[str]] = field(default_factory=dict)
    # dashboard variables without a value, per read: they stood for any value (core/aggregation.py blocks on them)
    unknown_variables: dict[tuple[str, Reader], frozenset[str]] = field(default_factory=dict)
    unparsable: dict[str, str] = field(default_factory=dict)
    unparsable_reads: int = 0

    def usage_of(self, expr: str) -> ExprUsage | None:
        if expr not in self.exprs:
            try:
                self.exprs[expr] = expression_usage(expr)
            except PromQLError as exc:
                self.exprs[expr] = None
                self.unparsable[expr] = str(exc).splitlines()[0][:200]
        return self.exprs[expr]

    def add(self, expr: str, reader: Reader, *, count: int = 1, seen: float | None = None,
            points: float | None = None, legend: str = "", unknown: Iterable[str] = ()) -> bool:
        """Record a read; False when the expression does not parse. ``points`` defaults to ``count``."""
        if self.usage_of(expr) is None:
            self.unparsable_reads += count
            return False
        key = (expr, reader)
        r = self.reads.get(key)
        if r is None:
            r = self.reads[key] = _Reads()
        r.count += count
        r.points += count if points is None else points
        if seen is not None and (r.last_seen is None or seen > r.last_seen):
            r.last_seen = seen
        if unknown:
            self.unknown_variables[key] = self.unknown_variables.get(key, frozenset()) | frozenset(unknown)
        if legend:
            labels = frozenset(_LEGEND_LABEL.findall(legend))
            if labels:
                self.legend_labels[key] = self.legend_labels.get(key, frozenset()) | labels
        return True

    def add_dashboard(self, model: Mapping[str, Any], name: str, *, builtins: Mapping[str, str]) -> list[str]:
        """Every panel query of a Grafana dashboard model; returns one note per problem.

        Variables: the dashboard's own current values are used where it has them; any other
        variable stands for "any value" (``.*``): its label still counts as read.
        """
        notes: list[str] = []
        values = _dashboard_variables(model)
        unknown_seen: set[str] = set()
        for title, target in _panel_targets(model):
            expr = target.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                continue
            sub = substitute(expr, values, builtins=builtins)
            text = sub.expr
            if sub.unknown:
                unknown_seen.update(sub.unknown)
                text = substitute(text, {v: ".*" for v in sub.unknown}).expr
            legend = target.get("legendFormat") if isinstance(target.get("legendFormat"), str) else ""
            if not self.add(text, Reader("dashboard", f"{name} / {title}"), legend=legend, unknown=sub.unknown):
                notes.append(f"dashboard {name}: panel {title!r}: query does not parse: "
                             f"{self.unparsable.get(text, '')[:120]}")
        if unknown_seen:
            notes.append(f"dashboard {name}: variables {', '.join('$' + v for v in sorted(unknown_seen))} have no "
                         "value here; they stood for any value (their labels count as read)")
        return notes


def _dashboard_variables(model: Mapping[str, Any]) -> dict[str, str]:
    values: dict[str, str] = {}
    templating = model.get("templating")
    items = templating.get("list") if isinstance(templating, Mapping) else None
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            continue
        current = item.get("current")
        value = current.get("value") if isinstance(current, Mapping) else None
        if isinstance(value, list):
            value = "|".join(str(v) for v in value)
        if isinstance(value, str) and value and not value.startswith("$"):
            values[item["name"]] = ".*" if value == "$__all" else value
    return values


def _panel_targets(model: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    stack: list[Any] = [model.get("panels") or []]
    for row in model.get("rows") or []:
        if isinstance(row, Mapping):
            stack.append(row.get("panels") or [])
    depth = 0
    while stack and depth < 10_000:
        depth += 1
        panels = stack.pop()
        for panel in panels if isinstance(panels, list) else []:
            if not isinstance(panel, Mapping):
                continue
            stack.append(panel.get("panels") or [])
            title = str(panel.get("title") or f"panel {panel.get('id', '?')}")
            for target in panel.get("targets") or []:
                if isinstance(target, Mapping):
                    yield title, target


# --------------------------------------------------------------------------- inventory and drops


@dataclass(frozen=True)
class DropCheck:
    """Which candidate labels can go together and still keep every series apart.

    ``safe`` were checked together (greedily, most distinct values first); ``unsafe`` maps a
    label to why, with the two series that would merge.
    """

    safe: frozenset[str]
    unsafe: Mapping[str, str]


class DropBasis:
    """One metric's series, compact, for exact uniqueness checks of label drops.

    Per candidate label a column of value codes (-1: the series has no such label), and per
    series a hash of its other labels. Two series merge after dropping ``D`` exactly when their
    other-label hashes and their non-dropped candidate columns agree; a hash collision can only
    make a safe drop look unsafe, never the other way round. About 4 bytes per series and
    candidate, so a million series fit in tens of MB.
    """

    __slots__ = ("columns", "labels", "name", "rest", "series", "values")

    def __init__(self, name: str, series: Sequence[Mapping[str, str]], candidates: Iterable[str], *,
                 present: set[str] | None = None) -> None:
        present = set().union(*series) if present is None else present
        self.name = name
        self.labels = tuple(sorted(c for c in set(candidates) if c in present and c != "__name__"))
        self.series = len(series)
        codes: list[dict[str | None, int]] = []
        cols = []
        for label in self.labels:
            code: dict[str | None, int] = {None: -1}
            cols.append(array("i", [code.setdefault(v, len(code) - 1) for v in (s.get(label) for s in series)]))
            del code[None]
            codes.append(code)
        others = sorted(present - set(self.labels))
        self.columns = tuple(cols)
        self.rest = array("q", [hash(tuple(s.get(k) for k in others)) for s in series])
        self.values = tuple(tuple(c) for c in codes)  # code -> value (dicts keep insertion order)

    def distinct(self, label: str) -> int:
        return len(self.values[self.labels.index(label)]) if label in self.labels else 0

    def clash(self, dropped: Iterable[str]) -> tuple[int, int] | None:
        """Two series that become one when ``dropped`` go, or None when all stay apart.

        Sorted on the kept columns (numpy's lexsort, over the arrays without copying them), two
        neighbours that agree on every kept column are the pair.
        """
        if self.series < 2:
            return None
        gone = set(dropped)
        keys = [np.frombuffer(c, dtype=np.int32) for label, c in zip(self.labels, self.columns, strict=True)
                if label not in gone]
        keys.append(np.frombuffer(self.rest, dtype=np.int64))
        order = np.lexsort(keys)
        same = np.ones(self.series - 1, dtype=bool)
        for key in keys:
            ordered = key[order]
            same &= ordered[1:] == ordered[:-1]
        hits = np.flatnonzero(same)
        if hits.size == 0:
            return None
        return int(order[hits[0]]), int(order[hits[0] + 1])

    def describe(self, pair: tuple[int, int], dropped: Iterable[str]) -> str:
        a, b = pair
        parts = []
        for label in sorted(set(dropped) & set(self.labels)):
            i = self.labels.index(label)
            va, vb = self.columns[i][a], self.columns[i][b]
            if va != vb:
                show = [f'{label}="{self.values[i][v]}"' if v >= 0 else f"no {label}" for v in (va, vb)]
                parts.append(f"{show[0]} vs {show[1]}")
        return (f"two series of {self.name} would merge: they differ only in {', '.join(parts)} "
                "(every other label equal)")


def check_drops(basis: DropBasis, candidates: Sequence[str] | None = None, *,
                also: Sequence[DropBasis] = ()) -> DropCheck:
    """Greedy over ``candidates`` (default: every candidate of ``basis``, most distinct values first).

    A label joins the drop set when every metric (``basis`` and ``also``) keeps its series apart
    without it and the labels already accepted.
    """
    bases = (basis, *also)
    if candidates is None:
        candidates = sorted(basis.labels, key=lambda c: (-basis.distinct(c), c))
    safe: list[str] = []
    unsafe: dict[str, str] = {}
    for label in candidates:
        dropped = [*safe, label]
        why = None
        for b in bases:
            if label not in b.labels:
                continue
            pair = b.clash(dropped)
            if pair is not None:
                why = b.describe(pair, dropped)
                if safe:
                    why += f" (with {', '.join(safe)} dropped too)"
                break
        if why is None:
            safe.append(label)
        else:
            unsafe[label] = why
    return DropCheck(frozenset(safe), unsafe)


@dataclass(frozen=True)
class MetricStats:
    """One metric in the source: series, labels with distinct values, jobs, type, and its drop basis."""

    name: str
    series: int
    labels: Mapping[str, int]  # label -> distinct values
    jobs: tuple[str, ...]
    type: str = "unknown"
    samples_per_s: float = 0.0
    basis: DropBasis | None = None
    level: tuple[str, ...] | None = None  # the aggregation level its reads allow (core/aggregation.py)
    level_series: int = 0  # the series recorded at that level

    def share(self, label: str) -> float:
        return self.labels.get(label, 0) / self.series if self.series else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "series": self.series, "type": self.type, "jobs": list(self.jobs),
                "samples_per_s": round(self.samples_per_s, 6),
                "labels": {k: {"values": v, "share": round(self.share(k), 6)} for k, v in sorted(self.labels.items())}}


def metric_stats(name: str, series: Sequence[Mapping[str, str]], *, candidates: Iterable[str] = (),
                 type_: str = "unknown", scrape_interval_s: Mapping[str, float] | None = None,
                 default_interval_s: float = 30.0, level: Sequence[str] | None = None) -> MetricStats:
    """Stats of one metric from its series, with the drop basis for ``candidates`` (labels nobody read).

    Samples per second: each series once per its job's scrape interval. ``level``: the labels an aggregation
    would keep (``core/aggregation.py``): its series are counted while the series are at hand.
    """
    present: set[str] = set().union(*series) if series else set()
    basis = DropBasis(name, series, candidates, present=present)
    distinct: dict[str, int] = {}
    for k in present - {"__name__"}:
        # Candidates were counted by the basis; the rest one column at a time (a set per label, not per series).
        distinct[k] = basis.distinct(k) if k in basis.labels else len({s.get(k) for s in series} - {None})
    jobs = Counter(s.get("job", "") for s in series)
    intervals = scrape_interval_s or {}
    rate = sum(n / (intervals.get(job) or default_interval_s) for job, n in jobs.items())
    return MetricStats(name=name, series=len(series), labels=dict(sorted(distinct.items())),
                       jobs=tuple(sorted(j for j in jobs if j)), type=type_, samples_per_s=rate, basis=basis,
                       level=None if level is None else tuple(level),
                       level_series=0 if level is None else level_series(series, level))


# --------------------------------------------------------------------------- resolution of reads


@dataclass
class _MetricUse:
    readers: dict[Reader, _Reads] = field(default_factory=dict)
    labels: dict[str, set[Reader]] = field(default_factory=dict)
    points: float = 0.0  # evaluation points of the expressions that read it
    samples_per_point: float = 0.0  # summed over those expressions, weighted below


def _nameless_matches(sel: Selector, metric: MetricStats) -> bool:
    for label, op, value in sel.matchers:
        if label == "__name__":
            targets = [metric.name]
        elif label == "job":
            targets = list(metric.jobs) or [""]
        else:
            continue
        if op in ("=~", "!~"):  # RE2, as Prometheus: a pattern from a query log must not backtrack for hours
            found = [prometheus_fullmatch(value, t) for t in targets]
            hit = None in found or any(found)
        else:
            hit = value in targets
        if (op in ("=", "=~")) != hit:
            return False
    return True


def resolve_usage(usage: UsageCollector, metrics: Mapping[str, MetricStats], *,
                  default_interval_s: float = 30.0) -> tuple[dict[str, _MetricUse], list[frozenset[str]]]:
    """Per metric: who reads it and which labels; and every all-label join between metrics."""
    uses: dict[str, _MetricUse] = {}
    joins: list[frozenset[str]] = []
    by_expr: dict[str, list[tuple[Reader, _Reads]]] = {}
    for (expr, reader), r in usage.reads.items():
        by_expr.setdefault(expr, []).append((reader, r))
    for expr, readers in by_expr.items():
        eu = usage.exprs[expr]
        assert eu is not None
        names: dict[str, frozenset[str]] = {m: labels for m, labels in eu.metrics.items() if m in metrics}
        for sel in eu.nameless:
            for m in metrics.values():
                if _nameless_matches(sel, m):
                    names[m.name] = names.get(m.name, frozenset()) | {label for label, _, _ in sel.matchers}
        joins.extend(eu.joins)
        # Samples one evaluation touches: each metric's series, times the widest range's samples.
        per_point = sum(metrics[m].series * max(1.0, eu.widest_range_s / default_interval_s) for m in names)
        for name, labels in names.items():
            use = uses.setdefault(name, _MetricUse())
            share = metrics[name].series / max(1.0, sum(metrics[m].series for m in names))
            for reader, r in readers:
                mine = use.readers.setdefault(reader, _Reads())
                mine.count += r.count
                mine.points += r.points
                if r.last_seen is not None and (mine.last_seen is None or r.last_seen > mine.last_seen):
                    mine.last_seen = r.last_seen
                if reader.kind == "query_log":
                    use.points += r.points
                    use.samples_per_point += r.points * per_point * share
                for label in labels | eu.labels | usage.legend_labels.get((expr, reader), frozenset()):
                    use.labels.setdefault(label, set()).add(reader)
    return uses, joins


# --------------------------------------------------------------------------- recommendations


@dataclass(frozen=True)
class GroupPlan:
    """One recommended group: its metrics (read ones kept), keep-filter, drops, wave and cost."""

    name: str
    job: str
    prefix: str
    metrics: tuple[str, ...]  # read: these move
    left_behind: tuple[str, ...]  # nobody read them in the period
    keep_regex: str
    drops: tuple[str, ...]
    unsafe_drops: Mapping[str, str]
    series: int
    series_all: int
    samples_per_s: float
    reads: int
    wave: int
    cost_before: Mapping[str, float]
    cost_after: Mapping[str, float]
    golden: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "job": self.job, "prefix": self.prefix, "wave": self.wave,
                "metrics": list(self.metrics), "left_behind": list(self.left_behind), "keep_regex": self.keep_regex,
                "labeldrop": list(self.drops), "unsafe_drops": dict(sorted(self.unsafe_drops.items())),
                "series": self.series, "series_all": self.series_all, "samples_per_s": round(self.samples_per_s, 6),
                "reads": self.reads, "cost_before": dict(self.cost_before), "cost_after": dict(self.cost_after),
                "golden_queries": list(self.golden)}


@dataclass(frozen=True)
class Plan:
    """The whole plan: groups in wave order, metrics and labels with their readers, what could not be read."""

    groups: tuple[GroupPlan, ...]
    metrics: Mapping[str, Mapping[str, Any]]
    unread_metrics: tuple[str, ...]
    never_read_labels: Mapping[str, tuple[str, ...]]
    not_read: tuple[str, ...]  # what the plan could not read: the plan is partial when any
    period_s: float
    generated_at: float
    # The aggregation pass (core/plan_aggregation.py): per read metric a recommendation or its blockers, per group
    # the recorded metrics and the group's cost with them, the workspace's bill (tiers, free tier, collectors).
    aggregations: tuple[Mapping[str, Any], ...] = ()
    group_aggregations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    bill: Mapping[str, Any] = field(default_factory=dict)
    prices_date: str = ""

    @property
    def partial(self) -> bool:
        return bool(self.not_read)

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "generated_at": self.generated_at, "period_s": self.period_s,
                "partial": self.partial, "not_read": list(self.not_read),
                "groups": [{**g.to_dict(), **self.group_aggregations.get(g.name, {"aggregations": [],
                                                                                  "cost_aggregated": g.cost_after})}
                           for g in self.groups],
                "unread_metrics": list(self.unread_metrics),
                "aggregations": [dict(a) for a in self.aggregations], "bill": dict(self.bill),
                "prices_date": self.prices_date,
                "never_read_labels": {k: list(v) for k, v in sorted(self.never_read_labels.items())},
                "metrics": {k: dict(v) for k, v in sorted(self.metrics.items())},
                "totals": {"before_usd": round(sum(g.cost_before["total_usd"] for g in self.groups), 4),
                           "after_usd": round(sum(g.cost_after["total_usd"] for g in self.groups), 4)}}


def _family(name: str, depth: int) -> str:
    tokens = [t for t in name.split("_") if t]
    return "_".join(tokens[:depth]) if tokens else name


def _shared_depth(names: Sequence[str], limit: int = 6) -> int:
    depth = 0
    while depth < limit and len({_family(n, depth + 1) for n in names}) == 1 and \
            all(len([t for t in n.split("_") if t]) > depth + 1 for n in names):
        depth += 1
    return depth


def _families(metrics: Sequence[MetricStats], max_metrics: int,
              min_metrics: int = 3) -> dict[tuple[str, str], list[MetricStats]]:
    """Group by job, then by name prefix, one token deeper while a family has over ``max_metrics``.

    A family is named by the prefix its metrics share (``DCGM_FI_DEV``); parts of a split with
    fewer than ``min_metrics`` stay together as ``<prefix>_other``.
    """
    out: dict[tuple[str, str], list[MetricStats]] = {}
    by_job: dict[str, list[MetricStats]] = {}
    for m in metrics:
        by_job.setdefault(m.jobs[0] if m.jobs else "", []).append(m)
    pending = list(by_job.items())
    while pending:
        job, ms = pending.pop()
        depth = _shared_depth([m.name for m in ms])
        prefix = _family(ms[0].name, depth) if depth else (_family(ms[0].name, 1) if len(ms) == 1 else job or "misc")
        split: dict[str, list[MetricStats]] = {}
        for m in ms:
            split.setdefault(_family(m.name, depth + 1), []).append(m)
        if len(ms) <= max_metrics or len(split) == 1:
            out[(job, prefix)] = ms
            continue
        pool: list[MetricStats] = []
        for part in split.values():
            if len(part) < min_metrics:
                pool.extend(part)
            else:
                pending.append((job, part))
        if pool:
            out[(job, f"{prefix}_other" if len(pool) < len(ms) else prefix)] = pool
    return out


def _group_name(job: str, prefix: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", f"{prefix}".lower()).strip("-") or "group"
    if job and not base.startswith(re.sub(r"[^a-z0-9]+", "-", job.lower()).strip("-")):
        base = re.sub(r"[^a-z0-9]+", "-", job.lower()).strip("-") + "-" + base
    if not base[0].isalpha():
        base = "g-" + base
    base = base[:90]
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def _re2_escape(name: str) -> str:
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", name)


def _cost(series: int, samples_per_s: float, query_samples_per_month: float, prices: AmpPrices,
          retention_days: float) -> dict[str, float]:
    interval = series / samples_per_s if samples_per_s > 0 else 30.0
    projection = project_monthly_cost(active_series=series, scrape_interval_s=interval, retention_days=retention_days,
                                      queries=(), dashboard_refresh_s=60.0, dashboard_viewers=0, prices=prices)
    query_usd = query_samples_per_month / 1e9 * prices.query_per_billion_samples
    return {"ingest_usd": round(projection.ingestion_usd, 4), "storage_usd": round(projection.storage_usd, 4),
            "query_usd": round(query_usd, 4),
            "total_usd": round(projection.ingestion_usd + projection.storage_usd + query_usd, 4),
            "samples_per_month": round(projection.ingestion_samples_per_month),
            "query_samples_per_month": round(query_samples_per_month), "series": series}


@dataclass(frozen=True)
class LabelReads:
    """Labels named per metric before the inventory is known; ``everywhere`` for selectors without a name."""

    by_metric: Mapping[str, frozenset[str]]
    everywhere: frozenset[str]

    def candidates(self, name: str, label_names: Iterable[str], protected: Iterable[str] = ()) -> set[str]:
        """Labels of ``name`` that no read names (conservative: nameless selectors' labels count everywhere)."""
        read = self.by_metric.get(name, frozenset()) | self.everywhere | set(protected) | {"__name__"}
        return {label for label in label_names if label not in read}


def label_reads(usage: UsageCollector) -> LabelReads:
    """Per metric name, every label any read of it names (grouping labels count for all its metrics)."""
    by: dict[str, set[str]] = {}
    everywhere: set[str] = set()
    for expr, reader in usage.reads:
        eu = usage.exprs[expr]
        assert eu is not None
        extra = eu.labels | usage.legend_labels.get((expr, reader), frozenset())
        for name, labels in eu.metrics.items():
            by.setdefault(name, set()).update(labels | extra)
        if eu.nameless:
            everywhere.update(extra)
            everywhere.update(label for sel in eu.nameless for label, _, _ in sel.matchers)
    return LabelReads({k: frozenset(v) for k, v in by.items()}, frozenset(everywhere))


def recommend(metrics: Mapping[str, MetricStats], usage: UsageCollector, *, prices: AmpPrices,
              retention_days: float, period_s: float, now: float, protected_labels: Iterable[str] = (),
              max_group_metrics: int = 12, not_read: Sequence[str] = (),
              default_interval_s: float = 30.0) -> Plan:
    """Groups, waves, left-behind metrics, safe drops and cost, from the inventory and the usage."""
    uses, joins = resolve_usage(usage, metrics, default_interval_s=default_interval_s)
    protected = set(protected_labels) | {"__name__"}
    months = MONTH_S / period_s if period_s > 0 else 0.0
    movable_metrics = [m for m in metrics.values() if not _SELF_METRICS.fullmatch(m.name)]
    families = _families(sorted(movable_metrics, key=lambda m: m.name), max_group_metrics)
    drafts: list[dict[str, Any]] = []
    taken: set[str] = set()
    group_of: dict[str, str] = {}
    for (job, prefix), ms in sorted(families.items()):
        name = _group_name(job, prefix, taken)
        for m in ms:
            group_of[m.name] = name
        drafts.append({"name": name, "job": job, "prefix": prefix, "metrics": ms})
    groups: list[dict[str, Any]] = []
    for d in drafts:
        ms: list[MetricStats] = d["metrics"]
        read = [m for m in ms if m.name in uses]
        behind = [m for m in ms if m.name not in uses]
        if not read:
            d["unread_only"] = True
            groups.append(d)
            continue
        # A label the group may drop: no read of any kept metric names it, each metric stays unique.
        labels = {label for m in read for label in m.labels}
        unsafe: dict[str, str] = {}
        candidates: list[str] = []
        for label in sorted(labels - protected):
            readers = sorted({r.text() for m in read for r in uses[m.name].labels.get(label, ())})
            if readers:
                unsafe[label] = f"read by {readers[0]}" + (f" and {len(readers) - 1} more" if len(readers) > 1 else "")
                continue
            unchecked = next((m for m in read if label in m.labels
                              and (m.basis is None or label not in m.basis.labels)), None)
            if unchecked is not None:
                unsafe[label] = (f"{unchecked.name}: not checked against the source's series (a read names it for "
                                 "another metric, or a selector without a metric name may read it)")
                continue
            outside = next((j for j in joins if any(group_of.get(n) == d["name"] for n in j)
                            and any(group_of.get(n) != d["name"] and label in metrics[n].labels
                                    for n in j if n in metrics)), None)
            if outside is not None:
                unsafe[label] = ("matched on all labels with another group's metric in one expression "
                                 f"({', '.join(sorted(outside))})")
                continue
            candidates.append(label)
        bases = [m.basis for m in read if m.basis is not None]
        distinct = {c: sum(m.labels.get(c, 0) for m in read) for c in candidates}
        order = sorted(candidates, key=lambda c: (-distinct[c], c))
        check = check_drops(bases[0], order, also=bases[1:]) if bases else DropCheck(frozenset(), {})
        drops = set(check.safe)
        unsafe.update(check.unsafe)
        for label in sorted(protected & labels - {"__name__"}):
            unsafe.setdefault(label, "kept on purpose (--keep-label / the host label)")
        qsamples = sum(uses[m.name].samples_per_point for m in read) * months
        reads = sum(r.count for m in read for r in uses[m.name].readers.values())
        series_all = sum(m.series for m in ms)
        series = sum(m.series for m in read)
        rate_all = sum(m.samples_per_s for m in ms)
        rate = sum(m.samples_per_s for m in read)
        golden = _golden(usage, {m.name for m in read})
        groups.append({**d, "read": read, "behind": behind, "drops": drops, "unsafe": unsafe, "reads": reads,
                       "series": series, "series_all": series_all, "rate": rate, "rate_all": rate_all,
                       "before": _cost(series_all, rate_all, qsamples, prices, retention_days),
                       "after": _cost(series, rate, qsamples, prices, retention_days), "golden": golden})
    movable = [g for g in groups if not g.get("unread_only")]
    # Small, read-heavy first: reads per series, then fewer series.
    movable.sort(key=lambda g: (-g["reads"] / max(1, g["series"]), g["series"], g["name"]))
    plans = []
    for i, g in enumerate(movable):
        plans.append(GroupPlan(
            name=g["name"], job=g["job"], prefix=g["prefix"], metrics=tuple(m.name for m in g["read"]),
            left_behind=tuple(m.name for m in g["behind"]),
            keep_regex="|".join(_re2_escape(m.name) for m in g["read"]), drops=tuple(sorted(g["drops"])),
            unsafe_drops=g["unsafe"], series=g["series"], series_all=g["series_all"], samples_per_s=g["rate"],
            reads=g["reads"], wave=1 if i == 0 else 2 + (i - 1) // 3, cost_before=g["before"], cost_after=g["after"],
            golden=g["golden"]))
    unread = sorted(m.name for m in movable_metrics if m.name not in uses)
    never: dict[str, tuple[str, ...]] = {}
    table: dict[str, dict[str, Any]] = {}
    for m in metrics.values():
        use = uses.get(m.name)
        row = m.to_dict()
        row["group"] = group_of.get(m.name)
        row["cost_usd"] = _cost(m.series, m.samples_per_s, 0.0, prices, retention_days)["total_usd"]
        if use is None:
            row["readers"] = []
        else:
            row["readers"] = sorted(({"reader": r.text(), "count": x.count, "last_seen": x.last_seen}
                                     for r, x in use.readers.items()), key=lambda e: (-e["count"], e["reader"]))[:50]
            for label, info in row["labels"].items():
                info["read_by"] = sorted(r.text() for r in use.labels.get(label, ()))[:20]
            unread_labels = tuple(sorted(k for k in m.labels if k not in use.labels))
            if unread_labels:
                never[m.name] = unread_labels
        table[m.name] = row
    return Plan(groups=tuple(plans), metrics=table, unread_metrics=tuple(unread), never_read_labels=never,
                not_read=tuple(not_read), period_s=period_s, generated_at=now)


def _golden(usage: UsageCollector, names: set[str], limit: int = 3) -> tuple[str, ...]:
    """The most-read plain expressions on these metrics only (golden latency queries), else ``count(m)``."""
    counts: dict[str, int] = {}
    for (expr, _), r in usage.reads.items():
        eu = usage.exprs.get(expr)
        if eu is None or eu.nameless or not eu.metrics or not set(eu.metrics) <= names or "$" in expr:
            continue
        if len(expr) > 500:
            continue
        counts[expr] = counts.get(expr, 0) + r.count
    best = sorted(counts, key=lambda e: (-counts[e], e))[:limit]
    try:
        best = [e for e in best if analyse(e).reads]
    except PromQLError:
        best = []
    return tuple(best) or tuple(f"count({n})" for n in sorted(names)[:limit])


# --------------------------------------------------------------------------- diff


def diff_plans(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What changed between two ``plan.json`` documents, one line each."""
    lines: list[str] = []
    old_unread, new_unread = set(old.get("unread_metrics", ())), set(new.get("unread_metrics", ()))
    for name in sorted(old_unread - new_unread):
        lines.append(f"now read: {name}")
    for name in sorted(new_unread - old_unread):
        lines.append(f"no longer read: {name}")
    og = {g["name"]: g for g in old.get("groups", ())}
    ng = {g["name"]: g for g in new.get("groups", ())}
    for name in sorted(set(ng) - set(og)):
        lines.append(f"new group: {name}")
    for name in sorted(set(og) - set(ng)):
        lines.append(f"group gone: {name}")
    for name in sorted(set(og) & set(ng)):
        a, b = og[name], ng[name]
        if set(a["metrics"]) != set(b["metrics"]):
            added = sorted(set(b["metrics"]) - set(a["metrics"]))
            removed = sorted(set(a["metrics"]) - set(b["metrics"]))
            lines.append(f"group {name}: metrics" + (f" +{', '.join(added)}" if added else "")
                         + (f" -{', '.join(removed)}" if removed else ""))
        if set(a["labeldrop"]) != set(b["labeldrop"]):
            lines.append(f"group {name}: labeldrop {sorted(a['labeldrop'])} -> {sorted(b['labeldrop'])}")
        before, after = a["cost_after"]["total_usd"], b["cost_after"]["total_usd"]
        if abs(after - before) > 0.005:
            lines.append(f"group {name}: monthly cost after trimming ${before:,.2f} -> ${after:,.2f}")
        if a.get("wave") != b.get("wave"):
            lines.append(f"group {name}: wave {a.get('wave')} -> {b.get('wave')}")
    return lines
