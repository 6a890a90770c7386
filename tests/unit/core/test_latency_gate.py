from __future__ import annotations

from functools import partial

import pytest

from promshift.core.errors import ErrorKind
from promshift.core.gate import GateAction, decide
from promshift.core.latency import (
    MAX_POINTS,
    ProbeRun,
    choose_step,
    judge_window,
    parse_retention,
    percentile,
    retention_problem,
)
from promshift.core.verdicts import Verdict, worst
from promshift.core.warmup import WarmupObservation, assess_warmup, parse_remote_write_lag

# Five pairs give an interval at 90 % (93.75 % at most): these tests judge five runs a side.
judge = partial(judge_window, confidence=0.9)


def test_percentile_interpolates() -> None:
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 95) == 10
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 95) == pytest.approx(9.55)
    with pytest.raises(ValueError):
        percentile([], 50)


@pytest.mark.parametrize("window", [60, 3600, 6 * 3600, 24 * 3600, 30 * 86400])
def test_step_keeps_results_under_the_point_limit(window: float) -> None:
    step = choose_step(window)
    assert step >= 15 and window / step < MAX_POINTS and step == int(step)


def runs(backend: str, times: list[float], ok: bool = True) -> list[ProbeRun]:
    return [ProbeRun(backend=backend, window="1h", query="q", wall_s=t, ok=ok, series=1) for t in times]


def test_faster_target_within_slo_passes_with_speedup() -> None:
    w = judge("1h", runs("source", [2.0] * 5) + runs("target", [0.5] * 5), slo_p95_s=1.0,
                     max_slowdown_ratio=1.2, min_successes=3)
    assert w.verdict == Verdict.SUCCESSFUL and w.speedup == pytest.approx(4.0)


def test_target_over_slo_or_slower_or_failing_fails() -> None:
    over = judge("1h", runs("source", [5.0] * 5) + runs("target", [3.0] * 5), slo_p95_s=1.0,
                        max_slowdown_ratio=1.2, min_successes=3)
    assert over.verdict == Verdict.FAILED and "over SLO" in over.outcome
    slower = judge("1h", runs("source", [0.1] * 5) + runs("target", [0.5] * 5), slo_p95_s=1.0,
                          max_slowdown_ratio=1.2, min_successes=3)
    assert slower.verdict == Verdict.FAILED and "slower than source" in slower.outcome
    jitter = judge("1h", runs("source", [0.028] * 5) + runs("target", [0.039] * 5), slo_p95_s=1.0,
                          max_slowdown_ratio=1.2, min_successes=3, slowdown_floor_s=0.25)
    assert jitter.verdict == Verdict.SUCCESSFUL
    real = judge("1h", runs("source", [1.0] * 5) + runs("target", [1.5] * 5), slo_p95_s=2.0,
                        max_slowdown_ratio=1.2, min_successes=3, slowdown_floor_s=0.25)
    assert real.verdict == Verdict.FAILED
    timeouts = judge("1h", runs("source", [0.1] * 5) + runs("target", [0.1] * 4)
                            + runs("target", [60.0], ok=False), slo_p95_s=1.0, max_slowdown_ratio=1.2,
                            min_successes=3)
    assert timeouts.verdict == Verdict.FAILED and "failed 1 of 5" in timeouts.outcome


def test_source_timeouts_are_a_win_and_too_few_runs_inconclusive() -> None:
    win = judge("24h", runs("source", [60.0] * 5, ok=False) + runs("target", [10.0] * 5), slo_p95_s=12,
                       max_slowdown_ratio=1.2, min_successes=3)
    assert win.verdict == Verdict.SUCCESSFUL and win.source_p50_s is None
    assert win.outcome == "source failed in 5 of 5 runs; target answered within SLO"  # no error text: "failed"
    timed_out = [ProbeRun(backend="source", window="24h", query="q", wall_s=60.0, ok=False,
                          error="timeout: no answer within 60s", kind=ErrorKind.TIMEOUT)] * 5
    seed = judge("24h", timed_out + runs("target", [10.0] * 5), slo_p95_s=12, max_slowdown_ratio=1.2,
                        min_successes=3)
    assert seed.verdict == Verdict.SUCCESSFUL and seed.source_failure == "timed out"
    assert seed.outcome == "source timed out in 5 of 5 runs; target answered within SLO"
    few = judge("1h", runs("target", [0.1]), slo_p95_s=1, max_slowdown_ratio=1.2, min_successes=3)
    assert few.verdict == Verdict.INCONCLUSIVE


def test_worst_verdict_wins_and_nothing_is_inconclusive() -> None:
    assert worst([Verdict.SUCCESSFUL, Verdict.INCONCLUSIVE]) == Verdict.INCONCLUSIVE
    assert worst([Verdict.ERROR, Verdict.FAILED, Verdict.SUCCESSFUL]) == Verdict.FAILED
    assert worst([Verdict.ERROR, Verdict.INCONCLUSIVE]) == Verdict.ERROR
    assert worst([]) == Verdict.INCONCLUSIVE


