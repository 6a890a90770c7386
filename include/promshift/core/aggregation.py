"""Aggregate before shipping: recording rules for what every read of a metric aggregates away.

AMP bills samples, not labels: a per-GPU series that every dashboard, rule and ad-hoc query reads as
``avg by (Hostname)`` costs eight times what its per-node aggregate would. This module reads every
expression that reads a metric (dashboards, rules, the query log over the period; the same
``UsageCollector`` the plan uses) and, per metric, either recommends recording rules on the source
that pre-aggregate it, or names the read that needs the raw series.

**A read's shape** (:func:`read_shapes`, one walk of the parser's tree per distinct expression,
through ``core.promql.parse`` and its budget): for every selector of a metric, the innermost
aggregation around it (``sum``/``avg``/``count``/``min``/``max`` with ``by``/``without``), and between
the two either nothing (a gauge read) or ``rate``/``increase`` over a range (a counter read). It
*needs the raw series*, and so blocks the metric's aggregation, when:

- no aggregation wraps the selector (a per-GPU panel, ``x / y`` per series, a bare alert);
- the aggregation returns series as they are (``topk``, ``bottomk``, ``quantile``, ``stddev``,
  ``stdvar``, ``count_values``, ``group``, ``limitk``): ``topk(5, x)`` is a read by GPU;
- anything else stands between the aggregation and the selector (another function, a binary
  operation, a subquery, ``offset``/``@``);
- a matcher selects on a label the aggregation removes (``gpu="0"``, ``gpu=~"$gpu"``);
- a dashboard variable had no value (it may select one GPU);
- a selector without a metric name may read the metric (resolved against the inventory).

**A metric's decision** (:func:`decide`): every read must be unblocked and of one family:
``sum``/``avg``/``count`` (recorded as sum and count), ``min`` or ``max``; gauges read raw, counters
through ``rate``/``increase`` over one window (never a sum of raw counters: a reset would show as a
drop). The recorded level is the union of the labels the reads keep; a read that keeps fewer
re-aggregates the recorded series (a sum of sums, a max of maxes, ``sum(sum) / sum(count)`` for an
average, ``increase = rate x window``). Names follow Prometheus' convention
``level:metric:operations`` (operations newest first; ``sum`` is implied for a rate).

Pure: no I/O. The inventory counts each level's series (:func:`level_series`) while it holds a
metric's series; the plan prices before and after.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import promql_parser

from promshift.core.durations import format_duration
from promshift.core.promql import PromQLError, Selector, _selector, parse

__all__ = [
    "Aggregation",
    "Blocker",
    "ReadShape",
    "RecordingRule",
    "decide",
    "AGGREGATE_RULE_PREFIX",
    "aggregation_of",
    "aggregation_rules_document",
    "level_series",
    "read_shapes",
    "recording_rules",
    "rewrite_expression",
    "rewrite_group_read",
    "rewrite_read",
    "rule_name",
]

# Aggregations a recording rule can pre-compute and a read can re-aggregate, by family.
FAMILY = {"sum": "sum", "avg": "sum", "count": "sum", "min": "min", "max": "max"}
# Aggregations that hand back (some of) the series as they are, or need every one of them.
RAW = frozenset({"topk", "bottomk", "quantile", "stddev", "stdvar", "count_values", "group", "limitk",
                 "limit_ratio"})
COUNTER_FUNCTIONS = frozenset({"rate", "increase"})
# Each read's evaluation of a raw series, said once per metric: a few are enough to act on.
MAX_BLOCKERS = 20


@dataclass(frozen=True)
class ReadShape:
    """How one expression reads one metric's selector (see the module docstring); ``blocked`` says why it needs
    the raw series ("" when it does not)."""

    metric: str | None  # None: a selector without a metric name
    expr: str
    op: str = ""
    by: frozenset[str] | None = None
    without: frozenset[str] | None = None
    function: str = ""  # rate or increase, or "" for a gauge read
    window_s: float = 0.0
    matchers: tuple[tuple[str, str, str], ...] = ()
    selector: Selector | None = None
    fragment: str = ""  # the aggregation's text as the parser prints it
    blocked: str = ""

    def keeps(self, labels: Iterable[str]) -> frozenset[str]:
        """The labels this read keeps, of a metric with ``labels``."""
        if self.by is not None:
            return self.by
        return frozenset(labels) - (self.without or frozenset()) - {"__name__"}


def _walk(node: Any, expr: str, agg: Any, between: str, function: tuple[str, float] | None,
          out: list[ReadShape]) -> None:
    """``agg``: the innermost pre-computable aggregation node (or None); ``between``: why what stands between it
    and here needs the raw series ("" when nothing does); ``function``: rate/increase and its window."""
    if isinstance(node, promql_parser.AggregateExpr):
        op = str(node.op)
        if op in FAMILY:
            _walk(node.expr, expr, node, "", None, out)
        else:
            why = f"{op}() hands back the series as they are" if op in RAW else f"{op}() is not pre-computed here"
            _walk(node.expr, expr, None, why, None, out)
        if isinstance(node.param, promql_parser.Expr):
            _walk(node.param, expr, None, f"the parameter of {op}()", None, out)
        return
    if isinstance(node, promql_parser.ParenExpr):
        _walk(node.expr, expr, agg, between, function, out)
        return
    if isinstance(node, promql_parser.Call):
        name = node.func.name
        args = [a for a in node.args if isinstance(a, promql_parser.Expr)]
        if (name in COUNTER_FUNCTIONS and agg is not None and not between and function is None and args
                and isinstance(args[0], promql_parser.MatrixSelector)):
            _walk(args[0], expr, agg, "", (name, args[0].range.total_seconds() if args[0].range else 0.0), out)
            return
        for a in args:
            _walk(a, expr, agg, between or (f"{name}() over the raw series" if agg is not None else ""), function, out)
        return
    if isinstance(node, promql_parser.BinaryExpr):
        why = between or ("a binary operation on the raw series inside the aggregation" if agg is not None else "")
        _walk(node.lhs, expr, agg, why, function, out)
        _walk(node.rhs, expr, agg, why, function, out)
        return
    if isinstance(node, promql_parser.UnaryExpr):
        _walk(node.expr, expr, agg, between or ("a sign change inside the aggregation" if agg is not None else ""),
              function, out)
        return
    if isinstance(node, promql_parser.SubqueryExpr):
        _walk(node.expr, expr, agg, between or ("a subquery over the raw series" if agg is not None else ""), function,
              out)
        return
    if isinstance(node, promql_parser.MatrixSelector):
        vs = node.vector_selector
        why = between if function is not None or agg is None else (between or "a range over the raw samples")
        _selector_shape(vs, expr, agg, why, function, out)
        return
    if isinstance(node, promql_parser.VectorSelector):
        _selector_shape(node, expr, agg, between, function, out)


def _selector_shape(vs: Any, expr: str, agg: Any, between: str, function: tuple[str, float] | None,
                    out: list[ReadShape]) -> None:
    sel = _selector(vs)
    matchers = tuple(m for m in sel.matchers if m[0] != "__name__")
    why = between
    if not why and agg is None:
        why = "reads the series as they are (no aggregation)"
    if not why and (vs.offset or vs.at):
        why = "offset or @ on the raw series"
    if agg is None:
        out.append(ReadShape(sel.name, expr, matchers=matchers, selector=sel, blocked=why))
        return
    mod = agg.modifier
    by = frozenset(mod.labels) if mod is not None and mod.type == promql_parser.AggModifierType.By else None
    without = frozenset(mod.labels) if mod is not None and mod.type == promql_parser.AggModifierType.Without else None
    if mod is None:
        by = frozenset()
    out.append(ReadShape(sel.name, expr, op=str(agg.op), by=by, without=without,
                         function=function[0] if function else "", window_s=function[1] if function else 0.0,
                         matchers=matchers, selector=sel, fragment=str(agg), blocked=why))


def read_shapes(expr: str) -> list[ReadShape]:
    """Every selector of ``expr`` with how it is read; PromQLError when it does not parse (or is over budget)."""
    out: list[ReadShape] = []
    _walk(parse(expr), expr, None, "", None, out)
    return out


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Blocker:
    """A read that needs the raw series: who reads, what, and why."""

    reader: str
    expr: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"reader": self.reader, "expr": self.expr[:300], "why": self.why}


@dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str

    def to_dict(self) -> dict[str, str]:
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Aggregation:
    """One metric's decision: recording rules (``rules``) at ``level``, or the reads that block it."""

    metric: str
    family: str = ""
    level: tuple[str, ...] = ()
    function: str = ""  # "rate" for a counter read through rate/increase, "" for a gauge
    window_s: float = 0.0
    rules: tuple[RecordingRule, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    rewrites: tuple[tuple[str, str, str], ...] = ()  # (reader, original aggregation, rewritten)
    reads: tuple[tuple[str, str, str], ...] = ()  # (reader, whole read, the whole read rewritten)

    @property
    def recommended(self) -> bool:
        return bool(self.rules) and not self.blockers

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "recommended": self.recommended, "family": self.family,
                "level": list(self.level), "function": self.function, "window_s": self.window_s,
                "operations": [r.expr.split(" ", 1)[0] for r in self.rules],
                "rules": [r.to_dict() for r in self.rules], "blocked_by": [b.to_dict() for b in self.blockers],
                "rewrites": [{"reader": r, "original": o, "rewritten": w} for r, o, w in self.rewrites],
                "reads": [{"reader": r, "read": o, "rewritten": w} for r, o, w in self.reads]}


