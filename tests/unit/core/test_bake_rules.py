"""The bake's ``rules`` measurement (pure): the moved rules' health and evaluation on the target."""

from __future__ import annotations

import pytest

from promshift.core.bake import (
    BakeObservation,
    MovedRule,
    RuleEvaluation,
    RulesObservation,
    judge,
    judge_rules,
    observe_rules,
    parse_rfc3339,
)
from promshift.core.catalog import BakePolicy
from promshift.core.rules import LoadedRule, RuleKind
from promshift.core.verdicts import Verdict

POLICY = BakePolicy(interval_s=60, period_s=300, max_staleness_s=60, max_lag_s=30, series_tolerance=0.01,
                    parity_window_s=60)
CLEAN = BakeObservation(target_newest_age_s=4, lag_s=1.5, failed_samples=0, source_series=240, target_series=240,
                        parity=Verdict.SUCCESSFUL, parity_reason="96 points compared")
RECORD = RuleEvaluation("record", "gpu:fb_used:ratio", "gpu-memory", health="ok", last_evaluation_age_s=3,
                        interval_s=5)
ALERT = RuleEvaluation("alert", "GpuMemoryNearlyFull", "gpu-memory", health="ok", last_evaluation_age_s=4,
                       interval_s=5)


def rules_line(*rules: RuleEvaluation, loaded_age_s: float | None = 120) -> tuple[Verdict, str]:
    m = judge_rules(RulesObservation(rules, loaded_age_s))
    return m.verdict, m.reason


def test_healthy_recently_evaluated_rules_pass() -> None:
    verdict, reason = rules_line(RECORD, ALERT)
    assert verdict == Verdict.SUCCESSFUL
    assert reason == "2 moved rules healthy, each evaluated within 3 x its interval"


def test_an_empty_observation_is_no_rules_moved() -> None:
    assert rules_line() == (Verdict.SUCCESSFUL, "no rules moved")


def test_a_missing_rule_fails_with_its_name() -> None:
    verdict, reason = rules_line(RECORD, RuleEvaluation("alert", "GpuMemoryNearlyFull", "gpu-memory", found=False))
    assert verdict == Verdict.FAILED
    assert reason == "alert GpuMemoryNearlyFull missing on the target"


def test_an_err_rule_fails_with_its_last_error_on_one_line() -> None:
    bad = RuleEvaluation("record", "gpu:fb_used:ratio", "gpu-memory", health="err",
                         last_error="vector contains metrics with the same labelset\nafter applying rule labels",
                         last_evaluation_age_s=2, interval_s=5)
    verdict, reason = rules_line(bad, ALERT)
    assert verdict == Verdict.FAILED
    assert reason == ("record gpu:fb_used:ratio health err: vector contains metrics with the same labelset "
                      "after applying rule labels")
    assert "\n" not in reason


def test_a_rule_not_evaluated_yet_within_the_grace_is_inconclusive() -> None:
    fresh = RuleEvaluation("alert", "GpuMemoryNearlyFull", "gpu-memory", health="unknown", interval_s=5)
    # grace: 3 x 5 s + 30 s = 45 s after the handoff loaded it
    assert rules_line(RECORD, fresh, loaded_age_s=44) == (
        Verdict.INCONCLUSIVE, "alert GpuMemoryNearlyFull not evaluated yet, loaded 44s ago (interval 5s)")
    assert rules_line(fresh, loaded_age_s=None)[0] == Verdict.INCONCLUSIVE


def test_a_rule_never_evaluated_past_the_grace_fails() -> None:
    never = RuleEvaluation("alert", "GpuMemoryNearlyFull", "gpu-memory", health="unknown", interval_s=5)
    verdict, reason = rules_line(never, loaded_age_s=46)
    assert verdict == Verdict.FAILED
    assert reason == "alert GpuMemoryNearlyFull never evaluated since it was loaded 46s ago (interval 5s)"


def test_a_stale_evaluation_fails_and_the_interval_bounds_it() -> None:
    stale = RuleEvaluation("record", "gpu:fb_used:ratio", "gpu-memory", health="ok", last_evaluation_age_s=16,
                           interval_s=5)
    assert rules_line(stale)[0] == Verdict.FAILED
    assert "last evaluated 16s ago (limit 15s: 3 x its interval)" in rules_line(stale)[1]
    just_in = RuleEvaluation("record", "gpu:fb_used:ratio", "gpu-memory", health="ok", last_evaluation_age_s=15,
                             interval_s=5)
    assert rules_line(just_in)[0] == Verdict.SUCCESSFUL
    # no interval reported: Prometheus's default 1m
    default = RuleEvaluation("record", "x", health="ok", last_evaluation_age_s=170)
    assert rules_line(default)[0] == Verdict.SUCCESSFUL


