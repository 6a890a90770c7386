"""Golden queries: the dashboard queries a group's users run, taken from Grafana dashboard JSON.

Each query gets its own comparable window: it starts once dual-write has run for the query's
look-back (range selectors, subqueries, offsets, after Grafana's ``$__rate_interval`` /
``$__range`` / ``$__interval`` are substituted) and ends early enough that a query reading
ahead (negative offset, ``@ end()``) never reads into the skipped recent samples. Every
dashboard expression gets a disposition in the golden inventory.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from promshift.core.durations import format_duration
from promshift.core.promql import (
    _TOKEN,
    Analysis,
    PromQLError,
    Selector,
    analyse,
    grafana_builtins,
    labels_depended_on,
    promql_string,
    rename_labels_in,
    substitute,
)

# A window with fewer evaluation instants than this is too short to compare: three points show
# a trend and survive one point lost to alignment, and at step 30 s they cost a minute of waiting.
MIN_POINTS = 3

COMPARED = "compared"
NOT_THIS_GROUP = "not this group's metrics"
NEEDS_VARIABLE = "needs variable"
UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class DashboardQuery:
    """One panel target: where it came from and its raw (templated) expression."""

    panel: str
    ref_id: str
    expr: str
    dashboard: str = ""


def _panels(panels: list[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # rows nest their panels


def dashboard_queries(dashboard: Mapping[str, Any], *, name: str = "") -> list[DashboardQuery]:
    """Every Prometheus target expression of every panel (rows included), in dashboard order."""
    out = []
    for panel in _panels(list(dashboard.get("panels") or [])):
        for target in panel.get("targets") or []:
            expr = (target.get("expr") or "").strip()
            if expr:
                out.append(DashboardQuery(panel=str(panel.get("title") or panel.get("id") or "?"),
                                          ref_id=str(target.get("refId") or ""), expr=expr, dashboard=name))
    return out


def golden_names(queries: Sequence[DashboardQuery]) -> list[str]:
    """One measurement name per query, unique across every dashboard: ``golden[panel]``, then
    ``golden[panel/refId]`` when a panel has several queries, then ``golden[dashboard/panel/refId]``
    when two dashboards share a panel title and refId (``p0``, ``A``), then a ``#n`` suffix."""
    panels = Counter(q.panel for q in queries)
    refs = Counter((q.panel, q.ref_id) for q in queries)
    out: list[str] = []
    seen: Counter[str] = Counter()
    for q in queries:
        if panels[q.panel] == 1:
            name = f"golden[{q.panel}]"
        elif refs[(q.panel, q.ref_id)] == 1:
            name = f"golden[{q.panel}/{q.ref_id or '?'}]"
        else:
            name = f"golden[{q.dashboard + '/' if q.dashboard else ''}{q.panel}/{q.ref_id or '?'}]"
        seen[name] += 1
        out.append(name if seen[name] == 1 else f"{name[:-1]}#{seen[name]}]")
    return out


@dataclass(frozen=True)
class GoldenWindow:
    """Where one golden query is comparable: its window, its resolved PromQL and what it reads."""

    start: float
    end: float
    step: float
    expr: str
    analysis: Analysis

    @property
    def points(self) -> int:
        return 1 + int(round((self.end - self.start) / self.step))

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "step": self.step, "points": self.points,
                "lookback_s": self.analysis.lookback_s, "readahead_s": self.analysis.readahead_s}


@dataclass(frozen=True)
class WindowShortfall:
    """Why a golden query has no comparable window yet, and how long to wait (None: never)."""

    reason: str
    wait_s: float | None


def _place(analysis: Analysis, *, length: float, earliest: float, latest: float,
           step: float) -> tuple[float, float, float]:
    """Best (start, end) for a window of ``length`` and the latest end its reads would need.

    Returns ``(start, end, needed_end)``: the window fits when ``end >= needed_end``.
    """
    ahead = max([analysis.readahead_s, *(r.ahead_s for r in analysis.anchored if r.anchor == "end")])
    end = math.floor((latest - ahead) / step) * step
    first_start = math.ceil((earliest + analysis.lookback_s) / step) * step
    needed = first_start + length
    for r in analysis.anchored:
        if r.anchor == "end":
            needed = max(needed, earliest + r.back_s)
        elif r.anchor == "start":
            needed = max(needed, math.ceil((earliest + r.back_s) / step) * step + length)
    return end - length, end, needed


