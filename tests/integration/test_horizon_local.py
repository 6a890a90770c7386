"""The history horizon on the lab stack: at cut-over the short panels switch, the 24 h panel and a rule reading
``[2h]`` wait (named, with their ready time), and each goes when the horizon passes.

A 2-node stack (Debian's Prometheus 2.42 on both sides) whose source evaluates gpu-memory's rules, one of them
``increase(DCGM_FI_DEV_FB_USED[2h])``; a provisioned dashboard that opens on the last 24 hours, two of its
panels on their own last 5 minutes. The rules move for real (the target's rule file and reload), the
dashboard is a real file. Only the clock is shortened: ``now`` is handed to the steps (the core never reads
the clock), so 24 hours pass in a test; the rule and the dashboard are as written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.blobs import LocalBlobs
from promshift.adapters.dashboard_files import DashboardFilesSwitch
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.rules_deploy import PrometheusRulesTarget, RulesMove, SourceRules, loaded_rules
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.events import EventKind
from promshift.core.horizon import Horizon, dual_write_since
from promshift.core.read_path import DatasourceRef
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.orchestration.compose import compose_migration
from promshift.steps.migration import Backends
from promshift.steps.moves import ReadPathStep, RulesStep

# slow: run by make e2e (.ci/run), which keeps make test inside its 15-minute budget
pytestmark = [pytest.mark.integration, pytest.mark.slow]

GROUP = "gpu-memory"
RULES = """\
groups:
  - name: gpu-memory
    rules:
      - record: gpu:fb_used:ratio
        expr: DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)
      - alert: GpuMemoryGrowing
        expr: increase(DCGM_FI_DEV_FB_USED[2h]) > 1e6
        for: 1m
