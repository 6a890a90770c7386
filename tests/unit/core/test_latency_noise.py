"""The latency judge under noise: synthetic paired runs, and the probe's rounds against scripted servers.

Identical backends with noise are never FAILED; a target 1.5x slower is; an interval that straddles
the limit is INCONCLUSIVE with its noise named; a query that read no samples is no evidence, and an
empty answer that read samples is judged.
"""

from __future__ import annotations

import math
import random
import re
import time
from typing import Any

import pytest

from promshift.core.latency import (
    ProbeRun,
    RatioInterval,
    WindowLatency,
    hodges_lehmann_interval,
    judge_window,
    look_level,
    paired_runs,
    ratio_interval,
    source_noise_pct,
)
from promshift.core.verdicts import Verdict
from tests.unit.adapters.test_latency_probe import empty, ok_matrix, probe
from tests.unit.adapters.test_latency_probe import servers as servers  # noqa: PLC0414 - the scripted servers' fixture


def paired(source: list[float], target: list[float], *, query: str = "q", samples: float | None = 1000.0,
           series: int = 1) -> list[ProbeRun]:
    """Runs as the probe makes them: pair i of round 1 on both sides."""
    return [ProbeRun(backend=backend, window="1h", query=query, wall_s=t, ok=True, series=series, samples=samples,
                     round=1, pair=i)
            for i, pair in enumerate(zip(source, target, strict=True))
            for backend, t in zip(("source", "target"), pair, strict=True)]


def noisy_pairs(rng: random.Random, n: int, *, slowdown: float = 1.0, base: float = 0.4,
                load_cv: float = 0.5, own_cv: float = 0.25) -> tuple[list[float], list[float]]:
    """A busy machine: each pair shares a load factor (heavy-tailed), and each run has its own jitter."""
    source, target = [], []
    for _ in range(n):
        load = math.exp(rng.gauss(0, load_cv))
        source.append(base * load * math.exp(rng.gauss(0, own_cv)))
        target.append(base * slowdown * load * math.exp(rng.gauss(0, own_cv)))
    return source, target


JUDGE = dict(slo_p95_s=30.0, max_slowdown_ratio=1.2, slowdown_floor_s=0.05, min_successes=3, confidence=0.95,
             looks=4)


# -- the interval itself ----------------------------------------------------------------------------

