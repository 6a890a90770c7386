"""Latency maths: step choice, percentiles and the per-window verdict, on already-measured runs.

The verdict knows its own noise: source and target are probed in pairs at the same instants (a
busy moment slows both halves of a pair, so the pair's ratio cancels it), and the target/source
ratio is judged by an exact, distribution-free interval on the pairs' typical ratio (Wilcoxon's
signed-rank interval around the Hodges-Lehmann estimate, :func:`ratio_interval`): FAILED only
when the whole interval is beyond the ratio (and the floor), SUCCESSFUL only when it is within,
INCONCLUSIVE when it straddles (the probe then adds rounds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from statistics import NormalDist
from typing import Any

from promshift.core.cost import CostEvidence
from promshift.core.durations import format_duration, parse_duration
from promshift.core.errors import ErrorKind
from promshift.core.evidence import json_number, json_safe, number_from_json, optional_number
from promshift.core.verdicts import Layer, Measurement, Verdict, worst

# Prometheus refuses range queries over 11,000 points per series.
MAX_POINTS = 11_000


def choose_step(window_s: float, *, min_step_s: float = 15.0, resolution: int = 1_000) -> float:
    """A dashboard-like step (about ``resolution`` points), whole seconds, under Prometheus' limit."""
    step = max(min_step_s, math.ceil(window_s / resolution))
    if window_s / step >= MAX_POINTS:
        step = math.ceil(window_s / (MAX_POINTS - 1))
    return float(step)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class ProbeRun:
    """One timed query on one backend."""

    backend: str  # "source" or "target"
    window: str
    query: str
    wall_s: float
    ok: bool
    server_s: float | None = None
    http_status: int | None = None
    error: str | None = None
    warnings: tuple[str, ...] = ()
    series: int = 0
    points: int = 0
    bytes: int = 0
    retries: int = 0  # 429/503 answers retried with backoff before this outcome
    samples: float | None = None  # samples processed, from stats=all when the backend reports it
    kind: ErrorKind | None = None  # how a failed run failed
    result_type: str = ""  # "matrix", "vector", "scalar" or "string" for an answered run
    round: int = 0  # the probe round (1, 2, ...) that made this run; 0: not recorded
    pair: int | None = None  # the source/target pair (same query, same instants) this run belongs to

    @property
    def has_data(self) -> bool:
        """An answer with at least one series. Latency judges by what a query read (:func:`read_data`)."""
        return self.ok and self.series > 0

    def to_dict(self) -> dict[str, Any]:
        d = json_safe({f.name: getattr(self, f.name) for f in fields(self)})
        d["kind"] = self.kind.value if self.kind else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProbeRun:
        return cls(backend=str(d["backend"]), window=str(d["window"]), query=str(d["query"]),
                   wall_s=number_from_json(d["wall_s"]), ok=bool(d["ok"]), server_s=optional_number(d.get("server_s")),
                   http_status=d.get("http_status"), error=d.get("error"), warnings=tuple(d.get("warnings") or ()),
                   series=int(d.get("series") or 0), points=int(d.get("points") or 0), bytes=int(d.get("bytes") or 0),
                   retries=int(d.get("retries") or 0), samples=optional_number(d.get("samples")),
                   kind=ErrorKind(d["kind"]) if d.get("kind") else None, result_type=str(d.get("result_type") or ""),
                   round=int(d.get("round") or 0), pair=d.get("pair"))


Behind = Mapping[str, "tuple[float | None, float] | str"]


def read_data(run: ProbeRun, behind: Behind | None = None) -> bool:
    """Whether an answered run read data, judged by what it read, not by what it returned.

    ``stats=all``'s samples read (``totalQueryableSamples``) when the backend reports them
    (Prometheus and AMP do); else the companion count of the group's series behind the query
    on that side (``behind``, when counted); else, with neither, whether it answered a series.
    ``count(x == 0)`` answers nothing when nothing is zero, yet it read every ``x``: a real timing.
    """
    if not run.ok:
        return False
    if run.samples is not None:
        return run.samples > 0
    counts = (behind or {}).get(run.query)
    if isinstance(counts, tuple):
        side = counts[0] if run.backend == "source" else counts[1]
        if side is not None:
            return side > 0
    return run.series > 0


