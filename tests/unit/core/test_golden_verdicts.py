"""Golden verdicts from what the two backends did and the data behind the query."""

from __future__ import annotations

import json

from promshift.core.parity import GoldenSide, SampleComparison, golden_comparison, golden_failure
from promshift.core.verdicts import Verdict

A = (("Hostname", "h1"),)
NAMED = (("Hostname", "h1"), ("__name__", "m"))
PTS = ((30.0, 1.0), (60.0, 2.0))


def answered(series: dict) -> GoldenSide:  # type: ignore[type-arg]
    return GoldenSide(series=series)


def test_both_reject_with_the_same_error_is_inconclusive_whatever_the_status() -> None:
    for status in (400, 422):
        err = GoldenSide(error=f"HTTP {status} for 'q': bad", http_status=status)
        m = golden_failure("golden[p]", "q", err, err)
        assert m is not None and m.verdict == Verdict.INCONCLUSIVE and "invalid on both sides" in m.reason


def test_only_the_target_rejects_fails() -> None:
    m = golden_failure("golden[p]", "q", answered({A: PTS}), GoldenSide(error="HTTP 422: nope", http_status=422))
    assert m is not None and m.verdict == Verdict.FAILED and "target rejects" in m.reason


def test_only_the_source_rejects_is_inconclusive_and_shows_the_target() -> None:
    m = golden_failure("golden[p]", "q", GoldenSide(error="HTTP 400: parse error", http_status=400),
                       answered({A: PTS}))
    assert m is not None and m.verdict == Verdict.INCONCLUSIVE and "parse error" in m.reason
    assert m.numbers["target_series"] == 1 and m.numbers["target"][0]["series"] == '{Hostname="h1"}'


def test_timeouts_are_errors_and_answers_are_not_failures() -> None:
    timeout = GoldenSide(error="timed out", http_status=None)
    m = golden_failure("golden[p]", "q", answered({}), timeout)
    assert m is not None and m.verdict == Verdict.ERROR
    assert golden_failure("golden[p]", "q", answered({}), answered({})) is None


def compare(src: dict, tgt: dict, behind: tuple[float, float] = (8, 8)):  # type: ignore[no-untyped-def,type-arg]
    return golden_comparison("golden[p]", "q", src, tgt, behind=behind, abs_tol=1e-9, rel_tol=1e-9)


def test_identical_answers_pass_only_with_series_behind_them() -> None:
    assert compare({A: PTS}, {A: PTS}).verdict == Verdict.SUCCESSFUL
    zero = compare({(): ((30.0, 0.0),)}, {(): ((30.0, 0.0),)}, behind=(0, 0))  # `or vector(0)` on nothing
    assert zero.verdict == Verdict.INCONCLUSIVE and "no data behind this query" in zero.reason
    assert compare({}, {}).verdict == Verdict.INCONCLUSIVE  # absent() while the series exist


def test_nothing_behind_on_the_target_fails_only_when_the_answers_differ() -> None:
    m = compare({A: PTS}, {(): ((30.0, 0.0),)}, behind=(8, 0))
    assert m.verdict == Verdict.FAILED and "target has none" in m.reason
    same = compare({(): ((30.0, 0.0),)}, {(): ((30.0, 0.0),)}, behind=(8, 0))
    assert same.verdict == Verdict.INCONCLUSIVE


def test_a_difference_only_in_the_metric_name_is_named() -> None:
    m = compare({NAMED: PTS}, {A: PTS})
    assert m.verdict == Verdict.INCONCLUSIVE and "only `__name__` differs" in m.reason
    assert "the source keeps the metric name" in m.reason


def test_infinite_deltas_stay_json() -> None:
    m = compare({A: ((30.0, float("inf")),)}, {A: ((30.0, 1.0),)})
    assert m.verdict == Verdict.FAILED
    json.dumps(m.to_dict(), allow_nan=False)  # the audit store's setting
    assert m.numbers["worst"][0]["max_abs_delta"] == "+Inf"
    c = SampleComparison(abs_tol=0, rel_tol=0)
    c.add({A: ((30.0, float("-inf")),)}, {A: ((30.0, 2.0),)})
    json.dumps(c.to_dict(), allow_nan=False)


def test_only_an_http_error_answer_is_a_rejection_whatever_its_status() -> None:
    from promshift.core.errors import ErrorKind

    refused = GoldenSide(error="HTTP 422: bad", http_status=422, kind=ErrorKind.HTTP)
    garbled = GoldenSide(error="a 422 page that is not an API answer", http_status=422, kind=ErrorKind.MALFORMED)
    assert refused.rejected and not garbled.rejected
    m = golden_failure("golden[p]", "q", answered({A: PTS}), garbled)
    assert m is not None and m.verdict == Verdict.ERROR
