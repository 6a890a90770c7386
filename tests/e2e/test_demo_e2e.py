"""End to end: the demo job on a small real stack, through Airflow standalone and its REST API.

Happy path (with 24 h of backfilled history, so the production windows 1h/6h/12h/24h are
timed): approval by an on-call engineer over REST, cutover. Drift (the plain ``demo``
profile): the target loses hosts after warm-up, parity fails, rollback restores the source
config byte for byte.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import requests

from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.local.airflow_lab import TRIGGER_USER, LocalAirflow
from promshift.local.demo import HISTORY_PROFILE, run_demo
from promshift.local.stack.local import LocalStack, StackConfig
from tests.e2e.conftest import free_port, stop_stack

pytestmark = pytest.mark.e2e


@pytest.mark.spine  # make test's end-to-end run: one Airflow
def test_happy_path_with_history_times_production_windows_and_cuts_over(small_stack_env: Path) -> None:
    port = free_port()
    try:
        out = run_demo(group_name="gpu-memory", scenario="happy", nodes=12, airflow_port=port,
                       report_root=small_stack_env / "reports", history_s=24 * 3600.0)
        report = json.loads((out / "report.json").read_text())
        # The demo leaves Airflow running with the stack: the board and the HITL record are there to open.
        left_running_airflow_serves_the_board_and_the_shown_evidence(small_stack_env, port, report)
    finally:
        stop_stack()
    assert not any("airflow standalone" in " ".join(proc_cmdline(pid)) and small_stack_env.name in
                   proc_environ(pid) for pid in proc_pids()), "stack down left Airflow running"
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
                                  "comment": "parity and latency evidence reviewed in the demo",
                                  "evidence_sha256": report["approval"]["evidence_sha256"]}
    assert report["rollback"]["performed"] is False
    assert report["audit"]["chain_ok"] is True and report["audit"]["events"] >= 9
    assert (out / "latency.png").stat().st_size > 10_000
    assert "## Latency" in (out / "report.md").read_text()
    # The routing state is a table in the demo's audit database (no routing.json any more).
    routing = RoutingStore(f"sqlite:///{small_stack_env / 'state' / 'audit.db'}").load()
    assert routing["groups"]["gpu-memory"]["read_from"] == "target"
    assert not (small_stack_env / "state" / "routing.json").exists()


def test_drift_fails_parity_and_rolls_back_byte_for_byte(small_stack_env: Path) -> None:
    try:
        out = run_demo(group_name="gpu-memory", scenario="drift", nodes=12, airflow_port=free_port(),
                       report_root=small_stack_env / "reports")
        from promshift.local.stack.local import LocalStack, StackConfig

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


def proc_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def proc_cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def proc_environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def left_running_airflow_serves_the_board_and_the_shown_evidence(tmp: Path, port: int,
                                                                 report: dict[str, Any]) -> None:
    """After ``make demo``, with the stack still up (issue 14's "done when")."""
    airflow = LocalAirflow(home=tmp / "state" / "airflow", port=port, extra_env={})
    airflow.load_passwords()
    base = airflow.base_url
    # Without credentials: no data.
    anonymous = requests.get(f"{base}/promshift/api/groups", timeout=30)
    assert anonymous.status_code in (401, 403), anonymous.text[:200]
    # With the demo user's token: every catalog group with its stage, the migrated one cut over.
    auth = {"Authorization": f"Bearer {airflow.token(TRIGGER_USER)}"}
    groups = requests.get(f"{base}/promshift/api/groups", headers=auth, timeout=30)
    groups.raise_for_status()
    body = groups.json()
    rows = body["groups"] if isinstance(body, dict) else body
    stages = {row["name"]: row["stage"] for row in rows}
    catalog = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile=HISTORY_PROFILE)
    assert set(stages) == {g.name for g in catalog.groups}
    assert stages["gpu-memory"] == "cut_over"
    # The group's page shows the parity and latency tables and the chart.
    page = requests.get(f"{base}/promshift/groups/gpu-memory", headers=auth, timeout=60)
    page.raise_for_status()
    assert "Parity" in page.text and "Latency" in page.text and "latency.png" in page.text
    chart = requests.get(f"{base}/promshift/groups/gpu-memory/latency.png", headers=auth, timeout=120)
    assert chart.status_code == 200 and chart.content[:8] == b"\x89PNG\r\n\x1a\n"
    # The approval audit event carries the evidence hash the HITL body showed the approver.
    detail = airflow.api(TRIGGER_USER, "GET", f"/dags/promshift__gpu_memory/dagRuns/{report['run_id']}"
                                              "/taskInstances/approval/-1/hitlDetails")
    shown = re.search(r"Evidence sha256 `([0-9a-f]{64})`", detail["body"])
    assert shown, detail["body"][:500]
    assert report["approval"]["evidence_sha256"] == shown.group(1)
    # The owners were told an approval was needed: the mail is in the stack's SMTP sink, with a link into the UI.
    mail = [m for m in LocalStack(StackConfig.from_env()).mail() if "approval needed" in m.subject]
    assert mail, [m.subject for m in LocalStack(StackConfig.from_env()).mail()]
    assert "gpu-memory" in mail[0].subject
    assert f"{base}/dags/promshift__gpu_memory/runs/" in mail[0].body()
    assert "/tasks/approval/required_actions" in mail[0].body()
