"""The overview and /metrics at scale: what they read grows with groups, not with a year of events.

A wall-clock assert would be flaky on 2 shared cores; bench/board_scale/run.py measures the time. Here the shape of
the reads is pinned: bake checks (most of a year's events) added to the log change neither how many event rows the
overview and /metrics read nor what they show, and neither reads a group's whole history.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.api_fastapi import app as airflow_app
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from promshift.adapters import audit_store
from promshift.adapters.audit_store import AUDIT_INDEXES, AuditStore, ChainWatch
from promshift.adapters.settings import default_catalog_path, load_catalog
from promshift.board import evidence
from promshift.board.app import BoardSource, create_app
from promshift.board.metrics import exposition
from promshift.core.audit import AuditEvent
from promshift.core.memory import cyclic_gc_paused
from promshift.core.stages import Stage
from tests.board.auth_manager import GroupScopedAuthManager
from tests.board.history import write_history

START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RUNS = {"gpu-utilization": "r1", "gpu-power-thermal": "r2", "gpu-memory": "r3"}


def bake(store: AuditStore, checks: int, *, first: datetime) -> None:
    """``checks`` bake checks of gpu-utilization, each from its own bake-watch run (as the bake watch DAG runs)."""
    for i in range(checks):
        at = first + timedelta(minutes=15 * i)
        run_id = f"scheduled__{at.isoformat()}"
        if store.stage_of("gpu-utilization") == Stage.CUT_OVER:
            store.append(group="gpu-utilization", run_id=run_id, kind="bake_started", actor="promshift", at=at,
                         evidence={"policy": {}}, stage_from=Stage.CUT_OVER, stage_to=Stage.BAKING)
        store.append(group="gpu-utilization", run_id=run_id, kind="bake_check", actor="promshift",
                     at=at + timedelta(seconds=1), evidence={"verdict": "SUCCESSFUL", "measurements": []})


@pytest.fixture
def store(tmp_path: Path) -> AuditStore:
    s = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    write_history(s, load_catalog(), START, RUNS)
    return s


class RowCount:
    """How many event rows were turned into ``AuditEvent``s, and whether a whole history was read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        self.whole_history_reads = 0
        real = audit_store._row_to_event
        real_read = AuditStore.read_events

        def counted(row: Any) -> Any:
            self.rows += 1
            return real(row)

        def read_events(store: AuditStore, **kw: Any) -> Any:
            self.whole_history_reads += 1
            return real_read(store, **kw)

        monkeypatch.setattr(audit_store, "_row_to_event", counted)
        monkeypatch.setattr(AuditStore, "read_events", read_events)

    def reset(self) -> None:
        self.rows = self.whole_history_reads = 0


def test_the_overview_rows_from_the_latest_runs_equal_those_from_the_whole_history(store: AuditStore) -> None:
    bake(store, 30, first=START + timedelta(days=1))
    chain = store.verify()
    digests = store.latest_runs(evidence.OVERVIEW_KINDS)
    moves = store.stage_moves()
    assert moves["gpu-utilization"][-1] == "baking"
    for group in load_catalog().groups:
        state = evidence.GroupState(store.stage_of(group.name).value)
        whole = evidence.overview_row(group, store.events(group=group.name), state, chain)
        d = digests.get(group.name)
        if d is None:
            assert store.events(group=group.name) == []
            continue
        assert len(d.events) < len(store.events(group=group.name)) or group.name != "gpu-utilization"
        assert evidence.overview_row(group, d.events, state, chain, runs=d.runs,
                                     last_event_at=d.last_event_at) == whole, group.name
    assert digests["gpu-utilization"].runs == 31  # the migration run and 30 bake-watch runs


