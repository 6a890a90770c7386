"""Queries sized to the workspace: the planning maths, exact splits and combines, refusal classes."""

from __future__ import annotations

import math
import random

import pytest

from promshift.core.query_limits import (
    MAX_PARTS,
    UNLIMITED,
    QueryLimits,
    QuerySplit,
    TooLargeToSplit,
    combine,
    combine_avg,
    plan_split,
    range_slices,
    size_refusal,
    split_more,
    window_slices,
)


def test_unlimited_or_small_queries_are_asked_whole() -> None:
    assert plan_split(series=64_000, samples_per_series=121, span_s=3600, limits=UNLIMITED).queries == 1
    small = plan_split(series=100, samples_per_series=121, span_s=3600, limits=QueryLimits(max_samples=500_000))
    assert (small.time_slices, small.host_shards, small.samples_per_query) == (1, 1, 12_100)


def test_the_bench_query_splits_by_time_under_the_limit() -> None:
    # 2,000 nodes x 8 GPUs, one metric, 1 h at 30 s: ~1.9M samples against a 500,000 limit.
    split = plan_split(series=16_000, samples_per_series=121, span_s=3600, limits=QueryLimits(max_samples=500_000))
    assert split.host_shards == 1 and split.time_slices == 5
    assert split.samples_per_query <= 0.8 * 500_000
    assert "samples" in split.reason


def test_with_shardable_series_the_bench_query_shards_by_host_first() -> None:
    split = plan_split(series=16_000, samples_per_series=121, span_s=3600, limits=QueryLimits(max_samples=500_000),
                       shard_first=True)
    assert (split.time_slices, split.host_shards) == (1, 5) and split.samples_per_query == 3200 * 121
    # One series' samples over the limit: time is split too.
    long = plan_split(series=10, samples_per_series=1_000_000, span_s=86_400, limits=QueryLimits(max_samples=500_000),
                      shard_first=True)
    assert long.host_shards == 10 and long.samples_per_query <= 400_000


def test_a_24h_window_against_amp_sized_limits_splits_by_time() -> None:
    # 16,000 GPUs x 4 metrics for 24 h at 30 s against 50M samples per query.
    split = plan_split(series=64_000, samples_per_series=2881, span_s=86_400,
                       limits=QueryLimits(max_samples=50_000_000))
    assert split.samples_per_query <= 40_000_000 and split.host_shards == 1
    assert split.time_slices == math.ceil(64_000 * 2881 / 40_000_000)


def test_more_series_than_one_sample_each_fits_shards_by_host() -> None:
    split = plan_split(series=1_000_000, samples_per_series=4, span_s=120, limits=QueryLimits(max_samples=500_000))
    assert split.time_slices == 4 and split.host_shards == math.ceil(1_000_000 / 400_000)
    assert split.samples_per_query <= 400_000


def test_series_chunks_and_time_range_limits_each_split() -> None:
    assert plan_split(series=10_000, samples_per_series=10, span_s=60,
                      limits=QueryLimits(max_series=1_000)).host_shards == math.ceil(10_000 / 800)
    chunked = plan_split(series=10_000, samples_per_series=2881, span_s=86_400, limits=QueryLimits(max_chunks=100_000))
    assert chunked.queries > 1
    per_part = math.ceil(10_000 / chunked.host_shards) * (
        math.ceil(math.ceil(2881 / chunked.time_slices) / 120) + 1)
    assert per_part <= 80_000
    long = plan_split(series=10, samples_per_series=10, span_s=40 * 86_400, limits=QueryLimits(max_range_s=32 * 86_400))
    assert long.time_slices == 2 and "time range" in long.reason


def test_limits_too_small_for_the_data_refuse_with_numbers() -> None:
    with pytest.raises(TooLargeToSplit, match="parts"):
        plan_split(series=10_000_000, samples_per_series=10_000, span_s=86_400, limits=QueryLimits(max_samples=10))


