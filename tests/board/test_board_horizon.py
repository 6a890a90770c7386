"""The board lists each panel and rule waiting for the target's history, with its ready time, until it moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import load_catalog
from promshift.board import evidence, pages
from promshift.core.events import EventKind

T0 = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)
GROUP = "gpu-memory"
DAY = (T0 + timedelta(hours=24)).isoformat()
RULE = (T0 + timedelta(hours=2, minutes=1)).isoformat()


def record(audit: AuditStore, kind: EventKind, evidence_: dict, at: datetime) -> None:
    audit.append(group=GROUP, run_id="manual__m", kind=kind, actor="promshift", at=at, evidence=evidence_)


def detail(audit: AuditStore) -> dict:
    group = load_catalog().get(GROUP)
    return evidence.group_detail(group, audit.events(group=GROUP), evidence.GroupState("cut_over"), audit.verify())


def test_waiting_panels_and_rules_are_listed_with_their_ready_times_until_they_move(tmp_path: Path) -> None:
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    assert detail(audit)["horizon_waiting"] == []
    cut = T0 + timedelta(minutes=10)
    record(audit, EventKind.HORIZON_WAITING, {"what": "read_path", "waiting": [
        {"path": "panels[2]", "title": "FB used, last day",
         "horizon": {"name": "fb.json / FB used, last day", "reach_s": 86400.0, "ready_at": DAY}}]}, cut)
    record(audit, EventKind.HORIZON_WAITING, {"what": "rules", "waiting": [
        {"kind": "rule", "name": "alert GpuMemoryGrowing (rules.yml: group 'gpu-memory', rule 2)",
         "reach_s": 7260.0, "ready_at": RULE}]}, cut)
    waiting = detail(audit)["horizon_waiting"]
    assert [(w["kind"], w["ready_at"]) for w in waiting] == [("rule", RULE), ("panel", DAY)]
    html = pages.group_html(detail(audit), user="oncall-bob", base="/promshift")
    assert 'id="horizon-waiting"' in html and "FB used, last day" in html and "GpuMemoryGrowing" in html
    assert DAY in html and RULE in html
    # The rules move when their horizon passes: only the panel is left; then it switches too.
    record(audit, EventKind.RULES_MOVED, {"moved": True}, T0 + timedelta(hours=2, minutes=2))
    assert [w["kind"] for w in detail(audit)["horizon_waiting"]] == ["panel"]
    record(audit, EventKind.HORIZON_SWITCHED, {"what": "read_path", "switched": [{"path": "panels[2]"}]},
           T0 + timedelta(hours=24, minutes=6))
    assert detail(audit)["horizon_waiting"] == []
    assert 'id="horizon-waiting"' not in pages.group_html(detail(audit), user="oncall-bob", base="/promshift")
    audit.engine.dispose()
