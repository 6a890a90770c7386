"""Retried steps (Airflow retries=1) resume instead of moving the stage twice (issue 12).

A crash is simulated around the audit append: before it (the step's event is lost) or just
after it (the event is committed, the task still fails). Either way the retry must end where
a run without a crash ends: one event per transition, the same stage.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.stages import IllegalTransition, Stage
from promshift.orchestration.compose import compose_migration
from promshift.steps.migration import Backends, GroupMigration

GROUP = "gpu-memory"
RUN_ID = "manual__retry"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Crash(RuntimeError):
    """The worker died (or the task failed) at this point."""


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.engine.dispose()


def migration(tmp_path: Path, audit: AuditStore, run_id: str = RUN_ID) -> GroupMigration:
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP)
    # Nothing listens here: the steps tested below must not need either backend.
    backends = Backends(source=PrometheusClient("http://127.0.0.1:9"), target=PrometheusClient("http://127.0.0.1:9"),
                        source_config_path=str(tmp_path / "prometheus.yml"),
                        target_remote_write_url="http://127.0.0.1:9/api/v1/write")
    return compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url),
                          snapshots_dir=tmp_path / "snapshots", run_id=run_id)


def crash_on(monkeypatch: pytest.MonkeyPatch, audit: AuditStore, kind: str, *, after_append: bool) -> list[str]:
    """Make the next append of ``kind`` fail once: before it is written, or right after it is committed."""
    real = audit.append
    crashed: list[str] = []

    def append(**kw: Any) -> Any:
        if kw["kind"] == kind and not crashed:
            crashed.append(kind)
            if after_append:
                real(**kw)
            raise Crash(f"crash {'after' if after_append else 'before'} recording {kind}")
        return real(**kw)

    monkeypatch.setattr(audit, "append", append)
    return crashed


def moves(audit: AuditStore) -> list[tuple[str, str | None, str | None]]:
    return [(e.kind, e.stage_from, e.stage_to) for e in audit.events(group=GROUP) if e.stage_to]


def to_dual_writing(m: GroupMigration) -> None:
    m.record("dual_write_deployed", T0, {"remote_write": "promshift-gpu-memory"}, to=Stage.DUAL_WRITING)


def clean_run(tmp_path: Path) -> list[tuple[str, str | None, str | None]]:
    """The transitions of the same steps without any crash."""
    store = AuditStore(f"sqlite:///{tmp_path / 'clean.db'}")
    try:
        m = migration(tmp_path / "clean", store)
        to_dual_writing(m)
        m.start_warmup(T0)
        return moves(store)
    finally:
        store.engine.dispose()


@pytest.mark.parametrize("after_append", [False, True], ids=["crash-before-event", "crash-after-event"])
def test_retried_start_warmup_moves_the_stage_once(tmp_path: Path, audit: AuditStore,
                                                   monkeypatch: pytest.MonkeyPatch, after_append: bool) -> None:
    m = migration(tmp_path, audit)
    to_dual_writing(m)
    crashed = crash_on(monkeypatch, audit, "warmup_started", after_append=after_append)
    with pytest.raises(Crash):
        m.start_warmup(T0)
    assert crashed == ["warmup_started"]
    assert audit.stage_of(GROUP) == (Stage.WARMING if after_append else Stage.DUAL_WRITING)

    m.start_warmup(T0)  # Airflow's retry: no IllegalTransition, no second event
    assert moves(audit) == clean_run(tmp_path) == [("dual_write_deployed", "planned", "dual_writing"),
                                                    ("warmup_started", "dual_writing", "warming")]
    assert audit.stage_of(GROUP) == Stage.WARMING
    n = len(audit.events())
    m.start_warmup(T0)  # a retry after the event was recorded adds nothing
    assert len(audit.events()) == n
    assert audit.verify().ok


def test_record_returns_the_recorded_transition_on_a_retry(tmp_path: Path, audit: AuditStore) -> None:
    m = migration(tmp_path, audit)
    first = m.record("dual_write_deployed", T0, {"n": 1}, to=Stage.DUAL_WRITING)
    again = m.record("dual_write_deployed", T0, {"n": 2}, to=Stage.DUAL_WRITING)
    assert (again.seq, again.hash, again.evidence_data) == (first.seq, first.hash, {"n": 1})
    assert len(audit.events()) == 1


def test_another_runs_transition_still_raises(tmp_path: Path, audit: AuditStore) -> None:
    to_dual_writing(migration(tmp_path, audit, run_id="manual__earlier"))
    other = migration(tmp_path, audit)
    with pytest.raises(IllegalTransition, match="illegal transition dual_writing -> dual_writing"):
        to_dual_writing(other)
    assert len(audit.events()) == 1


def test_an_illegal_transition_still_raises(tmp_path: Path, audit: AuditStore) -> None:
    m = migration(tmp_path, audit)
    with pytest.raises(IllegalTransition, match="planned -> warming"):
        m.start_warmup(T0)
    to_dual_writing(m)
    m.start_warmup(T0)
    # Same run, same kind, but the group has moved on since: the old step is not resumed.
    m.record("rolled_back", T0, {}, to=Stage.ROLLED_BACK)
    with pytest.raises(IllegalTransition, match="rolled_back -> warming"):
        m.start_warmup(T0)
    assert [k for k, _, _ in moves(audit)] == ["dual_write_deployed", "warmup_started", "rolled_back"]


def test_same_run_after_its_own_rollback_starts_a_fresh_dual_write(tmp_path: Path, audit: AuditStore) -> None:
    m = migration(tmp_path, audit)
    to_dual_writing(m)
    m.record("rolled_back", T0, {}, to=Stage.ROLLED_BACK)
    to_dual_writing(m)  # a cleared DAG run: a real second transition, recorded
    assert [t for _, _, t in moves(audit)] == ["dual_writing", "rolled_back", "dual_writing"]


@pytest.mark.parametrize("after_append", [False, True], ids=["crash-before-event", "crash-after-event"])
def test_retried_approval_and_cutover_record_once(tmp_path: Path, audit: AuditStore,
                                                  monkeypatch: pytest.MonkeyPatch, after_append: bool) -> None:
    m = migration(tmp_path, audit)
    to_dual_writing(m)
    m.start_warmup(T0)
    m.record("gate_passed", T0, {}, to=Stage.VERIFIED)
    crash_on(monkeypatch, audit, "approved", after_append=after_append)
    with pytest.raises(Crash):
        m.record_approval(decision="Approve", by="alice", comment="ok", now=T0)
    m.record_approval(decision="Approve", by="alice", comment="ok", now=T0)
    assert audit.stage_of(GROUP) == Stage.APPROVED

    crash_on(monkeypatch, audit, "cut_over", after_append=after_append)
    with pytest.raises(Crash):
        m.cutover(T0)
    since = m.routing.load()["groups"][GROUP]["since"]
    later = datetime(2026, 1, 2, tzinfo=UTC)
    routed = m.cutover(later)
    assert m.routing.read_from(GROUP) == "target"
    # Recorded before the crash: the retry returns that record and leaves the manifest alone.
    assert (routed["routing"]["since"] == since) is after_append
    assert [t for _, _, t in moves(audit)] == ["dual_writing", "warming", "verified", "approved", "cut_over"]
    n = len(audit.events())
    m.cutover(later)
    assert len(audit.events()) == n
    with pytest.raises(IllegalTransition, match="cut_over -> approved"):  # the group moved on: not a retry
        m.record_approval(decision="Approve", by="alice", comment="ok", now=later)
    assert len(audit.events()) == n
    assert audit.stage_of(GROUP) == Stage.CUT_OVER
    assert audit.verify().ok


def test_a_run_holds_its_group_until_it_ends_and_a_dry_run_never_does(tmp_path: Path, audit: AuditStore) -> None:
    from promshift.steps.migration import holding_runs

    first = migration(tmp_path, audit, run_id="manual__first")
    first.record("validated", T0, {"stage": "planned"})
    dry = migration(tmp_path, audit, run_id="manual__dry")
    dry.record("validated", T0, {"stage": "planned", "dry_run": True})
    assert [e.run_id for e in holding_runs(audit.events(group=GROUP))] == ["manual__first"]
    first.record("rollback_not_needed", T0, {})
    assert holding_runs(audit.events(group=GROUP)) == []
