"""Golden queries: the dashboard queries a group's users run, taken from Grafana dashboard JSON.

Each query gets its own comparable window: it starts once dual-write has run for the query's
look-back (range selectors, subqueries, offsets, after Grafana's ``$__rate_interval`` /
``$__range`` / ``$__interval`` are substituted) and ends early enough that a query reading
ahead (negative offset, ``@ end()``) never reads into the skipped recent samples. Every
dashboard expression gets a disposition in the golden inventory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from promshift.core.durations import format_duration
from promshift.core.promql import Analysis, analyse, grafana_builtins, substitute

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