@dataclass(frozen=True)
class RatioInterval:
    """Target/source over the pairs (same query, same instants), with its interval and the machine's noise.

    ``ratio`` is the pairs' typical target/source ratio (Hodges-Lehmann on log ratios), ``low``..``high``
    its interval at ``level`` (Wilcoxon's signed-rank; None: too few pairs for that level, unbounded),
    ``diff_*`` the same for target - source seconds. ``level`` is the configured confidence split over
    the rounds the probe may take, so that looking again cannot buy a FAILED. ``noise_pct`` is the
    source-vs-source spread (A/A'): the median of |A'/A - 1| over the source's own runs taken two by
    two (adjacent in time, the same backend twice), in percent: how much two identical measurements
    differ on this machine now.
    """

    ratio: float
    low: float | None
    high: float | None
    diff_low_s: float | None
    diff_high_s: float | None
    level: float
    pairs: int
    noise_pct: float | None = None

    @property
    def spread_pct(self) -> float:
        """Half the interval's width in percent of the ratio ("noise ±X %"); inf when unbounded."""
        if self.low is None or self.high is None or self.ratio <= 0:
            return math.inf
        return 100.0 * (self.high - self.low) / 2 / self.ratio

    def to_dict(self) -> dict[str, Any]:
        d = json_safe({f.name: getattr(self, f.name) for f in fields(self)})
        d["spread_pct"] = json_number(round(self.spread_pct, 1))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RatioInterval:
        return cls(ratio=number_from_json(d["ratio"]), low=optional_number(d.get("low")),
                   high=optional_number(d.get("high")), diff_low_s=optional_number(d.get("diff_low_s")),
                   diff_high_s=optional_number(d.get("diff_high_s")), level=number_from_json(d["level"]),
                   pairs=int(d["pairs"]), noise_pct=optional_number(d.get("noise_pct")))


def look_level(confidence: float, looks: int) -> float:
    """The interval level of each of ``looks`` looks, so that all of them together keep ``confidence``
    (Bonferroni): 0.95 over 4 rounds is 0.9875 at each."""
    return 1.0 - (1.0 - confidence) / max(1, looks)


def paired_runs(runs: Sequence[ProbeRun], behind: Behind | None = None) -> dict[str, list[tuple[float, float]]]:
    """Per query, ``(source s, target s)`` of each pair probed at the same instants where both read data.

    Runs carrying a ``pair`` index are matched on (round, pair); runs without are matched in order.
    """
    out: dict[str, list[tuple[float, float]]] = {}
    by_key: dict[tuple[str, int, int], dict[str, float]] = {}
    in_order: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        if not read_data(r, behind):
            continue
        if r.pair is None:
            in_order.setdefault((r.query, r.backend), []).append(r.wall_s)
        else:
            by_key.setdefault((r.query, r.round, r.pair), {})[r.backend] = r.wall_s
    for (query, _, _), sides in sorted(by_key.items()):
        if "source" in sides and "target" in sides:
            out.setdefault(query, []).append((sides["source"], sides["target"]))
    for (query, backend), _ in sorted(in_order.items()):
        if backend == "source":
            out.setdefault(query, []).extend(zip(in_order[(query, "source")], in_order.get((query, "target"), []),
                                                 strict=False))
    return {q: p for q, p in out.items() if p}


# Above this many pairs the signed-rank statistic's normal approximation replaces its exact count.
EXACT_SIGNED_RANK_MAX = 120


def _signed_rank_k(n: int, level: float) -> int:
    """The largest ``k`` with P(T+ < k) <= (1 - level) / 2 for Wilcoxon's signed-rank statistic over
    ``n`` values (exact count of subsets of 1..n by sum; the normal approximation above
    ``EXACT_SIGNED_RANK_MAX``); 0 when no interval reaches ``level``."""
    if n <= 0:
        return 0
    alpha_half = (1.0 - level) / 2
    if n > EXACT_SIGNED_RANK_MAX:
        mean, sd = n * (n + 1) / 4, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        z = -NormalDist().inv_cdf(alpha_half)
        return max(0, math.floor(mean - z * sd))
    top = n * (n + 1) // 2
    counts = [1] + [0] * top  # subsets of {1..i} by their sum
    for i in range(1, n + 1):
        for total in range(top, i - 1, -1):
            counts[total] += counts[total - i]
    # P(T+ <= t) <= alpha/2, in integers: cumulative * 10^9 <= alpha/2 * 10^9 * 2^n.
    budget = round(alpha_half * 1e9) * 2**n
    cumulative, k = 0, 0
    for t in range(top + 1):
        cumulative += counts[t]
        if cumulative * 10**9 > budget:
            break
        k = t + 1
    return k


