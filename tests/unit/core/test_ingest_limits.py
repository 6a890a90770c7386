"""AMP's data-plane rules (core.ingest_limits) and the strict lab workspace applying them (local.stack.amp_ingest)."""

from __future__ import annotations

import pytest

from promshift.core.ingest_limits import (
    DUPLICATE,
    LABEL_NAME_TOO_LONG,
    LABEL_SET_LIMIT,
    LABEL_VALUE_TOO_LONG,
    OUT_OF_ORDER,
    RATE_LIMITED,
    REQUEST_TOO_LARGE,
    SERIES_LIMIT,
    TOO_MANY_LABELS,
    TOO_OLD,
    TokenBucket,
    WorkspaceLimits,
    adaptive_capacity,
    describe_discards,
    judge_sample,
    label_problem,
    label_set_limits,
    query_range_problem,
    query_samples_problem,
    query_timeout_problem,
)
from promshift.local.stack.amp_ingest import (
    Series,
    WireError,
    WorkspaceIngest,
    decode_write_request,
    encode_write_request,
    snappy_compress,
    snappy_decompress,
)

LIMITS = WorkspaceLimits()
T0 = 1_700_000_000_000  # ms


def labels(n: int = 3, name: str = "gpu_temp") -> tuple[tuple[str, str], ...]:
    return (("__name__", name),) + tuple((f"l{i:02d}", "v") for i in range(n - 1))


def test_the_defaults_are_amps_documented_ones() -> None:
    assert (LIMITS.active_series, LIMITS.ingestion_rate, LIMITS.ingestion_burst) == (10_000_000, 170_000, 1_000_000)
    assert (LIMITS.labels_per_series, LIMITS.request_bytes, LIMITS.out_of_order_window_s) == (70, 1024 * 1024, 60)
    assert (LIMITS.query_range_s, LIMITS.series_floor) == (32 * 86400, 2_000_000)


def test_labels_per_series_name_and_value_length() -> None:
    assert label_problem(labels(70), LIMITS) is None
    reason, message = label_problem(labels(71), LIMITS) or ("", "")
    assert reason == TOO_MANY_LABELS
    assert message.startswith("series has too many labels (actual: 71, limit: 70) series: 'gpu_temp{l00=\"v\"")
    assert (label_problem((("__name__", "m"), ("x" * 1025, "v")), LIMITS) or ("",))[0] == LABEL_NAME_TOO_LONG
    assert (label_problem((("__name__", "m"), ("x", "v" * 2049)), LIMITS) or ("",))[0] == LABEL_VALUE_TOO_LONG
    assert label_problem((("__name__", "m"), ("x" * 1024, "v" * 2048)), LIMITS) is None


def test_samples_too_old_out_of_order_and_duplicates() -> None:
    # a new series one hour and one second behind the workspace's newest sample: too old
    assert judge_sample(T0 - 3_601_000, 1.0, last=None, newest_ms=T0, limits=LIMITS).reason == TOO_OLD
    assert judge_sample(T0 - 3_599_000, 1.0, last=None, newest_ms=T0, limits=LIMITS).accepted
    # behind its own series' last sample: inside the 60 s window accepted, outside refused
    assert judge_sample(T0 - 30_000, 1.0, last=(T0, 1.0), newest_ms=T0, limits=LIMITS).accepted
    late = judge_sample(T0 - 61_000, 1.0, last=(T0, 1.0), newest_ms=T0, limits=LIMITS)
    assert (late.accepted, late.reason, late.message) == (False, OUT_OF_ORDER, "out of order sample")
    no_window = WorkspaceLimits(out_of_order_window_s=0)
    assert judge_sample(T0 - 1, 1.0, last=(T0, 1.0), newest_ms=T0, limits=no_window).reason == OUT_OF_ORDER
    # the same timestamp: the same value is ignored, another one refused
    assert judge_sample(T0, 1.0, last=(T0, 1.0), newest_ms=T0, limits=LIMITS).ignored
    assert judge_sample(T0, 2.0, last=(T0, 1.0), newest_ms=T0, limits=LIMITS).reason == DUPLICATE


def test_the_token_bucket_refuses_a_request_past_the_burst_and_refills_at_the_rate() -> None:
    bucket = TokenBucket(rate=10, burst=100)
    assert bucket.take(100, now=0.0)
    assert not bucket.take(1, now=0.0)
    assert not bucket.take(11, now=1.0)  # 10 refilled
    assert bucket.take(10, now=1.0)
    assert not bucket.take(101, now=1000.0)  # never more than the burst


