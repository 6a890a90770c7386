"""Parity's golden queries: a backend's answer or refusal, the verdict on a pair of answers, and the inventory of
every dashboard expression with its disposition. Re-exported by ``core.parity``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from promshift.core.errors import ErrorKind
from promshift.core.evidence import json_number
from promshift.core.parity_labels import LabelSet, Points, format_labels
from promshift.core.parity_noise import values_equal
from promshift.core.parity_samples import SampleComparison
from promshift.core.verdicts import Measurement, Verdict

# What a backend answers for a query it refuses to run: bad_data (400) or an execution error (422).
REJECTED_STATUSES = frozenset({400, 422})


@dataclass(frozen=True)
class GoldenSide:
    """One backend's answer to a golden query: its normalized series, or why it gave none."""

    series: Mapping[LabelSet, Points] | None = None
    error: str | None = None
    http_status: int | None = None
    warnings: tuple[str, ...] = ()
    kind: ErrorKind | None = None  # how the request failed; None with an error: an HTTP error answer

    @property
    def rejected(self) -> bool:
        """The backend refused the query itself (as opposed to timing out or being unreachable)."""
        return (self.error is not None and self.kind in (None, ErrorKind.HTTP)
                and self.http_status in REJECTED_STATUSES)


def _shown(series: Mapping[LabelSet, Points], limit: int = 3) -> list[dict[str, Any]]:
    out = []
    for labels, points in list(series.items())[:limit]:
        out.append({"series": format_labels(labels), "points": len(points),
                    "last": json_number(points[-1][1]) if points else None})
    return out


def golden_failure(name: str, expr: str, source: GoldenSide, target: GoldenSide) -> Measurement | None:
    """The verdict when a backend did not answer a golden query; None when both answered.

    Both refuse with the same error: the query is invalid, not the migration (INCONCLUSIVE,
    whatever the status). Only the target refuses: FAILED. Only the source refuses:
    INCONCLUSIVE naming its error, with the target's answer shown. A timeout, throttling
    or an unreachable backend is an ERROR.
    """
    queries = (expr,)
    if source.error is None and target.error is None:
        return None
    # Errors quote the query and, for matching errors, whole label sets: keep the reason readable.
    source = GoldenSide(source.series, _clip(source.error), source.http_status, source.warnings, source.kind)
    target = GoldenSide(target.series, _clip(target.error), target.http_status, target.warnings, target.kind)
    if source.rejected and target.rejected:
        if (source.http_status, source.error) == (target.http_status, target.error):
            return Measurement(name, Verdict.INCONCLUSIVE, f"invalid on both sides: {source.error}", queries)
        return Measurement(name, Verdict.INCONCLUSIVE,
                           f"invalid on both sides, differently: source: {source.error}; target: {target.error}",
                           queries)
    if source.error is None and target.rejected:
        return Measurement(name, Verdict.FAILED, f"the target rejects a query the source answers: {target.error}",
                           queries, {"source_series": len(source.series or {})})
    if source.rejected and target.error is None:
        answer = target.series or {}
        return Measurement(name, Verdict.INCONCLUSIVE,
                           f"only the source rejects this query ({source.error}); the target answers "
                           f"{len(answer)} series", queries, {"target_series": len(answer), "target": _shown(answer)})
    errors = "; ".join(f"{side}: {s.error}" for side, s in (("source", source), ("target", target)) if s.error)
    return Measurement(name, Verdict.ERROR, f"query failed: {errors}", queries)


def _clip(text: str | None, limit: int = 400) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit] + "..."