def test_gate_actions() -> None:
    assert decide({"parity": Verdict.SUCCESSFUL, "latency": Verdict.SUCCESSFUL}).action == GateAction.ASK_APPROVAL
    inc = decide({"parity": Verdict.INCONCLUSIVE, "latency": Verdict.SUCCESSFUL})
    assert inc.verdict == Verdict.INCONCLUSIVE and inc.action == GateAction.ASK_APPROVAL and "parity" in inc.reason
    bad = decide({"parity": Verdict.FAILED, "latency": Verdict.ERROR})
    assert bad.verdict == Verdict.FAILED and bad.action == GateAction.ROLL_BACK and "parity" in bad.reason
    err = decide({"parity": Verdict.SUCCESSFUL, "latency": Verdict.ERROR})
    assert err.action == GateAction.ROLL_BACK
    assert decide({}).verdict == Verdict.INCONCLUSIVE


def test_warmup_states() -> None:
    kw = dict(min_duration_s=60, timeout_s=300, max_lag_s=10)
    ready = assess_warmup(WarmupObservation(70, 1600, 1600, 2.0, 0.0), **kw)
    assert ready.state == "ready"
    assert assess_warmup(WarmupObservation(30, 1600, 1600, 2.0, 0.0), **kw).state == "waiting"
    behind = assess_warmup(WarmupObservation(70, 1600, 800, 2.0, 0.0), **kw)
    assert behind.state == "waiting" and "800 of 1600" in behind.reason
    assert assess_warmup(WarmupObservation(70, 1600, 1600, 30.0, 0.0), **kw).state == "waiting"
    assert assess_warmup(WarmupObservation(70, 0, 0, 1.0, 0.0), **kw).state == "waiting"
    timeout = assess_warmup(WarmupObservation(301, 1600, 10, None, 0.0), **kw)
    assert timeout.state == "timeout" and "lag unknown" in timeout.reason


def test_parse_remote_write_lag_from_metrics_page() -> None:
    page = "\n".join([
        "# TYPE prometheus_remote_storage_highest_timestamp_in_seconds gauge",
        "prometheus_remote_storage_highest_timestamp_in_seconds 1.7e+09",
        'prometheus_remote_storage_queue_highest_sent_timestamp_seconds{remote_name="promshift-g",url="u"} '
        "1.699999997e+09",
        'prometheus_remote_storage_queue_highest_sent_timestamp_seconds{remote_name="other",url="u"} 1.0',
        'prometheus_remote_storage_samples_failed_total{remote_name="promshift-g",url="u"} 4',
    ])
    lag, failed = parse_remote_write_lag(page, "promshift-g")
    assert lag == pytest.approx(3.0) and failed == 4
    assert parse_remote_write_lag(page, "missing") == (None, None)


@pytest.mark.parametrize(("text", "seconds"), [
    ("15d", 15 * 86400.0), ("2d", 2 * 86400.0), ("15d or 512MiB", 15 * 86400.0), ("512MiB or 1w", 7 * 86400.0),
    ("512MiB", None), ("", None), (None, None), ("0s", None), ("forever", None),
])
def test_retention_is_read_from_prometheus_runtimeinfo_text(text: str | None, seconds: float | None) -> None:
    assert parse_retention(text) == seconds


def test_retention_problem_names_every_backend_that_keeps_too_little() -> None:
    assert retention_problem(3600, {"source": 7200.0, "target": None}) is None
    assert retention_problem(7200, {"source": 7200.0, "target": 7200.0}) is None  # exactly the retention is fine
    assert retention_problem(86400, {"source": 43200.0, "target": 150 * 86400.0}) == (
        "window of 1d is longer than the retention (source keeps 12h): not measured")


def test_answers_without_series_are_no_evidence_and_real_failures_still_fail() -> None:
    data = runs("source", [0.2] * 3) + runs("target", [0.1] * 3)
    empty = [ProbeRun(backend="target", window="1h", query="q", wall_s=0.001, ok=True, series=0,
                      result_type="matrix")] * 3
    scalar = [ProbeRun(backend="source", window="1h", query="scalar(q)", wall_s=0.001, ok=True,
                       result_type="scalar")]
    w = judge("1h", data + empty + scalar, slo_p95_s=1.0, max_slowdown_ratio=1.2, min_successes=3)
    assert w.verdict == Verdict.INCONCLUSIVE
    assert w.outcome == ("no data behind this query: 'q' (target: no series); "
                         "'scalar(q)' (source: only a scalar)")
    assert w.target_p50_s == pytest.approx(0.1)  # the 1 ms empty answers are not timed as evidence
    timeout = [ProbeRun(backend="target", window="1h", query="q", wall_s=2.0, ok=False, kind=ErrorKind.TIMEOUT)]
    failed = judge("1h", data + empty + timeout, slo_p95_s=1.0, max_slowdown_ratio=1.2, min_successes=3)
    assert failed.verdict == Verdict.FAILED and failed.outcome == "target failed 1 of 7 runs (timeout)"
    assert ProbeRun(backend="target", window="1h", query="q", wall_s=1, ok=False,
                    kind=ErrorKind.MALFORMED).to_dict()["kind"] == "malformed"
