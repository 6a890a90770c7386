"""Issue 39, item 5: the tolerance of a compared query per function family, for a pair of different engines."""

from __future__ import annotations

import pytest

from promshift.core.catalog import CatalogError, parse_catalog
from promshift.core.parity import ENGINE_ROUNDING, engine_tolerance, golden_comparison
from promshift.core.promql import functions_used
from promshift.core.verdicts import Verdict

LABELS = (("Hostname", "gpu-node-0000"), ("gpu", "0"))


def test_functions_used_reads_calls_and_aggregations() -> None:
    assert functions_used("max by (Hostname) (deriv(x[5m]))") == {"max", "deriv"}
    assert functions_used("stddev_over_time(rate(x[1m])[10m:1m]) * 2") == {"stddev_over_time", "rate"}
    assert functions_used("x") == set()


def test_same_engines_keep_the_catalog_tolerance() -> None:
    assert engine_tolerance({"deriv"}, engines="same", rel_tol=1e-9) == (1e-9, None)
    assert engine_tolerance({"max", "rate"}, engines="different", rel_tol=1e-9) == (1e-9, None)


def test_different_engines_widen_by_the_widest_family_with_a_reason() -> None:
    rel, why = engine_tolerance({"max", "deriv", "sum"}, engines="different", rel_tol=1e-9)
    assert rel == ENGINE_ROUNDING["regression"][1] == 1e-6
    assert why is not None and why["family"] == "regression" and why["functions"] == ["deriv"]
    assert why["reason"].startswith("parity.engines: different: deriv (regression) round differently")
    # Never narrower than the catalog's own tolerance.
    assert engine_tolerance({"deriv"}, engines="different", rel_tol=1e-3) == (1e-3, None)


def _deriv_pair(relative: float) -> tuple[dict, dict]:  # type: ignore[type-arg]
    source = {LABELS: [(1000.0 + 30 * i, 0.0123456789 * (1 + i / 10)) for i in range(10)]}
    target = {LABELS: [(t, v * (1 + relative)) for t, v in source[LABELS]]}
    return source, target


def test_deriv_on_another_engine_passes_only_when_the_pair_says_so() -> None:
    """VictoriaMetrics' deriv differed by 1.9e-9 relative: FAILED against 1e-9 for one engine (a dual-write from
    one Prometheus must match to 1e-9), SUCCESSFUL once the pair is declared as different engines."""
    source, target = _deriv_pair(1.9e-9)
    expr = "deriv(DCGM_FI_DEV_GPU_TEMP[5m])"
    same = golden_comparison("golden[g]", expr, source, target, behind=(1, 1), abs_tol=0.0, rel_tol=1e-9)
    assert same.verdict == Verdict.FAILED
    rel, _ = engine_tolerance(functions_used(expr), engines="different", rel_tol=1e-9)
    assert golden_comparison("golden[g]", expr, source, target, behind=(1, 1), abs_tol=0.0, rel_tol=rel).verdict \
        == Verdict.SUCCESSFUL
    # A real difference stays far beyond the widened tolerance.
    source, drifted = _deriv_pair(1e-3)
    assert golden_comparison("golden[g]", expr, source, drifted, behind=(1, 1), abs_tol=0.0, rel_tol=rel).verdict \
        == Verdict.FAILED


CATALOG = """
version: 1
groups:
  - name: gpu-temp
    owners: [gpu-platform]
    approvers: [alice, bob]
    metrics: [DCGM_FI_DEV_GPU_TEMP]
    parity: {engines: %s}
    latency:
      windows: [{range: 1h, slo_p95: 2s}]
      queries: ["avg(DCGM_FI_DEV_GPU_TEMP)"]
"""


def test_the_catalog_declares_the_engines() -> None:
    assert parse_catalog(CATALOG % "different").get("gpu-temp").parity.engines == "different"
    assert parse_catalog(CATALOG % "same").get("gpu-temp").parity.engines == "same"
    with pytest.raises(CatalogError, match="engines"):
        parse_catalog(CATALOG % "victoria")
