"""End to end: ``make demo SCENARIO=plan-aggregate`` (issue 40's first "Done when").

The plan reads the local read load and recommends recording ``DCGM_FI_DEV_MEM_COPY_UTIL`` per node; the demo turns it
into the lab's catalog group and migrates it through Airflow: the recording rules on the source, only the recorded
series shipped, parity's golden layer comparing each original read on the source with its rewrite on the target,
approval, and at cut-over the fleet view's reads rewritten to the recorded series.

Session: an Airflow of its own. It cannot join a shared session: the group exists only once the plan has read the
session's own read load, and Airflow's trigger form lists the catalog's groups when it parses the DAG, so the
catalog must hold the group before Airflow starts. Marked ``slow`` (make e2e): 282 s measured on 2 shared
cores (6 nodes; the unit tier ran beside it), about 3 min of it the scenario itself (warm-up 2 min).
The ``demo`` profile, not ``demo-quick``: the golden layer compares the fleet view's panels at their 30 s step and
needs 3 points of dual-write (measured: with ``demo-quick``'s 1-minute warm-up both panels were INCONCLUSIVE,
"too little dual-write for this query", and the run went to approval without ``verified``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from promshift.local.demo import main
from promshift.local.demo_plan_aggregate import FLEET_DASHBOARD, FLEET_PANELS
from promshift.local.stack.local import find_free_ports
from tests.e2e.conftest import stop_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

NODES = 6
GPUS_PER_NODE = 8
RECORDED = ("Hostname:DCGM_FI_DEV_MEM_COPY_UTIL:sum", "Hostname:DCGM_FI_DEV_MEM_COPY_UTIL:count")


def test_the_plans_aggregation_migrates_and_cuts_over_with_rewritten_reads(
        small_stack_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["--scenario", "plan-aggregate", "--nodes", str(NODES), "--airflow-port",
                     str(find_free_ports(1)[0]), "--report-root", str(small_stack_env / "reports")])
    finally:
        printed = capsys.readouterr().out
        stop_stack()
    assert code == 0, printed[-3000:]
    out = Path(printed.strip().splitlines()[-1])  # the demo's last line is its report directory
    report = json.loads((out / "report.json").read_text())
    assert report["final_stage"] == "cut_over", report["summary"]
    assert [s["stage"] for s in report["stages"]] == ["dual_writing", "warming", "verified", "approved", "cut_over"]
    parity = report["parity"]
    assert parity["verdict"] == "SUCCESSFUL", parity
    # The golden layer compared each fleet-view panel: its original read on the source, its rewrite on the target.
    golden = {m["name"]: m for m in parity["measurements"] if m["name"].startswith("golden[")}
    for title, original in FLEET_PANELS:
        found = golden[f"golden[{title}]"]
        assert found["verdict"] == "SUCCESSFUL", found
        source_read, target_read = found["queries"]
        assert source_read == original and all(r in target_read for r in RECORDED), found
        assert found["numbers"]["points_compared"] > 0, found
    # The target holds the recorded series only: one per node of each recording, 8x fewer than the per-GPU ones.
    agg = report["aggregation"]
    assert agg["target_holds_recorded_only"] is True, agg
    (metric,) = agg["metrics"]
    assert metric["target_raw_series"] == 0
    assert metric["target_recorded_series"] == dict.fromkeys(RECORDED, NODES)
    assert metric["source_raw_series"] == NODES * GPUS_PER_NODE and metric["ratio"] == GPUS_PER_NODE
    # The fleet view was rewritten at cut-over: on the target's datasource, reading the recordings.
    view = {p["title"]: p for p in agg["fleet_view_after"]}
    for title, original in FLEET_PANELS:
        (expr,) = view[title]["exprs"]
        assert expr != original and all(r in expr for r in RECORDED), view[title]
        assert view[title]["datasource"]["uid"] == "amp-local"
    assert report["read_path"]["switched"] is True and report["read_path"]["panels"] == 2, report["read_path"]
    assert "error" not in report["latency"]["cost"], report["latency"]["cost"]  # prices beside the lab catalog
    # plan.md beside the report shows the saving.
    plan_md = (out / "plan.md").read_text()
    assert "## Aggregate before shipping" in plan_md and RECORDED[0] in plan_md
    assert agg["saved_usd_per_month"] > 0
    assert report["source_config"]["identical"] is False  # dual-write stays after cut-over
    # The lab's catalog, beside the plan, holds the group; the fleet view is among its golden dashboards.
    catalog = Path(agg["catalog"]).read_text()
    assert f"dashboards/{FLEET_DASHBOARD}" in catalog and "aggregations:" in catalog
