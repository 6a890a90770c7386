"""Queries asked in parts sized to the workspace's limits (``core.query_limits``), combined exactly.

Each query is planned against the limits before it is sent (``plan_split``: time slices first, then
shards of the series); a refusal for size that still comes (an estimate was low) splits it further and asks
again (``split_more``), and is counted, never reported as a difference or an error. When no split keeps a
query inside the limits, ``RefusedForSize`` says so: the layer is INCONCLUSIVE with the numbers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from promshift.adapters.prometheus import PrometheusClient, PrometheusError, Series
from promshift.core.query_limits import (
    UNLIMITED,
    QueryLimits,
    QuerySplit,
    TooLargeToSplit,
    combine,
    plan_split,
    range_slices,
    size_refusal,
    split_more,
    window_slices,
)

log = logging.getLogger(__name__)

# Builds one part's PromQL: (range of the window part, e.g. "720000ms"; extra matchers for one shard of the
# series, e.g. ', Hostname=~"a|b"', or "").
Build = Callable[[str, str], str]
# The shards of the series as extra matchers that partition them (every series in exactly one), for n shards.
Partition = Callable[[int], list[str] | None]


class RefusedForSize(RuntimeError):
    """No split keeps the query inside the workspace's limits; the text names the numbers."""


def labels_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


_key = labels_key


