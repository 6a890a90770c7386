"""Samples lost on the source over a window: what was stored per series against what the scrape schedule predicts.

Prometheus scrapes each target once per ``interval`` at a fixed offset, so a range ``(end - window, end]``
holds ``floor(window / interval)`` or ``ceil(window / interval)`` scrape instants of every series, depending
on where the offset falls. Stored counts come from ``count_over_time(<series>[window])`` evaluated at ``end``.

Definitions (per series):

- ``expected`` = ``floor(window / interval)``: the fewest instants the window can hold (a whole schedule);
- ``shortfall`` = ``max(0, expected - stored)``: samples missing against that floor;
- ``lost`` = ``max(0, shortfall - edge_tolerance)``: what is missing beyond the edge allowance (default 1
  sample per series: a scrape that lands on the window's edge, or one delayed past it, is not a loss).

A series the source should hold but does not (absent from the answer) has ``stored = 0``. The totals are
sums over series; ``series_short`` names the series with ``lost > 0``. Pure: the caller queries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

EDGE_TOLERANCE = 1


@dataclass(frozen=True)
class SampleLoss:
    """The source's stored samples over one window against its scrape schedule."""

    window_s: float
    interval_s: float
    expected_per_series: int
    series: int
    stored_total: int
    shortfall_total: int
    lost_total: int
    worst_lost: int
    edge_tolerance: int
    series_short: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["series_short"] = list(self.series_short)
        return out


def expected_samples(window_s: float, interval_s: float) -> int:
    """Scrape instants a window ``(end - window, end]`` holds at the least: ``floor(window / interval)``.

    A tiny tolerance absorbs float noise (3.0 / 1.0 computed as 2.9999999 is 3)."""
    if not (interval_s > 0 and window_s >= 0 and math.isfinite(window_s) and math.isfinite(interval_s)):
        raise ValueError(f"window must be >= 0 and interval > 0 (finite), got {window_s!r} / {interval_s!r}")
    return int(math.floor(window_s / interval_s + 1e-9))


def sample_loss(stored: Mapping[str, float], *, window_s: float, interval_s: float,
                expected_series: Iterable[str] | None = None, edge_tolerance: int = EDGE_TOLERANCE) -> SampleLoss:
    """Per-series ``stored`` counts (``count_over_time`` results by series key) against the schedule.

    ``expected_series``: every series the source should hold over the window; one absent from ``stored`` counts
    as 0 stored. Without it, the series in ``stored`` are the population (a vanished series is not seen).
    """
    if edge_tolerance < 0:
        raise ValueError(f"edge tolerance must be >= 0, got {edge_tolerance}")
    expected = expected_samples(window_s, interval_s)
    keys = sorted(set(stored) | set(expected_series or ()))
    stored_total = shortfall_total = lost_total = worst = 0
    short: list[str] = []
    for key in keys:
        count = float(stored.get(key, 0.0))
        if count < 0 or not math.isfinite(count):
            raise ValueError(f"series {key!r}: a stored count must be a finite number >= 0, got {count!r}")
        n = int(round(count))
        shortfall = max(0, expected - n)
        lost = max(0, shortfall - edge_tolerance)
        stored_total += n
        shortfall_total += shortfall
        lost_total += lost
        worst = max(worst, lost)
        if lost:
            short.append(key)
    return SampleLoss(window_s=window_s, interval_s=interval_s, expected_per_series=expected, series=len(keys),
                      stored_total=stored_total, shortfall_total=shortfall_total, lost_total=lost_total,
                      worst_lost=worst, edge_tolerance=edge_tolerance, series_short=tuple(short))
