"""The audit store: append-only SQL table of hash-chained events (SQLite default, PostgreSQL by URL)."""

from __future__ import annotations

import hmac
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    DDL,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    inspect,
    make_url,
    select,
    text,
    tuple_,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from promshift.adapters.settings import ProductionSettingsMissing, audit_key, is_production, state_home
from promshift.core.audit import (
    SHA256_V1,
    AnchorPoint,
    AuditEvent,
    AuditKeyError,
    ChainCheck,
    ChainVerifier,
    canonical_json,
    checkpoint_mac,
    new_event,
)
from promshift.core.stages import Stage, current_stage

if TYPE_CHECKING:
    from promshift.core.audit import AuditAnchor

log = logging.getLogger(__name__)

NO_KEY = ("no audit key: set the Airflow connection promshift_audit (the key in its password), "
          "PROMSHIFT_AUDIT_KEY or PROMSHIFT_AUDIT_KEY_FILE")


class AuditDatabaseMissing(FileNotFoundError):
    """The audit database file does not exist (and a reader must not create it)."""


class AuditDatabaseUnreadable(RuntimeError):
    """The audit database cannot be read: corrupt, truncated, or not a database; the message says which."""


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
    # NULL: written before schemes were recorded, i.e. sha256-v1.
    Column("scheme", String(32)),
)


# Readers that need a group's latest state read these instead of its whole history (the board's overview: one
# row per group and kind, then a few runs' events): a year of bake checks must not cost the overview anything.
AUDIT_INDEXES = (
    Index("ix_promshift_audit_group_run", audit_events.c.group_name, audit_events.c.run_id),
    Index("ix_promshift_audit_kind_group_seq", audit_events.c.kind, audit_events.c.group_name, audit_events.c.seq),
    # Stage moves only (a few per run): the stage of every group without reading its other events.
    Index("ix_promshift_audit_stage_moves", audit_events.c.group_name, audit_events.c.seq,
          sqlite_where=audit_events.c.stage_to.isnot(None), postgresql_where=audit_events.c.stage_to.isnot(None)),
)


# Where a whole verification of the chain found it clean, keyed with the audit HMAC (``checkpoint_mac``): a board
# process that starts goes on from the latest one instead of reading the whole chain again (``ChainWatch``).
audit_checkpoints = Table(
    "promshift_audit_checkpoints",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("state", Text, nullable=False),
    Column("mac", String(64), nullable=False),
    Column("verified_at", Float, nullable=False),
)


_PG_APPEND_ONLY_FUNCTION = (
    "CREATE OR REPLACE FUNCTION promshift_audit_append_only() RETURNS trigger AS $$ "
    "BEGIN RAISE EXCEPTION 'promshift audit events are append-only'; END; $$ LANGUAGE plpgsql")


def append_only(table: Table, prefix: str) -> None:
    """Make ``table`` refuse UPDATE, DELETE (and on PostgreSQL TRUNCATE) in the database itself."""
    name = table.name
    sqlite = [
        DDL(f"CREATE TRIGGER IF NOT EXISTS {prefix}_no_update BEFORE UPDATE ON {name} "
            "BEGIN SELECT RAISE(ABORT, 'promshift audit events are append-only'); END"),
        DDL(f"CREATE TRIGGER IF NOT EXISTS {prefix}_no_delete BEFORE DELETE ON {name} "
            "BEGIN SELECT RAISE(ABORT, 'promshift audit events are append-only'); END"),
    ]
    postgres = [
        DDL(_PG_APPEND_ONLY_FUNCTION),
        DDL(f"DROP TRIGGER IF EXISTS {prefix}_append_only ON {name}"),
        DDL(f"CREATE TRIGGER {prefix}_append_only BEFORE UPDATE OR DELETE ON {name} "
            "FOR EACH ROW EXECUTE FUNCTION promshift_audit_append_only()"),
        # Row triggers do not see TRUNCATE.
        DDL(f"CREATE TRIGGER {prefix}_no_truncate BEFORE TRUNCATE ON {name} "
            "FOR EACH STATEMENT EXECUTE FUNCTION promshift_audit_append_only()"),
    ]
    for ddl in sqlite:
        event.listen(table, "after_create", ddl.execute_if(dialect="sqlite"))
    for ddl in postgres:
        event.listen(table, "after_create", ddl.execute_if(dialect="postgresql"))