def test_adaptive_capacity_doubles_the_last_30_min_average_between_2m_and_the_quota() -> None:
    assert adaptive_capacity(10_000_000, 0) == 2_000_000
    assert adaptive_capacity(10_000_000, 1_500_000) == 3_000_000
    assert adaptive_capacity(10_000_000, 9_000_000) == 10_000_000
    assert adaptive_capacity(1_000_000, 0) == 1_000_000  # a quota under 2M caps the floor
    assert adaptive_capacity(1_000, 100, floor=50) == 200
    with pytest.raises(ValueError):
        adaptive_capacity(0, 1)


def test_query_limits() -> None:
    assert query_range_problem(0, 32 * 86400, LIMITS) is None
    assert "query time range exceeds the limit" in query_range_problem(0, 33 * 86400, LIMITS).message  # type: ignore[union-attr]
    assert query_samples_problem(50_000_000, LIMITS) is None
    assert "too many samples" in query_samples_problem(50_000_001, LIMITS).message  # type: ignore[union-attr]
    assert query_timeout_problem(61, LIMITS).message == "query timed out in query execution"  # type: ignore[union-attr]
    assert query_timeout_problem(59, LIMITS) is None


def test_describe_discards_orders_by_count_and_names_a_series() -> None:
    text = describe_discards({OUT_OF_ORDER: 3, TOO_OLD: 12, DUPLICATE: 0}, 'm{a="b"}')
    assert text.startswith("12 too old")
    assert "3 out of order (sample-out-of-order)" in text and "duplicate" not in text
    assert text.endswith('e.g. series m{a="b"}')


def test_with_values_and_label_sets() -> None:
    limits = LIMITS.with_values({"active_series": 50.0, "labels_per_series": 10.0, "unknown": 1})
    assert (limits.active_series, limits.labels_per_series) == (50.0, 10)
    assert label_set_limits([{"labelSet": {"team": "a"}, "limits": {"maxSeries": 5}}]) == (((("team", "a"),), 5),)


# -- the lab's codec and workspace ------------------------------------------------------------------------------
def body(series: list[Series]) -> bytes:
    return snappy_compress(encode_write_request(series))


def test_the_codec_round_trips_and_reads_real_snappy_copies() -> None:
    series = [Series(labels(3), [(T0, 1.5), (T0 + 15_000, -2.0)]), Series(labels(2, "b"), [(-5, 0.0)])]
    raw = encode_write_request(series, [b"\x08\x01"])
    decoded, metadata = decode_write_request(snappy_decompress(snappy_compress(raw), max_length=10_000))
    assert [(s.labels, s.samples) for s in decoded] == [(s.labels, s.samples) for s in series]
    assert metadata == [b"\x08\x01"]
    # "abcdabcdabcd": a literal of 4, then a 2-byte-offset copy of 8 (overlapping)
    assert snappy_decompress(bytes([12, 3 << 2]) + b"abcd" + bytes([(8 - 1) << 2 | 2, 4, 0]),
                             max_length=100) == b"abcdabcdabcd"
    with pytest.raises(WireError):
        snappy_decompress(bytes([200, 1]), max_length=100)


def test_the_workspace_keeps_the_good_series_and_counts_each_refusal() -> None:
    ws = WorkspaceIngest()
    now = T0 / 1000
    first = ws.ingest(body([Series(labels(3), [(T0, 1.0)])]), LIMITS, now)
    assert (first.status, len(first.accepted)) == (200, 1)
    mixed = ws.ingest(body([Series(labels(3), [(T0 - 120_000, 1.0), (T0, 2.0), (T0 + 1000, 3.0)]),
                            Series(labels(71, "wide"), [(T0, 1.0)])]), LIMITS, now)
    assert mixed.status == 400
    assert mixed.message.startswith("out of order sample; series: 'gpu_temp{")
    assert [s.samples for s in mixed.accepted] == [[(T0 + 1000, 3.0)]]
    assert ws.discards.counts == {OUT_OF_ORDER: 1, DUPLICATE: 1, TOO_MANY_LABELS: 1}
    assert ws.discards.examples[TOO_MANY_LABELS].startswith("wide{")
    assert ws.take_unpublished() == {OUT_OF_ORDER: 1, DUPLICATE: 1, TOO_MANY_LABELS: 1}
    assert ws.take_unpublished() == {}


def test_the_workspace_throttles_rate_and_series() -> None:
    ws = WorkspaceIngest()
    small = WorkspaceLimits(ingestion_rate=10, ingestion_burst=20, active_series=2, series_floor=2)
    burst = ws.ingest(body([Series(labels(2, f"m{i}"), [(T0, 1.0)]) for i in range(21)]), small, 0.0)
    assert (burst.status, burst.accepted) == (429, [])
    assert burst.message == "ingestion rate limit (10) exceeded while adding 21 samples and 0 metadata"
    assert ws.discards.counts == {RATE_LIMITED: 21}
    three = ws.ingest(body([Series(labels(2, f"m{i}"), [(T0, 1.0)]) for i in range(3)]), small, 0.0)
    assert three.status == 429 and len(three.accepted) == 2
    assert three.message == "per-user series limit of 2 exceeded, please contact administrator to raise it"
    assert ws.discards.counts[SERIES_LIMIT] == 1