def test_the_interval_is_wilcoxons_signed_rank_around_the_hodges_lehmann_estimate() -> None:
    values = [2.0**i for i in range(20)]  # every Walsh average distinct: the order statistics are exact
    # n = 20: P(T+ <= 39) = 0.00604 <= 0.00625 < P(T+ <= 40) = 0.00681, so k = 40 at 98.75 %; at 95 %,
    # P(T+ <= 52) = 0.0242 <= 0.025 < P(T+ <= 53) = 0.0266, k = 53. Of the 210 Walsh averages, the k-th
    # smallest and the k-th largest.
    walsh = sorted((a + b) / 2 for i, a in enumerate(values) for b in values[i:])
    assert hodges_lehmann_interval(values, look_level(0.95, 4))[1:] == (walsh[39], walsh[210 - 40])
    assert hodges_lehmann_interval(values, 0.95)[1:] == (walsh[52], walsh[210 - 53])
    assert hodges_lehmann_interval([float(i) for i in range(1, 21)], 0.95)[0] == 10.5
    # Five values reach 93.75 % at most (min..max): no interval at 95 %; six do.
    assert hodges_lehmann_interval([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == (3.0, None, None)
    assert hodges_lehmann_interval([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == (3.0, 1.0, 5.0)
    assert hodges_lehmann_interval([1.0] * 6, 0.95) == (1.0, 1.0, 1.0)
    assert hodges_lehmann_interval([], 0.5) == (None, None, None)
    # An outlier moves the estimate little (the mean would move by 5).
    assert hodges_lehmann_interval([1.0] * 9 + [51.0], 0.9)[0] == 1.0
    assert look_level(0.95, 4) == pytest.approx(0.9875) and look_level(0.95, 1) == pytest.approx(0.95)


def test_many_pairs_use_the_normal_approximation_of_the_same_interval() -> None:
    rng = random.Random(1)
    values = [rng.gauss(0, 1) for _ in range(200)]
    _, low, high = hodges_lehmann_interval(values, 0.95)
    assert low is not None and high is not None and -0.35 < low < 0 < high < 0.35


def test_the_same_runs_always_give_the_same_interval() -> None:
    src, tgt = noisy_pairs(random.Random(7), 15)
    runs = paired(src, tgt)
    first = judge_window("1h", runs, **JUDGE)
    assert first == judge_window("1h", list(reversed(runs)), **JUDGE)
    assert first.interval is not None and first.interval.pairs == 15


def test_the_a_a_noise_is_the_sources_own_spread() -> None:
    assert source_noise_pct({"q": [(1.0, 9.0), (1.1, 9.0), (2.0, 9.0), (2.0, 9.0)]}) == pytest.approx(5.0)
    assert source_noise_pct({"q": [(1.0, 1.0)]}) is None


def test_pairs_match_on_round_and_index_and_skip_runs_that_read_nothing() -> None:
    runs = paired([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    runs[2] = ProbeRun(backend="source", window="1h", query="q", wall_s=0.001, ok=True, samples=0.0, round=1, pair=1)
    assert paired_runs(runs) == {"q": [(1.0, 1.5), (3.0, 3.5)]}


# -- identical backends, a slower one, a straddle -----------------------------------------------------

@pytest.mark.parametrize("rounds", [1, 2, 3, 4])
def test_identical_backends_with_heavy_noise_are_never_failed(rounds: int) -> None:
    verdicts = []
    for seed in range(300):
        src, tgt = noisy_pairs(random.Random(seed), 5 * rounds)
        verdicts.append(judge_window("1h", paired(src, tgt), rounds=rounds, **JUDGE).verdict)
    assert Verdict.FAILED not in verdicts
    # Not by refusing to judge: with less jitter of their own, and enough pairs, most runs pass.
    if rounds == 4:
        calmer = [judge_window("1h", paired(*noisy_pairs(random.Random(seed), 20, own_cv=0.08)), rounds=4,
                               **JUDGE).verdict for seed in range(100)]
        assert Verdict.FAILED not in calmer and calmer.count(Verdict.SUCCESSFUL) > 80


def test_the_old_point_judge_would_have_failed_those_same_runs() -> None:
    # The baseline this replaces: one p95 per side from five runs, ratio 1.2 and the floor.
    from promshift.core.latency import percentile

    fails = 0
    for seed in range(300):
        src, tgt = noisy_pairs(random.Random(seed), 5)
        s95, t95 = percentile(src, 95), percentile(tgt, 95)
        fails += t95 > 1.2 * s95 and t95 - s95 > 0.05
    assert fails > 30  # about a quarter of healthy checks rolled back on noise


def test_a_target_one_and_a_half_times_slower_is_failed() -> None:
    verdicts = []
    for seed in range(100):
        src, tgt = noisy_pairs(random.Random(seed), 20, slowdown=1.5, own_cv=0.1)
        verdicts.append(judge_window("1h", paired(src, tgt), rounds=4, **JUDGE))
    assert sum(w.verdict == Verdict.FAILED for w in verdicts) >= 95
    failed = next(w for w in verdicts if w.verdict == Verdict.FAILED)
    assert re.fullmatch(r"target p95 [0-9.]+s slower than source [0-9.]+s beyond ratio 1\.2: paired ratio 1\.[3-6]\d "
                        r"\(98\.75 % interval 1\.[2-9]\d-[0-9.]+, 20 pairs\)", failed.outcome), failed.outcome


def test_a_straddling_interval_is_inconclusive_with_its_noise_named() -> None:
    # Half the pairs 1.5x slower, half as fast: the median ratio's interval holds both 1.0 and 1.5.
    src = [0.4] * 12
    tgt = [0.4, 0.6] * 6
    w = judge_window("1h", paired(src, tgt), rounds=4, **JUDGE)
    assert w.verdict == Verdict.INCONCLUSIVE and w.undecided
    assert w.interval is not None and w.interval.low == pytest.approx(1.0) and w.interval.high == pytest.approx(1.5)
    assert w.outcome == ("target/source paired ratio 1.22 (98.75 % interval 1.00-1.50, 12 pairs) straddles the "
                         "limit 1.2 after 4 rounds; noise ±20 %: could not separate")
    few = judge_window("1h", paired([0.4] * 3, [0.6] * 3), **JUDGE)
    assert few.verdict == Verdict.INCONCLUSIVE and few.undecided
    assert few.outcome.endswith("after 1 round; too few pairs for an interval: could not separate")


def test_a_slowdown_under_the_floor_passes_whatever_the_ratio() -> None:
    w = judge_window("1h", paired([0.010] * 10, [0.030] * 10), **JUDGE)  # 3x, but 20 ms
    assert w.verdict == Verdict.SUCCESSFUL and w.outcome == "within SLO"
    assert w.interval is not None and w.interval.diff_high_s == pytest.approx(0.02)


# -- evidence by samples read --------------------------------------------------------------------------

def test_no_samples_read_is_inconclusive_and_an_empty_answer_that_read_samples_is_judged() -> None:
    nothing = judge_window("1h", paired([0.01] * 10, [0.01] * 10, samples=0.0, series=1), **JUDGE)
    assert nothing.verdict == Verdict.INCONCLUSIVE and not nothing.undecided
    assert nothing.outcome == "no data behind this query: 'q' (source: read no samples; target: read no samples)"
    # count(x == 0) when nothing is zero: no series answered, every x read.
    read = judge_window("1h", paired([0.3] * 10, [0.31] * 10, samples=48_000.0, series=0), **JUDGE)
    assert read.verdict == Verdict.SUCCESSFUL and read.target_p95_s == pytest.approx(0.31)
    slow = judge_window("1h", paired([0.3] * 10, [0.6] * 10, samples=48_000.0, series=0), **JUDGE)
    assert slow.verdict == Verdict.FAILED
    # Without stats, the companion count of the group's series behind the query decides.
    counted = judge_window("1h", paired([0.3] * 10, [0.31] * 10, samples=None, series=0),
                           behind={"q": (1600.0, 1600.0)}, **JUDGE)
    assert counted.verdict == Verdict.SUCCESSFUL
    none_behind = judge_window("1h", paired([0.3] * 10, [0.31] * 10, samples=None, series=0),
                               behind={"q": (0.0, 0.0)}, **JUDGE)
    assert none_behind.verdict == Verdict.INCONCLUSIVE and "no data behind this query" in none_behind.outcome


def test_the_interval_travels_in_the_evidence() -> None:
    src, tgt = noisy_pairs(random.Random(3), 10)
    w = judge_window("1h", paired(src, tgt), rounds=2, **JUDGE)
    d = w.to_dict()
    assert d["rounds"] == 2 and d["interval"]["pairs"] == 10 and d["interval"]["level"] == pytest.approx(0.9875)
    assert {"ratio", "low", "high", "noise_pct", "spread_pct"} <= set(d["interval"])
    back = WindowLatency.from_dict(d)
    assert back.interval == w.interval and back.rounds == 2
    assert RatioInterval.from_dict(RatioInterval(1.0, None, None, None, None, 0.95, 3).to_dict()).low is None
    assert ratio_interval({}, level=0.95) is None


# -- the probe's rounds against scripted servers ----------------------------------------------------

def test_the_probe_adds_rounds_while_the_interval_straddles_then_names_the_noise(servers: Any) -> None:
    def every_other_pair_late(n: int) -> Any:
        time.sleep(0.12 if n % 2 == 0 else 0.0)  # half the pairs ~1x, half much slower
        return ok_matrix()

    src = servers(lambda n: ok_matrix(), delay_s=0.01)
    tgt = servers(every_other_pair_late, delay_s=0.01)
    result = probe(src, tgt, repeats=4, max_rounds=3, confidence=0.9, slowdown_floor_s=0.02).run(
        now=1e6, queries=["q"], dual_write_since=None)
    [w] = result.windows
    assert w.verdict == Verdict.INCONCLUSIVE and w.rounds == 3
    assert "after 3 rounds" in w.outcome and "could not separate" in w.outcome
    assert len(src.requests) == len(tgt.requests) == 1 + 3 * 4  # one warm-up pair, three rounds of four
    assert {r.round for r in result.runs} == {1, 2, 3} and w.interval is not None and w.interval.pairs == 12


def test_the_probe_stops_at_the_round_that_decides(servers: Any) -> None:
    src = servers(lambda n: ok_matrix(), delay_s=0.01)
    slow = servers(lambda n: ok_matrix(), delay_s=0.08)
    result = probe(src, slow, repeats=4, max_rounds=4, confidence=0.95, slowdown_floor_s=0.02).run(
        now=1e6, queries=["q"], dual_write_since=None)
    [w] = result.windows
    # 4 pairs cannot reach 98.75 %; 8 can: FAILED in round 2, no third round.
    assert w.verdict == Verdict.FAILED and w.rounds == 2 and len(slow.requests) == 1 + 2 * 4
    same = servers(lambda n: empty(samples=900), delay_s=0.01)
    twin = servers(lambda n: empty(samples=900), delay_s=0.01)
    ok = probe(same, twin, repeats=4, max_rounds=4, confidence=0.95).run(now=1e6, queries=["q"],
                                                                           dual_write_since=None)
    assert ok.verdict == Verdict.SUCCESSFUL and ok.windows[0].rounds == 2