def hodges_lehmann_interval(values: Sequence[float], level: float) -> tuple[float | None, float | None, float | None]:
    """``(estimate, low, high)`` of the centre of ``values``: the Hodges-Lehmann estimate (the median of
    the Walsh averages (x_i + x_j) / 2, i <= j) and Wilcoxon's signed-rank interval at ``level``
    (order statistics k and M - k + 1 of the M Walsh averages). Distribution-free for a symmetric
    spread, robust to outliers, and about 1.5 times as efficient as the sign test on normal noise.
    (estimate, None, None) when there are too few values for ``level`` (8 are needed at 98.75 %)."""
    n = len(values)
    if n == 0:
        return None, None, None
    walsh = sorted((values[i] + values[j]) / 2 for i in range(n) for j in range(i, n))
    estimate = percentile(walsh, 50)
    k = _signed_rank_k(n, level)
    if k == 0 or k > len(walsh) - k + 1:
        return estimate, None, None
    return estimate, walsh[k - 1], walsh[len(walsh) - k]


def ratio_interval(pairs: Mapping[str, Sequence[tuple[float, float]]], *, level: float) -> RatioInterval | None:
    """The pairs' target/source ratio and target - source seconds, each with its interval at ``level``
    (:func:`hodges_lehmann_interval`; the ratio's on log ratios, so 2x slower and 2x faster weigh the
    same), and the A/A' noise; None without pairs.

    Every pair is one measurement of the slowdown at one instant: the queries' pairs are pooled
    (a ratio has no unit). No resampling and no seed: the same runs always give the same interval.
    """
    flat = [pair for _, p in sorted(pairs.items()) for pair in p]
    if not flat:
        return None
    logs = [math.log(b / a) if a > 0 and b > 0 else (math.inf if b > 0 else -math.inf) for a, b in flat]
    centre, low, high = hodges_lehmann_interval(logs, level)
    _, diff_low, diff_high = hodges_lehmann_interval([b - a for a, b in flat], level)
    return RatioInterval(ratio=_exp(centre), low=None if low is None else _exp(low),
                         high=None if high is None else _exp(high), diff_low_s=diff_low, diff_high_s=diff_high,
                         level=level, pairs=len(flat), noise_pct=source_noise_pct(pairs))


def _exp(value: float | None) -> float:
    if value is None or math.isnan(value):
        return math.nan
    return math.inf if value > 700 else math.exp(value)


def source_noise_pct(pairs: Mapping[str, Sequence[tuple[float, float]]]) -> float | None:
    """The A/A' spread: each query's source runs taken two by two (adjacent in time, the same backend
    twice), and the median of |A'/A - 1| in percent; None without two source runs of one query."""
    spreads = []
    for _, p in sorted(pairs.items()):
        own = [a for a, _ in p]
        spreads += [abs(own[i + 1] / own[i] - 1) for i in range(0, len(own) - 1, 2) if own[i] > 0]
    return 100.0 * percentile(spreads, 50) if spreads else None


