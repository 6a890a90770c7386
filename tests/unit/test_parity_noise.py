"""independent_scraper: points may differ by the series' own scrape-to-scrape jitter, and no more."""

from __future__ import annotations

import math
import random

from promshift.core.parity import INDEPENDENT_NOISE_K, SampleComparison, successive_spread

LABELS = (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0"), ("instance", "gpu-node-0000"))


def noisy(seed: int, *, scale: float = 1.0, offset: float = 0.0, n: int = 120) -> list[tuple[float, float]]:
    """A utilisation read once per 5 s bucket: a slow swing plus +-6 points of per-read noise (as the fleet)."""
    rng = random.Random(seed)
    return [(1000.0 + 5 * i, scale * (70 + 10 * math.sin(i / 20) + 12 * (rng.random() - 0.5)) + offset)
            for i in range(n)]


def compare(source: list[tuple[float, float]], target: list[tuple[float, float]], noise_k: float) -> SampleComparison:
    c = SampleComparison(abs_tol=0.05, rel_tol=0.0, noise_k=noise_k)
    c.add({LABELS: source}, {LABELS: target})
    return c


def test_the_spread_is_the_standard_deviation_of_successive_differences() -> None:
    assert successive_spread([(0, 1.0), (1, 1.0)]) == 0.0  # one difference: no spread to speak of
    assert successive_spread([(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]) == 0.0  # a trend is not jitter
    assert math.isclose(successive_spread([(0, 0.0), (1, 2.0), (2, 0.0), (3, 2.0)]), math.sqrt(16 / 3))
    assert successive_spread([(0, math.nan), (1, 1.0), (2, 3.0), (3, 1.0)]) > 0  # NaN skipped


def test_two_independent_reads_of_the_same_noisy_gauge_pass_only_with_the_noise_allowance() -> None:
    source, target = noisy(1), noisy(2)  # same process, different reads
    assert compare(source, target, 0.0).mismatches > 30
    allowed = compare(source, target, INDEPENDENT_NOISE_K)
    assert allowed.mismatches == 0 and allowed.points_compared == 120


def test_a_change_of_scale_or_an_offset_beyond_the_jitter_still_fails() -> None:
    source = noisy(1)
    assert compare(source, noisy(2, scale=1.5), INDEPENDENT_NOISE_K).mismatches > 100
    assert compare(source, noisy(2, offset=40.0), INDEPENDENT_NOISE_K).mismatches == 120
    # Identical samples compare exactly, whatever the allowance.
    assert compare(source, source, INDEPENDENT_NOISE_K).mismatches == 0


def test_a_flat_series_gets_no_allowance() -> None:
    flat = [(1000.0 + 5 * i, 42.0) for i in range(20)]
    off = [(t, v + 1.0) for t, v in flat]
    assert compare(flat, off, INDEPENDENT_NOISE_K).mismatches == 20
