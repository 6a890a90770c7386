from __future__ import annotations

import math

import pytest

from promshift.core.parity import (
    SampleComparison,
    align_window,
    comparison_window,
    coverage_measurement,
    normalize_labels,
    sample_hosts,
    values_equal,
)
from promshift.core.verdicts import Verdict


def test_align_window_rounds_inwards_to_the_step() -> None:
    assert align_window(101.0, 299.0, 30) == (120.0, 270.0)
    assert align_window(120.0, 270.0, 30) == (120.0, 270.0)
    with pytest.raises(ValueError):
        align_window(0, 10, 0)


def test_comparison_window_skips_recent_and_needs_room() -> None:
    assert comparison_window(dual_write_since=1000, now=1400, skip_recent_s=120, step=30) == (1020, 1260)
    assert comparison_window(dual_write_since=1000, now=1100, skip_recent_s=120, step=30) is None
    assert comparison_window(dual_write_since=1000, now=1400, skip_recent_s=120, step=30, settle_s=60) == (
        1080, 1260)


def test_sample_is_deterministic_and_seed_dependent() -> None:
    hosts = [f"gpu-node-{i:04d}" for i in range(200)]
    a = sample_hosts(hosts, 5, "g:1")
    assert a == sample_hosts(reversed(hosts), 5, "g:1")
    assert len(a) == 5 and set(a) <= set(hosts)
    assert a != sample_hosts(hosts, 5, "g:2")
    assert sample_hosts(hosts[:3], 5, "x") == sorted(hosts[:3])


def test_normalize_drops_external_labels_and_renames() -> None:
    labels = {"__name__": "m", "cluster": "c", "prometheus_replica": "r", "hostname": "h1", "gpu": "0"}
    out = normalize_labels(labels, ignore=("cluster", "prometheus_replica"), rename={"hostname": "Hostname"})
    assert out == (("Hostname", "h1"), ("__name__", "m"), ("gpu", "0"))


@pytest.mark.parametrize("a,b,equal", [
    (1.0, 1.0, True), (1.0, 1.0 + 1e-12, True), (1.0, 1.01, False), (math.nan, math.nan, True),
    (math.nan, 1.0, False), (math.inf, math.inf, True), (math.inf, 1e308, False),
])
def test_values_equal(a: float, b: float, equal: bool) -> None:
    assert values_equal(a, b, abs_tol=1e-9, rel_tol=1e-9) is equal


def L(host: str, gpu: str = "0") -> tuple:
    return (("Hostname", host), ("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", gpu))


def test_identical_data_passes() -> None:
    pts = [(float(t), float(t % 7)) for t in range(0, 300, 15)]
    c = SampleComparison(abs_tol=1e-9, rel_tol=1e-9)
    c.add({L("a"): pts, L("a", "1"): pts}, {L("a"): list(pts), L("a", "1"): list(pts)})
    m = c.measurement(["q"])
    assert m.verdict == Verdict.SUCCESSFUL
    assert (c.series_compared, c.points_compared, c.mismatches) == (2, 40, 0)