def test_split_more_halves_time_then_series() -> None:
    first = QuerySplit(1, 1, 0)
    steps = [first]
    for _ in range(4):
        steps.append(split_more(steps[-1], series=8, samples_per_series=4))
    assert [(s.time_slices, s.host_shards) for s in steps] == [(1, 1), (2, 1), (4, 1), (4, 2), (4, 4)]
    with pytest.raises(TooLargeToSplit):
        split_more(QuerySplit(4, 8, 1), series=8, samples_per_series=4)
    sharded = [QuerySplit(1, 1, 0)]
    for _ in range(4):
        sharded.append(split_more(sharded[-1], series=4, samples_per_series=4, shard_first=True))
    assert [(s.time_slices, s.host_shards) for s in sharded] == [(1, 1), (1, 2), (1, 4), (2, 4), (4, 4)]
    with pytest.raises(TooLargeToSplit):
        split_more(QuerySplit(MAX_PARTS, 1, 1), series=10, samples_per_series=10 * MAX_PARTS)


def test_limits_are_checked_and_round_trip() -> None:
    with pytest.raises(ValueError, match="max_samples"):
        QueryLimits(max_samples=0)
    limits = QueryLimits(500_000, None, 20_000_000, 32 * 86_400.0, 60.0, {"max_samples": "configuration"})
    assert QueryLimits.from_dict(limits.to_dict()) == limits and limits.limited and not UNLIMITED.limited


@pytest.mark.parametrize("parts", [1, 2, 3, 5, 7, 121, 500])
def test_range_slices_hold_every_point_once(parts: int) -> None:
    start, step = 1_796_281_170.0, 30.0
    end = start + 120 * step
    whole = [start + k * step for k in range(121)]
    got = []
    for low, high in range_slices(start, end, step, parts):
        got += [low + k * step for k in range(int(round((high - low) / step)) + 1)]
    assert got == whole
    assert len(range_slices(start, end, step, parts)) == min(parts, 121)


@pytest.mark.parametrize("closed", [True, False])
@pytest.mark.parametrize("parts", [1, 2, 5, 13])
def test_window_slices_read_every_sample_once(parts: int, closed: bool) -> None:
    """Samples on the slice boundaries (scrapes at whole seconds) are read by exactly one part."""
    end, span = 1_796_284_770.0, 3600
    samples = [round(end * 1000) - span * 1000 + 1000 * k for k in range(span + 1)]  # one a second, both ends
    rng = random.Random(parts)
    samples += [round(end * 1000) - rng.randrange(span * 1000) for _ in range(500)]

    def read(at_ms: int, range_ms: int) -> set[int]:  # [t - w, t] closed, (t - w, t] open
        return {s for s in samples if (at_ms - range_ms <= s if closed else at_ms - range_ms < s) and s <= at_ms}

    whole = read(round(end * 1000), span * 1000)
    seen: list[int] = []
    for part in window_slices(end, span, parts, closed=closed):
        assert part.duration == f"{part.range_ms}ms"
        seen += sorted(read(round(part.at * 1000), part.range_ms))
    assert sorted(seen) == sorted(whole) and len(seen) == len(set(seen))


def test_sum_count_min_max_and_avg_combine_exactly() -> None:
    rng = random.Random(7)
    values = {h: [rng.uniform(-5, 50) for _ in range(121)] for h in ("a", "b", "c")}
    cuts = [0, 25, 50, 75, 100, 121]
    parts = [{h: v[lo:hi] for h, v in values.items()} for lo, hi in zip(cuts, cuts[1:], strict=False)]
    parts[2].pop("c")  # a host with no samples in one part

    def agg(fn, part):  # noqa: ANN001, ANN202
        return {h: fn(v) for h, v in part.items()}

    kept = {h: [x for p in parts if h in p for x in p[h]] for h in values}
    assert combine("sum", [agg(sum, p) for p in parts]) == pytest.approx(agg(sum, kept))
    assert combine("count", [agg(len, p) for p in parts]) == agg(len, kept)
    assert combine("min", [agg(min, p) for p in parts]) == agg(min, kept)
    assert combine("max", [agg(max, p) for p in parts]) == agg(max, kept)
    sums, counts = combine("sum", [agg(sum, p) for p in parts]), combine("count", [agg(len, p) for p in parts])
    assert combine_avg(sums, counts) == pytest.approx({h: sum(v) / len(v) for h, v in kept.items()})
    with pytest.raises(ValueError, match="avg"):
        combine("avg", [])