@dataclass
class SizedQueries:
    """Asks a check's queries in parts that fit ``limits``; counts what it split and what was refused."""

    limits: QueryLimits = UNLIMITED
    # How a range selector reads its window's start: ``[t - w, t]`` (Prometheus 2.x) or ``(t - w, t]``.
    closed_ranges: bool = True
    refused: int = 0  # refusals for size met (each was split and asked again)
    split_queries: int = 0  # queries asked in more than one part
    parts: int = 0  # parts asked in all
    reasons: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def evidence(self) -> dict[str, Any]:
        """What a layer's numbers say about sizing (empty when nothing was split or refused)."""
        if not (self.refused or self.split_queries):
            return {}
        return {"split_queries": self.split_queries, "parts": self.parts, "refused_for_size": self.refused,
                "limits": self.limits.to_dict(), "why": sorted(set(self.reasons))[:5]}

    def _plan(self, series: int | None, samples_per_series: int, span_s: float,
              shard_first: bool = False) -> QuerySplit:
        try:
            return plan_split(series=series or 0, samples_per_series=samples_per_series, span_s=span_s,
                              limits=self.limits, shard_first=shard_first and bool(series))
        except TooLargeToSplit as exc:
            raise RefusedForSize(str(exc)) from None

    def _note(self, split: QuerySplit, asked: int) -> None:
        with self._lock:
            self.parts += asked
            if split.queries > 1:
                self.split_queries += 1
                if split.reason:
                    self.reasons.append(split.reason)

    def _refusal(self, exc: PrometheusError, split: QuerySplit, series: int | None,
                 samples_per_series: int, can_shard: bool, shard_first: bool = False) -> QuerySplit:
        """The next split after a refusal for size, or the error raised again when it is not one."""
        reason = size_refusal(exc.http_status, str(exc))
        if reason is None:
            raise exc
        with self._lock:
            self.refused += 1
        log.info("refused for size (%s) in %d part(s): splitting again", reason, split.queries)
        try:
            more = split_more(split, series=max(1, series or 0) if can_shard else 1,
                              samples_per_series=samples_per_series, shard_first=shard_first and can_shard)
        except TooLargeToSplit as stop:
            raise RefusedForSize(f"refused for size ({reason}) even in {split.queries} parts: {stop}") from None
        return more

    def needs_split(self, series: int | None, samples_per_series: int, span_s: float) -> bool:
        """Whether a query over ``series`` x ``samples_per_series`` must be asked in parts."""
        try:
            return self._plan(series, samples_per_series, span_s).queries > 1
        except RefusedForSize:
            return True

    def whole(self, client: PrometheusClient, expr: str, *, at: float) -> list[Series]:
        """An instant query that cannot be split exactly: asked whole; a refusal for size is ``RefusedForSize``."""
        try:
            res = client.query(expr, at=at)
        except PrometheusError as exc:
            reason = size_refusal(exc.http_status, str(exc))
            if reason is None:
                raise
            with self._lock:
                self.refused += 1
            raise RefusedForSize(f"{reason}: {exc}") from None
        self._note(QuerySplit(1, 1, 0), 1)
        return list(res.series)

    def window(self, client: PrometheusClient, build: Build, *, end: float, span_s: int, op: str,
               series: int | None, samples_per_series: int, partition: Partition | None = None,
               time_split: bool = True, queries: list[str] | None = None) -> list[tuple[dict[str, str], float]]:
        """An aggregate over the window ``[end - span_s, end]`` read at ``end``, as ``(labels, value)`` rows:
        asked in parts (disjoint pieces of the window, and shards of the series) combined with ``op``."""
        # Shards of the series first when they can be made: each part reads its series' chunks once.
        shard_first = partition is not None
        split = self._plan(series, samples_per_series if time_split else 1, span_s, shard_first)
        if not time_split and split.time_slices > 1:
            split = QuerySplit(1, max(split.host_shards, split.time_slices), split.samples_per_query, split.reason)
        while True:
            shards = [""] if split.host_shards == 1 else (partition(split.host_shards) if partition else None)
            if shards is None:
                raise RefusedForSize(f"needs {split.host_shards} shards of its series ({split.reason}), and the "
                                     f"series cannot be sharded here")
            slices = window_slices(end, span_s, split.time_slices if time_split else 1, closed=self.closed_ranges)
            try:
                parts = []
                asked = []
                for part in slices:
                    for extra in shards:
                        expr = build(part.duration if len(slices) > 1 else f"{span_s}s", extra)
                        asked.append(expr if len(slices) == 1 else f"{expr} at {part.at:.3f}")
                        res = client.query(expr, at=part.at if len(slices) > 1 else end)
                        parts.append({_key(s.labels): s.points[0][1] for s in res.series if s.points})
            except PrometheusError as exc:
                split = self._refusal(exc, split, series, samples_per_series if time_split else 1,
                                      partition is not None, shard_first)
                continue
            self._note(split, len(asked))
            if queries is not None:
                queries.extend(asked)
            return [(dict(k), v) for k, v in combine(op, parts).items()]

    def range_query(self, client: PrometheusClient, expr: str, *, start: float, end: float, step: float,
                    series: int | None, build: Build | None = None, partition: Partition | None = None,
                    queries: list[str] | None = None) -> tuple[list[Series], list[str]]:
        """A range query asked in step-aligned parts of ``start..end`` (and shards of its series when
        ``build``/``partition`` allow): the series with their points concatenated, and the answers' warnings."""
        points = int((end - start) / step + 1e-9) + 1 if end >= start else 1
        split = self._plan(series, points, end - start)
        while True:
            shards = [""] if split.host_shards == 1 or build is None else (
                partition(split.host_shards) if partition else None)
            if shards is None:
                raise RefusedForSize(f"needs {split.host_shards} shards of its series ({split.reason}), and the "
                                     f"series cannot be sharded here")
            try:
                merged: dict[Any, list[tuple[float, float]]] = {}
                labels: dict[Any, dict[str, str]] = {}
                warnings: list[str] = []
                asked = 0
                slices = [(start, end)] if split.time_slices == 1 else range_slices(start, end, step,
                                                                                     split.time_slices)
                for low, high in slices:
                    for extra in shards:
                        text = build("", extra) if build is not None else expr
                        res = client.query_range(text, start=low, end=high, step=step)
                        asked += 1
                        warnings.extend(res.warnings)
                        for s in res.series:
                            k = _key(s.labels)
                            labels.setdefault(k, s.labels)
                            merged.setdefault(k, []).extend(s.points)
            except PrometheusError as exc:
                split = self._refusal(exc, split, series, points, build is not None and partition is not None)
                continue
            self._note(split, asked)
            if queries is not None and split.queries > 1:
                queries.append(f"{expr} in {split.time_slices} time slices x {split.host_shards} shards")
            return [Series(labels[k], tuple(pts)) for k, pts in merged.items()], warnings


def host_partition(label: str, hosts: Sequence[str]) -> Partition:
    """Shards of a group's series by ``label``: ``n`` groups of the known hosts, and every other series
    (another host, or none under ``label``: usually none) in one more, so each series is in exactly one shard."""
    import re2

    from promshift.core.promql import promql_string

    known = sorted(set(h for h in hosts if h))

    def shards(n: int) -> list[str] | None:
        if not known or n < 2:
            return None
        groups = [known[i::n] for i in range(n)]
        alt = "|".join(re2.escape(h) for h in known)
        out = [f", {label}=~{promql_string('|'.join(re2.escape(h) for h in g))}" for g in groups if g]
        return [*out, f", {label}!~{promql_string(alt)}"]

    return shards