def test_bake_checks_do_not_change_how_many_rows_the_overview_and_metrics_read(
        store: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    count = RowCount(monkeypatch)

    def reads() -> int:
        count.reset()
        store.latest_runs(evidence.OVERVIEW_KINDS)
        store.stage_moves()
        store.events_of_kinds(__import__("promshift.board.metrics", fromlist=["FOLDED_KINDS"]).FOLDED_KINDS)
        store.totals()
        assert count.whole_history_reads == 0
        return count.rows

    bake(store, 1, first=START + timedelta(days=1))
    few = reads()
    bake(store, 60, first=START + timedelta(days=2))
    # The latest bake-watch run replaces the one before as "latest" (its bake_started and check; then one check).
    assert reads() <= few
    assert few <= 43  # the three groups' runs and the stage moves, the latest bake run: not the 85 events


def test_metrics_from_the_folded_kinds_equal_metrics_from_the_whole_log(store: AuditStore) -> None:
    from promshift.board.metrics import FOLDED_KINDS

    bake(store, 20, first=START + timedelta(days=1))
    groups = [(g.name, g.wave) for g in load_catalog().groups]
    whole = exposition(groups, store.events())
    assert exposition(groups, store.events_of_kinds(FOLDED_KINDS), totals=store.totals()) == whole
    assert "promshift_audit_events 45" in whole  # 24 of the history, 21 of the bake


@pytest.fixture
def client(store: AuditStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setattr(airflow_app._AuthManagerState, "instance", GroupScopedAuthManager())
    app = create_app(BoardSource(catalog_path=default_catalog_path(), audit_url=store.url, profile=None,
                                 run_states=lambda dag_id, run_ids: {}))
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer-victor", role="viewer")
    yield TestClient(app)
    app.dependency_overrides.clear()


def test_after_the_first_check_the_overview_reads_only_new_events_and_the_latest_runs(
        client: TestClient, store: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    first = client.get("/api/groups").json()
    assert first["chain"]["ok"] is True and first["chain"]["events"] == 24
    count = RowCount(monkeypatch)
    bake(store, 100, first=START + timedelta(days=1))
    count.reset()
    data = client.get("/api/groups").json()
    # The chain watch verifies the 101 new events once; the rows the overview reads stay O(groups).
    assert data["chain"] == {"ok": True, "events": 125, "problems": [], "pending": False}
    assert count.whole_history_reads == 0
    assert count.rows <= 101 + 30
    count.reset()
    client.get("/api/groups")
    assert count.rows < 30 and count.whole_history_reads == 0
    util = next(g for g in data["groups"] if g["name"] == "gpu-utilization")
    assert util["stage"] == "baking" and util["runs"] == 101 and util["approval"]["decision"] == "Approve"
    count.reset()
    text = client.get("/metrics").text
    assert 'promshift_group_stage{group="gpu-utilization",wave="1",stage="baking"} 1' in text
    assert "promshift_audit_events 125" in text
    assert count.rows < 40 and count.whole_history_reads == 0


def test_an_edit_to_a_verified_event_is_found_by_the_next_whole_verification(store: AuditStore) -> None:
    from sqlalchemy import text

    now = [0.0]
    watch = ChainWatch(store, full_every_s=300.0, clock=lambda: now[0], wall=lambda: 1e9 + now[0])
    assert watch.check(wait_s=None).ok is True  # type: ignore[union-attr]
    with store.engine.begin() as conn:
        conn.execute(text("DROP TRIGGER promshift_audit_no_update"))
        conn.execute(text("UPDATE promshift_audit_events SET actor = 'mallory' WHERE seq = 3"))
    assert watch.check(wait_s=None).ok is True  # type: ignore[union-attr]  # verified once, not read again
    now[0] = 301.0
    watch.check(wait_s=None)  # the checkpoint is 301 s old: starts the whole verification in the background
    thread = watch._thread
    assert thread is not None
    thread.join(30)
    check = watch.check(wait_s=None)
    assert check is not None and check.ok is False
    assert any(p.startswith("event seq 3:") for p in check.problems)


def test_a_new_watch_goes_on_from_the_checkpoint_and_ignores_a_forged_one(
        store: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy import text

    assert ChainWatch(store).check(wait_s=None).ok is True  # type: ignore[union-attr]  # saves a checkpoint
    bake(store, 5, first=START + timedelta(days=1))
    count = RowCount(monkeypatch)
    check = ChainWatch(store).check(wait_s=0)  # another server, started later
    assert check is not None and check.ok and check.events == 24 + 6
    assert count.rows == 6 and count.whole_history_reads == 0  # only the events after the checkpoint
    with store.engine.begin() as conn:  # someone without the key claims a verification further on
        conn.execute(text("UPDATE promshift_audit_checkpoints SET mac = :m"), {"m": "0" * 64})
    assert store.checkpoint() is None
    assert ChainWatch(store).check(wait_s=None).ok is True  # type: ignore[union-attr]  # read whole again
    assert count.whole_history_reads == 1


def test_the_first_check_is_pending_not_passed_while_the_whole_verification_runs(
        store: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    release = threading.Event()
    real = AuditStore.verified

    def slow(self: AuditStore, **kw: Any) -> Any:
        release.wait(10)
        return real(self, **kw)

    monkeypatch.setattr(AuditStore, "verified", slow)
    watch = ChainWatch(store)
    assert watch.check(wait_s=0.05) is None
    release.set()
    assert watch.check(wait_s=None).ok is True  # type: ignore[union-attr]


def test_an_audit_table_from_before_the_indexes_gets_them(tmp_path: Path) -> None:
    from sqlalchemy import inspect, text

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    old = AuditStore(url)
    with old.engine.begin() as conn:
        for index in AUDIT_INDEXES:
            conn.execute(text(f"DROP INDEX {index.name}"))
    assert not {i.name for i in AUDIT_INDEXES} & {i["name"] for i in inspect(old.engine).get_indexes(
        "promshift_audit_events")}
    old.append(group="gpu-memory", run_id="r1", kind="validated", actor="promshift", at=START, evidence={})
    new = AuditStore(url)
    assert {i.name for i in AUDIT_INDEXES} <= {i["name"] for i in inspect(new.engine).get_indexes(
        "promshift_audit_events")}
    assert [e.kind for e in new.events()] == ["validated"] and new.verify().ok


OVERVIEW_KEYS = ("run_id", "kinds", "source", "target", "connections", "gate", "approval", "gate_at", "approval_at",
                 "asked")


def test_the_overview_runs_are_the_pieces_of_each_runs_report_the_overview_shows(store: AuditStore) -> None:
    """``overview_runs`` decodes only validations, gates and approvals; what it gives equals ``build_report``'s
    (via ``run_reports``), for every run of a history with a cut-over, a rollback, a waiting approval, a refusal,
    a failed validation and a run under other connections."""
    at = START + timedelta(days=2)
    store.append(group="gpu-memory", run_id="r3", kind="approval_reject", actor="oncall-bob", at=at,
                 evidence={"decision": "Reject", "by": "oncall-bob", "comment": "not \u202etoday",
                           "evidence_sha256": "c3" * 32}, stage_from=Stage.VERIFIED, stage_to=Stage.ROLLED_BACK)
    store.append(group="gpu-power-thermal", run_id="r4", kind="validation_failed", actor="promshift",
                 at=at + timedelta(hours=1), evidence={"reason": "target unreachable"})
    store.append(group="gpu-power-thermal", run_id="r5", kind="validated", actor="promshift",
                 at=at + timedelta(hours=2), evidence={"source": "http://other:9090",
                                                       "target_backend": {"kind": "amp", "workspace_id": "ws-1",
                                                                          "region": "eu-west-1"},
                                                       "connections": {"source": "prom_b", "target": "amp_b"}})
    bake(store, 3, first=at + timedelta(hours=3))
    chain = store.verify()
    compared = kinds = 0
    for group in load_catalog().groups:
        events = store.events(group=group.name)
        state = evidence.GroupState(store.stage_of(group.name).value)
        full = evidence.run_reports(group.name, events, state, chain)
        light = evidence.overview_runs(events)
        assert len(light) == len(full), group.name
        for lite, report in zip(light, full, strict=True):
            assert {k: lite[k] for k in OVERVIEW_KEYS} == {k: report[k] for k in OVERVIEW_KEYS}, report["run_id"]
            assert lite["validation"]["ok"] == report["validation"]["ok"]
            assert lite["parity"]["verdict"] == report["parity"]["verdict"]
            assert lite["latency"]["verdict"] == report["latency"]["verdict"]
            compared += 1
            kinds |= bool(report["gate"]) << 0 | bool(report["approval"]["decision"]) << 1 \
                | (report["validation"]["ok"] is False) << 2 | bool(report["asked"]) << 3
    assert compared == 8 and kinds == 0b1111  # every piece was compared with data in it somewhere


def test_the_overview_builds_no_report_and_decodes_only_the_evidence_it_shows(
        client: TestClient, store: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per request: no ``build_report``, and one JSON decode per validation, gate, approval and approval request of
    the runs ``latest_runs`` picks; no bake check's, deploy's or warm-up's evidence."""
    bake(store, 20, first=START + timedelta(days=1))
    client.get("/api/groups")  # the chain watch's first check
    monkeypatch.setattr(evidence, "build_report", lambda **kw: pytest.fail("the overview built a whole report"))
    decoded: list[str] = []
    real = AuditEvent.evidence_data

    def counted(ev: AuditEvent) -> Any:
        decoded.append(ev.kind)
        return real.fget(ev)  # type: ignore[attr-defined]

    monkeypatch.setattr(AuditEvent, "evidence_data", property(counted))
    shown = {"validated", "gate_passed", "gate_failed", "gate_inconclusive", "approved", "approval_reject",
             "approval_timeout", "evidence_shown"}
    expected = sorted(e.kind for d in store.latest_runs(evidence.OVERVIEW_KINDS).values() for e in d.events
                      if e.kind in shown)
    assert len(expected) >= 8  # validations, gates, approvals and approval requests of three groups
    for path in ("/api/groups", "/"):
        decoded.clear()
        assert client.get(path).status_code == 200
        assert sorted(decoded) == expected, path


def test_the_overview_pauses_the_cyclic_collector_and_gives_it_back(
        client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    real = evidence.overview_row

    def row(*args: Any, **kw: Any) -> Any:
        seen.append(gc.isenabled())
        return real(*args, **kw)

    monkeypatch.setattr(evidence, "overview_row", row)
    assert gc.isenabled()
    for path in ("/", "/api/groups"):
        assert client.get(path).status_code == 200
        assert gc.isenabled(), path
    assert seen and not any(seen)
    # Nested (two overviews at once): the collector comes back when the last ends; off before stays off.
    with cyclic_gc_paused():
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        assert client.get("/api/groups").status_code == 200
        assert not gc.isenabled()
    finally:
        gc.enable()
