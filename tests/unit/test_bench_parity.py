"""bench/parity's setup logic: the whole-fleet group, the text-size estimate and the disk passes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from promshift.stack.backfill import fleet_metrics
from promshift.stack.fleet import FleetSpec
from promshift.stack.local import EXTERNAL_LABELS, SCRAPE_JOB

RUN_PY = Path(__file__).resolve().parents[2] / "bench" / "parity" / "run.py"


@pytest.fixture(scope="module")
def bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_parity_run", RUN_PY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_whole_fleet_group_claims_every_rendered_counter(bench) -> None:  # type: ignore[no-untyped-def]
    group = bench.bench_group("whole-fleet")
    assert list(group.metrics) == list(fleet_metrics())
    assert len(group.metrics) == 25  # dcgm-exporter's 26 default counters but the label-only driver version
    assert group.metric_regex is None
    assert group.parity == bench.bench_group("gpu-power-thermal").parity


def test_estimate_is_close_to_the_text_written(bench, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fleet = FleetSpec(nodes=6)
    metrics = list(fleet_metrics())
    steps = list(range(1_796_223_570, 1_796_223_570 + 20 * 30, 30))
    plan = bench.plan_faults(fleet, metrics, seed="test")
    estimate = bench.estimate_text_bytes(fleet, metrics, steps, EXTERNAL_LABELS, SCRAPE_JOB)
    written = bench.write_openmetrics(fleet, metrics, steps, plan, EXTERNAL_LABELS, SCRAPE_JOB, tmp_path)
    for side, size in written["bytes"].items():
        assert size <= estimate[side] <= size * 1.10, (side, size, estimate[side])
    # Writing one side alone gives the same file as writing it with the others.
    alone = tmp_path / "alone"
    alone.mkdir()
    clean = bench.write_openmetrics(fleet, metrics, steps, plan, EXTERNAL_LABELS, SCRAPE_JOB, alone, ("clean",))
    assert list(clean["files"]) == ["clean"]
    assert clean["files"]["clean"].read_bytes() == written["files"]["clean"].read_bytes()
    assert clean["samples"]["clean"] == written["samples"]["clean"] == fleet.nodes * 8 * len(metrics) * len(steps)


def test_passes_fit_half_the_free_disk(bench) -> None:  # type: ignore[no-untyped-def]
    estimate = {"source": 17, "target": 20, "clean": 20}
    assert bench.plan_passes(estimate, 200) == [("source", "target", "clean")]
    assert bench.plan_passes(estimate, 80) == [("source", "target"), ("clean",)]
    assert bench.plan_passes(estimate, 40) == [("source",), ("target",), ("clean",)]
    with pytest.raises(RuntimeError, match="disk: one side's OpenMetrics text needs"):
        bench.plan_passes(estimate, 39)
