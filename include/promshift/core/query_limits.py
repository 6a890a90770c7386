"""Queries sized to the workspace: its per-query limits, how to split a query so no part exceeds them, how the
parts' answers combine, and whether a refusal was for size.

AMP refuses a query that would load too many samples, fetch too many series or chunks, span too long a time
range or run past its timeout: HTTP 422 with a message naming the limit ("AMP-troubleshooting": "HTTP 422
error: query timeout"; Prometheus' own engine answers ``query processing would load too many samples into
memory in query execution``, which AMP passes on). Parity and latency read those limits once per run
(``QueryLimits``), plan each query against them (``plan_split``), and treat a refusal for size that still
comes (``size_refusal``) as "split and ask again", never as a difference or an error.

Splits are exact: a range query over a window is the concatenation of range queries over step-aligned
parts of it (``range_slices``); a window aggregate read at one instant (``sum_over_time(x[w])``) is the
sum of the same aggregate over disjoint parts of the window (``window_slices``), and sum/count/min/max of
parts combine into the whole's (``combine``); an average is carried as sum and count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K")

# A TSDB chunk holds up to 120 samples (Prometheus' head and compacted chunks; AMP's chunks count the same way).
SAMPLES_PER_CHUNK = 120
# Plan to this share of a limit: estimates count samples from the scrape interval, and a series scraped a
# little faster than that, or a chunk cut early, must not tip a part over the limit.
HEADROOM = 0.8
# At most this many parts for one query: past it, the limits are too small for the data to be compared at all.
MAX_PARTS = 4096


@dataclass(frozen=True)
class QueryLimits:
    """One workspace's per-query limits (None: not limited, or not known) and where they were read."""

    max_samples: int | None = None
    max_series: int | None = None
    max_chunks: int | None = None
    max_range_s: float | None = None
    timeout_s: float | None = None
    # Where each number came from ("service quotas", "configuration", "AMP default").
    source: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        for name in ("max_samples", "max_series", "max_chunks", "max_range_s", "timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"query limit {name} must be > 0, got {value}")

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.max_samples, self.max_series, self.max_chunks, self.max_range_s))

    def to_dict(self) -> dict[str, Any]:
        return {"max_samples": self.max_samples, "max_series": self.max_series, "max_chunks": self.max_chunks,
                "max_range_s": self.max_range_s, "timeout_s": self.timeout_s, "source": dict(self.source or {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> QueryLimits:
        data = data or {}

        def num(key: str, kind: type = int) -> Any:
            return None if data.get(key) is None else kind(data[key])

        return cls(num("max_samples"), num("max_series"), num("max_chunks"), num("max_range_s", float),
                   num("timeout_s", float), dict(data.get("source") or {}))


UNLIMITED = QueryLimits()


@dataclass(frozen=True)
class QuerySplit:
    """How one query is asked: in ``time_slices`` parts of its window times ``host_shards`` parts of its series."""

    time_slices: int
    host_shards: int
    samples_per_query: int
    reason: str = ""

    @property
    def queries(self) -> int:
        return self.time_slices * self.host_shards

    def to_dict(self) -> dict[str, Any]:
        return {"time_slices": self.time_slices, "host_shards": self.host_shards,
                "samples_per_query": self.samples_per_query, "reason": self.reason}


class TooLargeToSplit(ValueError):
    """The limits are too small for the data: even the smallest part exceeds them (one line, with numbers)."""


def plan_split(*, series: int, samples_per_series: int, span_s: float, limits: QueryLimits,
               headroom: float = HEADROOM, shard_first: bool = False) -> QuerySplit:
    """The fewest parts so that none loads more than ``headroom`` of the limits.

    ``series``: how many series the query reads; ``samples_per_series``: how many samples it loads from each
    (a range-vector function over a window: window / scrape interval + 1; a range query over raw series: its
    points); ``span_s``: the time range it covers. By default time is split first (every part still reads every
    series once); series are sharded only when one sample per series per part is still too many, or a series or
    chunks limit asks for it. ``shard_first`` (the caller can shard the series, e.g. by host): series are
    sharded first and time split only when one series' samples are too many: each part then reads its series'
    chunks once, where time slices would each read (and decode, and count against a chunks limit) the chunks
    that straddle their edges.
    """
    if series < 0 or samples_per_series < 0 or span_s < 0:
        raise ValueError("series, samples per series and span must be >= 0")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    per_series = max(1, samples_per_series)
    total = series * per_series
    reasons = []
    slices = 1
    if limits.max_range_s is not None and span_s > limits.max_range_s:
        slices = math.ceil(span_s / limits.max_range_s)
        reasons.append(f"time range {span_s:.0f}s > {limits.max_range_s:.0f}s")
    shards = 1
    if limits.max_samples is not None and total > 0:
        budget = max(1, int(limits.max_samples * headroom))
        if total > budget:
            reasons.append(f"~{total:,} samples > {headroom:.0%} of {limits.max_samples:,}")
            if shard_first:
                shards = max(shards, min(series, math.ceil(total / budget)))
                slices = max(slices, math.ceil(math.ceil(series / shards) * per_series / budget))
            else:
                slices = max(slices, min(per_series, math.ceil(total / budget)))
                shards = max(shards, math.ceil(series * math.ceil(per_series / slices) / budget))
    if limits.max_series is not None and series > 0:
        budget = max(1, int(limits.max_series * headroom))
        if series > budget:
            reasons.append(f"{series:,} series > {headroom:.0%} of {limits.max_series:,}")
            shards = max(shards, math.ceil(series / budget))
    if limits.max_chunks is not None and series > 0:
        budget = max(1, int(limits.max_chunks * headroom))
        # Each series' part spans its share of chunks plus one a boundary may cut.
        def chunks(slices_: int, shards_: int) -> int:
            return math.ceil(series / shards_) * (math.ceil(math.ceil(per_series / slices_) / SAMPLES_PER_CHUNK) + 1)

        if chunks(slices, shards) > budget:
            reasons.append(f"~{chunks(slices, shards):,} chunks > {headroom:.0%} of {limits.max_chunks:,}")
            while chunks(slices, shards) > budget and slices < per_series:
                slices = min(per_series, slices * 2)
            while chunks(slices, shards) > budget and shards < series:
                shards = min(series, shards * 2)
    if slices * shards > MAX_PARTS:
        raise TooLargeToSplit(f"a query over {series:,} series x {per_series:,} samples needs {slices * shards:,} "
                              f"parts to stay inside the workspace's limits (more than {MAX_PARTS:,}); "
                              f"raise the limits or shorten the window")
    per_query = math.ceil(series / shards) * math.ceil(per_series / slices)
    return QuerySplit(slices, shards, per_query, "; ".join(reasons))


def split_more(split: QuerySplit, *, series: int, samples_per_series: int, shard_first: bool = False) -> QuerySplit:
    """The next split after a refusal for size: twice the time slices while a part still holds more than one
    sample per series, then twice the host shards (``shard_first``: the shards first, then time)."""
    per_series = max(1, samples_per_series)
    if shard_first and split.host_shards < max(1, series):
        slices, shards = split.time_slices, min(max(1, series), split.host_shards * 2)
    elif split.time_slices < per_series:
        slices, shards = min(per_series, split.time_slices * 2), split.host_shards
    elif split.host_shards < max(1, series):
        slices, shards = split.time_slices, min(max(1, series), split.host_shards * 2)
    else:
        raise TooLargeToSplit(f"refused for size at one sample of one series per query ({split.queries:,} parts)")
    if slices * shards > MAX_PARTS:
        raise TooLargeToSplit(f"still refused for size at {split.queries:,} parts (at most {MAX_PARTS:,})")
    return QuerySplit(slices, shards, math.ceil(max(1, series) / shards) * math.ceil(per_series / slices),
                      "refused for size: split again")


def range_slices(start: float, end: float, step: float, parts: int) -> list[tuple[float, float]]:
    """``start..end`` at ``step`` as ``parts`` step-aligned ranges that hold every point once.

    A range query's points are ``start + k * step`` for ``k = 0..n-1``; each part asks a contiguous run of
    them, so the parts' answers concatenated are the whole query's answer.
    """
    if step <= 0:
        raise ValueError(f"step must be > 0, got {step}")
    points = int(math.floor((end - start) / step + 1e-9)) + 1 if end >= start else 0
    parts = max(1, min(parts, points))
    out = []
    for i in range(parts):
        first, last = (points * i) // parts, (points * (i + 1)) // parts - 1
        if last >= first:
            out.append((start + first * step, start + last * step))
    return out


@dataclass(frozen=True)
class WindowSlice:
    """One part of a window read at one instant: ``fn(x[range_ms ms])`` evaluated at ``at``."""

    at: float
    range_ms: int

    @property
    def duration(self) -> str:
        return f"{self.range_ms}ms"


def window_slices(end: float, span_s: int, parts: int, *, closed: bool = True) -> list[WindowSlice]:
    """The window ``x[span_s]`` read at ``end`` as ``parts`` disjoint ranges, each read at its own end.

    ``closed``: a range selector ``x[w]`` at ``t`` holds the samples in ``[t - w, t]`` (both ends, as
    Prometheus 2.x reads it): the first part keeps the window's start and every later part starts 1 ms after
    the previous part's end, so no sample is read twice and none is missed (timestamps are whole
    milliseconds). Not ``closed`` (Prometheus 3's ``(t - w, t]``): the parts simply meet.
    """
    if span_s <= 0:
        raise ValueError(f"span must be > 0, got {span_s}")
    total_ms = int(span_s) * 1000
    parts = max(1, min(parts, total_ms))
    end_ms = round(end * 1000)
    bounds = [end_ms - total_ms + (total_ms * i) // parts for i in range(parts + 1)]
    out = []
    for i in range(parts):
        low, high = bounds[i], bounds[i + 1]
        out.append(WindowSlice(high / 1000, high - low if i == 0 or not closed else high - low - 1))
    return out


def combine(op: str, parts: Iterable[Mapping[K, float]]) -> dict[K, float]:
    """The whole's aggregate from its disjoint parts': ``sum`` and ``count`` add, ``min`` and ``max`` keep the
    extreme. A key absent from a part had no samples there."""
    if op not in ("sum", "count", "min", "max"):
        raise ValueError(f"{op} does not combine exactly from parts (carry avg as sum and count)")
    out: dict[K, float] = {}
    for part in parts:
        for key, value in part.items():
            if key not in out:
                out[key] = value
            elif op in ("sum", "count"):
                out[key] += value
            elif op == "min":
                out[key] = min(out[key], value)
            else:
                out[key] = max(out[key], value)
    return out


def combine_avg(sums: Mapping[K, float], counts: Mapping[K, float]) -> dict[K, float]:
    """The average of each key from its combined sum and count (keys without samples are left out)."""
    return {k: sums[k] / counts[k] for k in sums if counts.get(k)}


# What a refusal for size says (lower case): Prometheus' engine (which AMP runs), and AMP's own limits on
# series, chunks, time range, query samples processed and time.
_SIZE_REFUSALS = {
    "samples": ("would load too many samples", "samples limit", "max_samples_processed",
                "query samples processed"),
    "chunks": ("max number of chunks", "chunks limit", "too many chunks", "chunk bytes limit"),
    "series": ("max number of series", "series limit", "too many series"),
    "time range": ("query time range exceeds", "query length", "time range exceeds"),
    "resolution": ("exceeded maximum resolution",),
    "timeout": ("query timed out", "timed out in expression evaluation", "query timeout"),
}
# Statuses a refusal for size comes with: 422 (AMP and Prometheus' execution errors), 400 (too many points),
# 503 (Prometheus' own query timeout).
_SIZE_STATUSES = (400, 422, 503)


def size_refusal(status: int | None, message: str) -> str | None:
    """Which limit a refusal names (``samples``, ``chunks``, ``series``, ``time range``, ``resolution``,
    ``timeout``), or None when it is not a refusal for size."""
    if status not in _SIZE_STATUSES:
        return None
    text = message.lower()
    for reason, needles in _SIZE_REFUSALS.items():
        if any(n in text for n in needles):
            return reason
    return None
