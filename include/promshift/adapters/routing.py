"""The routing state: which backend serves each metric group's reads, one row per group in the audit database.

Each change is one transaction holding one statement on the group's own row (``INSERT ... ON CONFLICT
DO UPDATE``, SQLite and PostgreSQL only), so two groups cutting over at once on different workers both
keep their entry, and two writers of one group both count: there is no read-modify-write. The table lives in
the audit database (``PROMSHIFT_AUDIT_URL``, else the Airflow connection ``promshift_audit``'s
``extra.url`` in the Airflow shell, else SQLite under ``PROMSHIFT_HOME``): every worker reaches it.

``routing.json`` under ``PROMSHIFT_HOME`` is no longer written or read by the migration; an old file can
be taken into the store once with ``RoutingStore.import_manifest`` (entries the store already holds win).
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, inspect, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from promshift.adapters.audit_store import (
    create_tables,
    default_audit_url,
    dialect_insert,
    open_engine,
    redacted,
    short_error,
    unsupported_upsert_backend,
)
from promshift.adapters.settings import state_home
from promshift.core.errors import RoutingError

log = logging.getLogger(__name__)

READ_FROM = ("source", "target")

metadata = MetaData()

routing_table = Table(
    "promshift_routing",
    metadata,
    Column("group_name", String(128), primary_key=True),
    Column("read_from", String(16), nullable=False),
    Column("url", String(2048), nullable=False),
    Column("run_id", String(256), nullable=False),
    # ISO text, as the audit events keep ``at``: the route's own time ("since") and the write's wall clock.
    Column("since", String(40), nullable=False),
    Column("updated_at", String(40), nullable=False),
    # How many times the row was written: 1 on the first route.
    Column("version", Integer, nullable=False),
    # The group's (source, target) connection ids when it was routed: with the group, the route's key.
    # NULL in rows written before per-group connections (they were promshift_source/promshift_target).
    Column("source_conn", String(256), nullable=True),
    Column("target_conn", String(256), nullable=True),
)
# Columns added after the table's first release: an older table gets them when a store opens it.
_ADDED_COLUMNS = ("source_conn", "target_conn")


def legacy_manifest_path() -> Path:
    """Where the JSON routing manifest used to live (read only by ``import_manifest``)."""
    return state_home() / "routing.json"


def _route_of(row: Any) -> dict[str, Any]:
    """The route; ``source``/``target`` (connection ids) only when it was routed with its pair."""
    route = {"read_from": row.read_from, "url": row.url, "since": row.since, "run_id": row.run_id}
    if row.source_conn is not None or row.target_conn is not None:
        route.update(source=row.source_conn, target=row.target_conn)
    return route


class RoutingStore:
    """group -> {read_from, url, since, run_id, source, target}, one row per group in the audit database.

    The table is created when the store is opened, never afterwards: if it disappears, every
    call raises ``RoutingError`` rather than starting over with no routes.
    """

    def __init__(self, url: str | None = None, *, engine: Engine | None = None) -> None:
        self.url = url or default_audit_url()
        self.where = f"{redacted(self.url)} table {routing_table.name}"
        if refused := unsupported_upsert_backend(self.url):
            raise RoutingError(f"routing store {self.where}: {refused}")
        try:
            self.engine = engine or open_engine(self.url, create=True)
            self._create_table()
        except SQLAlchemyError as exc:
            raise RoutingError(f"routing store {self.where} cannot be opened: {short_error(exc)}") from None

    def _create_table(self) -> None:
        create_tables(metadata, self.engine, routing_table)
        self._add_columns()

    def _add_columns(self) -> None:
        """A table from before per-group connections gets ``source_conn``/``target_conn`` (NULL in old rows)."""
        for column in _ADDED_COLUMNS:
            if column in {c["name"] for c in inspect(self.engine).get_columns(routing_table.name)}:
                continue
            try:
                with self.engine.begin() as conn:
                    conn.execute(text(f"ALTER TABLE {routing_table.name} ADD COLUMN {column} VARCHAR(256)"))
                log.info("routing table %s gained column %s", self.where, column)
            except SQLAlchemyError:
                # Another worker added it first.
                if column not in {c["name"] for c in inspect(self.engine).get_columns(routing_table.name)}:
                    raise

    def _fail(self, exc: SQLAlchemyError) -> RoutingError:
        return RoutingError(f"routing store {self.where} is unreadable or corrupt: {short_error(exc)}")

    # -- reads ----------------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        """``{"groups": {group: {read_from, url, since, run_id}}}`` (the old manifest's shape)."""
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(select(routing_table).order_by(routing_table.c.group_name)).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return {"groups": {r.group_name: _route_of(r) for r in rows}}

    def get(self, group: str) -> dict[str, Any] | None:
        """The group's route, or None if it was never routed."""
        try:
            with self.engine.connect() as conn:
                row = conn.execute(select(routing_table).where(routing_table.c.group_name == group)).first()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return _route_of(row) if row else None

    def read_from(self, group: str) -> str:
        route = self.get(group)
        return route["read_from"] if route else "source"

    def version(self, group: str) -> int:
        """How many times the group's row was written (0: never routed)."""
        try:
            with self.engine.connect() as conn:
                v = conn.execute(select(routing_table.c.version)
                                 .where(routing_table.c.group_name == group)).scalar()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return int(v or 0)

    # -- the one write --------------------------------------------------------------------------
    def route(self, group: str, *, read_from: str, url: str, at: datetime, run_id: str,
              pair: tuple[str, str] | None = None) -> dict[str, Any]:
        """Point the group's reads at ``read_from`` in one transaction on its own row; returns the route.

        ``pair``: the group's (source, target) connection ids, kept with the route (its key with the group).
        """
        if read_from not in READ_FROM:
            raise ValueError(f"read_from must be one of {', '.join(READ_FROM)}, got {read_from!r}")
        source, target = pair if pair is not None else (None, None)
        values = {"group_name": group, "read_from": read_from, "url": url, "run_id": run_id,
                  "since": at.isoformat(), "updated_at": datetime.now(UTC).isoformat(),
                  "source_conn": source, "target_conn": target}
        try:
            with self.engine.begin() as conn:
                self._upsert(conn, values)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        route = {"read_from": read_from, "url": url, "since": values["since"], "run_id": run_id}
        return route if pair is None else {**route, "source": source, "target": target}

    def _upsert(self, conn: Connection, values: dict[str, Any]) -> None:
        """INSERT ... ON CONFLICT (group_name) DO UPDATE: one atomic statement on the group's row."""
        t = routing_table
        stmt = dialect_insert(t, conn.dialect.name).values(**values, version=1)
        changed = {k: stmt.excluded[k] for k in values if k != "group_name"}
        conn.execute(stmt.on_conflict_do_update(index_elements=[t.c.group_name],
                                                set_={**changed, "version": t.c.version + 1}))

    # -- the old JSON manifest ------------------------------------------------------------------
    def import_manifest(self, path: str | os.PathLike[str] | None = None) -> list[str]:
        """Take the groups of an old ``routing.json`` that the store does not hold yet; returns their names.

        Groups already in the store keep their row (the store is newer than any file). The file is
        left as it was; a missing file imports nothing.
        """
        path = Path(path) if path else legacy_manifest_path()
        if not path.exists():
            return []
        try:
            data = json.loads(path.read_bytes())
            groups = data["groups"]
            if not isinstance(groups, dict) or not all(isinstance(v, dict) for v in groups.values()):
                raise ValueError('not {"groups": {group: route}}')
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RoutingError(f"routing manifest {path} is unreadable or corrupt: {exc}") from None
        taken: list[str] = []
        try:
            for group, route in sorted(groups.items()):
                values = {"group_name": group, "read_from": route["read_from"], "url": route.get("url", ""),
                          "run_id": route.get("run_id", ""), "since": route.get("since", ""),
                          "updated_at": datetime.now(UTC).isoformat(), "version": 1}
                with self.engine.begin() as conn:
                    # A row already there (routed, or imported by another worker first) wins.
                    # (RETURNING: the driver's rowcount is not reliable here; a skipped row returns nothing.)
                    insert = dialect_insert(routing_table, conn.dialect.name).values(**values)
                    if conn.execute(insert.on_conflict_do_nothing(index_elements=[routing_table.c.group_name])
                                    .returning(routing_table.c.group_name)).first() is not None:
                        taken.append(group)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        except KeyError as exc:
            raise RoutingError(f"routing manifest {path} has a route without {exc}") from None
        if taken:
            log.info("routing: imported %s group(s) from the old manifest %s into %s: %s",
                     len(taken), path, self.where, ", ".join(taken))
        return taken