def _window(seconds: float) -> str:
    return format_duration(seconds)


def rule_name(level: Sequence[str], metric: str, operation: str) -> str:
    """``level:metric:operations`` (Prometheus' recording-rule convention); an empty level for a fleet-wide one."""
    return f"{'_'.join(level)}:{metric}:{operation}"


def _operation(op: str, function: str, window_s: float) -> str:
    if not function:
        return op
    rate = f"rate{_window(window_s)}"
    return rate if op == "sum" else f"{op}_{rate}"


def _inner(metric: str, function: str, window_s: float) -> str:
    return f"rate({metric}[{_window(window_s)}])" if function else metric


def _by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)}) " if labels else ""


def _ops_needed(ops: Iterable[str]) -> tuple[str, ...]:
    """The recorded operations a family's reads need: avg needs sum and count."""
    need: set[str] = set()
    for op in ops:
        need.update(("sum", "count") if op == "avg" else (op,))
    return tuple(o for o in ("sum", "count", "min", "max") if o in need)


def _matcher_text(matchers: Sequence[tuple[str, str, str]]) -> str:
    from promshift.core.promql import promql_string

    return "{" + ", ".join(f"{k}{op}{promql_string(v)}" for k, op, v in matchers) + "}" if matchers else ""


def rewrite_read(shape: ReadShape, level: Sequence[str], labels: Iterable[str], family_function: str,
                 window_s: float) -> str:
    """The read's aggregation as it reads the recorded series (the same answer, see the module docstring)."""
    keep = sorted(shape.keeps(labels))
    sel = _matcher_text(shape.matchers)
    scale = f" * {window_s:g}" if shape.function == "increase" else ""

    def rec(op: str) -> str:
        return rule_name(level, shape.metric or "", _operation(op, family_function, window_s)) + sel

    if shape.op == "avg":
        text = f"(sum {_by(keep)}({rec('sum')}) / sum {_by(keep)}({rec('count')}))"
    elif shape.op == "count":
        text = f"sum {_by(keep)}({rec('count')})"
    else:
        text = f"{shape.op} {_by(keep)}({rec(shape.op)})"
    return f"({text}{scale})" if scale else text


