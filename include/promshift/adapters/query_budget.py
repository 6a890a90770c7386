"""The query budget's shared ledger: one row per workspace minute and per check run, in the audit database.

Every worker that sends a check's queries to a workspace takes from the same rows (no state on one worker's disk).
A take reads the rows, lets ``core.query_budget.take`` decide, and writes the new counts only if nobody changed the
rows meanwhile (compare-and-set on a version column, in one transaction); a writer that lost the race reads again.
So two workers can never both spend the last query of a minute, on SQLite or PostgreSQL.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from promshift.adapters.audit_store import create_tables, default_audit_url, open_engine
from promshift.core.query_budget import BudgetCount, Grant, QueryBudget, QueryBudgetExhausted, take

log = logging.getLogger(__name__)

budget_metadata = MetaData()
query_budget_counts = Table(
    "promshift_query_budget",
    budget_metadata,
    # "minute:<workspace>" or "run:<workspace>:<run key>"
    Column("scope", String(600), primary_key=True),
    Column("window_start", Float, nullable=False),
    Column("used", Integer, nullable=False),
    Column("version", Integer, nullable=False),
)
# Longest scope key part kept: a run key is a DAG id and run id (each at most 250 in Airflow).
_MAX_KEY = 280
ATTEMPTS = 200


class QueryBudgetLedger:
    """Takes from workspaces' query budgets, shared by every worker through one database (default: the audit
    database, ``PROMSHIFT_AUDIT_URL``)."""

    def __init__(self, url: str | None = None, *, engine: Engine | None = None) -> None:
        self.url = url or default_audit_url()
        self.engine = engine or open_engine(self.url, create=True)
        create_tables(budget_metadata, self.engine, query_budget_counts)

    def _read(self, conn: Connection, scope: str) -> tuple[BudgetCount | None, int | None]:
        row = conn.execute(select(query_budget_counts).where(query_budget_counts.c.scope == scope)).first()
        if row is None:
            return None, None
        return BudgetCount(row.window_start, row.used), row.version

    @staticmethod
    def _write(conn: Connection, scope: str, count: BudgetCount, version: int | None) -> bool:
        t = query_budget_counts
        if version is None:
            conn.execute(t.insert().values(scope=scope, window_start=count.window, used=count.used, version=1))
            return True
        done = conn.execute(t.update().where(t.c.scope == scope, t.c.version == version)
                            .values(window_start=count.window, used=count.used, version=version + 1))
        return done.rowcount == 1

    def take(self, budget: QueryBudget, *, workspace: str, run_key: str, now: float, queries: int = 1) -> Grant:
        """Take ``queries`` for ``run_key`` on ``workspace`` at ``now`` (seconds since the epoch), atomically."""
        minute_scope = f"minute:{workspace[:_MAX_KEY]}"
        run_scope = f"run:{workspace[:_MAX_KEY]}:{run_key[:_MAX_KEY]}"
        for attempt in range(ATTEMPTS):
            try:
                with self.engine.connect() as conn:
                    minute, minute_version = self._read(conn, minute_scope)
                    run, run_version = self._read(conn, run_scope)
                    grant = take(budget, workspace=workspace, minute=minute, run=run, now=now, queries=queries)
                    if not grant.ok:
                        conn.rollback()
                        return grant
                    if (self._write(conn, minute_scope, grant.minute, minute_version)
                            and self._write(conn, run_scope, grant.run, run_version)):
                        conn.commit()
                        return grant
                    conn.rollback()  # a row changed since it was read: read again
            except (IntegrityError, OperationalError) as exc:
                # Another worker inserted the row first, or held SQLite's write lock past its timeout.
                log.debug("query budget: %s (attempt %d); reading again", type(exc).__name__, attempt + 1)
            time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 20)))
        raise RuntimeError(f"query budget of workspace {workspace!r}: no consistent take after {ATTEMPTS} attempts")


class WorkspaceQueryGate:
    """What a ``PrometheusClient`` calls before each query to one workspace: take one query from its budget, wait
    for the next minute when that minute is spent (at most ``budget.max_wait_s`` in all), else raise
    ``QueryBudgetExhausted``."""

    def __init__(self, ledger: QueryBudgetLedger, budget: QueryBudget, *, workspace: str, run_key: str,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.ledger, self.budget, self.workspace, self.run_key = ledger, budget, workspace, run_key
        self.clock, self.sleep = clock, sleep
        self.waited_s = 0.0
        self.taken = 0

    def __call__(self) -> None:
        while True:
            grant = self.ledger.take(self.budget, workspace=self.workspace, run_key=self.run_key, now=self.clock())
            if grant.ok:
                self.taken += 1
                return
            if grant.wait_s is None or self.waited_s + grant.wait_s > self.budget.max_wait_s:
                waited = f" after waiting {self.waited_s:.0f}s" if self.waited_s else ""
                raise QueryBudgetExhausted(f"{grant.reason}{waited}")
            log.info("%s; waiting %.1fs for the next minute", grant.reason, grant.wait_s)
            # A little past the minute's start, so this worker does not read the old minute again.
            pause = grant.wait_s + 0.05
            self.sleep(pause)
            self.waited_s += pause


def query_gate(extra: dict[str, Any], *, workspace: str, run_key: str, ledger: QueryBudgetLedger | None = None
               ) -> WorkspaceQueryGate | None:
    """The gate for a target connection whose extra sets ``query_budget``; None when it sets none."""
    budget = QueryBudget.from_mapping(extra.get("query_budget"), where=f"connection {workspace!r} extra.query_budget")
    if not budget.limited:
        return None
    return WorkspaceQueryGate(ledger or QueryBudgetLedger(), budget, workspace=workspace, run_key=run_key)
