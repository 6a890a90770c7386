"""The board's data, read from a real audit store: stages, verdicts, approvals, pending requests, diff, chain."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import load_catalog
from promshift.board import evidence, pages
from promshift.core.audit import new_event, verify_chain
from tests.board.history import write_history

START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RUNS = {"gpu-utilization": "manual__2026-12-01T09:00:00+00:00",
        "gpu-power-thermal": "manual__2026-12-01T10:00:00+00:00",
        "gpu-memory": "manual__2026-12-01T11:00:00+00:00"}


@pytest.fixture
def audit(tmp_path: Path) -> AuditStore:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    write_history(store, load_catalog(), START, RUNS)
    return store


def rows(audit: AuditStore) -> dict[str, dict]:
    chain = audit.verify()
    return {g.name: evidence.overview_row(g, audit.events(group=g.name), evidence.GroupState(
        audit.stage_of(g.name).value), chain, root="/base") for g in load_catalog().groups}


def test_overview_reads_stage_verdicts_approval_and_dependencies_from_the_log(audit: AuditStore) -> None:
    by_name = rows(audit)
    assert {n: r["stage"] for n, r in by_name.items()} == {
        "gpu-utilization": "cut_over", "gpu-memory": "verified", "gpu-power-thermal": "rolled_back",
        "gpu-clocks": "planned"}
    util = by_name["gpu-utilization"]
    assert util["parity"]["verdict"] == "SUCCESSFUL" and util["latency"]["verdict"] == "SUCCESSFUL"
    assert util["approval"]["by"] == "oncall-alice" and util["approval"]["decision"] == "Approve"
    assert util["approval"]["at"] > util["parity"]["at"]
    assert util["pending_approval"] is None
    thermal = by_name["gpu-power-thermal"]
    assert thermal["parity"]["verdict"] == "FAILED" and thermal["approval"] is None
    assert thermal["depends_on"] == ["gpu-utilization"] and thermal["wave"] == 2
    clocks = by_name["gpu-clocks"]
    assert clocks["parity"] is None and clocks["runs"] == 0 and clocks["last_event_at"] is None


def test_a_gate_without_an_answer_is_a_pending_approval_with_a_link_to_the_required_action(
        audit: AuditStore) -> None:
    pending = rows(audit)["gpu-memory"]["pending_approval"]
    assert pending["run_id"] == RUNS["gpu-memory"]
    assert pending["waiting_for"] == ["oncall-alice", "oncall-bob"]
    assert pending["gate"] == "SUCCESSFUL"
    # The run is in the group's target migration DAG (the shipped catalog's one target: every group's).
    assert load_catalog().get("gpu-memory").dag_id == "promshift__migrate__promshift_target"
    assert pending["link"] == ("/base/dags/promshift__migrate__promshift_target/runs/"
                               "manual__2026-12-01T11%3A00%3A00%2B00%3A00/tasks/approval/required_actions")


def test_group_detail_has_report_pieces_config_diff_runs_and_a_verified_timeline(audit: AuditStore) -> None:
    group = load_catalog().get("gpu-utilization")
    chain = audit.verify()
    data = evidence.group_detail(group, audit.events(group=group.name), evidence.GroupState("cut_over"), chain)
    report = data["report"]
    assert [m["name"] for m in report["parity"]["measurements"]] == [
        "coverage", "host_coverage", "aggregates", "labels", "samples"]
    assert [w["window"] for w in report["latency"]["windows"]] == [w.name for w in group.latency.windows]
    assert report["cost"]["total_usd"] > 0
    diff = data["config_diff"]
    assert diff["error"] is None
    assert "+- name: promshift-gpu-utilization" in diff["lines"]
    assert any(line.startswith("+  - action: keep") or "action: keep" in line for line in diff["lines"])
    assert data["chain"] == {"ok": True, "events": chain.events, "problems": []}
    assert [e["kind"] for e in data["timeline"]][:2] == ["run_complete", "cut_over"]  # newest first
    assert all(e["chain_ok"] for e in data["timeline"])
    assert [r["run_id"] for r in data["dag_runs"]] == [RUNS["gpu-utilization"]]
    assert data["dag_runs"][0]["final_stage"] == "cut_over"


def test_an_edited_event_is_marked_in_the_timeline() -> None:
    t = START
    first = new_event(prev=None, group="g", run_id="r", kind="validated", stage_from=None, stage_to=None,
                      actor="promshift", at=t, evidence={"source_series": 1}, key=None)
    second = new_event(prev=first, group="g", run_id="r", kind="snapshot_taken", stage_from=None, stage_to=None,
                       actor="promshift", at=t, evidence={"sha256": "x"}, key=None)
    edited = dataclasses.replace(first, evidence='{"source_series":1000}')
    chain = verify_chain([edited, second])
    marks = {e["seq"]: e["chain_ok"] for e in evidence.timeline([edited, second], problems=chain.problems)}
    assert chain.ok is False and marks == {1: False, 2: True}


def test_pages_render_the_tables_and_escape_what_people_typed(audit: AuditStore) -> None:
    group = load_catalog().get("gpu-utilization")
    chain = audit.verify()
    data = evidence.group_detail(group, audit.events(group=group.name), evidence.GroupState("cut_over"), chain)
    data["report"]["approval"]["comment"] = "<script>alert(1)</script>"
    html = pages.group_html(data, user="oncall-bob", base="/promshift")
    for anchor in ('id="parity-layers"', 'id="latency-windows"', 'id="latency-chart"', 'id="cost"',
                   'id="config-diff"', 'id="dag-runs"', 'id="timeline"', 'id="chain-status"'):
        assert anchor in html, anchor
    assert 'src="/promshift/groups/gpu-utilization/latency.png"' in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    overview = pages.overview_html({"user": "oncall-bob", "chain": {"ok": True, "events": chain.events},
                                    "groups": list(rows(audit).values()),
                                    "waves": [{"wave": 1, "groups": list(rows(audit).values())}]}, base="/promshift")
    assert 'id="pending-approvals"' in overview and "required_actions" in overview


def test_the_board_shows_which_cluster_and_workspace_each_group_is_on(tmp_path: Path) -> None:
    import yaml

    from promshift.core.catalog import parse_catalog
    from tests.board.history import Recorder

    doc = yaml.safe_load(default_catalog_text())
    doc["waves"] = {2: {"source": "cluster_b", "target": "amp_b"}}
    catalog = parse_catalog(yaml.safe_dump(doc, sort_keys=False))
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    thermal = catalog.get("gpu-power-thermal")
    Recorder(store, thermal, "r1", START).record("validated", {
        "stage": "planned", "selector": thermal.selector(), "source_series": 8, "source": "http://127.0.0.1:29090",
        "target": "http://aps/ws-b", "connections": {"source": "cluster_b", "target": "amp_b"},
        "target_backend": {"kind": "amp", "workspace_id": "ws-b", "region": "us-west-2"}})
    chain = store.verify()
    placed = {g.name: evidence.overview_row(g, store.events(group=g.name), evidence.GroupState("planned"), chain)
              for g in catalog.groups}
    assert placed["gpu-power-thermal"]["source"] == {"connection": "cluster_b", "url": "http://127.0.0.1:29090"}
    assert placed["gpu-power-thermal"]["target"] == {"connection": "amp_b", "workspace": "ws-b (us-west-2)"}
    # Not run yet: the catalog's pair, nothing recorded.
    assert placed["gpu-utilization"]["source"] == {"connection": "promshift_source", "url": None}
    assert placed["gpu-utilization"]["target"] == {"connection": "promshift_target", "workspace": None}
    rows_ = list(placed.values())
    html = pages.overview_html({"user": "u", "chain": {"ok": True, "events": chain.events, "problems": []},
                                "waves": [{"wave": w, "groups": [r for r in rows_ if r["wave"] == w]} for w in (1, 2)],
                                "groups": rows_}, base="/promshift")
    assert html.count('class="source-conn"') == 4 and ">cluster_b</span>" in html and ">amp_b</span>" in html
    assert "ws-b (us-west-2)" in html
    # A run recorded under another pair (the catalog moved the group since) shows no stale workspace.
    moved = dataclasses.replace(thermal, target="amp_c")
    row = evidence.overview_row(moved, store.events(group=thermal.name), evidence.GroupState("planned"), chain)
    assert row["target"] == {"connection": "amp_c", "workspace": None}


def default_catalog_text() -> str:
    from promshift.adapters.settings import default_catalog_path

    return default_catalog_path().read_text()
