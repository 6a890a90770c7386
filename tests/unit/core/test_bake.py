"""The bake judgement (pure): each check's verdict, the clean streak, and when a group is baked."""

from __future__ import annotations

import pytest

from promshift.core.bake import BakeObservation, baked, clean_streak_start, judge
from promshift.core.catalog import BakePolicy
from promshift.core.verdicts import Verdict

POLICY = BakePolicy(interval_s=60, period_s=300, max_staleness_s=60, max_lag_s=30, series_tolerance=0.01,
                    parity_window_s=60)
CLEAN = BakeObservation(target_newest_age_s=4, lag_s=1.5, failed_samples=0, source_series=240, target_series=240,
                        parity=Verdict.SUCCESSFUL, parity_reason="96 points compared")
S, INC, F = Verdict.SUCCESSFUL, Verdict.INCONCLUSIVE, Verdict.FAILED


def verdicts(obs: BakeObservation) -> dict[str, str]:
    return {m.name: m.verdict.value for m in judge(obs, POLICY).measurements}


def test_a_clean_observation_passes_every_check() -> None:
    result = judge(CLEAN, POLICY)
    assert result.verdict == S and not result.failed
    assert verdicts(CLEAN) == {"freshness": "SUCCESSFUL", "lag": "SUCCESSFUL", "series": "SUCCESSFUL",
                               "parity": "SUCCESSFUL", "ingestion": "SUCCESSFUL"}
    assert result.reason() == "every bake check passed"


@pytest.mark.parametrize(("change", "name", "verdict", "reason"), [
    ({"target_newest_age_s": None}, "freshness", "FAILED", "the target has no sample of the group"),
    ({"target_newest_age_s": 600}, "freshness", "FAILED", "newest sample on the target is 10m old (limit 1m)"),
    ({"lag_s": 45}, "lag", "FAILED", "remote-write lag 45s (limit 30s)"),
    ({"lag_s": None}, "lag", "INCONCLUSIVE", "the group's remote-write queue was not found on the source"),
    ({"target_series": 230}, "series", "FAILED", "target 230 of 240 source series (4.17%, limit 1.00%)"),
    ({"source_series": 0}, "series", "INCONCLUSIVE", "the source has no series of the group to compare with"),
    ({"parity": Verdict.FAILED, "parity_reason": "samples: 3 mismatches"}, "parity", "FAILED",
     "samples: 3 mismatches"),
    ({"parity": None, "parity_reason": ""}, "parity", "INCONCLUSIVE", "no parity window ran"),
])
def test_each_check_fails_or_is_inconclusive_on_its_own(change: dict, name: str, verdict: str, reason: str) -> None:
    import dataclasses

    obs = dataclasses.replace(CLEAN, **change)
    result = judge(obs, POLICY)
    [bad] = result.not_passed()
    assert (bad.name, bad.verdict.value, bad.reason) == (name, verdict, reason)
    assert result.verdict.value == verdict  # the worst wins
    assert result.failed is (verdict == "FAILED")


def test_an_observation_that_could_not_be_made_is_an_error_and_fails_the_bake() -> None:
    import dataclasses

    # The failed read is named as such, never judged as "no sample" on the value it could not read.
    obs = dataclasses.replace(CLEAN, target_newest_age_s=None, errors=(("age", "http://amp: unreachable"),))
    result = judge(obs, POLICY)
    assert result.verdict == Verdict.ERROR and result.failed
    assert result.reason() == "freshness ERROR: age: http://amp: unreachable"
    assert [m.name for m in result.measurements] == ["freshness", "lag", "series", "parity", "ingestion"]


def test_the_scraper_path_has_no_queue_and_its_lag_does_not_apply() -> None:
    import dataclasses

    obs = dataclasses.replace(CLEAN, lag_s=None, queue_expected=False)
    assert judge(obs, POLICY).verdict == S


def test_the_clean_streak_restarts_after_anything_but_success_and_after_a_gap() -> None:
    assert clean_streak_start([(0, S), (60, S), (120, S)], interval_s=60) == 0
    assert clean_streak_start([(0, S), (60, INC), (120, S), (180, S)], interval_s=60) == 120
    assert clean_streak_start([(0, S), (60, S), (120, F)], interval_s=60) is None
    # The watch stopped for 10 minutes (more than 3 intervals): the streak starts again after the gap.
    assert clean_streak_start([(0, S), (60, S), (660, S), (720, S)], interval_s=60) == 660
    assert clean_streak_start([], interval_s=60) is None


def test_baked_only_once_the_clean_streak_covers_the_period() -> None:
    checks = [(t, S) for t in range(0, 301, 60)]
    assert baked(checks, POLICY, now=300)
    assert not baked(checks[:-1], POLICY, now=240)  # 240 s of 300
    assert not baked([*checks[:3], (180, INC), *checks[4:]], POLICY, now=300)
    # A clean streak whose last check is old is not a bake: the watch must still be watching.
    assert not baked(checks, POLICY, now=300 + 4 * 60)
