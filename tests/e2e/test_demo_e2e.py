"""End to end: the demo job on a small real stack, through Airflow standalone and its REST API.

Both scenarios join ``spine_session`` (tests/e2e/conftest.py): one stack with 24 h of gpu-memory's backfilled
history, the ``demo-history`` catalog profile, and one Airflow, for make test (marker ``spine``).

Happy path on gpu-memory (the production windows 1h/6h/12h/24h are timed over the history): approval by an
on-call engineer over REST, cutover. Drift on gpu-utilization, after it: the target loses hosts during
dual-write, parity fails, rollback restores the source config byte for byte (gpu-utilization has no history:
its latency windows are not what the drift is about).
"""

from __future__ import annotations

import re
import stat
import time
from typing import Any

import pytest
import requests

from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.catalog import migration_dag_id
from promshift.local.airflow_lab import TRIGGER_USER, LocalAirflow
from promshift.local.demo import HISTORY_PROFILE
from promshift.local.stack.local import LocalStack, StackConfig
from tests.e2e.conftest import SharedSession, proc_cmdline, proc_environ, proc_pids

__all__ = ["proc_cmdline", "proc_environ", "proc_pids"]  # tests/e2e/test_celery_demo_e2e.py imports them from here

# Make test's end-to-end run: one Airflow for both scenarios. The first test's time includes the session's start
# (backfill, stack, Airflow) as a single run_demo's did.
pytestmark = [pytest.mark.e2e, pytest.mark.spine, pytest.mark.timeout(1200)]


def test_happy_path_with_history_times_production_windows_and_cuts_over(spine_session: SharedSession) -> None:
    run = spine_session.run("happy", group="gpu-memory", scenario="happy")
    report, out = run.report, run.out
    # The demo leaves Airflow running with the stack: the board and the HITL record are there to open.
    left_running_airflow_serves_the_board_and_the_shown_evidence(spine_session, report)
    the_source_prometheus_scrapes_promshift_itself(spine_session, report)
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
    routing = RoutingStore(f"sqlite:///{spine_session.home / 'audit.db'}").load()
    assert routing["groups"]["gpu-memory"]["read_from"] == "target"
    assert not (spine_session.home / "routing.json").exists()
    # (That stopping the session leaves no Airflow running is checked when spine_session ends.)


def test_drift_fails_parity_and_rolls_back_byte_for_byte(spine_session: SharedSession) -> None:
    run = spine_session.run("drift", group="gpu-utilization", scenario="drift")
    report, config_text = run.report, run.source_config
    assert report["final_stage"] == "rolled_back"
    assert report["parity"]["verdict"] == "FAILED"
    host_cov = next(m for m in report["parity"]["measurements"] if m["name"] == "host_coverage")
    assert host_cov["verdict"] == "FAILED"
    assert host_cov["numbers"]["short_keys"] == ["gpu-node-0001", "gpu-node-0002"]
    assert report["rollback"]["performed"] is True and report["rollback"]["restored_identical"] is True
    assert "gpu-node-0001, gpu-node-0002" in report["rollback"]["reason"]
    assert report["approval"]["decision"] is None
    assert "promshift-gpu-utilization" not in config_text
    assert report["source_config"]["identical"] is True  # byte for byte: the session's other entries included
    assert report["audit"]["chain_ok"] is True


def left_running_airflow_serves_the_board_and_the_shown_evidence(shared: SharedSession,
                                                                 report: dict[str, Any]) -> None:
    """After ``make demo``, with the stack still up (issue 14's "done when"): reached as a user would, from the
    Airflow home's password file."""
    airflow = LocalAirflow(home=shared.home / "airflow", port=shared.session.airflow.port, extra_env={})
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
    dag_id = migration_dag_id(catalog.get("gpu-memory").target)  # the target's DAG, shared by its groups
    assert dag_id == "promshift__migrate__promshift_target"
    detail = airflow.api(TRIGGER_USER, "GET", f"/dags/{dag_id}/dagRuns/{report['run_id']}"
                                              "/taskInstances/approval/-1/hitlDetails")
    # gpu-memory's approvers are team:gpu-oncall (the Variable promshift_teams: oncall-alice, oncall-bob and
    # sre-carol): resolved when the question was asked, without sre-carol, who triggered the run.
    assert sorted(u["id"] for u in detail["assigned_users"]) == ["oncall-alice", "oncall-bob"], detail
    shown = re.search(r"Evidence sha256 `([0-9a-f]{64})`", detail["body"])
    assert shown, detail["body"][:500]
    assert report["approval"]["evidence_sha256"] == shown.group(1)
    # The shared cutover task emitted the group's own cut_over asset through its alias, from this run.
    events = airflow.asset_events("promshift://group/gpu-memory/cut_over")
    assert [(e["source_dag_id"], e["source_task_id"], e["source_run_id"]) for e in events] == [
        (dag_id, "cutover", report["run_id"])], events
    assert events[0]["extra"]["group"] == "gpu-memory", events[0]
    # The owners were told an approval was needed: the mail is in the stack's SMTP sink, with a link into the UI.
    mail = [m for m in LocalStack(StackConfig.from_env()).mail() if "approval needed" in m.subject]
    assert mail, [m.subject for m in LocalStack(StackConfig.from_env()).mail()]
    assert "gpu-memory" in mail[0].subject
    assert f"{base}/dags/{dag_id}/runs/" in mail[0].body()
    assert "/tasks/approval/required_actions" in mail[0].body()


def the_source_prometheus_scrapes_promshift_itself(shared: SharedSession, report: dict[str, Any]) -> None:
    """The local source Prometheus scrapes the board's /metrics on the session's Airflow (job ``promshift``), with
    the metrics user's token from a 0600 file; the report said so, and the source holds the series now."""
    block = report["self_metrics"]
    assert block["up"] == 1 and block["groups_series"] > 0, block
    assert block["target"] == f"127.0.0.1:{shared.session.airflow.port}"
    stack = shared.stack
    assert stat.S_IMODE(stack.promshift_token_path.stat().st_mode) == 0o600
    source = stack.source_url

    def query(promql: str) -> list[dict[str, Any]]:
        resp = requests.get(f"{source}/api/v1/query", params={"query": promql}, timeout=30)
        resp.raise_for_status()
        return resp.json()["data"]["result"]

    up = query('up{job="promshift"} == 1')
    assert len(up) == 1, up
    # The migrated group stands cut over in what the source scraped (a scrape every 5 s: at most a few to wait).
    deadline, cut_over = time.monotonic() + 60, []
    while time.monotonic() < deadline and not cut_over:
        cut_over = query('promshift_group_stage{job="promshift",group="gpu-memory",stage="cut_over"} == 1')
        time.sleep(0 if cut_over else 2)
    assert cut_over, query('promshift_group_stage{job="promshift",group="gpu-memory"}')
    groups = query('sum(promshift_groups{job="promshift"})')
    catalog = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile=HISTORY_PROFILE)
    assert groups and int(float(groups[0]["value"][1])) == len(catalog.groups), groups
