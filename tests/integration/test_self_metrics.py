"""promshift's own metrics in a real Prometheus, and its example alert rules in promtool's rule engine.

- The board app (as Airflow's API server mounts it) is served by uvicorn on 127.0.0.1; Debian's Prometheus scrapes
  its ``/metrics`` with a bearer token and loads ``deploy/alerts/promshift-rules.yaml``. What Airflow's auth
  would check is a fixed token here (the real API server checks its JWT); a scrape without it gets 401 (``up`` 0).
  The approval the history leaves waiting (a day old) puts ``PromshiftApprovalWaiting`` in ``pending`` at once.
- ``promtool test rules``: with the exposition's own series as input, the approval alert fires after 4 h and
  10 min of waiting and not at 3 h; a failed rollback fires at once; a warm-up over 6 h fires.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
import uvicorn
import yaml
from airflow.api_fastapi import app as airflow_app
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from airflow.models.dag import DagModel
from fastapi import HTTPException, Request

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import default_catalog_path, load_catalog
from promshift.board.app import BoardSource, create_app
from promshift.local.stack.prometheus import PROMTOOL_BIN, PrometheusProcess
from tests.board.auth_manager import GroupScopedAuthManager
from tests.board.history import write_history
from tests.integration.conftest import eventually

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "alerts" / "promshift-rules.yaml"
TOKEN = "scrape-token-for-this-test-only"


@pytest.fixture
def board_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free_ports) -> Iterator[str]:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    write_history(AuditStore(url), load_catalog(), datetime.now(UTC) - timedelta(days=1),
                  {"gpu-utilization": "r1", "gpu-power-thermal": "r2", "gpu-memory": "r3"})
    monkeypatch.setattr(airflow_app._AuthManagerState, "instance", GroupScopedAuthManager())
    monkeypatch.setattr(DagModel, "get_team_name", staticmethod(lambda dag_id, **_: None))
    app = create_app(BoardSource(catalog_path=default_catalog_path(), audit_url=url, profile=None,
                                 run_states=lambda dag_id, run_ids: {}))

    def token_user(request: Request) -> SimpleAuthManagerUser:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            raise HTTPException(401, "Not authenticated")
        return SimpleAuthManagerUser(username="prometheus-scraper", role="viewer")

    app.dependency_overrides[get_user] = token_user
    port = free_ports(1)[0]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    eventually(lambda: server.started, timeout=30, message="the board app did not start")
    yield f"127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def query(prom: PrometheusProcess, expr: str) -> list[dict]:  # type: ignore[type-arg]
    answer = requests.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=5).json()
    return answer["data"]["result"]


def test_a_real_prometheus_scrapes_the_board_and_evaluates_the_rules(tmp_path: Path, board_url: str,
                                                                      free_ports) -> None:  # type: ignore[no-untyped-def]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "promshift", "metrics_path": "/metrics", "authorization": {"credentials": TOKEN},
             "static_configs": [{"targets": [board_url]}]},
            {"job_name": "promshift-no-token", "metrics_path": "/metrics",
             "static_configs": [{"targets": [board_url]}]},
        ],
    }
    prom = PrometheusProcess("self", tmp_path, port=free_ports(1)[0], config=yaml.safe_dump(config)).wait_ready()
    try:
        eventually(lambda: query(prom, 'promshift_group_stage{group="gpu-memory"}'), timeout=30,
                   message="Prometheus never scraped the board")
        (row,) = query(prom, 'promshift_group_stage{group="gpu-memory"}')
        assert row["metric"]["stage"] == "verified"
        assert [r["value"][1] for r in query(prom, 'up{job="promshift"}')] == ["1"]
        # The other job's first scrape may come a moment later (each target's offset within the interval).
        refused = eventually(lambda: query(prom, 'up{job="promshift-no-token"}'), timeout=30,
                             message="the job without a token was never scraped")
        assert [r["value"][1] for r in refused] == ["0"]
        assert query(prom, "sum(promshift_groups)")[0]["value"][1] == "4"

        def pending() -> list[dict]:  # type: ignore[type-arg]
            alerts = requests.get(f"{prom.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "PromshiftApprovalWaiting"]

        (alert,) = eventually(pending, timeout=30, message="the approval alert never became pending")
        assert alert["state"] == "pending" and alert["labels"]["group"] == "gpu-memory"
        assert "PromshiftRollbackFailed" not in str(requests.get(f"{prom.url}/api/v1/alerts", timeout=5).json())
    finally:
        prom.stop()


def _promtool_test(tmp_path: Path, series: list[dict[str, str]], cases: list[dict]) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}]}
    path = tmp_path / "rules_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run([PROMTOOL_BIN, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_promtool_fires_the_alerts_when_they_should(tmp_path: Path) -> None:
    check = subprocess.run([PROMTOOL_BIN, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    series = [
        # asked at t=0 (the value is the time it was asked), for 10 h
        {"series": 'promshift_approval_waiting_since_timestamp_seconds{group="gpu-memory",run_id="r3"}',
         "values": "0x600"},
        {"series": 'promshift_group_stage_entered_timestamp_seconds{group="gpu-clocks",stage="warming"}',
         "values": "0x600"},
        {"series": 'promshift_rollback_failed{group="gpu-power-thermal"}', "values": "0 0 1x600"},
        {"series": "promshift_audit_events", "values": "10x600"},
    ]
    approval = {"alertname": "PromshiftApprovalWaiting", "exp_alerts": [
        {"exp_labels": {"severity": "warning", "group": "gpu-memory", "run_id": "r3"},
         "exp_annotations": {
             "summary": "gpu-memory: an approval has waited over 4 h (run r3)",
             "description": "The gate asked the on-call approvers and nobody answered; the run times out "
                            "and rolls back."}}]}
    warmup = {"alertname": "PromshiftStuckInWarmup", "exp_alerts": [
        {"exp_labels": {"severity": "warning", "group": "gpu-clocks", "stage": "warming"},
         "exp_annotations": {
             "summary": "gpu-clocks has been warming up for over 6 h",
             "description": "The target has not caught up with the source; check the remote-write queue "
                            "and the target."}}]}
    cases = [
        {"eval_time": "3h", "alertname": "PromshiftApprovalWaiting", "exp_alerts": []},
        {"eval_time": "4h5m", "alertname": "PromshiftApprovalWaiting", "exp_alerts": []},  # waiting, but not 10 min
        {"eval_time": "4h11m", **approval},
        {"eval_time": "5h", "alertname": "PromshiftStuckInWarmup", "exp_alerts": []},
        {"eval_time": "6h16m", **warmup},
        {"eval_time": "1m", "alertname": "PromshiftRollbackFailed", "exp_alerts": []},
        {"eval_time": "3m", "alertname": "PromshiftRollbackFailed", "exp_alerts": [
            {"exp_labels": {"severity": "critical", "group": "gpu-power-thermal"},
             "exp_annotations": {
                 "summary": "gpu-power-thermal: a rollback failed; the group stays held until someone restores it",
                 "description": "Nobody has verified the source's config since; see the group's board page and its "
                                "audit events."}}]},
        {"eval_time": "1h", "alertname": "PromshiftMetricsAbsent", "exp_alerts": []},
    ]
    done = _promtool_test(tmp_path, series, cases)
    assert done.returncode == 0, done.stdout + done.stderr
    # The test can fail: expecting the approval alert at 3 h is refused by promtool.
    wrong = _promtool_test(tmp_path, series, [{"eval_time": "3h", **approval}])
    assert wrong.returncode != 0 and "PromshiftApprovalWaiting" in wrong.stdout + wrong.stderr