def test_missing_series_value_drift_and_renamed_label_fail_with_offenders() -> None:
    pts = [(float(t), 50.0) for t in range(0, 150, 15)]
    off = [(t, v * 1.01) for t, v in pts]
    renamed = (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0"), ("hostname", "c"))
    c = SampleComparison(abs_tol=1e-9, rel_tol=1e-9)
    c.add({L("a"): pts, L("b"): pts, L("c"): pts}, {L("b"): off, renamed: pts})
    m = c.measurement(["q"])
    assert m.verdict == Verdict.FAILED
    assert c.missing_series == 2 and c.extra_series == 1 and c.mismatches == len(pts)
    problems = {o["problem"] for o in m.numbers["worst"]}
    assert problems == {"missing on target", "values differ", "only on target"}
    assert any('hostname="c"' in o["series"] for o in m.numbers["worst"])


def test_no_points_is_inconclusive_never_a_pass() -> None:
    c = SampleComparison(abs_tol=0, rel_tol=0)
    c.add({}, {})
    assert c.measurement([]).verdict == Verdict.INCONCLUSIVE


def test_coverage_flags_missing_series_and_empty_source() -> None:
    ok = coverage_measurement([(1.0, {"m": 1600.0}, {"m": 1600.0})], max_missing_ratio=0.0, queries=["q"])
    assert ok.verdict == Verdict.SUCCESSFUL
    bad = coverage_measurement([(1.0, {"m": 1600.0}, {"m": 1584.0})], max_missing_ratio=0.0, queries=["q"])
    assert bad.verdict == Verdict.FAILED and "1.00%" in bad.reason and "(m)" in bad.reason
    tolerated = coverage_measurement([(1.0, {"m": 1600.0}, {"m": 1584.0})], max_missing_ratio=0.02, queries=[])
    assert tolerated.verdict == Verdict.SUCCESSFUL
    empty = coverage_measurement([(1.0, {}, {})], max_missing_ratio=0.0, queries=[])
    assert empty.verdict == Verdict.INCONCLUSIVE


def test_host_coverage_names_the_missing_hosts() -> None:
    src = {f"h{i}": 32.0 for i in range(10)}
    tgt = dict(src, h3=0.0)
    del tgt["h7"]
    m = coverage_measurement([(1.0, src, src), (2.0, src, tgt)], max_missing_ratio=0.0, queries=["q"],
                             name="host_coverage", key="host")
    assert m.verdict == Verdict.FAILED
    assert "2 hosts (h3, h7)" in m.reason
    assert m.numbers["short_keys"] == ["h3", "h7"]


def test_aggregates_find_a_drifted_host_and_tolerate_float_noise() -> None:
    from promshift.core.parity import aggregate_measurement

    src = {f"h{i}": 1000.0 + i for i in range(50)}
    noisy = {k: v * (1 + 1e-13) for k, v in src.items()}
    assert aggregate_measurement([("sum m", src, noisy)], abs_tol=1e-9, rel_tol=1e-9, queries=[]).verdict \
        == Verdict.SUCCESSFUL
    drifted = dict(src, h7=src["h7"] * 1.01)
    m = aggregate_measurement([("sum m", src, drifted)], abs_tol=1e-9, rel_tol=1e-9, queries=["q"])
    assert m.verdict == Verdict.FAILED and m.numbers["differing_keys"] == ["h7"]
    assert m.numbers["worst"][0]["relative_delta"] > 0.009
    assert aggregate_measurement([("sum m", src, {})], abs_tol=0, rel_tol=0, queries=[]).verdict \
        == Verdict.INCONCLUSIVE


def test_aggregates_name_the_drifted_host_before_hosts_with_missing_series() -> None:
    from promshift.core.parity import aggregate_measurement

    src = {f"h{i:02d}": 100.0 for i in range(80)}
    tgt = {k: (v * 0.9 if k < "h65" else v) for k, v in src.items()}  # h00..h64 lost series
    tgt["h70"] = 101.0  # drifted, fully covered
    m = aggregate_measurement([("sum m", src, tgt)], abs_tol=0, rel_tol=1e-9, queries=[],
                              explained=[f"h{i:02d}" for i in range(65)])
    assert m.reason.startswith("window aggregates differ for 1 host (h70) with full coverage")
    assert "65 more hosts differ where series are missing" in m.reason
    assert m.numbers["unexplained_keys"] == ["h70"]


def test_aggregates_when_every_difference_is_explained_by_missing_series() -> None:
    from promshift.core.parity import aggregate_measurement

    src = {"h1": 10.0, "h2": 10.0, "h3": 10.0}
    m = aggregate_measurement([("sum m", src, {"h1": 5.0, "h2": 5.0, "h3": 10.0})], abs_tol=0, rel_tol=1e-9,
                              queries=[], explained=["h1", "h2"])
    assert m.reason == "2 hosts (h1, h2) differ, all where series are missing (see host_coverage)"
