"""The history horizon: how far back panels and rules read, and what waits for the target's history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from promshift.core.horizon import (
    Horizon,
    HorizonError,
    Reach,
    decommission_short_by,
    expression_lookback_s,
    grafana_duration_s,
    grafana_relative_s,
    panel_reach,
    prometheus_duration_s,
    rule_reach,
    split_by_horizon,
)

NOW = datetime(2026, 12, 6, 4, 0, tzinfo=UTC)
H = 3600.0


@pytest.mark.parametrize(("text", "seconds"), [
    ("now-24h", 24 * H), ("now-7d", 7 * 86400), ("now-30m", 1800), ("now", 0), ("now-1d/d", 2 * 86400),
    ("now/d", 86400), (" now-6h ", 6 * H), ("2026-12-01T00:00:00Z", None), ("now-1x", None), (None, None),
])
def test_grafana_relative_times(text: object, seconds: float | None) -> None:
    assert grafana_relative_s(text) == seconds


def test_durations() -> None:
    assert grafana_duration_s("7d") == 7 * 86400 and grafana_duration_s("now-2h") == 2 * H
    assert grafana_duration_s("") is None and grafana_duration_s(3) is None
    assert prometheus_duration_s("1h30m") == 5400 and prometheus_duration_s("10m") == 600
    assert prometheus_duration_s("10 minutes") is None and prometheus_duration_s(None) is None


@pytest.mark.parametrize(("expr", "back"), [
    ("DCGM_FI_DEV_GPU_UTIL", 0),
    ("rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])", 300),
    ("increase(x[1d])", 86400),
    ("predict_linear(x[6h], 3600)", 6 * H),
    ("absent_over_time(x[1h])", H),
    ("x offset 1d", 86400),
    ("rate(x[5m] offset 1h)", H + 300),
    ("max_over_time(rate(x[5m])[2h:1m])", 2 * H + 300),
    ("avg_over_time(x[$__range])", 24 * H),
    ("rate(x[$__rate_interval])", 345),  # four steps, whole seconds (core.promql.grafana_builtins)
])
def test_the_longest_look_back_of_an_expression(expr: str, back: float) -> None:
    assert expression_lookback_s(expr, range_s=24 * H, step_s=86.4) == pytest.approx(back)


def test_a_fixed_instant_reads_back_to_it_and_garbage_is_one_line() -> None:
    at = NOW - timedelta(days=3)
    assert expression_lookback_s(f"x @ {at.timestamp():.0f}", now=NOW) == pytest.approx(3 * 86400)
    with pytest.raises(HorizonError, match="cannot tell how far back"):
        expression_lookback_s("rate(x[5m]")


def test_a_panel_reaches_its_range_plus_shift_plus_look_back() -> None:
    day = panel_reach({"title": "GPU util"}, ["avg(rate(x[5m]))"], dashboard_time={"from": "now-24h", "to": "now"},
                      name="fleet / GPU util")
    assert day.reach_s == 24 * H + 300
    assert day.parts[0] == "dashboard range now-24h" and "look-back 5m" in day.parts[-1]
    own = panel_reach({"timeFrom": "1h", "timeShift": "1d"}, ["x"], dashboard_time={"from": "now-24h"}, name="p")
    assert own.reach_s == H + 86400
    default = panel_reach({}, ["x"], dashboard_time=None, name="p")
    assert default.reach_s == 6 * H and "default range 6h" in default.parts[0]
    # $__interval follows the range over maxDataPoints, never under the panel's interval.
    wide = panel_reach({"maxDataPoints": 100, "interval": "1m"}, ["rate(x[$__interval])"],
                       dashboard_time={"from": "now-7d"}, name="p")
    assert wide.reach_s == 7 * 86400 + 7 * 86400 / 100
    absolute = panel_reach({}, ["x"], dashboard_time={"from": "2026-12-01T00:00:00Z", "to": "now"}, name="p")
    assert absolute.reach_s is None and "not relative to now" in absolute.parts[0]


def test_a_rule_reaches_its_ranges_plus_its_for() -> None:
    assert rule_reach("increase(x[2h]) > 0", name="r").reach_s == 2 * H
    alert = rule_reach("rate(x[5m]) > 1", for_="10m", name="a")
    assert alert.reach_s == 900 and alert.parts == ("look-back 5m", "for 10m")
    assert rule_reach("x > 1", name="r").parts == ("reads only the newest samples",)
    assert rule_reach("x > 1", for_="ten minutes", name="r").reach_s is None


def test_the_split_switches_what_the_target_holds_and_names_the_rest_with_its_ready_time() -> None:
    since = NOW - timedelta(hours=2)
    short = Reach("panel", "short", 3600.0, ())
    day = Reach("panel", "day", 24 * H, ())
    rule = Reach("rule", "r", 2 * H + 1, ())
    unknown = Reach("panel", "abs", None, ())
    split = split_by_horizon([short, day, rule, unknown], dual_write_since=since, now=NOW)
    assert split.ready == (short,)
    assert [(w.reach.name, w.ready_at) for w in split.waiting] == [
        ("day", since + timedelta(hours=24)), ("r", since + timedelta(seconds=2 * H + 1)), ("abs", None)]
    assert split.next_ready() == since + timedelta(seconds=2 * H + 1)
    assert split.longest_s is None  # one reach is unknown
    assert split.to_dict()["waiting"][0]["target_holds_s"] == 2 * H
    # When its time has passed, it goes.
    later = split_by_horizon([short, day, rule], dual_write_since=since, now=since + timedelta(hours=24))
    assert [r.name for r in later.ready] == ["short", "day", "r"] and not later.waiting
    accepted = split_by_horizon([short, day], dual_write_since=since, now=NOW, accept_short_history=True)
    assert accepted.accepted_short == (day,) and not accepted.waiting


def test_a_lab_clock_advance_counts_history_ahead_keeps_the_wall_clock_and_is_named_in_every_record() -> None:
    since = NOW - timedelta(minutes=5)
    day, rule = Reach("panel", "day", 24 * H, ()), Reach("rule", "r", 2 * H + 15 * 60, ())
    wall = Horizon(since, NOW)
    assert [w.reach.name for w in wall.split([day, rule]).waiting] == ["day", "r"]
    # a record without an advance reads as before: no lab keys at all
    assert set(wall.to_dict()) == {"dual_write_since", "now", "accept_short_history", "scrape_interval_s"}
    ahead = Horizon(since, NOW, lab_clock_ahead_s=24 * H)
    split = ahead.split([day, rule])
    assert [r.name for r in split.ready] == ["day", "r"] and not split.waiting
    assert ahead.counted_now == NOW + timedelta(hours=24) and ahead.now == NOW  # the wall clock is kept
    record = ahead.to_dict()
    assert record["now"] == NOW.isoformat() and record["lab_clock_ahead_s"] == 24 * H
    assert record["counted_now"] == (NOW + timedelta(hours=24)).isoformat()
    assert record["clock"] == "LAB ONLY: history counted 1d ahead of the wall clock"
    assert Horizon.from_dict(record) == ahead and Horizon.from_dict(wall.to_dict()) == wall
    # an advance too short for the day still leaves it waiting, its ready time the wall-clock one
    half = Horizon(since, NOW, lab_clock_ahead_s=12 * H).split([day, rule])
    assert [(w.reach.name, w.ready_at) for w in half.waiting] == [("day", since + timedelta(hours=24))]
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(HorizonError, match="lab_clock_ahead_s must be a finite number"):
            Horizon(since, NOW, lab_clock_ahead_s=bad)


def test_decommission_waits_for_the_longest_read() -> None:
    since = NOW - timedelta(hours=2)
    assert decommission_short_by(24 * H, dual_write_since=since, now=NOW) == 22 * H
    assert decommission_short_by(H, dual_write_since=since, now=NOW) == 0
    assert decommission_short_by(None, dual_write_since=since, now=NOW) is None


def test_the_run_form_accepts_short_history_only_as_a_boolean() -> None:
    from promshift.core.run_params import RunParamsError, parse_run_params

    assert parse_run_params({}, scrape_interval_s=15).accept_short_history is False
    assert parse_run_params({"accept_short_history": True}, scrape_interval_s=15).to_dict()["accept_short_history"]
    with pytest.raises(RunParamsError, match="'accept_short_history' must be true or false"):
        parse_run_params({"accept_short_history": "yes"}, scrape_interval_s=15)


def test_dual_write_starts_at_its_deploy_and_ends_at_a_full_rollback() -> None:
    from promshift.core.audit import new_event
    from promshift.core.horizon import dual_write_since

    def event(kind: str, at: datetime) -> object:
        return new_event(prev=None, group="g", run_id="r", kind=kind, stage_from=None, stage_to=None, actor="a",
                         at=at, evidence={}, key=None)

    first, second = NOW - timedelta(days=2), NOW - timedelta(hours=1)
    assert dual_write_since([]) is None
    assert dual_write_since([event("dual_write_deployed", first)]) == first
    assert dual_write_since([event("dual_write_deployed", first), event("reads_rolled_back", second)]) == first
    assert dual_write_since([event("dual_write_deployed", first), event("rolled_back", second)]) is None
    assert dual_write_since([event("dual_write_deployed", first), event("rolled_back", second),
                             event("dual_write_deployed", NOW)]) == NOW
