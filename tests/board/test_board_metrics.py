"""promshift's own metrics at the board's ``/metrics``: what they say about a known history, and who may read them.

The history (tests/board/history.py): gpu-utilization cut over, gpu-power-thermal rolled back on a failed gate,
gpu-memory verified and waiting for an approval, gpu-clocks never started. The exposition is parsed with the
Prometheus client library's own parser, so a format error fails here, not in someone's Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from promshift.adapters.settings import load_catalog
from promshift.board.metrics import exposition
from promshift.core.audit import new_event
from promshift.core.events import EventKind
from promshift.core.promql import metric_names
from tests.board.auth_manager import SCOPED_USER
from tests.board.conftest import HISTORY_START

REPO = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: Any) -> float | None:
    return found.get((name, frozenset((k, str(v)) for k, v in labels.items())))


def test_the_metrics_tell_the_history(client_as) -> None:  # type: ignore[no-untyped-def]
    resp = client_as("viewer-victor", "viewer").get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    found = samples(resp.text)
    catalog = load_catalog()
    wave = {g.name: g.wave for g in catalog.groups}
    assert value(found, "promshift_group_stage", group="gpu-utilization", wave=wave["gpu-utilization"],
                 stage="cut_over") == 1
    assert value(found, "promshift_group_stage", group="gpu-clocks", wave=wave["gpu-clocks"], stage="planned") == 1
    stages = {(dict(labels)["stage"], dict(labels)["wave"]): v for (name, labels), v in found.items()
              if name == "promshift_groups"}
    assert sum(stages.values()) == 4 and stages[("rolled_back", str(wave["gpu-power-thermal"]))] >= 1
    assert value(found, "promshift_gate_verdicts_total", group="gpu-power-thermal", verdict="failed") == 1
    assert value(found, "promshift_gate_verdicts_total", group="gpu-utilization", verdict="passed") == 1
    assert value(found, "promshift_rollbacks_total", group="gpu-power-thermal", outcome="rolled_back") == 1
    assert value(found, "promshift_rollback_failed", group="gpu-power-thermal") == 0
    assert value(found, "promshift_gate_duration_seconds_count", group="gpu-memory") == 1
    assert value(found, "promshift_gate_duration_seconds_sum", group="gpu-memory") == 40  # history: gate 40 s on
    waiting = {dict(labels)["group"]: v for (name, labels), v in found.items()
               if name == "promshift_approval_waiting_since_timestamp_seconds"}
    assert list(waiting) == ["gpu-memory"] and waiting["gpu-memory"] > HISTORY_START.timestamp()
    assert value(found, "promshift_audit_events") > 10


def test_a_scoped_user_sees_only_its_groups_and_anonymous_nothing(client_as) -> None:  # type: ignore[no-untyped-def]
    text = client_as(SCOPED_USER, "viewer").get("/metrics").text
    assert 'group="gpu-memory"' not in text and 'group="gpu-utilization"' in text
    assert 'group="' not in client_as("nobody-nina", "").get("/metrics").text
    app = client_as("viewer-victor", "viewer").app
    app.dependency_overrides.pop(get_user)
    assert TestClient(app).get("/metrics").status_code == 401


TOKEN = "scrape-token-" + "0123456789abcdef" * 2


def test_a_scraper_reads_every_group_with_the_static_token_only(client_as, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No Airflow login and no daily JWT: the Secret's token opens /scrape/metrics, and nothing else."""
    app = client_as("viewer-victor", "viewer").app
    app.dependency_overrides.pop(get_user)
    anonymous = TestClient(app)
    assert anonymous.get("/scrape/metrics").status_code == 404  # no token configured: no route
    monkeypatch.setenv("PROMSHIFT_METRICS_TOKEN", TOKEN)
    found = anonymous.get("/scrape/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert found.status_code == 200
    assert 'group="gpu-memory"' in found.text and 'group="gpu-utilization"' in found.text
    for wrong in ("", "Bearer ", f"Bearer {TOKEN}x", f"Basic {TOKEN}", f"Bearer {TOKEN[:-1]}"):
        assert anonymous.get("/scrape/metrics", headers={"Authorization": wrong}).status_code == 401, wrong
    # the token is scoped to that route: the board and its API still want an Airflow login
    for path in ("/metrics", "/api/groups", "/"):
        refused = anonymous.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert refused.status_code in (401, 403) and 'group="' not in refused.text, path  # not a valid Airflow JWT
    monkeypatch.setenv("PROMSHIFT_METRICS_TOKEN", "short")
    with pytest.raises(ValueError, match="needs at least 32"):
        anonymous.get("/scrape/metrics", headers={"Authorization": "Bearer short"})


def test_a_failed_rollback_shows_until_a_later_rollback_succeeds() -> None:
    def ev(prev, kind, run, seconds):  # type: ignore[no-untyped-def]
        return new_event(prev=prev, group="g", run_id=run, kind=kind, stage_from=None, stage_to=None,
                         actor="promshift", at=HISTORY_START.replace(second=seconds), evidence={}, key=None)

    first = ev(None, EventKind.ROLLBACK_FAILED, "r1", 1)
    found = samples(exposition([("g", 1)], [first]))
    assert value(found, "promshift_rollback_failed", group="g") == 1
    second = ev(first, EventKind.ROLLED_BACK, "r1", 2)
    found = samples(exposition([("g", 1)], [first, second]))
    assert value(found, "promshift_rollback_failed", group="g") == 0
    assert value(found, "promshift_rollbacks_total", group="g", outcome="failed") == 1
    quoted = samples(exposition([('we"ird\\name', 1)], []))  # label values are escaped, not broken
    assert value(quoted, "promshift_group_stage", group='we"ird\\name', wave=1, stage="planned") == 1


def test_rules_and_dashboard_read_only_metrics_the_board_exports() -> None:
    exported = set()
    for line in exposition([("g", 1)], []).splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            exported |= {name + "_sum", name + "_count"} if kind == "summary" else {name}
    exported.add("promshift_audit_last_event_timestamp_seconds")  # only once there is an event
    rules = yaml.safe_load((REPO / "deploy" / "alerts" / "promshift-rules.yaml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((REPO / "deploy" / "grafana" / "promshift-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 12
    for expr in exprs:
        names = set(metric_names(expr))
        assert names and names <= exported, f"{expr}: {sorted(names - exported)}"