@pytest.mark.parametrize(("status", "message", "reason"), [
    (422, "query processing would load too many samples into memory in query execution", "samples"),
    (422, "expanding series: the query hit the max number of series limit (limit: 100000 series)", "series"),
    (422, "the query hit the max number of chunks limit (limit: 2000000 chunks)", "chunks"),
    (422, "the query time range exceeds the limit (query length: 800h0m0s, limit: 768h0m0s)", "time range"),
    (422, "query timed out in expression evaluation", "timeout"),
    (503, "query timed out in expression evaluation", "timeout"),
    (400, "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution",
     "resolution"),
    (422, "1:1: parse error: unexpected end of input", None),
    (500, "query processing would load too many samples into memory in query execution", None),
    (None, "connection refused", None),
])
def test_size_refusals_are_told_from_other_errors(status: int | None, message: str, reason: str | None) -> None:
    assert size_refusal(status, message) == reason


def test_latency_names_a_refusal_for_size_as_a_refusal_not_a_slow_answer() -> None:
    from promshift.adapters.latency_probe import classify_error
    from promshift.adapters.prometheus import PrometheusError
    from promshift.core.errors import ErrorKind
    from promshift.core.latency import ProbeRun, failure_kind

    refused = PrometheusError("http://amp", "query processing would load too many samples into memory in query "
                              "execution", http_status=422, error_type="execution")
    kind, reason = classify_error(refused, 60)
    assert kind == ErrorKind.QUERY_TOO_EXPENSIVE and reason.startswith("refused by the workspace (samples limit)")
    timed_out = PrometheusError("http://amp", "query timed out in expression evaluation", http_status=422)
    assert classify_error(timed_out, 60)[1].startswith("HTTP 422: query timed out")
    run = ProbeRun(backend="target", window="1h", query="q", wall_s=0.2, ok=False, http_status=422, error=reason,
                   kind=kind)
    assert failure_kind([run]) == "refused the query (HTTP 422: too large or too slow)"


class _Quotas:
    """Service Quotas' ``list_service_quotas`` paginator over a fixed listing, or refusing."""

    def __init__(self, quotas: list[dict[str, object]] | None) -> None:
        self.quotas = quotas

    def get_paginator(self, name: str) -> _Quotas:
        assert name == "list_service_quotas"
        return self

    def paginate(self, **params: object) -> list[dict[str, object]]:
        assert params == {"ServiceCode": "aps"}
        if self.quotas is None:
            raise PermissionError("AccessDenied")
        return [{"Quotas": self.quotas}]


def test_query_limits_come_from_configuration_then_service_quotas_then_amp_defaults() -> None:
    from promshift.adapters.amp_quota import AMP_QUERY_DEFAULTS, QUERY_LIMIT_QUOTAS, read_query_limits

    listing = [{"QuotaName": QUERY_LIMIT_QUOTAS["max_samples"], "QuotaCode": "L-1", "Value": 20_000_000.0},
               {"QuotaName": QUERY_LIMIT_QUOTAS["max_series"], "QuotaCode": "L-2", "Value": 1_000_000.0},
               {"QuotaName": "Active series per workspace", "QuotaCode": "L-3", "Value": 10_000_000.0}]
    limits = read_query_limits(_Quotas(listing), configured={"max_samples": 500_000})
    assert (limits.max_samples, limits.max_series, limits.max_chunks) == (500_000, 1_000_000, 20_000_000)
    assert limits.max_range_s == AMP_QUERY_DEFAULTS["max_range_s"] and limits.timeout_s == 60.0
    assert limits.source == {"max_samples": "configuration", "max_series": "service quotas",
                             "max_chunks": "AMP default", "max_range_s": "AMP default", "timeout_s": "AMP default"}
    unread = read_query_limits(_Quotas(None))
    assert unread.max_samples == 50_000_000 and unread.source["max_samples"].startswith("AMP default (Service Quotas")
    with pytest.raises(ValueError, match="unknown keys"):
        read_query_limits(None, configured={"max_samplez": 1})


def test_a_latency_window_past_the_query_time_range_is_named_as_refused() -> None:
    from promshift.adapters.latency_probe import range_refusal

    limits = QueryLimits(max_range_s=32 * 86_400.0, source={"max_range_s": "service quotas"})
    assert range_refusal(7 * 86_400, limits) is None and range_refusal(40 * 86_400, None) is None
    text = range_refusal(40 * 86_400, limits)
    assert text is not None and text.startswith("refused by the workspace's limits") and "service quotas" in text
