"""The audit store on SQLite (always) and PostgreSQL (the machine's local server, when it answers)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from promshift.adapters.audit_cli import add_audit_commands
from promshift.adapters.audit_store import AuditStore
from promshift.core.stages import IllegalTransition, Stage

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def fill(store: AuditStore, group: str = "gpu-memory") -> None:
    moves = [(None, Stage.PLANNED, Stage.DUAL_WRITING), ("warmup", Stage.DUAL_WRITING, Stage.WARMING)]
    for i, (_, frm, to) in enumerate(moves):
        store.append(group=group, run_id="r1", kind=f"step{i}", actor="promshift", at=T0 + timedelta(seconds=i),
                     evidence={"i": i}, stage_from=frm, stage_to=to)
    store.append(group=group, run_id="r1", kind="note", actor="oncall-alice", at=T0 + timedelta(seconds=9),
                 evidence={"comment": "ok"})


def test_sqlite_append_read_verify(tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'a.db'}")
    fill(store)
    events = store.events(group="gpu-memory")
    assert [e.seq for e in events] == [1, 2, 3]
    assert events[0].at == T0 and events[0].at.tzinfo is not None
    assert store.stage_of("gpu-memory") == Stage.WARMING
    assert store.stage_of("never-seen") == Stage.PLANNED
    assert store.verify().ok


def test_sqlite_refuses_update_and_delete(tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'a.db'}")
    fill(store)
    with store.engine.connect() as conn:
        with pytest.raises(DBAPIError, match="append-only"):
            conn.execute(text("UPDATE promshift_audit_events SET actor='mallory'"))
        conn.rollback()
        with pytest.raises(DBAPIError, match="append-only"):
            conn.execute(text("DELETE FROM promshift_audit_events"))


def tamper(db: Path, sql: str) -> None:
    """What someone with raw database access could do: drop the guards, then edit."""
    con = sqlite3.connect(db)
    con.execute("DROP TRIGGER promshift_audit_no_update")
    con.execute("DROP TRIGGER promshift_audit_no_delete")
    con.execute(sql)
    con.commit()
    con.close()


@pytest.mark.parametrize("sql,needle", [
    ("UPDATE promshift_audit_events SET evidence='{\"i\":7}' WHERE seq=2", "edited"),
    ("DELETE FROM promshift_audit_events WHERE seq=2", "missing"),
])
def test_verify_cli_detects_tampering(tmp_path: Path, sql: str, needle: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    db = tmp_path / "a.db"
    store = AuditStore(f"sqlite:///{db}")
    fill(store)
    parser = argparse.ArgumentParser()
    add_audit_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["audit", "verify", "--url", f"sqlite:///{db}"])
    assert args.handler(args) == 0
    assert "audit chain OK: 3 events" in capsys.readouterr().out
    tamper(db, sql)
    assert args.handler(args) == 2
    out = capsys.readouterr().out
    assert "BROKEN" in out and needle in out


def test_illegal_stage_history_is_caught_on_read(tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'a.db'}")
    store.append(group="g", run_id="r", kind="x", actor="a", at=T0, evidence={},
                 stage_from=Stage.PLANNED, stage_to=Stage.CUT_OVER)
    with pytest.raises(IllegalTransition):
        store.stage_of("g")


def test_show_cli_lists_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    url = f"sqlite:///{tmp_path / 'a.db'}"
    fill(AuditStore(url))
    parser = argparse.ArgumentParser()
    add_audit_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["audit", "show", "gpu-memory", "--url", url])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "planned -> dual_writing" in out and "oncall-alice" in out and "current stage of gpu-memory: warming" in out


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A throwaway schema on the local PostgreSQL (trust auth on 127.0.0.1, database 'test')."""
    schema = f"promshift_test_{uuid.uuid4().hex[:8]}"
    try:
        admin = create_engine(PG_URL)
        with admin.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.fail(f"local PostgreSQL at {PG_URL} is required for this test: {exc}")
    yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))


def test_postgres_chain_and_append_only(pg_url: str) -> None:
    store = AuditStore(pg_url)
    fill(store)
    assert store.verify().ok and store.stage_of("gpu-memory") == Stage.WARMING
    with store.engine.connect() as conn:
        with pytest.raises(DBAPIError, match="append-only"):
            conn.execute(text("DELETE FROM promshift_audit_events WHERE seq = 1"))


def test_postgres_concurrent_writers_keep_one_chain(pg_url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    store = AuditStore(pg_url)

    def write(i: int) -> None:
        AuditStore(pg_url).append(group=f"g{i % 3}", run_id="r", kind="k", actor="a", at=T0, evidence={"i": i})

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(write, range(30)))
    check = store.verify()
    assert check.ok and check.events == 30