def fit_window(raw: str, values: Mapping[str, str], *, earliest: float, latest: float, step: float,
               min_points: int = MIN_POINTS) -> GoldenWindow | WindowShortfall:
    """The longest window (aligned to ``step``) in which ``raw`` reads only dual-written, settled data.

    ``earliest`` is the first instant whose look-back may start (dual-write start plus settling),
    ``latest`` the last instant that may be read (now minus ``skip_recent``). ``$__range`` is the
    window's own length, so the longest window that fits is searched for. Unknown variables stay
    as written (the caller reports them); an expression that does not parse raises PromQLError.
    """
    def analysed(points: int) -> tuple[str, Analysis]:
        length = (points - 1) * step
        expr = substitute(raw, values, builtins=grafana_builtins(step, length)).expr
        return expr, analyse(expr)

    expr, analysis = analysed(min_points)
    for r in analysis.anchored:
        if r.anchor == "fixed" and r.at is not None:
            if r.at - r.back_s < earliest:
                return WindowShortfall(f"reads at a fixed time (@ {r.at:.0f}) from before dual-write began: "
                                       "never comparable", None)
            if r.at + r.ahead_s > latest:
                wait = r.at + r.ahead_s - latest
                return WindowShortfall(f"reads at a fixed time (@ {r.at:.0f}) newer than the settled data; "
                                       f"wait {format_duration(wait)}", wait)
    start, end, needed = _place(analysis, length=(min_points - 1) * step, earliest=earliest, latest=latest,
                                step=step)
    if end < needed:
        wait = needed - end
        parts = []
        if analysis.lookback_s:
            parts.append(f"needs {format_duration(analysis.lookback_s)} of dual-write before the window")
        if analysis.readahead_s:
            parts.append(f"reads {format_duration(analysis.readahead_s)} ahead, so its window ends that much "
                         "earlier")
        parts.append(f"needs {min_points} points at step {format_duration(step)}")
        return WindowShortfall(f"too little dual-write for this query: {'; '.join(parts)}; "
                               f"wait {format_duration(wait)}", wait)
    low, high = min_points, max(min_points, int((latest - earliest) // step) + 1)
    best = (expr, analysis, start, end)
    while low < high:  # the longest window that still fits ($__range grows with it)
        mid = (low + high + 1) // 2
        mid_expr, mid_analysis = analysed(mid)
        s, e, need = _place(mid_analysis, length=(mid - 1) * step, earliest=earliest, latest=latest, step=step)
        if e >= need:
            low, best = mid, (mid_expr, mid_analysis, s, e)
        else:
            high = mid - 1
    expr, analysis, start, end = best
    return GoldenWindow(start=start, end=end, step=step, expr=expr, analysis=analysis)


# --------------------------------------------------------------------------- renames on a mixed fleet

# Identifiers that are never a metric name where a selector could stand.
_NOT_SELECTORS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                            "group_left", "group_right", "atan2", "inf", "nan", "sum", "min", "max", "avg",
                            "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
                            "limitk", "limit_ratio"})
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


@dataclass
class _Sel:
    """One selector as written: its name, the tokens inside its braces, its range and modifiers."""

    name: str
    body: list[str]
    range: str  # "[5m]" for a range selector, else ""
    modifiers: str  # " offset 5m @ end()" as written


@dataclass
class _Group:
    """A parenthesised part of the expression (a call's arguments, a label list, a sub-expression)."""

    items: list[Any]
    raw: bool = False  # a label list: kept as written


def _significant(tokens: list[str], i: int) -> int:
    while i < len(tokens) and (tokens[i][0].isspace() or tokens[i].startswith("#")):
        i += 1
    return i


def _structure(tokens: list[str], i: int = 0, *, raw: bool = False) -> tuple[list[Any], int]:
    """Tokens up to the matching ``)`` as items: tokens, ``_Sel`` and ``_Group`` (index after it)."""
    items: list[Any] = []
    previous = ""
    while i < len(tokens):
        tok = tokens[i]
        if tok == ")":
            return items, i + 1
        if tok == "(":
            inner, i = _structure(tokens, i + 1, raw=raw or previous in _LABEL_LISTS)
            items.append(_Group(inner, raw or previous in _LABEL_LISTS))
            previous = ")"
            continue
        if tok[0].isspace() or tok.startswith("#"):
            items.append(tok)
            i += 1
            continue
        if raw:
            items.append(tok)
            previous, i = tok, i + 1
            continue
        if tok == "[":  # a subquery's range: kept as written
            j = tokens.index("]", i)
            items.extend(tokens[i:j + 1])
            previous, i = "]", j + 1
            continue
        after = _significant(tokens, i + 1)
        is_name = (tok[0].isalpha() or tok[0] in "_:") and tok.lower() not in _NOT_SELECTORS
        if (is_name and previous not in ("@", "offset") and not (after < len(tokens) and tokens[after] == "(")) \
                or tok == "{":
            sel, i = _read_selector(tokens, i)
            items.append(sel)
            previous = "}"
            continue
        items.append(tok)
        previous, i = tok, i + 1
    return items, i