def test_the_adaptive_capacity_grows_with_the_last_30_minutes() -> None:
    ws = WorkspaceIngest()
    limits = WorkspaceLimits(active_series=100, series_floor=4)
    assert ws.ingest(body([Series(labels(2, f"m{i}"), [(T0, 1.0)]) for i in range(4)]), limits, 0.0).status == 200
    assert ws.ingest(body([Series(labels(2, "m5"), [(T0, 1.0)])]), limits, 1.0).status == 429
    # the capacity follows the time-weighted average of the last 30 min: after 30 min at 4 series, 8
    for minute in range(1, 31):
        ws.ingest(body([Series(labels(2, f"m{i}"), [(T0 + minute * 60_000, 1.0)]) for i in range(4)]), limits,
                  minute * 60.0)
    assert ws.capacity(limits, 900.0) == 4  # half the window at 4: average 2, floor 4
    assert ws.capacity(limits, 1860.0) == 8
    grown = ws.ingest(body([Series(labels(2, f"n{i}"), [(T0 + 1_900_000, 1.0)]) for i in range(5)]), limits, 1900.0)
    assert (grown.status, len(grown.accepted)) == (429, 4)


def test_label_set_limits_throttle_only_their_series() -> None:
    ws = WorkspaceIngest()
    limits = WorkspaceLimits(label_set_limits=(((("team", "a"),), 1),))
    a = (("__name__", "m"), ("team", "a"))
    out = ws.ingest(body([Series(a + (("i", "1"),), [(T0, 1.0)]), Series(a + (("i", "2"),), [(T0, 1.0)]),
                          Series((("__name__", "m"), ("team", "b")), [(T0, 1.0)])]), limits, 0.0)
    assert out.status == 429 and len(out.accepted) == 2
    assert ws.discards.counts == {LABEL_SET_LIMIT: 1}


def test_a_request_over_the_size_limit_is_refused_whole() -> None:
    ws = WorkspaceIngest()
    out = ws.ingest(body([Series(labels(3), [(T0 + i, 1.0) for i in range(100)])]),
                    WorkspaceLimits(request_bytes=500), 0.0)
    assert (out.status, out.accepted) == (400, [])
    assert out.message.startswith("received message larger than max (")
    assert ws.discards.counts == {REQUEST_TOO_LARGE: 100}


def test_ha_pairs_keep_one_replica_without_its_label_and_fail_over_after_30s() -> None:
    from promshift.core.ingest_limits import HaTracker, ha_judge

    tracker = HaTracker()
    a = (("__name__", "m"), ("__replica__", "a"), ("cluster", "c1"))
    b = (("__name__", "m"), ("__replica__", "b"), ("cluster", "c1"))
    assert ha_judge(a, tracker, 0.0, LIMITS) == ("keep", (("__name__", "m"), ("cluster", "c1")))
    assert ha_judge(b, tracker, 10.0, LIMITS)[0] == "dedupe"
    assert ha_judge(a, tracker, 20.0, LIMITS)[0] == "keep"
    assert ha_judge(b, tracker, 49.0, LIMITS)[0] == "dedupe"  # a sent 29 s ago
    assert ha_judge(b, tracker, 51.0, LIMITS)[0] == "keep"  # a silent 31 s: b leads
    assert ha_judge(a, tracker, 52.0, LIMITS)[0] == "dedupe"
    assert ha_judge((("__name__", "m"), ("cluster", "c1")), tracker, 53.0, LIMITS)[0] == "keep"  # not an HA series
    one = WorkspaceLimits(ha_clusters=1)
    assert ha_judge((("__replica__", "a"), ("cluster", "c2")), tracker, 54.0, one)[0] == "too_many"


def test_the_workspace_stores_an_ha_pair_once() -> None:
    ws = WorkspaceIngest()
    pair = [Series((("__name__", "m"), ("__replica__", r), ("cluster", "c1"), ("gpu", "0")), [(T0, 1.0)])
            for r in ("a", "b")]
    out = ws.ingest(body(pair), LIMITS, 0.0)
    assert out.status == 200
    assert [s.labels for s in out.accepted] == [(("__name__", "m"), ("cluster", "c1"), ("gpu", "0"))]
    assert ws.deduped == 1 and ws.discards.total() == 0