def _aggregation_spans(expr: str, op: str) -> list[tuple[int, int]]:
    """Where ``op(...)`` with its ``by``/``without`` clause (before or after the body) stands in ``expr``'s text."""
    from promshift.core.promql import _TOKEN

    tokens = [(m.start(), m.end(), m.group()) for m in _TOKEN.finditer(expr)]
    solid = [t for t in tokens if not t[2][0].isspace() and not t[2].startswith("#")]

    def group_end(i: int) -> int:
        """Index after the parenthesised group opening at solid[i] (-1 when unbalanced)."""
        depth = 0
        for k in range(i, len(solid)):
            depth += {"(": 1, ")": -1}.get(solid[k][2], 0)
            if depth == 0:
                return k + 1
        return -1

    spans = []
    for i, (start, _, text) in enumerate(solid):
        if text.lower() != op:
            continue
        j = i + 1
        if j < len(solid) and solid[j][2].lower() in ("by", "without"):
            j = group_end(j + 1) if j + 1 < len(solid) and solid[j + 1][2] == "(" else -1
        if j < 0 or j >= len(solid) or solid[j][2] != "(":
            continue
        j = group_end(j)
        if j < 0:
            continue
        if j + 1 < len(solid) and solid[j][2].lower() in ("by", "without") and solid[j + 1][2] == "(":
            j = group_end(j + 1)
            if j < 0:
                continue
        spans.append((start, solid[j - 1][1]))
    return spans