def golden_comparison(name: str, expr: str, source: Mapping[LabelSet, Points], target: Mapping[LabelSet, Points],
                      *, behind: tuple[float, float], abs_tol: float, rel_tol: float,
                      answers_without_series: bool = False, numbers: Mapping[str, Any] | None = None,
                      noise_k: float = 0.0, grid: tuple[float, float, float] | None = None,
                      span: tuple[float, float] | None = None, edge_s: float = 0.0) -> Measurement:
    """Compare a golden query's answers, counting them only with the group's series behind them.

    ``behind`` is (source, target) series of the group that the query's selectors read in its
    window. Nothing behind it on the source: INCONCLUSIVE ("no data behind this query"). Nothing
    on the target: a different answer FAILS, the same answer is INCONCLUSIVE (it cannot tell).
    A difference only in ``__name__`` (kept by one backend, dropped by the other) is named. ``grid``, ``span``
    and ``edge_s`` (independent scrapers, ``SampleComparison``'s): a point one side lacks next to a gap on the
    other is their noise.
    """
    queries = (expr,)
    extra = {**(numbers or {}), "behind_source": behind[0], "behind_target": behind[1],
             "answers_without_series": answers_without_series}
    if not behind[0]:
        return Measurement(name, Verdict.INCONCLUSIVE, "no data behind this query: its selectors select none of "
                           "this group's series on the source in its window", queries, extra)
    if not source and not target:
        return Measurement(name, Verdict.INCONCLUSIVE, "matches nothing on either side", queries, extra)
    comparison = SampleComparison(abs_tol=abs_tol, rel_tol=rel_tol, noise_k=noise_k, grid=grid, span=span,
                                  edge_s=edge_s)
    comparison.add(source, target)
    m = comparison.measurement([expr])
    numbers_out = {**m.numbers, **extra}
    if m.verdict == Verdict.FAILED and (comparison.missing_series or comparison.extra_series):
        unnamed = SampleComparison(abs_tol=abs_tol, rel_tol=rel_tol, noise_k=noise_k, grid=grid, span=span,
                                  edge_s=edge_s)
        unnamed.add(_without_name(source), _without_name(target))
        if unnamed.measurement([expr]).verdict == Verdict.SUCCESSFUL and len(source) == len(target):
            keeps = "source" if any(dict(k).get("__name__") for k in source) else "target"
            other = "target" if keeps == "source" else "source"
            return Measurement(name, Verdict.INCONCLUSIVE,
                               f"values match, but only `__name__` differs: the {keeps} keeps the metric name, "
                               f"the {other} drops it", queries, numbers_out)
    if not behind[1]:
        if m.verdict == Verdict.FAILED:
            return Measurement(name, Verdict.FAILED, f"the target has none of this query's series "
                               f"({behind[0]:.0f} on the source): {m.reason}", queries, numbers_out)
        return Measurement(name, Verdict.INCONCLUSIVE, "no data behind this query on the target (the answers agree "
                           "without it)", queries, numbers_out)
    reason = m.reason
    if m.verdict == Verdict.SUCCESSFUL:
        reason += f"; {behind[0]:.0f} source and {behind[1]:.0f} target series behind it"
    return Measurement(name, m.verdict, reason, queries, numbers_out)


# At most this share of the source's points may lack a point on the target (the rule's first evaluation after the
# window opened, its last before it closed) before the comparison says it cannot tell.
REWRITE_MISSING_SHARE = 0.1
# A scrape that lands while the rule evaluates is read by one side and not the other: that point's value lies
# between the original's then and one evaluation earlier. Up to REWRITE_BETWEEN_NOISE of the points is that timing
# (SUCCESSFUL). A recording that is wrong is wrong nearly everywhere: more than REWRITE_DIFFER_FAILED of the points
# differing (in between or outside) FAILS; fewer differences than that, but more than timing explains (or any
# point outside), are noise the comparison cannot call: INCONCLUSIVE.
REWRITE_BETWEEN_NOISE = 0.1
REWRITE_DIFFER_FAILED = 0.5


