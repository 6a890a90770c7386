"""The sample-loss maths the fault matrix measures the source with (core.sample_loss)."""

from __future__ import annotations

import math

import pytest

from promshift.core.sample_loss import expected_samples, sample_loss


@pytest.mark.parametrize(("window", "interval", "expected"), [
    (30.0, 1.0, 30), (30.0, 2.0, 15), (31.0, 2.0, 15), (29.9, 1.0, 29), (0.0, 1.0, 0),
    (3.0, 0.1, 30),  # 3.0 / 0.1 is 29.999999999999996 in floats: still 30 instants
])
def test_expected_is_the_floor_of_window_over_interval(window: float, interval: float, expected: int) -> None:
    assert expected_samples(window, interval) == expected


@pytest.mark.parametrize(("window", "interval"), [(10.0, 0.0), (10.0, -1.0), (-1.0, 1.0), (math.inf, 1.0),
                                                   (10.0, math.nan)])
def test_a_window_or_interval_that_predicts_nothing_is_refused(window: float, interval: float) -> None:
    with pytest.raises(ValueError):
        expected_samples(window, interval)


def test_a_full_schedule_loses_nothing_whichever_edge_the_offset_falls_on() -> None:
    # 30 s at 2 s: 15 or 16 instants depending on the scrape offset; both are whole.
    loss = sample_loss({"a": 15, "b": 16}, window_s=30, interval_s=2)
    assert (loss.expected_per_series, loss.series, loss.stored_total) == (15, 2, 31)
    assert (loss.shortfall_total, loss.lost_total, loss.worst_lost, loss.series_short) == (0, 0, 0, ())


def test_one_sample_short_is_an_edge_not_a_loss_but_two_are() -> None:
    loss = sample_loss({"a": 14, "b": 13, "c": 15}, window_s=30, interval_s=2)
    assert loss.shortfall_total == 1 + 2
    assert loss.lost_total == 1  # b only: 2 short, 1 allowed
    assert loss.series_short == ("b",)
    assert loss.worst_lost == 1


def test_a_source_down_for_ten_seconds_at_one_second_scrapes_loses_about_ten_per_series() -> None:
    stored = {f"node-{i}": 60 - 10 for i in range(4)}
    loss = sample_loss(stored, window_s=60, interval_s=1)
    assert loss.lost_total == 4 * (10 - 1)
    assert loss.worst_lost == 9
    assert loss.to_dict()["series_short"] == [f"node-{i}" for i in range(4)]


def test_a_series_missing_from_the_answer_counts_as_nothing_stored() -> None:
    loss = sample_loss({"a": 10}, window_s=10, interval_s=1, expected_series=["a", "b"])
    assert loss.series == 2
    assert loss.shortfall_total == 10 and loss.lost_total == 9 and loss.series_short == ("b",)
    # Without the expected population a vanished series is invisible: the caller must pass it.
    assert sample_loss({"a": 10}, window_s=10, interval_s=1).lost_total == 0


def test_the_edge_tolerance_is_a_parameter_and_zero_is_exact() -> None:
    assert sample_loss({"a": 9}, window_s=10, interval_s=1, edge_tolerance=0).lost_total == 1
    assert sample_loss({"a": 9}, window_s=10, interval_s=1, edge_tolerance=1).lost_total == 0
    with pytest.raises(ValueError):
        sample_loss({"a": 9}, window_s=10, interval_s=1, edge_tolerance=-1)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_nonsense_stored_count_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="stored count"):
        sample_loss({"a": bad}, window_s=10, interval_s=1)