def rewrite_expression(expr: str, agg: Aggregation, labels: Iterable[str]) -> str:
    """``expr`` reading ``agg``'s recorded series instead of its metric: each aggregation of the metric replaced
    by its rewrite, every other byte as written. PromQLError when a read of the metric in it needs the raw
    series, or when the result would not read the recorded series only."""
    shapes = [s for s in read_shapes(expr) if s.metric == agg.metric]
    if not agg.recommended or not shapes:
        raise PromQLError(f"nothing of {agg.metric} to rewrite in {expr[:120]!r}")
    blocked = next((s for s in shapes if s.blocked), None)
    if blocked is not None:
        raise PromQLError(f"{expr[:120]!r} needs the raw series of {agg.metric}: {blocked.blocked}")
    level = set(agg.level)
    for s in shapes:  # a read the recommendation was not made from must still be served by it
        if (FAMILY[s.op] != agg.family or ("rate" if s.function else "") != agg.function
                or (s.function and s.window_s != agg.window_s) or not s.keeps(labels) <= level
                or any(label not in level for label, _, _ in s.matchers)):
            raise PromQLError(f"{expr[:120]!r} reads {agg.metric} in a way its recording does not serve")
    wanted = {s.fragment: rewrite_read(s, agg.level, labels, agg.function, agg.window_s) for s in shapes}
    edits: list[tuple[int, int, str]] = []
    for op in {s.op for s in shapes}:
        for start, end in _aggregation_spans(expr, op):
            try:
                printed = str(parse(expr[start:end]))
            except PromQLError:
                continue
            if printed in wanted:
                edits.append((start, end, wanted[printed]))
    out = expr
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    left = [s for s in read_shapes(out) if s.metric == agg.metric]
    if left:
        raise PromQLError(f"cannot rewrite every read of {agg.metric} in {expr[:120]!r}")
    return out


def recording_rules(metric: str, level: Sequence[str], operations: Sequence[str],
                    rate_s: float = 0.0) -> tuple[tuple[str, str], ...]:
    """(record, expr) for each recorded operation of ``metric`` at ``level`` (rate over ``rate_s`` when > 0):
    the rules :func:`decide` recommends, from a catalog's ``aggregations`` entry."""
    function = "rate" if rate_s > 0 else ""
    return tuple((rule_name(level, metric, _operation(op, function, rate_s)),
                  f"{op} {_by(level)}({_inner(metric, function, rate_s)})") for op in operations)


# The rule group (and rule file stem) promshift owns on the source for a group's aggregations.
AGGREGATE_RULE_PREFIX = "promshift-aggregate-"


