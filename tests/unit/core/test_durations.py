"""Prometheus-style duration parsing and formatting."""

from __future__ import annotations

import math

import pytest

from promshift.core.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("2d", 172800.0),
        ("1w", 604800.0),
        ("1y", 365 * 86400.0),
        ("1m30s", 90.0),
        ("1h0m", 3600.0),
        ("1d2h3m4s5ms", 86400 + 7200 + 180 + 4 + 0.005),
        ("0", 0.0),
        ("0s", 0.0),
        ("90", 90.0),
        ("1.5", 1.5),
        (45, 45.0),
        (2.5, 2.5),
    ],
)
def test_parse_duration_accepts_prometheus_forms_and_plain_seconds(
    text: str | int | float, seconds: float
) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", "1.5h", "30m1h", "1h1h", "10x", " 10m", "10 m", "-5", "-5s", "ms", "h", "1H", "1e3"],
)
def test_parse_duration_rejects_malformed_strings_naming_the_input(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration") as excinfo:
        parse_duration(text)
    assert repr(text) in str(excinfo.value)


@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, True, None, [1]])
def test_parse_duration_rejects_bad_numbers_and_types(value: object) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5400, "1h30m"),
        (0, "0s"),
        (0.5, "500ms"),
        (30, "30s"),
        (90061.5, "1d1h1m1s500ms"),
        (604800, "1w"),
        (8 * 86400, "1w1d"),
        (365 * 86400, "1y"),
        (0.1 * 3, "300ms"),  # float residue must not leak into the text
    ],
)
def test_format_duration_is_shortest_prometheus_form(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0.001, 1, 59, 61, 3599, 3601, 5400, 86399, 1234567.891])
def test_format_then_parse_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [-1, math.nan, math.inf, True, "10m"])
def test_format_duration_rejects_non_durations(value: object) -> None:
    with pytest.raises(ValueError, match="cannot format"):
        format_duration(value)  # type: ignore[arg-type]