# Append-only in the database itself, not only by convention in this module.
append_only(audit_events, "promshift_audit")


def sqlite_file(url: str) -> Path | None:
    """The file behind a SQLite URL, or None (another database, or in memory)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:" \
            or u.database.startswith("file:"):
        return None
    return Path(u.database)


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as nothing rather than leaked
        return "<unparsable database URL>"


def open_engine(url: str, *, create: bool) -> Engine:
    """An engine for ``url``; without ``create`` a SQLite file must exist and is opened read-only."""
    path = sqlite_file(url)
    if path is None:
        return create_engine(url, future=True)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        return create_engine(url, future=True)
    if not path.is_file():
        raise AuditDatabaseMissing(f"no audit database at {path}" if not path.exists()
                                   else f"{path} is not a file")
    uri = f"{path.resolve().as_uri()}?mode=ro"
    return create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False),
                         future=True)


# Databases with INSERT ... ON CONFLICT, the one statement an upsert or a claim is (routing, notify deliveries).
UPSERT_DIALECTS = ("postgresql", "sqlite")


def unsupported_upsert_backend(url: str) -> str | None:
    """Why ``url``'s database cannot hold an upsert table ("<backend> is not supported (use ...)"), else None."""
    backend = make_url(url).get_backend_name()
    return None if backend in UPSERT_DIALECTS else f"{backend} is not supported (use {' or '.join(UPSERT_DIALECTS)})"


def dialect_insert(table: Table, dialect: str) -> Any:
    """``INSERT`` into ``table`` in ``dialect``'s own construct (it has ``on_conflict_do_*``)."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    return insert(table)


def create_tables(metadata: MetaData, engine: Engine, table: Table) -> None:
    """``metadata``'s tables in ``engine``'s database; another worker creating ``table`` between the check and the
    CREATE is fine."""
    try:
        metadata.create_all(engine)
    except SQLAlchemyError:
        if not inspect(engine).has_table(table.name):
            raise


def short_error(exc: BaseException) -> str:
    """The driver's first line, without SQL or parameters."""
    orig = getattr(exc, "orig", None) or exc
    text_ = str(orig).strip().splitlines()
    return text_[0] if text_ else type(orig).__name__


def default_audit_url() -> str:
    """``PROMSHIFT_AUDIT_URL``, else SQLite under ``PROMSHIFT_HOME`` (default ``./.state``), never in production."""
    url = os.environ.get("PROMSHIFT_AUDIT_URL")
    if url:
        return url
    if is_production():
        raise ProductionSettingsMissing("PROMSHIFT_ENV=production: no audit database (PROMSHIFT_AUDIT_URL); "
                                        "no SQLite default")
    return f"sqlite:///{state_home() / 'audit.db'}"


class AuditRowUnreadable(ValueError):
    """A stored event cannot be read back (its ``at`` is no time, ...): an edited row; the message names it."""


def _row_to_event(row: Any) -> AuditEvent:
    try:
        at = datetime.fromisoformat(row.at)
    except (TypeError, ValueError):
        shown = str(row.at)[:60].encode("unicode_escape").decode("ascii")
        raise AuditRowUnreadable(f"event seq {row.seq}: at {shown!r} is not an ISO-8601 time (the row was "
                                 "edited)") from None
    return AuditEvent(
        seq=row.seq,
        group=row.group_name,
        run_id=row.run_id,
        kind=row.kind,
        stage_from=row.stage_from,
        stage_to=row.stage_to,
        actor=row.actor,
        at=at,
        evidence=row.evidence,
        prev_hash=row.prev_hash,
        hash=row.hash,
        scheme=getattr(row, "scheme", None) or SHA256_V1,
    )