"""


def panel(pid: int, title: str, expr: str, **extra: object) -> dict[str, object]:
    return {"id": pid, "title": title, "type": "timeseries", "datasource": {"type": "prometheus", "uid": "prometheus"},
            "targets": [{"refId": "A", "expr": expr}], **extra}


DASHBOARD = {"uid": "fb", "title": "Framebuffer", "time": {"from": "now-24h", "to": "now"}, "panels": [
    panel(1, "FB used now", "DCGM_FI_DEV_FB_USED", timeFrom="5m"),
    panel(2, "FB free now", "avg(DCGM_FI_DEV_FB_FREE)", timeFrom="5m"),
    panel(3, "FB used, last day", "max by (Hostname) (DCGM_FI_DEV_FB_USED)"),
]}


@pytest.fixture(scope="module")
def stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    stack = LocalStack(stack_config_factory(nodes=2, scrape_interval="1s"))
    stack.source_rules_path.parent.mkdir(parents=True, exist_ok=True)
    stack.source_rules_path.write_text(RULES)  # written before up: the stack keeps a rule file it finds
    try:
        stack.up(timeout=90)
        yield stack
    finally:
        stack.down()


def test_short_panels_switch_the_day_panel_and_the_2h_rule_wait_then_go(stack: LocalStack, tmp_path: Path) -> None:
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    source, target = PrometheusClient(stack.source_url), PrometheusClient(stack.target_url)
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP)
    backends = Backends(source=source, target=target, source_config_path=str(stack.source_config_path),
                        target_remote_write_url=stack.target_remote_write_url)
    m = compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url), snapshots_dir=tmp_path,
                       run_id="manual__horizon")
    boards = tmp_path / "dashboards"
    boards.mkdir()
    board = boards / "fb.json"
    original = json.dumps(DASHBOARD, indent=2).encode()
    board.write_bytes(original)
    blobs = LocalBlobs(tmp_path / "blobs")
    read_path = ReadPathStep(m, DashboardFilesSwitch([str(board)], group, source=DatasourceRef("prometheus"),
                                                     target=DatasourceRef("amp-local"), blobs=blobs))
    move = RulesMove.for_group(SourceRules(stack.source_config_path, source),
                               PrometheusRulesTarget(stack.target_config_path, target, group_name=GROUP), group)
    rules = RulesStep(m, move, blobs)

    started = datetime.now(UTC)
    m.record(EventKind.DUAL_WRITE_DEPLOYED, started, {"remote_write": f"promshift-{GROUP}"})
    since = dual_write_since(audit.events(group=GROUP))
    assert since == started
    read_path.snapshot(started)
    rules.snapshot(started)
    rules.add_records(started)

    # Cut-over 10 minutes into dual-write: the short panels switch; the day panel and the rules wait.
    cut = since + timedelta(minutes=10)
    read_path.switch(cut, Horizon(since, cut))
    handoff = rules.handoff(cut, Horizon(since, cut))
    assert handoff["moved"] is False
    switched = json.loads(board.read_bytes())["panels"]
    assert [p["datasource"]["uid"] for p in switched] == ["amp-local", "amp-local", "prometheus"]
    waits = [e for e in audit.events(group=GROUP) if e.kind == EventKind.HORIZON_WAITING]
    assert [e.evidence_data["what"] for e in waits] == ["read_path", "rules"]
    (day,) = waits[0].evidence_data["waiting"]
    assert day["title"] == "FB used, last day"
    assert day["horizon"]["ready_at"] == (since + timedelta(hours=24)).isoformat()
    alert = next(w for w in waits[1].evidence_data["waiting"] if "GpuMemoryGrowing" in w["name"])
    assert alert["ready_at"] == (since + timedelta(hours=2, minutes=1)).isoformat()
    assert waits[1].evidence_data["next_ready_at"] == alert["ready_at"]
    assert not any(r.name == "GpuMemoryGrowing" for r in loaded_rules(target))
    assert rules.waiting() is not None and read_path.waiting() is not None

    # The bake watch an hour later: nothing is ready yet, nothing moves, nothing is recorded.
    hour = since + timedelta(hours=1)
    before = len(audit.events(group=GROUP))
    assert rules.handoff_when_ready(m, Horizon(since, hour), hour)["moved"] is False
    assert read_path.switch_when_ready(m, Horizon(since, hour), hour)["switched"] == []
    assert len(audit.events(group=GROUP)) == before

    # Past 2 h 1 min the rules move (the target loads them); past 24 h the day panel switches.
    later = since + timedelta(hours=2, minutes=2)
    moved = rules.handoff_when_ready(m, Horizon(since, later), later)
    assert moved["moved"] is True
    assert any(r.name == "GpuMemoryGrowing" for r in loaded_rules(target))
    assert rules.waiting() is None
    day_after = since + timedelta(hours=24, minutes=6)
    out = read_path.switch_when_ready(m, Horizon(since, day_after), day_after)
    assert out["switched"] == [{"path": "panels[2]", "title": "FB used, last day"}] and out["waiting"] == []
    assert [p["datasource"]["uid"] for p in json.loads(board.read_bytes())["panels"]] == ["amp-local"] * 3
    assert read_path.waiting() is None
    assert [e.evidence_data["what"] for e in audit.events(group=GROUP) if e.kind == EventKind.HORIZON_SWITCHED] == [
        "rules", "read_path"]

    # A rollback restores the dashboard byte for byte from the snapshot, whatever switched in between.
    read_path.restore(reason="test", now=day_after)
    assert board.read_bytes() == original
    rules.restore(reason="test", now=day_after)
    assert not any(r.name == "GpuMemoryGrowing" for r in loaded_rules(target))
    audit.engine.dispose()


def test_accepting_short_history_switches_everything_at_once(stack: LocalStack, tmp_path: Path) -> None:
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP)
    client = PrometheusClient(stack.source_url)
    m = compose_migration(group, Backends(client, client, str(stack.source_config_path), ""), audit=audit,
                       routing=RoutingStore(audit.url), snapshots_dir=tmp_path, run_id="manual__short")
    board = tmp_path / "fb.json"
    board.write_bytes(json.dumps(DASHBOARD, indent=2).encode())
    read_path = ReadPathStep(m, DashboardFilesSwitch([str(board)], group, source=DatasourceRef("prometheus"),
                                                     target=DatasourceRef("amp-local"), blobs=LocalBlobs(tmp_path)))
    since = datetime.now(UTC)
    read_path.snapshot(since)
    cut = since + timedelta(minutes=10)
    out = read_path.switch(cut, Horizon(since, cut, accept_short_history=True))
    assert [p["datasource"]["uid"] for p in json.loads(board.read_bytes())["panels"]] == ["amp-local"] * 3
    assert out["result"]["files"][0]["waiting"] == []
    assert not [e for e in audit.events(group=GROUP) if e.kind == EventKind.HORIZON_WAITING]
    audit.engine.dispose()
