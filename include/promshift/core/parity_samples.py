"""Parity's raw-sample comparison (``SampleComparison``): running totals, offenders, edges and the bias model's
sums, mergeable across shards. Re-exported by ``core.parity``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from promshift.core.evidence import json_safe
from promshift.core.parity_labels import LabelSet, Points, format_labels
from promshift.core.parity_noise import (
    _BIAS_FIELDS,
    BIAS_K,
    OUTLIER_SHARE,
    _either,
    _mean_step,
    _own_spread,
    bias_findings,
    describe_bias,
    pooled_spreads,
    values_equal,
)
from promshift.core.parity_window import near_gap
from promshift.core.verdicts import Measurement, Verdict


@dataclass
class SampleComparison:
    """Running totals of a raw-sample comparison; feed it series, it keeps only counts and offenders."""

    abs_tol: float
    rel_tol: float
    max_offenders: int = 10
    # independent_scraper: each series may also differ by noise_k x its successive-difference spread (0: exact),
    # and the verdict comes from the bias model (``bias_findings``) over every series of a metric and host.
    noise_k: float = 0.0
    # The names of the host label, to key the bias model per host (none: per metric only).
    host_labels: tuple[str, ...] = ()
    # independent_scraper: the window's grid (start, end, step) and how far from a gap in a series a point may be
    # missing on the other side (``edge_allowance``: one scrape interval, the most two scrapers' phases differ,
    # and a step, the bucket a sample rounds into). 0: every missing point counts.
    grid: tuple[float, float, float] | None = None
    edge_s: float = 0.0
    # The compared window inside ``grid`` (None: all of it): points beyond it only show where a gap is.
    span: tuple[float, float] | None = None
    series_compared: int = 0
    points_compared: int = 0
    mismatches: int = 0
    missing_points: int = 0
    missing_series: int = 0
    extra_series: int = 0
    # Points (and whole series) one side lacks next to a gap in the other side's series: the scrapers' noise.
    edge_points: int = 0
    edge_series: int = 0
    offenders: list[dict[str, Any]] = field(default_factory=list)
    bias_stats: dict[str, list[float]] = field(default_factory=dict)

    def _inside(self, side: Mapping[LabelSet, Points]) -> dict[LabelSet, Points]:
        assert self.span is not None
        low, high = self.span
        out = {labels: [p for p in points if low - 1e-6 <= p[0] <= high + 1e-6] for labels, points in side.items()}
        return {labels: points for labels, points in out.items() if points}

    @property
    def judges_edges(self) -> bool:
        return bool(self.noise_k and self.edge_s > 0 and self.grid)

    def _at_edge(self, points: Points) -> Callable[[float], bool]:
        """Whether an instant is within ``edge_s`` of a grid instant where ``points`` has no value (a scrape gap,
        a staleness marker, a restart: whatever left the series without a sample there)."""
        assert self.grid is not None
        return near_gap(points, self.grid, self.edge_s)

    def _offend(self, labels: LabelSet, problem: str, **numbers: Any) -> None:
        if len(self.offenders) < self.max_offenders:
            # An infinite delta (+Inf against a finite value) must stay JSON: the audit store refuses Inf.
            self.offenders.append({"series": format_labels(labels), "problem": problem, **json_safe(numbers)})

    def add(self, source: Mapping[LabelSet, Points], target: Mapping[LabelSet, Points]) -> None:
        """Compare one batch (e.g. one host) of normalized series from both sides."""
        pooled = pooled_spreads(source, target) if self.noise_k else {}
        # Each side's gaps, read on the whole grid; points are compared only inside the window (``span``).
        src_gaps = {labels: self._at_edge(points) for labels, points in source.items()} if self.judges_edges else {}
        tgt_gaps = {labels: self._at_edge(points) for labels, points in target.items()} if self.judges_edges else {}
        if self.span is not None and self.judges_edges:
            source, target = self._inside(source), self._inside(target)
        for labels, src_points in source.items():
            tgt_points = target.get(labels)
            at_edge = src_gaps.get(labels)
            if tgt_points is None and at_edge is not None and all(at_edge(t) for t, _ in src_points):
                # The source holds this series only next to its own gaps (a host going down or coming back):
                # the other scraper saw that edge a little earlier or later.
                self.edge_series += 1
                self.edge_points += len(src_points)
                continue
            if tgt_points is None:
                self.missing_series += 1
                self.missing_points += len(src_points)
                self._offend(labels, "missing on target", source_points=len(src_points))
                continue
            self.series_compared += 1
            tgt_by_t = {round(t, 3): v for t, v in tgt_points}
            bad = missing = edge = 0
            worst_delta = 0.0
            spreads = (_own_spread(src_points, tgt_points, pooled.get(dict(labels).get("__name__", ""), 0.0))
                       if self.noise_k else (0.0, 0.0))
            noise = self.noise_k * max(spreads)
            for t, v in src_points:
                tv = tgt_by_t.get(round(t, 3))
                if tv is None:
                    if at_edge is not None and at_edge(t):
                        edge += 1
                    else:
                        missing += 1
                    continue
                self.points_compared += 1
                if not values_equal(v, tv, abs_tol=self.abs_tol + noise, rel_tol=self.rel_tol):
                    bad += 1
                    if not (math.isnan(v) or math.isnan(tv)):
                        worst_delta = max(worst_delta, abs(v - tv))
            self.mismatches += bad
            self.missing_points += missing
            self.edge_points += edge
            if self.noise_k:
                edge_test = _either(at_edge, tgt_gaps[labels]) if at_edge is not None else None
                self._add_bias(labels, src_points, tgt_points, tgt_by_t, spreads, edge_test)
            if bad or missing:
                self._offend(labels, "values differ" if bad else "points missing on target",
                             mismatched_points=bad, missing_points=missing, max_abs_delta=worst_delta)
        for labels in target.keys() - source.keys():
            own = tgt_gaps.get(labels)
            if own is not None and all(map(own, (t for t, _ in target[labels]))):
                self.edge_series += 1  # only next to the target's own gaps: the source saw the edge apart
                continue
            self.extra_series += 1
            self._offend(labels, "only on target")

    def _add_bias(self, labels: LabelSet, src_points: Points, tgt_points: Points,
                  tgt_by_t: Mapping[float, float], spreads: tuple[float, float],
                  at_edge: Callable[[float], bool] | None = None) -> None:
        """Add one series to the bias model. A point next to a gap on either side (``at_edge``) is left out of
        the mean: its step bucket holds fewer samples than the others (as few as one read, or a rate over two),
        so its value is as noisy as its existence; the point screen still judges it."""
        diffs, scale = [], 0.0
        for t, v in src_points:
            tv = tgt_by_t.get(round(t, 3))
            if at_edge is not None and at_edge(t):
                continue
            if tv is not None and math.isfinite(v) and math.isfinite(tv):
                diffs.append(tv - v)
                scale += abs(v)
        if not diffs:
            return
        p = len(diffs)
        d = sum(diffs) / p
        # One read's variance is half the variance of successive differences; each side reads once per point.
        model = (spreads[0] ** 2 + spreads[1] ** 2) / 2 / p
        row = (1.0, d, d * d, model, max(_mean_step(src_points), _mean_step(tgt_points)), scale / p)
        as_dict = dict(labels)
        metric = as_dict.get("__name__", "")
        host = next((as_dict[n] for n in self.host_labels if as_dict.get(n)), "")
        for key in (metric, f"{metric}\x00{host}") if host else (metric,):
            acc = self.bias_stats.setdefault(key, [0.0] * len(_BIAS_FIELDS))
            for i, x in enumerate(row):
                acc[i] += x

    def findings(self) -> list[dict[str, Any]]:
        """The bias model's findings (independent scrapers only; empty for exact comparisons)."""
        if not self.noise_k:
            return []
        return bias_findings(self.bias_stats, abs_tol=self.abs_tol, rel_tol=self.rel_tol)[0]

    COUNTS = ("series_compared", "points_compared", "mismatches", "missing_points", "missing_series",
              "extra_series", "edge_points", "edge_series")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe totals, so shards (mapped tasks) can hand them to a reducer."""
        out = {**{k: getattr(self, k) for k in self.COUNTS}, "offenders": list(self.offenders)}
        if self.judges_edges:
            out["edge_s"] = self.edge_s
        if self.bias_stats:
            out["bias_stats"] = {k: list(v) for k, v in self.bias_stats.items()}
        return out

    def merge(self, shard: Mapping[str, Any]) -> None:
        """Add one shard's totals (from ``to_dict``) into this comparison."""
        for k in self.COUNTS:
            setattr(self, k, getattr(self, k) + int(shard.get(k, 0)))
        if shard.get("edge_s") and not self.edge_s:
            self.edge_s = float(shard["edge_s"])
        room = self.max_offenders - len(self.offenders)
        self.offenders.extend(list(shard.get("offenders", []))[:max(0, room)])
        for key, row in (shard.get("bias_stats") or {}).items():
            acc = self.bias_stats.setdefault(key, [0.0] * len(_BIAS_FIELDS))
            for i, x in enumerate(row):
                acc[i] += float(x)

    def measurement(self, queries: Sequence[str]) -> Measurement:
        numbers: dict[str, Any] = {
            "series_compared": self.series_compared,
            "points_compared": self.points_compared,
            "mismatches": self.mismatches,
            "missing_points": self.missing_points,
            "missing_series": self.missing_series,
            "extra_series": self.extra_series,
            "worst": list(self.offenders),
        }
        if self.noise_k and self.edge_s > 0:
            numbers["edges"] = {"points": self.edge_points, "series": self.edge_series, "within_s": self.edge_s}
        findings: list[dict[str, Any]] = []
        # Independent scrapers: single points beyond the jitter are expected now and then (OUTLIER_SHARE);
        # a systematic difference is the bias model's to find.
        outliers = self.mismatches
        if self.noise_k:
            findings, evidence = bias_findings(self.bias_stats, abs_tol=self.abs_tol, rel_tol=self.rel_tol)
            numbers["noise_model"] = {"per_metric": evidence, "bias_k": BIAS_K, "outlier_share": OUTLIER_SHARE,
                                      "findings": findings[:20]}
            if self.mismatches <= OUTLIER_SHARE * self.points_compared:
                outliers = 0
        if self.missing_series or self.extra_series or outliers or self.missing_points or findings:
            parts = []
            if findings:
                parts.append(describe_bias(findings))
            if self.missing_series:
                parts.append(f"{self.missing_series} series missing on target")
            if self.extra_series:
                parts.append(f"{self.extra_series} series only on target (label drift?)")
            if outliers:
                parts.append(f"{self.mismatches} of {self.points_compared} points differ beyond tolerance")
            if self.missing_points:
                parts.append(f"{self.missing_points} points missing on target")
            return Measurement("samples", Verdict.FAILED, "; ".join(parts), tuple(queries), numbers)
        if self.points_compared == 0:
            return Measurement("samples", Verdict.INCONCLUSIVE, "no points to compare in the window",
                               tuple(queries), numbers)
        if self.noise_k:
            edges = (f"; {self.edge_points} points missing on one side within {self.edge_s:g}s of a gap on the "
                     f"other (a scrape the other scraper missed at an outage's edge)" if self.edge_points else "")
            return Measurement("samples", Verdict.SUCCESSFUL,
                               f"{self.points_compared} points in {self.series_compared} series agree within the two "
                               f"scrapers' own noise ({len(numbers['noise_model']['per_metric'])} metrics, no bias "
                               f"beyond {BIAS_K:g} standard errors){edges}", tuple(queries), numbers)
        return Measurement("samples", Verdict.SUCCESSFUL,
                           f"{self.points_compared} points in {self.series_compared} series identical "
                           f"within tolerance", tuple(queries), numbers)
