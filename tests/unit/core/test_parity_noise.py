"""independent_scraper: points may differ by the series' own scrape-to-scrape jitter, and no more."""

from __future__ import annotations

import math
import random
import re

from promshift.core.parity import (
    INDEPENDENT_NOISE_K,
    SampleComparison,
    independent_aggregate_measurement,
    successive_spread,
)
from promshift.core.verdicts import Measurement, Verdict

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
    scaled = compare(source, noisy(2, scale=1.5), INDEPENDENT_NOISE_K)
    assert scaled.mismatches > 60 and scaled.measurement(["q"]).verdict == Verdict.FAILED
    assert compare(source, noisy(2, offset=40.0), INDEPENDENT_NOISE_K).mismatches == 120
    # Identical samples compare exactly, whatever the allowance.
    assert compare(source, source, INDEPENDENT_NOISE_K).mismatches == 0


def test_a_flat_series_gets_no_allowance() -> None:
    flat = [(1000.0 + 5 * i, 42.0) for i in range(20)]
    off = [(t, v + 1.0) for t, v in flat]
    assert compare(flat, off, INDEPENDENT_NOISE_K).mismatches == 20


# -- the bias model (issue 24, item 3): judged against the two scrapers' own noise, per metric and host ------



Side = dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]


def fleet_side(seed: int, *, hosts: int = 10, bias: dict[str, float] | None = None,
               host_bias: dict[str, float] | None = None) -> Side:
    """Per step bucket, each side's average of its own noisy reads of two gauges (8 GPUs per host)."""
    bias, host_bias = bias or {}, host_bias or {}
    out = {}
    for h in range(hosts):
        host = f"gpu-node-{h:04d}"
        for g in range(8):
            for metric, level in (("UTIL:avg5s", 70.0), ("POWER:avg5s", 450.0)):
                rng = random.Random(f"{seed}/{host}/{g}/{metric}")
                factor = 1 + bias.get(metric, 0.0) + (host_bias.get(host, 0.0) if metric == "UTIL:avg5s" else 0.0)
                points = [(1000.0 + 5 * i, factor * (level * (1 + 0.1 * math.sin(i / 15 + h)) +
                                                     0.06 * level * (rng.random() - 0.5))) for i in range(20)]
                out[(("Hostname", host), ("__name__", metric), ("gpu", str(g)))] = points
    return out


def judged(source: dict, target: dict) -> Measurement:  # type: ignore[type-arg]
    c = SampleComparison(abs_tol=1e-9, rel_tol=1e-9, noise_k=INDEPENDENT_NOISE_K, host_labels=("Hostname",))
    c.add(source, target)
    return c.measurement(["q"])


def test_healthy_independent_scrapes_pass_without_a_blanket_tolerance() -> None:
    for seed in range(20):
        m = judged(fleet_side(2 * seed), fleet_side(2 * seed + 1))
        assert m.verdict == Verdict.SUCCESSFUL, m.reason
    assert set(m.numbers["noise_model"]["per_metric"]) == {"UTIL:avg5s", "POWER:avg5s"}


def test_a_five_percent_bias_on_one_metric_fails_naming_it() -> None:
    m = judged(fleet_side(1), fleet_side(2, bias={"POWER:avg5s": 0.05}))
    assert m.verdict == Verdict.FAILED
    assert re.match(r"POWER:avg5s reads [45]\.\d% higher on the target", m.reason), m.reason
    assert "UTIL" not in m.reason


def test_a_bias_on_one_host_fails_naming_the_host() -> None:
    m = judged(fleet_side(1), fleet_side(2, host_bias={"gpu-node-0003": 0.05}))
    assert m.verdict == Verdict.FAILED
    assert "UTIL:avg5s on host gpu-node-0003 reads" in m.reason, m.reason


def test_shards_merge_the_bias_model() -> None:
    source, target = fleet_side(1), fleet_side(2, bias={"UTIL:avg5s": -0.05})
    keys = sorted(source)
    whole = SampleComparison(abs_tol=0, rel_tol=0, noise_k=INDEPENDENT_NOISE_K, host_labels=("Hostname",))
    for part in (keys[:50], keys[50:]):
        shard = SampleComparison(abs_tol=0, rel_tol=0, noise_k=INDEPENDENT_NOISE_K, host_labels=("Hostname",))
        shard.add({k: source[k] for k in part}, {k: target[k] for k in part})
        whole.merge(shard.to_dict())
    m = whole.measurement(["q"])
    assert m.verdict == Verdict.FAILED and re.match(r"UTIL:avg5s reads [45]\.\d% lower", m.reason), m.reason


def aggregates(seed: int, *, bias: float = 0.0, off_host: str = "", hosts: int = 20) -> Measurement:
    rng = random.Random(seed)
    src = {f"h{i}": 560.0 + 40 * math.sin(i) for i in range(hosts)}
    tgt = {h: v + rng.gauss(0, 0.5) for h, v in src.items()}
    tgt = {h: v * (1 + bias) * (1.05 if h == off_host else 1.0) for h, v in tgt.items()}
    model = {"avg_over_time UTIL": dict.fromkeys(src, 0.25)}
    return independent_aggregate_measurement([("avg_over_time UTIL", src, tgt)], model_var=model,
                                             abs_tol=1e-9, rel_tol=1e-9, queries=["q"])


def test_window_aggregates_of_independent_scrapers() -> None:
    assert all(aggregates(seed).verdict == Verdict.SUCCESSFUL for seed in range(20))
    biased = aggregates(1, bias=0.05)
    assert biased.verdict == Verdict.FAILED and re.match(r"avg_over_time UTIL reads [45]\.\d% higher", biased.reason)
    one = aggregates(1, off_host="h7")
    assert one.verdict == Verdict.FAILED and "1 host (h7)" in one.reason, one.reason
