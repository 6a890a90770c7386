"""The lifecycle demo's history horizon: the lab's long reads are planted as written, and the board's waiting rows
are read back from the page the board renders."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.board import evidence, pages
from promshift.core.events import EventKind
from promshift.core.horizon import Horizon, panel_reach, rule_reach
from promshift.local.demo_lifecycle import (
    DAY_PANEL,
    HORIZON_ALERT,
    HORIZON_DASHBOARD,
    HORIZON_DASHBOARD_FILE,
    SHORT_PANELS,
    board_waiting_rows,
    panel_datasources,
    plant_horizon_reads,
)
from promshift.local.stack.parts.prometheus import SOURCE_RULES

T0 = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)


def test_the_long_reads_are_planted_once_as_written(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(SOURCE_RULES)
    reloads: list[int] = []
    plant_horizon_reads(tmp_path / "dashboards", rules, lambda: reloads.append(1))
    group = yaml.safe_load(rules.read_text())["groups"][0]
    alert = next(r for r in group["rules"] if r.get("alert") == HORIZON_ALERT)
    assert alert["expr"] == "delta(DCGM_FI_DEV_FB_USED[2h]) > 8192" and alert["for"] == "15m"
    assert rules.read_text().startswith(SOURCE_RULES)  # every byte before it kept
    assert rule_reach(alert["expr"], for_=alert["for"], name="x").reach_s == 2 * 3600 + 15 * 60
    board = json.loads((tmp_path / "dashboards" / HORIZON_DASHBOARD_FILE).read_text())
    assert board == HORIZON_DASHBOARD and board["time"]["from"] == "now-24h"
    reaches = {p["title"]: panel_reach(p, [t["expr"] for t in p["targets"]], dashboard_time=board["time"],
                                       name=p["title"], scrape_interval_s=30.0).reach_s for p in board["panels"]}
    assert reaches == {SHORT_PANELS[0]: 60.0, SHORT_PANELS[1]: 90.0, DAY_PANEL: 86400.0}
    assert panel_datasources(tmp_path / "dashboards") == {
        f"{HORIZON_DASHBOARD_FILE} / {t}": "prometheus" for t in (*SHORT_PANELS, DAY_PANEL)}
    (tmp_path / "dashboards" / "var.json").write_text(json.dumps({"panels": [{"title": "t", "datasource": "$ds"}]}))
    assert panel_datasources(tmp_path / "dashboards")["var.json / t"] == "$ds"  # a variable, as written
    plant_horizon_reads(tmp_path / "dashboards", rules, lambda: reloads.append(1))  # again: nothing changes
    assert reloads == [1] and rules.read_text().count(HORIZON_ALERT) == 1


def test_rules_whose_last_group_is_not_the_groups_are_refused_untouched(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(SOURCE_RULES + "  - name: fleet\n    rules: []\n")
    before = rules.read_bytes()
    with pytest.raises(RuntimeError, match="the last rule group is not 'gpu-memory'"):
        plant_horizon_reads(tmp_path / "dashboards", rules, lambda: None)
    assert rules.read_bytes() == before


def test_the_board_rows_are_read_from_the_rendered_page(tmp_path: Path) -> None:
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml").get("gpu-memory")
    day, rule = (T0 + timedelta(hours=24)).isoformat(), (T0 + timedelta(hours=2, minutes=15)).isoformat()
    horizon = Horizon(T0, T0 + timedelta(minutes=4)).to_dict()
    for what, waiting in (("read_path", [{"path": "panels[2]", "title": DAY_PANEL, "horizon": {
            "name": f"{HORIZON_DASHBOARD_FILE} / {DAY_PANEL}", "reach_s": 86400.0, "ready_at": day}}]),
                          ("rules", [{"kind": "rule", "name": f"alert {HORIZON_ALERT} (rules.yml: group "
                                      "'gpu-memory', rule 3)", "reach_s": 8100.0, "ready_at": rule}])):
        audit.append(group="gpu-memory", run_id="manual__m", kind=EventKind.HORIZON_WAITING, actor="promshift",
                     at=T0 + timedelta(minutes=4), evidence={"what": what, "horizon": horizon, "waiting": waiting})
    detail = evidence.group_detail(group, audit.events(group="gpu-memory"), evidence.GroupState("cut_over"),
                                   audit.verify())
    rows = board_waiting_rows(pages.group_html(detail, user="sre-carol", base="/promshift"))
    assert [(r["kind"], r["ready_at"].split()[0]) for r in rows] == [("rule", rule), ("panel", day)]
    assert HORIZON_ALERT in rows[0]["name"] and DAY_PANEL in rows[1]["name"]
    assert [r["reads_back"] for r in rows] == ["2.2 h", "24.0 h"]
    assert board_waiting_rows("<html><table id='dag-runs'><tr><td>x</td></tr></table></html>") == []
    audit.engine.dispose()


def test_the_demo_prints_what_waited_and_that_the_lab_clock_moved_it() -> None:
    from promshift.local.demo import lifecycle_lines

    report = {"lifecycle": {}, "horizon": {
        "lab_clock_ahead": "24h", "still_waiting": [], "switched": [{"what": "read_path"}, {"what": "rules"}],
        "at_cut_over": {"dual_write_age_at_cut_over_s": 201.5, "waiting": [
            {"kind": "panel", "name": DAY_PANEL, "ready_at": "2026-12-07T03:00:00+00:00"}]}}}
    (line,) = [x for x in lifecycle_lines(report) if x.startswith("Horizon:")]
    assert line == (f"Horizon: at cut-over (201.5s into dual-write) 1 waited: panel {DAY_PANEL} (ready "
                    "2026-12-07T03:00:00+00:00); the bake watch (LAB ONLY: clock 24h ahead) switched read_path, "
                    "rules; still waiting 0")
    assert not [x for x in lifecycle_lines({"lifecycle": {}}) if x.startswith("Horizon:")]
