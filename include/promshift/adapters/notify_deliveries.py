"""Which notifications were delivered: one row per (group, run, event kind, channel) in the audit database.

A task that is retried, or re-run after its worker died, asks again to tell the owners of the same event.
Before sending, the step *claims* the event's delivery key with one ``INSERT ... ON CONFLICT DO NOTHING``
(SQLite and PostgreSQL, as the routing table); only the claim's holder sends, then marks the row ``sent``
or ``failed``. A later ask finds:

- ``sent``: nothing to do (the earlier try delivered it);
- ``failed``: it takes the claim over (a conditional ``UPDATE`` on the row as it read it) and sends again;
- ``sending`` held by another try of the same task instance: that try is over (Airflow runs one try of a
  task instance at a time), so its worker died between the claim and the mark: take it over and send;
- ``sending`` held by another task, claimed less than ``lease_s`` ago: that task is sending now; skip.

So an event is sent once per channel, a failed send is retried, and only an ambiguous outcome (a worker
that died after the provider accepted the message but before the mark, or a send that outlived its
timeout) can send twice: at least once, never lost for a crash. The table lives in the audit database
(``PROMSHIFT_AUDIT_URL`` / the ``promshift_audit`` connection): every worker reaches it, none keeps it on
its own disk. A row holds ids, the channel and the outcome's one-line error, never an address or a body.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Column, Integer, MetaData, String, Table, select, update
from sqlalchemy.engine import Engine
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

log = logging.getLogger(__name__)

SENDING, SENT, FAILED = "sending", "sent", "failed"
# Far longer than a send may take (PROMSHIFT_NOTIFY_TIMEOUT, 30 s by default): a claim of another task
# that is older than this belongs to a worker that died.
DEFAULT_LEASE_S = 600.0
MAX_ERROR_CHARS = 300

metadata = MetaData()

deliveries_table = Table(
    "promshift_notify_deliveries",
    metadata,
    # core.notify.delivery_key: sha256 of (group, run id, kind, channel, detail).
    Column("delivery_key", String(64), primary_key=True),
    Column("group_name", String(128), nullable=False),
    Column("run_id", String(256), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("channel", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    # How many sends were started (1 on the first claim).
    Column("attempts", Integer, nullable=False),
    # The task instance and try that holds the claim ("dag/task/map_index" and the try number), and a token
    # of the claim itself: only the holder marks the outcome.
    Column("holder_task", String(512), nullable=False),
    Column("holder_try", Integer, nullable=False),
    Column("claim_token", String(36), nullable=False),
    # ISO text with offset, as the audit events keep ``at``.
    Column("claimed_at", String(40), nullable=False),
    Column("finished_at", String(40), nullable=True),
    Column("error", String(MAX_ERROR_CHARS), nullable=True),
)


class DeliveryError(RuntimeError):
    """The delivery table cannot be read or written (database unreachable, table missing)."""


class Holder(NamedTuple):
    """Who asks to send: the task instance (``dag/task/map_index``) and its try number."""

    task: str
    try_number: int


class Claim(NamedTuple):
    """The answer to ``claim``: send only when ``owned``; ``state`` and ``attempts`` are the row's after it."""

    owned: bool
    state: str
    attempts: int
    token: str | None = None
    holder: str | None = None


class DeliveryLedger:
    """delivery key -> state (sending, sent, failed), one row per event and channel in the audit database."""

    def __init__(self, url: str | None = None, *, engine: Engine | None = None,
                 lease_s: float = DEFAULT_LEASE_S) -> None:
        self.url = url or default_audit_url()
        self.lease = timedelta(seconds=lease_s)
        self.where = f"{redacted(self.url)} table {deliveries_table.name}"
        if refused := unsupported_upsert_backend(self.url):
            raise DeliveryError(f"delivery table {self.where}: {refused}")
        try:
            self.engine = engine or open_engine(self.url, create=True)
            create_tables(metadata, self.engine, deliveries_table)
        except SQLAlchemyError as exc:
            raise DeliveryError(f"delivery table {self.where} cannot be opened: {short_error(exc)}") from None

    def _fail(self, exc: SQLAlchemyError) -> DeliveryError:
        return DeliveryError(f"delivery table {self.where} is unreadable: {short_error(exc)}")

    def claim(self, key: str, *, group: str, run_id: str, kind: str, channel: str, holder: Holder,
              now: datetime) -> Claim:
        """Take the right to send the event ``key``, or learn why not (already sent, being sent elsewhere)."""
        t = deliveries_table
        token = str(uuid.uuid4())
        mine = {"state": SENDING, "holder_task": holder.task, "holder_try": holder.try_number,
                "claim_token": token, "claimed_at": now.isoformat(), "finished_at": None, "error": None}
        try:
            with self.engine.begin() as conn:
                stmt = dialect_insert(t, conn.dialect.name).values(
                    delivery_key=key, group_name=group, run_id=run_id, kind=kind, channel=channel, attempts=1, **mine)
                # RETURNING, not rowcount: through SQLAlchemy and psycopg this INSERT reports rowcount -1 (measured).
                inserted = conn.execute(stmt.on_conflict_do_nothing(index_elements=[t.c.delivery_key])
                                        .returning(t.c.delivery_key)).first()
                if inserted is not None:
                    return Claim(True, SENDING, 1, token, holder.task)
                row = conn.execute(select(t).where(t.c.delivery_key == key)).one()
                if not self._may_take_over(row, holder, now):
                    return Claim(False, row.state, row.attempts, None, row.holder_task)
                # Conditional on the row as read: of two askers taking over at once, one wins.
                taken = conn.execute(update(t).where(t.c.delivery_key == key, t.c.state == row.state,
                                                     t.c.claim_token == row.claim_token)
                                     .values(attempts=t.c.attempts + 1, **mine)).rowcount
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        if taken != 1:
            return Claim(False, SENDING, row.attempts + 1, None, None)
        log.info("notification %s via %s: taking over a %s claim of %s try %s", kind, channel, row.state,
                 row.holder_task, row.holder_try)
        return Claim(True, SENDING, row.attempts + 1, token, holder.task)

    def _may_take_over(self, row: Any, holder: Holder, now: datetime) -> bool:
        if row.state == SENT:
            return False
        if row.state == FAILED:
            return True
        if row.holder_task == holder.task and row.holder_try != holder.try_number:
            return True  # an earlier try of this task instance: it is over, it died mid-send
        try:
            claimed = datetime.fromisoformat(row.claimed_at)
        except ValueError:
            return True
        return now - claimed >= self.lease

    def finish(self, key: str, claim: Claim, *, sent: bool, now: datetime, error: str | None = None) -> bool:
        """Mark the outcome of the send ``claim`` allowed; False when the claim was taken over meanwhile."""
        if not claim.owned or claim.token is None:
            raise ValueError("only an owned claim has an outcome to mark")
        t = deliveries_table
        values = {"state": SENT if sent else FAILED, "finished_at": now.isoformat(),
                  "error": None if sent else (error or "failed")[:MAX_ERROR_CHARS]}
        try:
            with self.engine.begin() as conn:
                done = conn.execute(update(t).where(t.c.delivery_key == key, t.c.claim_token == claim.token)
                                    .values(**values)).rowcount
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return done == 1

    def get(self, key: str) -> dict[str, Any] | None:
        """The row of ``key`` (state, attempts, holder, times, error), or None."""
        try:
            with self.engine.connect() as conn:
                row = conn.execute(select(deliveries_table).where(deliveries_table.c.delivery_key == key)).first()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return dict(row._mapping) if row else None