def event_row(ev: AuditEvent) -> dict[str, Any]:
    """The table row of an event."""
    return dict(seq=ev.seq, group_name=ev.group, run_id=ev.run_id, kind=ev.kind, stage_from=ev.stage_from,
                stage_to=ev.stage_to, actor=ev.actor, at=ev.at.isoformat(), evidence=ev.evidence,
                prev_hash=ev.prev_hash, hash=ev.hash, scheme=ev.scheme)


_UNSET: Any = object()


@dataclass
class GroupDigest:
    """What ``AuditStore.latest_runs`` reads of one group: runs, the last event's time, a few runs' events."""

    runs: int = 0
    last_event_at: datetime | None = None
    events: list[AuditEvent] = field(default_factory=list)


class AuditStore:
    """Append and read hash-chained audit events. There is no update or delete.

    Writers (``create=True``, the default) create the table and need the audit key (HMAC); each
    append is anchored in ``anchor`` (default: ``PROMSHIFT_AUDIT_ANCHOR_URL``, else a SQLite file
    next to a SQLite audit database). Readers (``create=False``) create nothing: a missing SQLite
    file raises ``AuditDatabaseMissing`` and an existing one is opened read-only.
    """

    def __init__(self, url: str | None = None, *, key: bytes | None = _UNSET, anchor: AuditAnchor | None = _UNSET,
                 engine: Engine | None = None, create: bool = True,
                 on_head: Callable[[AnchorPoint], None] | None = None) -> None:
        self.url = url or default_audit_url()
        self.where = redacted(self.url)
        self.create = create
        self.engine = engine or open_engine(self.url, create=create)
        self._key = key
        self._anchor = anchor
        self.on_head = on_head
        if create:
            try:
                metadata.create_all(self.engine)
                self._add_scheme_column()
                self._add_indexes()
            except SQLAlchemyError as exc:
                raise AuditDatabaseUnreadable(f"cannot open the audit database {self.where}: "
                                              f"{short_error(exc)}") from None
            # The anchor store is made with the table, so a table without its anchor store reads as a lost anchor.
            if self._anchor is _UNSET:
                try:
                    _ = self.anchor
                except ValueError:
                    pass  # no anchor configured: append says so, verify reports it

    # -- key and anchor (resolved on first use: reading events needs neither) ---------------------
    @property
    def key(self) -> bytes | None:
        """The HMAC key: as given, else from the environment (``promshift.adapters.settings.audit_key``)."""
        if self._key is _UNSET:
            self._key = audit_key()
        return self._key

    @property
    def anchor(self) -> AuditAnchor:
        if self._anchor is _UNSET:
            from promshift.adapters.audit_anchor import default_anchor

            self._anchor = default_anchor(self.url, create=self.create)
        if self._anchor is None:
            raise ValueError("this audit store has no anchor")
        return self._anchor

    def _add_scheme_column(self) -> None:
        """Databases from before schemes existed get the column (NULL: their rows are sha256-v1)."""
        if "scheme" in {c["name"] for c in inspect(self.engine).get_columns(audit_events.name)}:
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(text(f"ALTER TABLE {audit_events.name} ADD COLUMN scheme VARCHAR(32)"))
                if conn.dialect.name == "postgresql":
                    # Old tables were guarded against UPDATE/DELETE by row triggers, which TRUNCATE bypasses.
                    conn.execute(text(_PG_APPEND_ONLY_FUNCTION))
                    conn.execute(text(f"CREATE TRIGGER promshift_audit_no_truncate BEFORE TRUNCATE ON "
                                      f"{audit_events.name} FOR EACH STATEMENT "
                                      "EXECUTE FUNCTION promshift_audit_append_only()"))
            log.info("audit table %s gained a scheme column; existing events are %s", self.where, SHA256_V1)
        except SQLAlchemyError:
            # Another writer added it first.
            if "scheme" not in {c["name"] for c in inspect(self.engine).get_columns(audit_events.name)}:
                raise

    def _add_indexes(self) -> None:
        """Databases from before ``AUDIT_INDEXES`` get them (a new table has them from ``create_all``)."""
        for index in AUDIT_INDEXES:
            try:
                index.create(self.engine, checkfirst=True)
            except SQLAlchemyError:
                # Another writer created it first.
                if index.name not in {i["name"] for i in inspect(self.engine).get_indexes(audit_events.name)}:
                    raise

    def _select(self) -> Any:
        """SELECT of the table's columns as they exist (an old table has no ``scheme``)."""
        if self.create:
            return select(audit_events)
        present = {c["name"] for c in inspect(self.engine).get_columns(audit_events.name)}
        return select(*[c for c in audit_events.c if c.name in present])

    def _last(self, conn: Any) -> AuditEvent | None:
        row = conn.execute(self._select().order_by(audit_events.c.seq.desc()).limit(1)).first()
        return _row_to_event(row) if row else None

    def append(self, *, group: str, run_id: str, kind: str, actor: str, at: datetime,
               evidence: Mapping[str, Any], stage_from: Stage | None = None,
               stage_to: Stage | None = None) -> AuditEvent:
        """Add one keyed event at the head of the chain, then anchor the new head.

        Retries if another writer got there first. The event is committed before it is
        anchored: an anchor ahead of the chain would read as a truncation.
        """
        key = self.key
        if key is None:
            raise AuditKeyError(NO_KEY)
        anchor = self.anchor
        for attempt in range(20):
            with self.engine.connect() as conn:
                prev = self._last(conn)
                ev = new_event(prev=prev, group=group, run_id=run_id, kind=kind,
                               stage_from=stage_from.value if stage_from else None,
                               stage_to=stage_to.value if stage_to else None,
                               actor=actor, at=at, evidence=evidence, key=key)
                try:
                    conn.execute(audit_events.insert().values(**event_row(ev)))
                    conn.commit()
                except IntegrityError:
                    conn.rollback()
                    log.debug("audit chain head moved (attempt %s); retrying", attempt + 1)
                    time.sleep(0.01 * (attempt + 1))
                    continue
            log.info("audit: %s %s %s -> %s by %s", group, kind, ev.stage_from, ev.stage_to, actor)
            head = AnchorPoint(ev.seq, ev.hash)
            try:
                anchor.record(head.seq, head.head)
            except Exception as exc:  # noqa: BLE001 - the event is committed; say loudly that it is unanchored
                log.error("audit event seq %s is committed but its head was not anchored in %s: %s",
                          ev.seq, anchor.where, exc)
            if self.on_head is not None:
                self.on_head(head)
            return ev
        raise RuntimeError("could not append to the audit chain after 20 attempts")

    def has_table(self) -> bool:
        return inspect(self.engine).has_table(audit_events.name)

    def events(self, *, group: str | None = None, run_id: str | None = None) -> list[AuditEvent]:
        """Events oldest first; a reader on a database without the audit table gets none.

        An unreadable row raises ``AuditRowUnreadable`` naming it; ``read_events`` reads past it.
        """
        events, problems = self.read_events(group=group, run_id=run_id)
        if problems:
            raise AuditRowUnreadable(problems[0])
        return events

    def read_events(self, *, group: str | None = None, run_id: str | None = None
                    ) -> tuple[list[AuditEvent], list[str]]:
        """The readable events oldest first, and one line for each row that cannot be read (it is skipped)."""
        if not self.create and not self.has_table():
            return [], []
        stmt = self._select().order_by(audit_events.c.seq)
        if group is not None:
            stmt = stmt.where(audit_events.c.group_name == group)
        if run_id is not None:
            stmt = stmt.where(audit_events.c.run_id == run_id)
        events: list[AuditEvent] = []
        problems: list[str] = []
        with self.engine.connect() as conn:
            for row in conn.execute(stmt):
                try:
                    events.append(_row_to_event(row))
                except AuditRowUnreadable as exc:
                    problems.append(str(exc))
        return events, problems

    def events_after(self, seq: int) -> Iterator[AuditEvent]:
        """The events after ``seq``, oldest first, read as they stream (the primary key: nothing before is read)."""
        stmt = self._select().where(audit_events.c.seq > seq).order_by(audit_events.c.seq)
        with self.engine.connect() as conn:
            for row in conn.execution_options(yield_per=2000).execute(stmt):
                yield _row_to_event(row)

    def stage_moves(self) -> dict[str, list[str]]:
        """Every group's stages entered, oldest first (the stage moves' own index: no other event is read)."""
        if not self.create and not self.has_table():
            return {}
        c = audit_events.c
        stmt = select(c.group_name, c.stage_to).where(c.stage_to.isnot(None)).order_by(c.group_name, c.seq)
        moves: dict[str, list[str]] = {}
        with self.engine.connect() as conn:
            for group, stage in conn.execute(stmt):
                moves.setdefault(group, []).append(stage)
        return moves

    def latest_runs(self, kind_sets: Iterable[Collection[str]], *, chunk: int = 400) -> dict[str, GroupDigest]:
        """Per group: how many runs, its last event's time, and the events of the few runs that say where it
        stands: its latest run, and the latest run with an event of each of ``kind_sets``, oldest first.

        Reads one row per group (and kind set), then only those runs' events: O(groups x runs kept), not
        O(events), however many bake checks a year added.
        """
        if not self.create and not self.has_table():
            return {}
        c = audit_events.c
        digests: dict[str, GroupDigest] = {}
        wanted: set[int] = set()
        with self.engine.connect() as conn:
            last: dict[str, int] = {}
            for group, runs, seq in conn.execute(select(c.group_name, func.count(c.run_id.distinct()),
                                                        func.max(c.seq)).group_by(c.group_name)):
                last[group] = seq
                digests[group] = GroupDigest(runs=runs)
                wanted.add(seq)
            for kinds in kind_sets:
                stmt = select(func.max(c.seq)).where(c.kind.in_(sorted(kinds))).group_by(c.group_name)
                wanted.update(seq for (seq,) in conn.execute(stmt))
            keys: set[tuple[str, str]] = set()
            seqs = sorted(wanted)
            for i in range(0, len(seqs), chunk):
                for seq, group, run_id, at in conn.execute(select(c.seq, c.group_name, c.run_id, c.at)
                                                           .where(c.seq.in_(seqs[i:i + chunk]))):
                    keys.add((group, run_id))
                    if last.get(group) == seq:
                        digests[group].last_event_at = datetime.fromisoformat(at)
            # SQLite: by group, then run id: both IN lists seek the (group_name, run_id) index (a row-value IN
            # scans it whole there); a row of another wanted group's run id (bake-watch runs share ids) is dropped.
            # PostgreSQL: the (group_name, run_id) pairs themselves, which it seeks in that index whether or not the
            # table was analyzed (two IN lists on a table without statistics are a whole scan each).
            pairs = self.engine.dialect.name == "postgresql"
            runs_of: dict[str, set[str]] = {}
            for group, run_id in keys:
                runs_of.setdefault(group, set()).add(run_id)
            groups = sorted(runs_of)
            for i in range(0, len(groups), chunk // 4):
                part = groups[i:i + chunk // 4]
                if pairs:
                    stmt = self._select().where(tuple_(c.group_name, c.run_id).in_(
                        sorted((g, r) for g in part for r in runs_of[g])))
                else:
                    run_ids = sorted({r for g in part for r in runs_of[g]})
                    stmt = self._select().where(c.group_name.in_(part), c.run_id.in_(run_ids))
                for row in conn.execute(stmt):
                    if row.run_id in runs_of[row.group_name]:
                        digests[row.group_name].events.append(_row_to_event(row))
        for digest in digests.values():
            digest.events.sort(key=lambda e: e.seq)
        return digests

    def events_of_kinds(self, kinds: Collection[str]) -> list[AuditEvent]:
        """Events of ``kinds`` and every stage move, oldest first (the kind index: other events are not read)."""
        if not self.create and not self.has_table():
            return []
        c = audit_events.c
        stmt = self._select().where(c.kind.in_(sorted(kinds)) | c.stage_to.isnot(None)).order_by(c.seq)
        with self.engine.connect() as conn:
            return [_row_to_event(row) for row in conn.execute(stmt)]

    def totals(self) -> tuple[int, datetime | None]:
        """How many events, and the latest ``at`` (ISO text compared as text: every writer stores UTC)."""
        if not self.create and not self.has_table():
            return 0, None
        with self.engine.connect() as conn:
            count, last = conn.execute(select(func.count(), func.max(audit_events.c.at))).one()
        return int(count), datetime.fromisoformat(last) if last else None

    def save_checkpoint(self, verifier: ChainVerifier, *, verified_at: float) -> None:
        """Record that a whole verification found the chain clean up to ``verifier.head`` (keyed)."""
        key, head = self.key, verifier.head
        if key is None or head is None or not verifier.clean:
            return
        state = verifier.state()
        row = dict(seq=head.seq, state=canonical_json(state), mac=checkpoint_mac(state, key=key),
                   verified_at=verified_at)
        with self.engine.begin() as conn:
            done = conn.execute(audit_checkpoints.update().where(audit_checkpoints.c.seq == head.seq)
                                .values(verified_at=verified_at))
            if done.rowcount == 0:
                conn.execute(audit_checkpoints.insert().values(**row))

    def checkpoint(self) -> tuple[dict[str, Any], float] | None:
        """The latest checkpoint (state, when verified) whose HMAC holds and whose head is still the hash of the
        event at its ``seq``; None if there is none (or it does not hold: then everything is read again)."""
        import json

        key = self.key
        if key is None or not inspect(self.engine).has_table(audit_checkpoints.name):
            return None
        c = audit_checkpoints.c
        with self.engine.connect() as conn:
            row = conn.execute(select(c.state, c.mac, c.verified_at).order_by(c.seq.desc()).limit(1)).first()
            if row is None:
                return None
            state = json.loads(row.state)
            if not hmac.compare_digest(checkpoint_mac(state, key=key), row.mac):
                log.warning("audit checkpoint at seq %s does not match its HMAC: ignored", state.get("head"))
                return None
            head = state.get("head") or {}
            now_hash = conn.execute(select(audit_events.c.hash).where(audit_events.c.seq == head.get("seq"))
                                    ).scalar_one_or_none()
        if now_hash != head.get("head"):
            return None
        return state, float(row.verified_at)

    def stage_of(self, group: str) -> Stage:
        """The group's current stage, replayed (and so checked) from its stage events."""
        return current_stage(Stage(e.stage_to) for e in self.events(group=group) if e.stage_to)

    def integrity_problem(self) -> str | None:
        """SQLite's own page-level check: corruption the rows we read may not show."""
        if self.engine.dialect.name != "sqlite":
            return None
        with self.engine.connect() as conn:
            rows = [r[0] for r in conn.execute(text("PRAGMA quick_check"))]
        return None if rows == ["ok"] else f"SQLite integrity check failed: {'; '.join(rows[:3])}"

    def verify(self, *, allow_unanchored_tail: bool = False) -> ChainCheck:
        """The whole chain checked: hashes (HMAC with the key), links, schemes, and the anchored head.

        Never raises for a database it cannot read: that is a broken chain with the reason. An audit table
        whose anchor store is gone is broken (emptied table and deleted anchor is not "nothing happened");
        events after the last anchored head are broken unless ``allow_unanchored_tail``.
        """
        return self.verified(allow_unanchored_tail=allow_unanchored_tail)[0]

    def verified(self, *, allow_unanchored_tail: bool = False, keep_hashes: int = 0
                 ) -> tuple[ChainCheck, ChainVerifier | None]:
        """``verify``, and the verifier that read the chain (None where no chain was read) to feed later events
        to (``ChainWatch``)."""
        def broken(reason: str) -> tuple[ChainCheck, None]:
            return ChainCheck(ok=False, events=0, problems=(reason,)), None

        try:
            corrupt = self.integrity_problem()
            if corrupt:
                return broken(f"the audit database {self.where} is corrupt: {corrupt}")
            table = self.has_table()
            events, unreadable = self.read_events() if table else ([], [])
        except SQLAlchemyError as exc:
            return broken(f"the audit database {self.where} is corrupt or unreadable: {short_error(exc)}")
        try:
            anchor = self.anchor
            point = anchor.latest()
            anchor_exists = getattr(anchor, "exists", lambda: True)()
        except Exception as exc:  # noqa: BLE001 - any anchor failure means the head cannot be checked
            return broken(f"cannot read the anchored head: {exc}")
        try:
            key = self.key
        except AuditKeyError as exc:
            return broken(str(exc))
        if not table:
            if point is not None:
                return ChainCheck(ok=False, events=0, anchor=point, problems=(
                    f"the audit table {audit_events.name} is missing but {point.seq} events were anchored "
                    f"(head seq {point.seq}): it was dropped",)), None
            return broken(f"no audit table {audit_events.name} in {self.where} and no anchored head "
                          f"in {anchor.where}: nothing was ever recorded here")
        if table and not events and not anchor_exists:
            # A writer creates the anchor store with the table: an empty table without it was emptied, and its
            # anchor deleted. (A legacy unkeyed chain, never anchored, still has its events and only gets a note.)
            return broken(f"anchor missing for a chain that was anchored: the audit table in {self.where} is "
                          f"empty and the anchor store {anchor.where} does not exist (deleted?)")
        try:  # every head the store holds, not only the latest: a chain replaced past the old head shows here
            heads = list(getattr(anchor, "heads", lambda: [])())
            permission = getattr(anchor, "permission_problem", lambda: None)()
        except Exception as exc:  # noqa: BLE001
            return broken(f"cannot read the anchored heads: {exc}")
        verifier = ChainVerifier(key=key, keep_hashes=keep_hashes)
        verifier.watch(point)
        for head in heads:
            verifier.watch(head)
        verifier.feed(events)
        check = verifier.check(anchored=True, anchor=point, allow_unanchored_tail=allow_unanchored_tail)
        earlier = verifier.anchored_heads_problems(heads)
        if earlier or permission:
            check = replace(check, ok=check.ok and not earlier, problems=(*check.problems, *earlier),
                            notes=(*check.notes, *([f"warning: {permission}"] if permission else [])))
        if unreadable:
            return replace(check, ok=False, events=check.events + len(unreadable),
                           problems=(*unreadable, *check.problems)), None
        return check, verifier


class ChainWatch:
    """The audit chain's check kept current for a long-lived reader (the board), without reading it all each time.

    The first ``check`` goes on from the latest checkpoint (``AuditStore.checkpoint``: where a whole verification,
    in any process, found the chain clean; keyed, and its head still in the table), else starts a whole
    verification (``AuditStore.verified``) on a thread and waits for it up to ``wait_s``; until that ends, ``check``
    returns None (not verified yet: never a pass). After that each ``check``
    verifies only the events appended since (``ChainVerifier``) against the current anchored head. An edit to an
    event already verified is found by the next whole verification, started in the background once the last (this
    process's, or a checkpoint another saved) is ``full_every_s`` old; its result replaces the running one.
    """

    def __init__(self, store: AuditStore, *, full_every_s: float = 900.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.store = store
        self.full_every_s = full_every_s
        self.clock = clock
        self.wall = wall
        self._lock = threading.Lock()
        self._verifier: ChainVerifier | None = None
        self._check: ChainCheck | None = None  # the last whole verification's, where no verifier can go on
        self._full_at: float | None = None
        self._thread: threading.Thread | None = None

    def _full(self) -> None:
        started, verified_at = self.clock(), self.wall()
        try:
            check, verifier = self.store.verified(keep_hashes=1024)
        except Exception as exc:  # noqa: BLE001 - a verification that could not run is a broken chain, said why
            check, verifier = ChainCheck(ok=False, events=0, problems=(f"the chain could not be verified: "
                                                                        f"{short_error(exc)}",)), None
        if verifier is not None and check.ok:
            try:
                self.store.save_checkpoint(verifier, verified_at=verified_at)
            except Exception as exc:  # noqa: BLE001 - a reader may not write: the next process reads it all again
                log.info("audit checkpoint not saved: %s", short_error(exc))
        with self._lock:
            self._verifier, self._check, self._full_at = verifier, check, started
            self._thread = None

    def _start_full(self) -> threading.Thread:
        if self._thread is None:
            self._thread = threading.Thread(target=self._full, name="promshift-chain-verify", daemon=True)
            self._thread.start()
        return self._thread

    def _resume(self) -> bool:
        """Go on from the latest checkpoint (lock held); its age counts toward the next whole verification."""
        try:
            found = self.store.checkpoint()
        except Exception as exc:  # noqa: BLE001 - no usable checkpoint: verify it all
            log.info("audit checkpoint unreadable: %s", short_error(exc))
            return False
        if found is None:
            return False
        state, verified_at = found
        self._verifier = ChainVerifier.resume(state, key=self.store.key)
        self._full_at = self.clock() - max(0.0, self.wall() - verified_at)
        return True

    def _due(self) -> bool:
        """A whole verification is due: this process's last is old, and no other process saved a newer one."""
        if self._full_at is None or self.clock() - self._full_at <= self.full_every_s:
            return False
        try:
            found = self.store.checkpoint()
        except Exception:  # noqa: BLE001 - then verify here
            found = None
        if found is not None and self.wall() - found[1] <= self.full_every_s:
            self._full_at = self.clock() - max(0.0, self.wall() - found[1])
            return False
        return True

    def _current(self) -> ChainCheck | None:
        """The check as of now (lock held): the verifier caught up with the table, or the last whole check."""
        if self._due():
            self._start_full()
        verifier = self._verifier
        if verifier is None:
            return self._check
        try:
            point = self.store.anchor.latest()
            head = verifier.head
            verifier.feed(self.store.events_after(head.seq if head else 0))
            return verifier.check(anchored=True, anchor=point)
        except LookupError:
            # An anchor on an event this verifier no longer holds: only a whole verification can judge it.
            self._verifier, self._check = None, None
            self._start_full()
            return None
        except Exception as exc:  # noqa: BLE001 - an unreadable tail or anchor is a broken chain, said why
            return ChainCheck(ok=False, events=verifier.count, problems=(f"the chain's newest events could not be "
                                                                         f"verified: {short_error(exc)}",))

    def check(self, *, wait_s: float | None = 1.0) -> ChainCheck | None:
        """The chain's check, or None while the first whole verification runs (after waiting ``wait_s``; None:
        as long as it takes)."""
        with self._lock:
            if self._full_at is not None or self._resume():
                return self._current()
            thread = self._start_full()
        thread.join(wait_s)
        with self._lock:
            return self._current() if self._full_at is not None else None