def test_failed_beats_inconclusive_and_the_line_names_three_then_counts() -> None:
    missing = [RuleEvaluation("alert", f"A{i}", found=False) for i in range(5)]
    pending = RuleEvaluation("record", "p", health="unknown", interval_s=5)
    verdict, reason = rules_line(pending, *missing, loaded_age_s=1)
    assert verdict == Verdict.FAILED
    assert reason == ("alert A0 missing on the target; alert A1 missing on the target; alert A2 missing on the "
                      "target (and 2 more)")


def test_judge_adds_rules_last_only_when_rules_moved() -> None:
    assert [m.name for m in judge(CLEAN, POLICY).measurements] == ["freshness", "lag", "series", "parity",
                                                                    "ingestion"]
    obs = BakeObservation(**{**CLEAN.__dict__, "rules": RulesObservation((RECORD,), 10)})
    result = judge(obs, POLICY)
    assert [m.name for m in result.measurements] == ["freshness", "lag", "series", "parity", "ingestion", "rules"]
    assert result.verdict == Verdict.SUCCESSFUL


def test_a_failed_rules_measurement_fails_the_bake() -> None:
    obs = BakeObservation(**{**CLEAN.__dict__, "rules": RulesObservation(
        (RuleEvaluation("alert", "GpuMemoryNearlyFull", found=False),), 10)})
    result = judge(obs, POLICY)
    assert result.failed and result.verdict == Verdict.FAILED
    assert result.reason() == "rules FAILED: alert GpuMemoryNearlyFull missing on the target"


def test_an_unreadable_rules_api_is_error_never_judged() -> None:
    obs = BakeObservation(**{**CLEAN.__dict__, "rules": None,
                             "errors": (("rules", "HTTP 503 from /api/v1/rules"),)})
    result = judge(obs, POLICY)
    assert result.verdict == Verdict.ERROR and result.failed
    assert [(m.name, m.verdict) for m in result.measurements][-1] == ("rules", Verdict.ERROR)
    assert result.measurements[-1].reason == "rules: HTTP 503 from /api/v1/rules"


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-12-04T10:00:00Z", 1796378400.0),
    ("2026-12-04T10:00:00.123456789Z", 1796378400.123456),
    ("2026-12-04T11:00:00.5+01:00", 1796378400.5),
    ("0001-01-01T00:00:00Z", None),
    ("", None),
    ("not a time", None),
])
def test_parse_rfc3339(text: str, expected: float | None) -> None:
    got = parse_rfc3339(text)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_observe_rules_matches_kind_name_and_group_and_computes_ages() -> None:
    now = 1796378400.0
    loaded = [
        LoadedRule("amp-ws-promshift-gpu-memory.yml", "gpu-memory", RuleKind.RECORD, "gpu:fb_used:ratio",
                   health="ok", last_evaluation="2026-12-04T09:59:57Z", interval_s=5.0),
        LoadedRule("other.yml", "other", RuleKind.ALERT, "GpuMemoryNearlyFull", health="ok",
                   last_evaluation="2026-12-04T09:59:58Z", interval_s=5.0),
        LoadedRule("amp-ws-promshift-gpu-memory.yml", "gpu-memory", RuleKind.RECORD, "GpuMemoryNearlyFull",
                   health="ok", last_evaluation="2026-12-04T09:59:58Z", interval_s=5.0),
    ]
    moved = [MovedRule("record", "gpu:fb_used:ratio", "gpu-memory"), MovedRule("alert", "GpuMemoryNearlyFull",
                                                                              "gpu-memory")]
    obs = observe_rules(moved, loaded, now=now, loaded_at=now - 100)
    assert obs.loaded_age_s == 100
    record, alert = obs.rules
    assert record == RuleEvaluation("record", "gpu:fb_used:ratio", "gpu-memory", True, "ok", "", 3.0, 5.0)
    # the alert of that name is in another group, and the record of that name is not an alert
    assert alert.found is False
    assert judge_rules(obs).verdict == Verdict.FAILED


def test_observe_rules_judges_the_worst_copy_and_a_never_evaluated_rule() -> None:
    now = 1796378400.0
    loaded = [LoadedRule("a", "g", RuleKind.ALERT, "A", health="ok", last_evaluation="2026-12-04T09:59:59Z"),
              LoadedRule("b", "g", RuleKind.ALERT, "A", health="err", last_error="boom",
                         last_evaluation="2026-12-04T09:59:59Z"),
              LoadedRule("c", "h", RuleKind.RECORD, "r", health="unknown", last_evaluation="0001-01-01T00:00:00Z")]
    obs = observe_rules([MovedRule("alert", "A"), MovedRule("record", "r")], loaded, now=now, loaded_at=None)
    assert obs.rules[0].health == "err" and obs.rules[0].last_error == "boom"
    assert obs.rules[1].last_evaluation_age_s is None and obs.loaded_age_s is None