def _read_selector(tokens: list[str], i: int) -> tuple[_Sel, int]:
    name = ""
    if tokens[i] != "{":
        name, i = tokens[i], i + 1
    body: list[str] = []
    j = _significant(tokens, i)
    if j < len(tokens) and tokens[j] == "{":
        end = tokens.index("}", j)
        body, i = tokens[j + 1:end], end + 1
    rng = ""
    j = _significant(tokens, i)
    if j < len(tokens) and tokens[j] == "[":
        end = tokens.index("]", j)
        if not any(":" in t for t in tokens[j + 1:end]):  # [5m:1m] is a subquery of the selector
            rng, i = "".join(tokens[j:end + 1]), end + 1
    modifiers: list[str] = []
    while True:
        j = _significant(tokens, i)
        if j < len(tokens) and tokens[j] == "offset":
            k = _significant(tokens, j + 1)
            if k < len(tokens) and tokens[k] in "+-":
                k = _significant(tokens, k + 1)
            modifiers.append(" " + "".join(t for t in tokens[j:k + 1] if not t[0].isspace()).replace(
                "offset", "offset "))
            i = k + 1
        elif j < len(tokens) and tokens[j] == "@":
            k = _significant(tokens, j + 1)
            if tokens[k] in ("start", "end"):
                close = tokens.index(")", k)
                modifiers.append(f" @ {tokens[k]}()")
                i = close + 1
            else:
                if tokens[k] in "+-":
                    k = _significant(tokens, k + 1)
                modifiers.append(" @ " + "".join(t for t in tokens[j + 1:k + 1] if not t[0].isspace()))
                i = k + 1
        else:
            return _Sel(name, body, rng, "".join(modifiers)), i


def _variant(sel: _Sel, new: str, old: str, renamed: bool) -> str:
    """The selector reading only series without ``new`` (as written), or only those with it (renamed)."""
    body = [new if renamed and t == old else t for t in sel.body]
    inner = "".join(body).strip().rstrip(",").strip()
    extra = f'{new}!=""' if renamed else f'{new}=""'
    return f"{sel.name}{{{inner + ', ' if inner else ''}{extra}}}{sel.range}{sel.modifiers}"


def _carried(expr: str, new: str, old: str) -> str:
    """``expr``'s series with ``new`` renamed to ``old`` (copied, then dropped)."""
    return (f"label_replace(label_replace({expr}, {promql_string(old)}, \"$1\", {promql_string(new)}, \"(.+)\"), "
            f"{promql_string(new)}, \"\", \"\", \"\")")


def _listless(out: list[str]) -> None:
    """``group_left (x)`` reads ``(x)`` as a label list: give a bare ``group_left`` its empty list first."""
    last = next((x for x in reversed(out) if not x[0].isspace()), "")
    if last in ("group_left", "group_right"):
        out.append("()")


def _render(items: list[Any], new: str, old: str, forced: Mapping[int, bool]) -> str:
    out: list[str] = []
    k = 0
    while k < len(items):
        item = items[k]
        if isinstance(item, _Sel) and not item.range and id(item) not in forced:
            _listless(out)
        if isinstance(item, _Sel):
            if id(item) in forced:
                out.append(_variant(item, new, old, forced[id(item)]))
            elif item.range:  # a range selector outside a call: leave it (the backend refuses it anyway)
                out.append(_variant(item, new, old, False))
            else:
                out.append(f"({_variant(item, new, old, False)} or "
                           f"{_carried(_variant(item, new, old, True), new, old)})")
        elif isinstance(item, _Group):
            ranged = [x for x in item.items if isinstance(x, _Sel) and x.range and id(x) not in forced]
            callee = next((x for x in reversed(out) if not x[0].isspace()), "") if out else ""
            if ranged and (callee[:1].isalpha() or callee[:1] == "_"):
                # A function of a range selector (rate, *_over_time): label_replace cannot take a range,
                # so the whole call is read twice, once per variant, and its results combined.
                while out[-1][0].isspace():
                    out.pop()
                fn = out.pop()
                _listless(out)
                both = {id(x): False for x in ranged}
                as_written = f"{fn}({_render(item.items, new, old, {**forced, **both})})"
                both = {id(x): True for x in ranged}
                renamed = f"{fn}({_render(item.items, new, old, {**forced, **both})})"
                out.append(f"({as_written} or {_carried(renamed, new, old)})")
            elif item.raw:
                out.append("(" + "".join(str(x) for x in item.items) + ")")
            else:
                out.append("(" + _render(item.items, new, old, forced) + ")")
        else:
            out.append(item)
        k += 1
    return "".join(out)


