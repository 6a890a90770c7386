"""End to end: the demo job on a small real stack, through Airflow standalone and its REST API.

Happy path (with 24 h of backfilled history, so the production windows 1h/6h/12h/24h are
timed): approval by an on-call engineer over REST, cutover. Drift (the plain ``demo``
profile): the target loses hosts after warm-up, parity fails, rollback restores the source
config byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from promshift.demo import run_demo
from tests.e2e.conftest import free_port, stop_stack

pytestmark = pytest.mark.e2e


def test_happy_path_with_history_times_production_windows_and_cuts_over(small_stack_env: Path) -> None:
    try:
        out = run_demo(group_name="gpu-memory", scenario="happy", nodes=12, airflow_port=free_port(),
                       report_root=small_stack_env / "reports", history_s=24 * 3600.0)
    finally:
        stop_stack()
    report = json.loads((out / "report.json").read_text())
    assert report["final_stage"] == "cut_over", report["summary"]
    assert [s["stage"] for s in report["stages"]] == ["dual_writing", "warming", "verified", "approved", "cut_over"]
    assert report["parity"]["verdict"] == "SUCCESSFUL"
    assert report["parity"]["series_compared"] > 0 and report["parity"]["points_compared"] > 0
    assert report["parity"]["mismatches"] == 0
    assert report["latency"]["verdict"] == "SUCCESSFUL"
    # Every window reaches back before dual-write began; each was measured, because the target
    # holds the backfilled history (a window judged "not comparable" would be INCONCLUSIVE).
    windows = report["latency"]["windows"]
    assert [w["window"] for w in windows] == ["1h", "6h", "12h", "24h"]
    assert all(w["verdict"] == "SUCCESSFUL" and w["outcome"] == "within SLO" for w in windows), windows
    assert report["latency"]["probe"] == {"max_concurrency": 1, "accept_encoding": "identity",
                                          "retention_s": {"source": 2 * 86400.0, "target": 15 * 86400.0}}
    assert report["parity"]["shards"] == 2  # 4 sampled hosts, 2 per mapped task
    layers = {m["name"]: m["verdict"] for m in report["parity"]["measurements"]}
    assert layers == dict.fromkeys(["coverage", "host_coverage", "aggregates", "labels",
                                    "golden[GPU Framebuffer Mem Used]", "samples"], "SUCCESSFUL")
    assert all(w["target_p95_s"] > 0 for w in report["latency"]["windows"])
    assert report["approval"] == {"decision": "Approve", "by": "oncall-alice",
                                  "comment": "parity and latency evidence reviewed in the demo"}
    assert report["rollback"]["performed"] is False
    assert report["audit"]["chain_ok"] is True and report["audit"]["events"] >= 9
    assert (out / "latency.png").stat().st_size > 10_000
    assert "## Latency" in (out / "report.md").read_text()
    routing = json.loads((small_stack_env / "state" / "routing.json").read_text())
    assert routing["groups"]["gpu-memory"]["read_from"] == "target"


def test_drift_fails_parity_and_rolls_back_byte_for_byte(small_stack_env: Path) -> None:
    try:
        out = run_demo(group_name="gpu-memory", scenario="drift", nodes=12, airflow_port=free_port(),
                       report_root=small_stack_env / "reports")
        from promshift.stack.local import LocalStack, StackConfig

        config_text = LocalStack(StackConfig.from_env()).source_config_path.read_text()
    finally:
        stop_stack()
    report = json.loads((out / "report.json").read_text())
    assert report["final_stage"] == "rolled_back"
    assert report["parity"]["verdict"] == "FAILED"
    host_cov = next(m for m in report["parity"]["measurements"] if m["name"] == "host_coverage")
    assert host_cov["verdict"] == "FAILED"
    assert host_cov["numbers"]["short_keys"] == ["gpu-node-0001", "gpu-node-0002"]
    assert report["rollback"]["performed"] is True and report["rollback"]["restored_identical"] is True
    assert "gpu-node-0001, gpu-node-0002" in report["rollback"]["reason"]
    assert report["approval"]["decision"] is None
    assert "promshift-gpu-memory" not in config_text
    assert report["audit"]["chain_ok"] is True
