"""The audit store: append-only SQL table of hash-chained events (SQLite default, PostgreSQL by URL)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import (
    DDL,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from promshift.core.audit import AuditEvent, ChainCheck, new_event, verify_chain
from promshift.core.stages import Stage, current_stage
from promshift.settings import state_home

log = logging.getLogger(__name__)

metadata = MetaData()

audit_events = Table(
    "promshift_audit_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("group_name", String(128), nullable=False, index=True),
    Column("run_id", String(256), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("stage_from", String(32)),
    Column("stage_to", String(32)),
    Column("actor", String(128), nullable=False),
    # ISO text keeps the timezone exactly as hashed; SQLite would drop it from a DateTime.
    Column("at", String(40), nullable=False),
    Column("evidence", Text, nullable=False),
    # UNIQUE prev_hash: two writers racing to extend the chain cannot both win.
    Column("prev_hash", String(64), nullable=False, unique=True),
    Column("hash", String(64), nullable=False, unique=True),
)

# Append-only in the database itself, not only by convention in this module.
_SQLITE_GUARDS = [
    DDL("CREATE TRIGGER IF NOT EXISTS promshift_audit_no_update BEFORE UPDATE ON promshift_audit_events "
        "BEGIN SELECT RAISE(ABORT, 'promshift audit events are append-only'); END"),
    DDL("CREATE TRIGGER IF NOT EXISTS promshift_audit_no_delete BEFORE DELETE ON promshift_audit_events "
        "BEGIN SELECT RAISE(ABORT, 'promshift audit events are append-only'); END"),
]
_POSTGRES_GUARDS = [
    DDL("CREATE OR REPLACE FUNCTION promshift_audit_append_only() RETURNS trigger AS $$ "
        "BEGIN RAISE EXCEPTION 'promshift audit events are append-only'; END; $$ LANGUAGE plpgsql"),
    DDL("DROP TRIGGER IF EXISTS promshift_audit_append_only ON promshift_audit_events"),
    DDL("CREATE TRIGGER promshift_audit_append_only BEFORE UPDATE OR DELETE ON promshift_audit_events "
        "FOR EACH ROW EXECUTE FUNCTION promshift_audit_append_only()"),
]
for _ddl in _SQLITE_GUARDS:
    event.listen(audit_events, "after_create", _ddl.execute_if(dialect="sqlite"))
for _ddl in _POSTGRES_GUARDS:
    event.listen(audit_events, "after_create", _ddl.execute_if(dialect="postgresql"))


def default_audit_url() -> str:
    """``PROMSHIFT_AUDIT_URL``, else SQLite under ``PROMSHIFT_HOME`` (default ``./.state``)."""
    url = os.environ.get("PROMSHIFT_AUDIT_URL")
    if url:
        return url
    home = state_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'audit.db'}"


def _row_to_event(row: Any) -> AuditEvent:
    return AuditEvent(
        seq=row.seq,
        group=row.group_name,
        run_id=row.run_id,
        kind=row.kind,
        stage_from=row.stage_from,
        stage_to=row.stage_to,
        actor=row.actor,
        at=datetime.fromisoformat(row.at),
        evidence=row.evidence,
        prev_hash=row.prev_hash,
        hash=row.hash,
    )


class AuditStore:
    """Append and read hash-chained audit events. There is no update or delete."""

    def __init__(self, url: str | None = None, *, engine: Engine | None = None) -> None:
        self.url = url or default_audit_url()
        self.engine = engine or create_engine(self.url, future=True)
        metadata.create_all(self.engine)

    def _last(self, conn: Any) -> AuditEvent | None:
        row = conn.execute(select(audit_events).order_by(audit_events.c.seq.desc()).limit(1)).first()
        return _row_to_event(row) if row else None

    def append(self, *, group: str, run_id: str, kind: str, actor: str, at: datetime,
               evidence: Mapping[str, Any], stage_from: Stage | None = None,
               stage_to: Stage | None = None) -> AuditEvent:
        """Add one event at the head of the chain; retries if another writer got there first."""
        for attempt in range(20):
            with self.engine.connect() as conn:
                prev = self._last(conn)
                ev = new_event(prev=prev, group=group, run_id=run_id, kind=kind,
                               stage_from=stage_from.value if stage_from else None,
                               stage_to=stage_to.value if stage_to else None,
                               actor=actor, at=at, evidence=evidence)
                try:
                    conn.execute(audit_events.insert().values(
                        seq=ev.seq, group_name=ev.group, run_id=ev.run_id, kind=ev.kind,
                        stage_from=ev.stage_from, stage_to=ev.stage_to, actor=ev.actor,
                        at=ev.at.isoformat(), evidence=ev.evidence, prev_hash=ev.prev_hash, hash=ev.hash))
                    conn.commit()
                except IntegrityError:
                    conn.rollback()
                    log.debug("audit chain head moved (attempt %s); retrying", attempt + 1)
                    time.sleep(0.01 * (attempt + 1))
                    continue
            log.info("audit: %s %s %s -> %s by %s", group, kind, ev.stage_from, ev.stage_to, actor)
            return ev
        raise RuntimeError("could not append to the audit chain after 20 attempts")

    def events(self, *, group: str | None = None, run_id: str | None = None) -> list[AuditEvent]:
        stmt = select(audit_events).order_by(audit_events.c.seq)
        if group is not None:
            stmt = stmt.where(audit_events.c.group_name == group)
        if run_id is not None:
            stmt = stmt.where(audit_events.c.run_id == run_id)
        with self.engine.connect() as conn:
            return [_row_to_event(r) for r in conn.execute(stmt)]

    def stage_of(self, group: str) -> Stage:
        """The group's current stage, replayed (and so checked) from its stage events."""
        return current_stage(Stage(e.stage_to) for e in self.events(group=group) if e.stage_to)

    def verify(self) -> ChainCheck:
        return verify_chain(self.events())