@dataclass(frozen=True)
class WindowLatency:
    """p50/p95 per backend for one window, with the window's verdict."""

    window: str
    source_p50_s: float | None
    source_p95_s: float | None
    target_p50_s: float | None
    target_p95_s: float | None
    source_failures: int
    target_failures: int
    slo_p95_s: float
    verdict: Verdict
    outcome: str
    # How the source failed when the target answered ("timed out", "throttled", ...): the table
    # shows "source timed out" instead of a speedup, as the seed's table did.
    source_failure: str | None = None
    # Per query: the group's series its selectors read in the window, (source, target), or why unknown.
    behind: Mapping[str, tuple[float | None, float] | str] = field(default_factory=dict)
    # The paired target/source interval the verdict stands on (None: nothing paired, e.g. the source
    # failed every run), the rounds probed, and whether another round could still decide.
    interval: RatioInterval | None = None
    rounds: int = 1
    undecided: bool = False

    @property
    def speedup(self) -> float | None:
        if self.source_p50_s and self.target_p50_s:
            return self.source_p50_s / self.target_p50_s
        return None

    @property
    def source_failed_label(self) -> str | None:
        """ "source timed out" (throttled, ...) when the source failed while the target answered, the
        seed's "60 s timeout" cell; None otherwise. The table and the chart both show it."""
        if self.source_failures and self.target_p50_s is not None:
            return f"source {self.source_failure or 'failed'}"
        return None

    def to_dict(self) -> dict[str, Any]:
        d = json_safe({f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("behind", "interval")})
        d["verdict"] = self.verdict.value
        d["interval"] = self.interval.to_dict() if self.interval else None
        d["behind"] = [{"query": q, "source": b[0], "target": b[1]} if isinstance(b, tuple)
                       else {"query": q, "error": b} for q, b in self.behind.items()]
        speedup = self.speedup
        d["speedup"] = json_number(round(speedup, 2)) if speedup else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WindowLatency:
        """Read ``to_dict``'s form (``speedup`` is derived, not read); old records lack some counts."""
        return cls(window=str(d["window"]), source_p50_s=optional_number(d.get("source_p50_s")),
                   source_p95_s=optional_number(d.get("source_p95_s")),
                   target_p50_s=optional_number(d.get("target_p50_s")),
                   target_p95_s=optional_number(d.get("target_p95_s")),
                   source_failures=int(d.get("source_failures") or 0),
                   target_failures=int(d.get("target_failures") or 0),
                   slo_p95_s=number_from_json(d.get("slo_p95_s") or 0.0),
                   verdict=Verdict(d.get("verdict") or Verdict.INCONCLUSIVE), outcome=str(d.get("outcome") or ""),
                   source_failure=d.get("source_failure"),
                   behind={str(b["query"]): str(b["error"]) if "error" in b else
                           (optional_number(b["source"]), number_from_json(b["target"]))
                           for b in d.get("behind") or ()},
                   interval=RatioInterval.from_dict(d["interval"]) if d.get("interval") else None,
                   rounds=int(d.get("rounds") or 1), undecided=bool(d.get("undecided")))


# How a backend failed, as the table says it ("source timed out").
_FAILURE_PHRASES = {ErrorKind.TIMEOUT: "timed out",
                    ErrorKind.QUERY_TOO_EXPENSIVE: "refused the query (HTTP 422: too large or too slow)",
                    ErrorKind.THROTTLED: "throttled", ErrorKind.UNREACHABLE: "unreachable",
                    ErrorKind.PARTIAL: "returned partial data", ErrorKind.MALFORMED: "answered malformed data",
                    ErrorKind.TOO_LARGE: "answered too much data"}


def failure_kind(runs: Sequence[ProbeRun]) -> str | None:
    """One phrase for how the failed runs failed: e.g. "timed out"; "failed" when the kinds differ."""
    kinds = {_FAILURE_PHRASES.get(r.kind, "failed") if r.kind else "failed" for r in runs if not r.ok}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "failed"


def _p(runs: Sequence[ProbeRun], q: float, behind: Behind | None = None) -> float | None:
    # Only runs that read data are evidence: a run that read nothing says nothing about the backend.
    timed = [r.wall_s for r in runs if read_data(r, behind)]
    return percentile(timed, q) if timed else None


def no_data_problem(runs: Sequence[ProbeRun], behind: Mapping[str, tuple[float | None, float] | str] | None = None
                    ) -> str | None:
    """Why some query's timings are no evidence, or None: an answered run that read nothing on
    either side (``stats=all``: no samples read; where a backend does not report samples, none of
    the group's series behind it, else no series answered), or a query with none of the group's
    series behind it on a side (``behind``, see :func:`evidence_parts`). Such a query is fast
    because there is nothing behind it; "within SLO" would be a pass without data. An empty answer
    that read samples (``count(x == 0)`` when nothing is zero) is a real timing and is judged.
    """
    empty: dict[str, dict[str, set[str]]] = {}
    for r in runs:
        if r.ok and not read_data(r, behind):
            if r.samples is not None:
                what = "read no samples"
            else:
                what = "only a scalar" if r.result_type == "scalar" else "no series"
            empty.setdefault(r.query, {}).setdefault(r.backend, set()).add(what)
    parts = []
    for query, sides in empty.items():
        said = "; ".join(f"{side}: {', '.join(sorted(whats))}" for side, whats in sorted(sides.items()))
        parts.append(f"{query!r} ({said})")
    parts += [p for q, p in evidence_parts(behind or {}) if q not in empty]
    return "no data behind this query: " + "; ".join(parts) if parts else None