def aggregation_rules_document(group_name: str, aggregates: Sequence[Any], interval_s: float) -> str:
    """The source's rule file for a group's ``aggregations`` (``core.catalog.Aggregate``): one rule group
    ``promshift-aggregate-<group>`` evaluated every ``interval_s`` (the group's scrape interval, so each recorded
    sample is one scrape's aggregate), every rule of every aggregate in catalog order. Strings are JSON-quoted
    (valid YAML 1.1 and 1.2 double-quoted scalars)."""
    lines = ["# Written by promshift: the recording rules of the group's aggregations (catalog `aggregations`).",
             "# Removed by a rollback; do not edit.", "groups:",
             f"  - name: {json.dumps(AGGREGATE_RULE_PREFIX + group_name)}",
             f"    interval: {format_duration(interval_s)}", "    rules:"]
    for aggregate in aggregates:
        for record, expr in recording_rules(aggregate.metric, aggregate.level, aggregate.operations,
                                            aggregate.rate_s):
            lines += [f"      - record: {json.dumps(record)}", f"        expr: {json.dumps(expr)}"]
    return "\n".join(lines) + "\n"


def aggregation_of(aggregate: Any) -> Aggregation:
    """The :class:`Aggregation` of a catalog ``aggregations`` entry (``core.catalog.Aggregate``)."""
    function = "rate" if aggregate.rate_s > 0 else ""
    rules = tuple(RecordingRule(r, e) for r, e in recording_rules(aggregate.metric, aggregate.level,
                                                                   aggregate.operations, aggregate.rate_s))
    return Aggregation(aggregate.metric, family=aggregate.family, level=aggregate.level, function=function,
                       window_s=aggregate.rate_s, rules=rules)


def rewrite_group_read(expr: str, aggregates: Sequence[Any]) -> str:
    """``expr`` with every read of an aggregated metric (``core.catalog.Aggregate``s) pointed at its recorded
    series, every other byte as written; ``expr`` itself when it reads none. PromQLError naming why when a read
    needs the raw series, or reads with ``without`` (the catalog does not carry the metric's labels), or uses
    an operation the recording does not hold (an ``avg`` read needs ``sum`` and ``count`` recorded)."""
    shapes = read_shapes(expr)
    out = expr
    for aggregate in aggregates:
        mine = [s for s in shapes if s.metric == aggregate.metric]
        if not mine:
            continue
        for s in mine:
            if s.blocked:
                raise PromQLError(f"needs the raw series of {aggregate.metric}: {s.blocked}")
            if s.without is not None:
                raise PromQLError(f"reads {aggregate.metric} with without(): rewrite it with by() to read the "
                                  "recorded series")
            need = set(_ops_needed([s.op]))
            if not need <= set(aggregate.operations):
                raise PromQLError(f"reads {aggregate.metric} with {s.op}(), which needs "
                                  f"{', '.join(sorted(need - set(aggregate.operations)))} recorded")
        out = rewrite_expression(out, aggregation_of(aggregate), aggregate.level)
    return out