def dropped_labels_read(expr: str, dropped: Sequence[str]) -> list[str]:
    """The group's declared drops that ``expr``'s answer could depend on (``core.promql.labels_depended_on``).

    Matched in a selector, grouped ``by``, joined ``on``/``ignoring``, copied by ``group_left``/``group_right``,
    written by ``count_values`` or named by ``label_replace``/``label_join``: the target has no such label, so
    the query cannot answer there as on the source. A drop only removed (``max without (UUID) (...)``, or an
    aggregation without grouping) reads nothing the target lacks: both sides answer without it.
    """
    used = labels_depended_on(expr)
    return [n for n in dropped if n in used]


def dropped_label_uses(expr: str, dropped: Sequence[str]) -> dict[str, str]:
    """Each declared drop ``expr`` depends on, with how (``"grouped by"``, ``"matched"``, ...)."""
    used = labels_depended_on(expr)
    return {n: used[n] for n in dropped if n in used}


def read_either_name(expr: str, renames: Sequence[tuple[str, str]]) -> str:
    """``expr`` reading each series under either name of a renamed label, as if all had the old one.

    ``renames`` are ``(new, old)`` pairs (a group's ``parity.rename_labels``): a fleet half-way through a
    rename has some hosts under ``hostname`` and some under ``Hostname``. Each selector is read twice,
    the series without ``new`` as written and those with it renamed back (``label_replace``), and the two
    combined with ``or`` (they are disjoint); a range selector's function is read twice instead (a range
    cannot be relabelled). So ``avg by (Hostname)`` groups every host, whichever name it sends.
    A query written with the new name only (``by (hostname)``) is normalised the other way. Checked
    against the parse; PromQLError when the rewrite would read other selectors.
    """
    for new, old in renames:
        mentions = {n: rename_labels_in(expr, {n: "__promshift_probe"}) != expr for n in (new, old)}
        if mentions[new] and not mentions[old]:
            new, old = old, new
        original = analyse(expr).selectors
        tokens = _TOKEN.findall(expr)
        items, end = _structure(tokens)
        if end < len(tokens):
            raise PromQLError(f"unbalanced parentheses in {expr!r}")
        rewritten = _render(items, new, old, {})
        wanted = set()
        for s in original:
            wanted.add(Selector(s.name, (*s.matchers, (new, "=", ""))))
            wanted.add(Selector(s.name, (*((new if k == old else k, op, v) for k, op, v in s.matchers),
                                         (new, "!=", ""))))
        if set(analyse(rewritten).selectors) != wanted:
            raise PromQLError(f"cannot read {expr!r} under both `{old}` and `{new}`")
        expr = rewritten
    return expr


def either_name_selectors(selector: Selector, renames: Sequence[tuple[str, str]]) -> list[Selector]:
    """The selectors that together read what ``selector`` reads under either name of each renamed label.

    Only a selector that matches on a renamed label needs two (``Hostname="a"`` becomes
    ``{Hostname="a", hostname=""}`` and ``{hostname="a", hostname!=""}``); one that does not already reads
    series under both names. The parts are disjoint, so their series counts add up.
    """
    out = [selector]
    for new, old in renames:
        split: list[Selector] = []
        for sel in out:
            labels = {k for k, _, _ in sel.matchers}
            if old not in labels and new not in labels:
                split.append(sel)
                continue
            if new in labels and old not in labels:
                new, old = old, new
            split.append(Selector(sel.name, (*sel.matchers, (new, "=", ""))))
            split.append(Selector(sel.name, (*((new if k == old else k, op, v) for k, op, v in sel.matchers),
                                             (new, "!=", ""))))
        out = split
    return out