def evidence_parts(behind: Mapping[str, tuple[float | None, float] | str]) -> list[tuple[str, str]]:
    """``(query, why)`` for each query with nothing behind it.

    ``behind`` maps a query to ``(source, target)``: the group's series its selectors read in the
    window on each side (``series_behind``; source None: not counted, the source answered none of
    the query's runs, so no source timing is judged), or why that is unknown. A query with none of the
    group's series behind it on a side answers fast because there is nothing to read:
    ``sum(x) or vector(0)`` and ``absent(x)`` answer something whether or not ``x`` exists.
    """
    parts = []
    for query, counts in behind.items():
        if isinstance(counts, str):
            parts.append((query, f"{query!r} ({counts})"))
            continue
        src, tgt = counts
        if (src is not None and not src) or not tgt:
            said = "not counted" if src is None else f"{src:.0f}"
            parts.append((query, f"{query!r} (this group's series behind it: source {said}, target {tgt:.0f})"))
    return parts


def history_instants(*, start: float, dual_write_since: float, step: float) -> tuple[float, ...]:
    """Where to check that the target already holds a window's pre-dual-write part: its start, and
    half-way to the dual-write start (a gap left by an earlier attempt shows there)."""
    return (start + step, (start + dual_write_since) / 2)


def target_span_problem(*, window_s: float, start: float, dual_write_since: float | None, step: float,
                        history: Sequence[tuple[float, float | None, float | None]] = ()) -> str | None:
    """Why a window's timings are not comparable, or None.

    The target holds the group only since dual-write began unless history was copied
    (backfilled), so a longer window may ask the target for less data than the source: a
    fake speedup. ``history`` is ``(at, source series, target series)`` counts of the group
    at ``history_instants``; when the target holds at least the source's series at each of
    them, the window is comparable. One step of slack covers the alignment of start to the step.
    """
    if dual_write_since is None or start + step >= dual_write_since:
        return None
    if history and all(src and tgt is not None and tgt >= src for _, src, tgt in history):
        return None
    held = max(0.0, window_s - (dual_write_since - start))
    seen = "; ".join(f"{_count(tgt)} of {_count(src)} series {dual_write_since - at:.0f}s before dual-write"
                     for at, src, tgt in history)
    return (f"target holds only {held:.0f}s of this {window_s:.0f}s window (dual-write began "
            f"{dual_write_since - start:.0f}s after the window start"
            + (f"; no backfilled history: target has {seen}" if seen else "")
            + "); timings are not comparable")