def decide(metric: str, shapes: Sequence[tuple[str, ReadShape]], labels: Iterable[str], *, type_: str = "unknown",
           extra_blockers: Sequence[Blocker] = ()) -> Aggregation:
    """One metric's aggregation from every read of it (``(reader, shape)`` pairs; see the module docstring)."""
    labels = frozenset(labels) - {"__name__"}
    blockers = list(extra_blockers)
    for reader, s in shapes:
        if s.blocked:
            blockers.append(Blocker(reader, s.expr, s.blocked))
    clean = [(r, s) for r, s in shapes if not s.blocked]
    # The level: every label some read keeps. A matcher on any other label selects what the recording sums away.
    level = tuple(sorted(frozenset().union(*(s.keeps(labels) for _, s in clean)))) if clean else ()
    for reader, s in clean:
        for label, op, value in s.matchers:
            if label not in level:
                blockers.append(Blocker(reader, s.expr, f"selects on {label} ({label}{op}{value!r}), "
                                                        "which the aggregation removes"))
                break
    families = {FAMILY[s.op] for _, s in clean}
    if len(families) > 1:
        seen = {}
        for r, s in clean:
            seen.setdefault(FAMILY[s.op], (r, s))
        (r1, s1), (r2, s2) = list(seen.values())[:2]
        blockers.append(Blocker(r2, s2.expr, f"aggregates with {s2.op}, another read ({r1}) with {s1.op}: no one "
                                              "family serves both"))
    functions = {(s.function != "", s.window_s) for _, s in clean}
    counter = "counter" in type_ or (type_ in ("unknown", "") and metric.endswith("_total"))
    if any(not s.function for _, s in clean) and counter:
        r, s = next((r, s) for r, s in clean if not s.function)
        blockers.append(Blocker(r, s.expr, "aggregates the raw counter (a sum of raw counters drops at every "
                                           "reset); only rate/increase reads can be pre-aggregated"))
    elif len(functions) > 1:
        r, s = clean[0]
        other = next((r2, s2) for r2, s2 in clean if (s2.function != "", s2.window_s) != (s.function != "",
                                                                                            s.window_s))
        blockers.append(Blocker(other[0], other[1].expr, f"reads {_what(other[1])}, another read ({r}) "
                                                          f"{_what(s)}: one recording serves one window"))
    if blockers or not clean:
        return Aggregation(metric, blockers=tuple(_first(blockers)))
    family = families.pop()
    function = "rate" if clean[0][1].function else ""
    window = clean[0][1].window_s
    ops = _ops_needed(s.op for _, s in clean)
    rules = tuple(RecordingRule(rule_name(level, metric, _operation(op, function, window)),
                                f"{op} {_by(level)}({_inner(metric, function, window)})") for op in ops)
    rewrites = tuple(dict.fromkeys((r, s.fragment, rewrite_read(s, level, labels, function, window))
                                   for r, s in clean))
    agg = Aggregation(metric, family=family, level=level, function=function, window_s=window, rules=rules,
                      rewrites=rewrites)
    whole = []
    for r, e in dict.fromkeys((r, s.expr) for r, s in clean):
        try:
            whole.append((r, e, rewrite_expression(e, agg, labels)))
        except PromQLError as exc:  # a read that cannot be pointed at the recording keeps its raw series
            return Aggregation(metric, blockers=(Blocker(r, e, f"cannot be rewritten to the recorded series: "
                                                               f"{str(exc)[:160]}"),))
    return dataclasses.replace(agg, reads=tuple(whole))


def _what(shape: ReadShape) -> str:
    return f"rate/increase over {_window(shape.window_s)}" if shape.function else "the raw value"


def _first(blockers: Sequence[Blocker]) -> list[Blocker]:
    """One blocker per reader and reason, at most ``MAX_BLOCKERS``."""
    out = list(dict.fromkeys(blockers))
    return out[:MAX_BLOCKERS]


def level_series(series: Sequence[Mapping[str, str]], level: Sequence[str]) -> int:
    """How many series the aggregation to ``level`` records: the distinct values of its labels together."""
    return len({tuple(s.get(label) for label in level) for s in series})


@dataclass
class ShapeIndex:
    """Every read's shapes, by metric name (nameless selectors apart), built once from the usage."""

    by_metric: dict[str, list[tuple[str, ReadShape]]] = field(default_factory=dict)
    nameless: list[tuple[str, ReadShape]] = field(default_factory=list)
    unparsable: dict[str, str] = field(default_factory=dict)

    def add(self, expr: str, readers: Iterable[str], *, unknown: Iterable[str] = ()) -> None:
        try:
            shapes = read_shapes(expr)
        except PromQLError as exc:
            self.unparsable[expr] = str(exc).splitlines()[0][:200]
            return
        gone = sorted(set(unknown))
        for reader in readers:
            for s in shapes:
                if gone and not s.blocked:
                    s = dataclasses.replace(s, blocked=f"the dashboard variable(s) {', '.join('$' + v for v in gone)} "
                                            "had no value here (they may pick single series)")
                if s.metric is None:
                    self.nameless.append((reader, s))
                else:
                    self.by_metric.setdefault(s.metric, []).append((reader, s))

    def level(self, metric: str, labels: Iterable[str], type_: str = "unknown") -> tuple[str, ...] | None:
        """The level the metric would be recorded at (None when its reads block it): what the inventory counts."""
        shapes = self.by_metric.get(metric)
        if not shapes:
            return None
        agg = decide(metric, shapes, labels, type_=type_)
        return agg.level if agg.recommended else None