def rewrite_comparison(name: str, expr: str, rewritten: str, source: Mapping[LabelSet, Points],
                       target: Mapping[LabelSet, Points], *, behind: tuple[float, float], step: float,
                       abs_tol: float, rel_tol: float, phase: float | None = None) -> Measurement:
    """An original read on the source against its rewrite over the recorded series on the target (issue 40).

    Both are asked on the grid of the recording rule's own evaluations (every ``step``, the group's scrape interval,
    at the rule group's phase), so at each instant the recorded series holds the rule's evaluation of that instant:
    the original's value then. A scrape that was appended just after the rule evaluated is seen by the original
    and not by the rule: the target's value is then the original's one evaluation earlier (a gauge), or lies
    between the two (a rate, extrapolated to its window's edges). A wrong recording differs at most points: FAILED,
    naming the series, instant and values; fewer differences than that but more than timing explains: INCONCLUSIVE
    (``REWRITE_*``). A series one side lacks: FAILED. Nothing behind the read, or too few common points:
    INCONCLUSIVE.

    ``phase`` (an instant of the recording's evaluations, e.g. its newest sample's timestamp): a target that answers
    on its own grid (a backend that aligns range queries to the step) is read at each point as the evaluation it
    holds, the latest at or before it, and compared with the source there.
    """
    queries = (expr, rewritten)

    def evaluation(t: float) -> float:
        if phase is None:
            return round(t, 3)
        back = (t - phase) % step
        return round(t - (0.0 if step - back < 1e-3 else back), 3)

    numbers: dict[str, Any] = {"rewritten": rewritten, "behind_source": behind[0], "behind_target": behind[1]}
    if not behind[0]:
        return Measurement(name, Verdict.INCONCLUSIVE, "no data behind this read: its recorded series select nothing "
                           "on the source in its window (are the recording rules deployed?)", queries, numbers)
    if not source and not target:
        return Measurement(name, Verdict.INCONCLUSIVE, "matches nothing on either side", queries, numbers)
    missing = [k for k in source if k not in target]
    extra = [k for k in target if k not in source]
    if missing or extra:
        shown = format_labels((missing or extra)[0])
        return Measurement(name, Verdict.FAILED, f"the rewritten read on the target {'lacks' if missing else 'adds'} "
                           f"{len(missing or extra)} series of the original read on the source (e.g. {shown})",
                           queries, {**numbers, "missing_series": len(missing), "extra_series": len(extra)})
    compared = lagged = lacking = total = between = outside = 0
    offenders: list[dict[str, Any]] = []
    for labels, points in source.items():
        by_t = {round(t, 3): v for t, v in points}
        total += len(points)
        there = {evaluation(t) for t, _ in target[labels]}
        lacking += sum(1 for t, _ in points if round(t, 3) not in there)
        for t, v in target[labels]:
            at = evaluation(t)
            now, before = by_t.get(at), by_t.get(round(at - step, 3))
            if now is None and before is None:
                continue
            compared += 1
            if now is not None and values_equal(v, now, abs_tol=abs_tol, rel_tol=rel_tol):
                continue
            if before is not None and values_equal(v, before, abs_tol=abs_tol, rel_tol=rel_tol):
                lagged += 1
                continue
            if now is not None and before is not None and (
                    min(now, before) - abs_tol <= v <= max(now, before) + abs_tol):
                between += 1  # a scrape that landed as the rule evaluated: read by one side and not the other
                continue
            outside += 1
            if len(offenders) < 5:
                offenders.append({"series": format_labels(labels), "at": json_number(t), "target": json_number(v),
                                  "source": None if now is None else json_number(now),
                                  "source_one_step_earlier": None if before is None else json_number(before)})
    numbers.update(points_compared=compared, points_one_evaluation_behind=lagged, points_between=between,
                   points_outside=outside, source_points=total, target_lacks_points=lacking, offenders=offenders)
    differ = between + outside
    if differ > REWRITE_DIFFER_FAILED * compared:
        first = ""
        if offenders:
            o = offenders[0]
            first = (f": {o['series']} at {o['at']}: target {o['target']}, source {o['source']} (one evaluation "
                     f"earlier {o['source_one_step_earlier']})")
        return Measurement(name, Verdict.FAILED, f"the rewritten read on the target differs from the original read "
                           f"on the source at {differ} of {compared} points{first}: the recording is wrong", queries,
                           numbers)
    if outside or between > REWRITE_BETWEEN_NOISE * compared:
        return Measurement(name, Verdict.INCONCLUSIVE, f"the rewritten read differs from the original at {differ} of "
                           f"{compared} points ({outside} outside the original's value then and one evaluation "
                           "earlier): more than scrape timing explains, too few to call the recording wrong", queries,
                           numbers)
    if not compared or lacking > REWRITE_MISSING_SHARE * total:
        return Measurement(name, Verdict.INCONCLUSIVE, f"the rewritten read answers at {compared} of the original's "
                           f"{total} points: too few to tell", queries, numbers)
    return Measurement(name, Verdict.SUCCESSFUL, f"the rewritten read on the target matches the original read on "
                       f"the source at {compared} points of {len(source)} series ({lagged} one rule evaluation "
                       f"behind); {behind[0]:.0f} source and {behind[1]:.0f} target series behind it", queries, numbers)


def _without_name(series: Mapping[LabelSet, Points]) -> dict[LabelSet, Points]:
    return {tuple(kv for kv in labels if kv[0] != "__name__"): points for labels, points in series.items()}



@dataclass(frozen=True)
class GoldenRow:
    """One dashboard expression and what became of it (``core.golden``'s dispositions)."""

    dashboard: str
    panel: str
    expr: str
    disposition: str
    detail: str | None = None
    ref_id: str | None = None
    measurement: str | None = None  # the measurement's name when the expression was compared

    def to_dict(self) -> dict[str, Any]:
        return {"dashboard": self.dashboard, "panel": self.panel, "ref_id": self.ref_id, "expr": self.expr,
                "disposition": self.disposition, "detail": self.detail, "measurement": self.measurement}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GoldenRow:
        return cls(str(d.get("dashboard", "")), str(d.get("panel", "")), str(d.get("expr", "")),
                   str(d.get("disposition", "")), d.get("detail"), d.get("ref_id"), d.get("measurement"))


@dataclass(frozen=True)
class GoldenInventory:
    """Every dashboard expression of the group's golden dashboards, with its disposition."""

    dashboards: tuple[str, ...] = ()
    required: bool = False
    queries: tuple[GoldenRow, ...] = ()
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"dashboards": list(self.dashboards), "required": self.required,
                "queries": [q.to_dict() for q in self.queries], "summary": self.summary}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> GoldenInventory | None:
        if d is None:
            return None
        return cls(tuple(d.get("dashboards") or ()), bool(d.get("required", False)),
                   tuple(GoldenRow.from_dict(q) for q in d.get("queries") or ()), str(d.get("summary") or ""))