def _count(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def parse_retention(text: str | None) -> float | None:
    """Seconds of time-based retention from Prometheus' ``storageRetention`` ("15d", "15d or 512MiB").

    None when there is no time limit to read (size-only retention, empty, or not a duration).
    """
    for part in (text or "").split(" or "):
        try:
            seconds = parse_duration(part.strip())
        except ValueError:
            continue
        if seconds > 0:
            return seconds
    return None


def retention_problem(window_s: float, retention_s: dict[str, float | None]) -> str | None:
    """Why a window cannot be measured because a backend does not keep that much history, or None.

    Such a window would ask a backend for data it has deleted: it answers from less data and
    looks fast. ``retention_s`` maps a backend name to its retention (None: unknown, not checked).
    """
    short = [f"{backend} keeps {format_duration(kept)}" for backend, kept in retention_s.items()
             if kept is not None and window_s > kept]
    if not short:
        return None
    return (f"window of {format_duration(window_s)} is longer than the retention "
            f"({'; '.join(short)}): not measured")


def judge_window(window: str, runs: Sequence[ProbeRun], *, slo_p95_s: float, max_slowdown_ratio: float,
                 min_successes: int, slowdown_floor_s: float = 0.0,
                 not_comparable: str | None = None,
                 behind: Mapping[str, tuple[float | None, float] | str] | None = None,
                 confidence: float = 0.95, looks: int = 1, rounds: int = 1) -> WindowLatency:
    """Verdict for one window: target p95 within SLO and not slower than source beyond the ratio,
    the slowdown judged by its interval (:func:`ratio_interval` over the pairs, at
    ``look_level(confidence, looks)``), never by one noisy p95 per side.

    FAILED when the target's p95 is over the SLO, or when the interval is wholly beyond: the pairs'
    target/source ratio above ``max_slowdown_ratio`` and their difference above ``slowdown_floor_s``
    (a smaller slowdown is jitter). SUCCESSFUL only when the interval is wholly within (ratio or
    difference). Otherwise INCONCLUSIVE with ``undecided`` set: the probe adds a round, and after
    the last one the outcome names the noise ("noise ±X %: could not separate").

    A failed run (timeout, HTTP error, partial data, malformed or too large answer) is a
    failure, never a slow success; a query that read nothing on a side is INCONCLUSIVE (no
    evidence, :func:`no_data_problem`), and so is a query whose selectors read none of the group's
    series on a side (``behind``), and fewer than ``min_successes`` good target runs.
    """
    src = [r for r in runs if r.backend == "source"]
    tgt = [r for r in runs if r.backend == "target"]
    src_fail = sum(not r.ok for r in src)
    tgt_fail = sum(not r.ok for r in tgt)
    t50, t95, s50, s95 = _p(tgt, 50, behind), _p(tgt, 95, behind), _p(src, 50, behind), _p(src, 95, behind)
    good_target = sum(read_data(r, behind) for r in tgt)
    no_data = no_data_problem(runs, behind or {})
    interval: RatioInterval | None = None
    undecided = False
    if tgt and all(not r.ok and r.kind == ErrorKind.UNREACHABLE for r in tgt):
        # Nothing was measured: the backend is down. That is an error of the check, not a slow target.
        verdict, outcome = Verdict.ERROR, f"target unreachable in all {len(tgt)} runs"
    elif tgt_fail:
        reasons = sorted({r.kind.value if r.kind else "failed" for r in tgt if not r.ok})
        verdict, outcome = Verdict.FAILED, f"target failed {tgt_fail} of {len(tgt)} runs ({'; '.join(reasons)})"
    elif not_comparable:
        verdict, outcome = Verdict.INCONCLUSIVE, not_comparable
    elif no_data:
        verdict, outcome = Verdict.INCONCLUSIVE, no_data
    elif good_target < min_successes or t95 is None:
        verdict, outcome = Verdict.INCONCLUSIVE, f"only {good_target} successful target runs"
    else:
        level = look_level(confidence, looks)
        interval = ratio_interval(paired_runs(runs, behind), level=level)
        verdict, outcome, undecided = _judge_interval(interval, t95=t95, s95=s95, slo_p95_s=slo_p95_s,
                                                      max_slowdown_ratio=max_slowdown_ratio,
                                                      slowdown_floor_s=slowdown_floor_s, rounds=rounds)
        if verdict == Verdict.SUCCESSFUL and src_fail:
            outcome = f"source {failure_kind(src)} in {src_fail} of {len(src)} runs; target answered within SLO"
    return WindowLatency(window, s50, s95, t50, t95, src_fail, tgt_fail, slo_p95_s, verdict, outcome,
                         failure_kind(src) if src_fail else None, dict(behind or {}), interval, rounds, undecided)


def _pct(level: float) -> str:
    return f"{100 * level:.4g} %"


def _judge_interval(iv: RatioInterval | None, *, t95: float, s95: float | None, slo_p95_s: float,
                    max_slowdown_ratio: float, slowdown_floor_s: float, rounds: int) -> tuple[Verdict, str, bool]:
    """(verdict, outcome, undecided) from the target's p95 and the pairs' interval; without pairs (the
    source answered none of them) only the target's own p95 against the SLO can be judged."""
    if t95 > slo_p95_s:
        return Verdict.FAILED, f"target p95 {t95:.3f}s over SLO {slo_p95_s:.3f}s", False
    if iv is None:
        return Verdict.SUCCESSFUL, "within SLO", False
    said = f"{_pct(iv.level)} interval {_bounds(iv.low, iv.high)}, {iv.pairs} pairs"
    if (iv.low is not None and iv.low > max_slowdown_ratio
            and iv.diff_low_s is not None and iv.diff_low_s > slowdown_floor_s):
        return (Verdict.FAILED, f"target p95 {t95:.3f}s slower than source {s95 or 0:.3f}s beyond ratio "
                f"{max_slowdown_ratio}: paired ratio {iv.ratio:.2f} ({said})", False)
    if ((iv.high is not None and iv.high <= max_slowdown_ratio)
            or (iv.diff_high_s is not None and iv.diff_high_s <= slowdown_floor_s)):
        return Verdict.SUCCESSFUL, "within SLO", False
    spread = "too few pairs for an interval" if iv.high is None else f"noise ±{iv.spread_pct:.0f} %"
    return (Verdict.INCONCLUSIVE, f"target/source paired ratio {iv.ratio:.2f} ({said}) straddles the limit "
            f"{max_slowdown_ratio} after {rounds} round{'s' if rounds != 1 else ''}; {spread}: could not separate",
            True)


def _bounds(low: float | None, high: float | None) -> str:
    return "unbounded" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def latency_measurement(windows: Sequence[WindowLatency], queries: Sequence[str]) -> Measurement:
    """The latency check: the worst window verdict, with the whole table as evidence."""
    verdict = worst(w.verdict for w in windows)
    bad = [f"{w.window}: {w.outcome}" for w in windows if w.verdict != Verdict.SUCCESSFUL]
    reason = "; ".join(bad) if bad else f"all {len(windows)} windows within SLO"
    if not windows:
        reason = "no latency windows measured"
    return Measurement("latency", verdict, reason, tuple(queries),
                       {"windows": [w.to_dict() for w in windows]})


@dataclass(frozen=True)
class LatencyResult:
    """The latency check's result: the verdict, each window's table row, every run, and the cost projection.

    ``to_dict`` is what XCom carries; the gate's audit record leaves ``runs`` out.
    ``from_dict`` reads records written before some fields existed.
    """

    verdict: Verdict
    measurement: Measurement
    windows: tuple[WindowLatency, ...] = ()
    runs: tuple[ProbeRun, ...] = ()
    retries: int = 0
    retention_s: Mapping[str, float | None] = field(default_factory=dict)
    max_concurrency: int | None = None
    accept_encoding: str | None = None
    cost: CostEvidence | None = None

    def with_cost(self, cost: CostEvidence) -> LatencyResult:
        return LatencyResult(self.verdict, self.measurement, self.windows, self.runs, self.retries, self.retention_s,
                             self.max_concurrency, self.accept_encoding, cost)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "verdict": self.verdict.value,
            "measurement": self.measurement.to_dict(),
            "windows": [w.to_dict() for w in self.windows],
            "runs": [r.to_dict() for r in self.runs],
            "retries": self.retries,
            "retention_s": json_safe(dict(self.retention_s)),
            "max_concurrency": self.max_concurrency,
            "accept_encoding": self.accept_encoding,
        }
        if self.cost is not None:
            d["cost"] = self.cost.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LatencyResult:
        """Read ``to_dict``'s form; a missing or empty record is INCONCLUSIVE (no evidence never passes)."""
        verdict = Verdict(d.get("verdict") or Verdict.INCONCLUSIVE)
        return cls(
            verdict=verdict,
            measurement=Measurement.from_dict(d.get("measurement") or {}, name=Layer.LATENCY.value, verdict=verdict),
            windows=tuple(WindowLatency.from_dict(w) for w in d.get("windows") or ()),
            runs=tuple(ProbeRun.from_dict(r) for r in d.get("runs") or ()),
            retries=int(d.get("retries") or 0),
            retention_s={k: optional_number(v) for k, v in (d.get("retention_s") or {}).items()},
            max_concurrency=d.get("max_concurrency"),
            accept_encoding=d.get("accept_encoding"),
            cost=CostEvidence.from_dict(d["cost"]) if d.get("cost") is not None else None,
        )
