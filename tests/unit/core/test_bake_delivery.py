"""core.bake's delivery measurement: a moved alert that fires on the target must be held by its Alertmanager."""

from __future__ import annotations

from promshift.core.bake import (
    DELIVERY_GRACE_S,
    BakeObservation,
    DeliveryObservation,
    RulesObservation,
    judge,
    judge_delivery,
    observe_delivery,
)
from promshift.core.catalog import BakePolicy
from promshift.core.verdicts import Verdict

POLICY = BakePolicy(interval_s=60, period_s=300, max_staleness_s=60, max_lag_s=30, series_tolerance=0.01,
                    parity_window_s=60)
CLEAN = BakeObservation(target_newest_age_s=4, lag_s=1.5, failed_samples=0, source_series=240, target_series=240,
                        parity=Verdict.SUCCESSFUL, parity_reason="96 points compared", rules=RulesObservation((), 10))
NOW = 1_796_378_400.0
ALERT = "GpuMemoryNearlyFull"


def line(firing: list[tuple[str, float]], held: dict | None, moved: tuple[str, ...] = (ALERT,)) -> tuple[str, str]:
    m = judge_delivery(observe_delivery(moved, firing, held, now=NOW))
    return m.verdict.value, m.reason


def test_a_firing_moved_alert_held_for_a_receiver_is_delivered() -> None:
    firing = [(ALERT, NOW - 300), (ALERT, NOW - 20), ("SomethingElse", NOW - 900)]
    assert line(firing, {ALERT: [("oncall",), ("oncall", "gpu-team")]}) == (
        "SUCCESSFUL", "1 firing moved alerts delivered: alert GpuMemoryNearlyFull to oncall, gpu-team")
    obs = observe_delivery((ALERT,), firing, {ALERT: [("oncall",)]}, now=NOW)
    assert obs.alerts[0].instances == 2 and obs.alerts[0].firing_s == 300 and obs.alerts[0].held == 1


def test_one_firing_past_the_grace_and_not_held_pages_nobody_and_fails_the_bake() -> None:
    firing = [(ALERT, NOW - DELIVERY_GRACE_S - 1)]
    assert line(firing, {ALERT: []}) == ("FAILED", "alert GpuMemoryNearlyFull fires on the target (1 instances, "
                                                   "2m1s) but its Alertmanager holds none: it pages nobody")
    result = judge(BakeObservation(**{**CLEAN.__dict__, "delivery": observe_delivery(
        (ALERT,), firing, {ALERT: []}, now=NOW)}), POLICY)
    assert result.failed and [m.name for m in result.measurements][-1] == "delivery"
    # held, but for no receiver, is not delivered either
    assert line(firing, {ALERT: [()]})[0] == "FAILED"


def test_within_the_grace_it_is_inconclusive_and_without_an_alertmanager_too() -> None:
    assert line([(ALERT, NOW - 30)], {})[0] == "INCONCLUSIVE"
    verdict, reason = line([(ALERT, NOW - 900)], None)
    assert verdict == "INCONCLUSIVE" and reason.endswith("Alertmanager is not known: delivery not checked")


def test_a_quiet_alert_has_no_delivery_measurement_and_does_not_hold_the_bake() -> None:
    quiet = observe_delivery((ALERT,), [("Other", NOW - 900)], {}, now=NOW)
    assert quiet == DeliveryObservation((), True)
    result = judge(BakeObservation(**{**CLEAN.__dict__, "delivery": quiet}), POLICY)
    assert "delivery" not in [m.name for m in result.measurements] and result.verdict == Verdict.SUCCESSFUL


def test_an_unreadable_alertmanager_is_error() -> None:
    result = judge(BakeObservation(**{**CLEAN.__dict__, "errors": (("delivery", "Alertmanager x: HTTP 503"),)}),
                   POLICY)
    assert result.verdict == Verdict.ERROR
    assert [(m.name, m.reason) for m in result.measurements][-1] == ("delivery", "delivery: Alertmanager x: HTTP 503")
