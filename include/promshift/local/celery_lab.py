"""What ``make demo EXECUTOR=celery`` needs besides Airflow: Redis as the broker, PostgreSQL for the databases.

Both are the machine's own services (Redis at 127.0.0.1:6379, PostgreSQL at 127.0.0.1:5432 with trust
auth); the demo only uses a Redis database number and PostgreSQL databases of its own:

- ``promshift_airflow_<port>``: Airflow's metadata (and Celery's results);
- ``promshift_audit_<port>``: the audit log and the routing table (``promshift_audit``'s ``extra.url``);
- ``promshift_anchor_<port>``: the audit chain's anchored heads (``PROMSHIFT_AUDIT_ANCHOR_URL``), a
  different database than the audit log's, as in production.

A fresh demo drops and recreates these, and only databases it created itself (each carries a
comment saying so): a database of that name the user made is refused, never dropped. Celery tasks
go to a queue of their own (``promshift-<port>``), so two demos on one Redis database never take
each other's tasks.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/5"
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DB_COMMENT = "created by promshift's local demo (make demo EXECUTOR=celery); dropped by the next one"
DB_ROLES = ("airflow", "audit", "anchor")
# How to start each service on this kind of machine (Debian packages).
REDIS_START = "service redis-server start"
POSTGRES_START = "service postgresql start"


class ServiceUnavailable(RuntimeError):
    """Redis or PostgreSQL cannot be reached: one line saying which and how to start it."""


def redis_problem(url: str, error: BaseException | str) -> str:
    """The one-line refusal when the broker does not answer."""
    where = _host_port(url, 6379)
    return (f"Redis is not reachable at {where} ({_short(error)}): the celery executor needs it as its broker; "
            f"start it with `{REDIS_START}` (or point PROMSHIFT_REDIS_URL at one)")


def postgres_problem(url: str, error: BaseException | str) -> str:
    """The one-line refusal when PostgreSQL does not answer (or refuses the user)."""
    where = _host_port(url, 5432)
    user = _url_user(url)
    return (f"PostgreSQL is not reachable at {where}{f' as {user}' if user else ''} ({_short(error)}): the celery "
            f"executor keeps Airflow's metadata and the audit log there; start it with `{POSTGRES_START}` "
            "(or point PROMSHIFT_PG_URL at one)")


def _short(error: BaseException | str) -> str:
    if isinstance(error, str):
        text = error
    else:
        lines = str(error).strip().splitlines()
        text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return " ".join(text.split())[:200]


def _host_port(url: str, default_port: int) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        port = parts.port or default_port
    except ValueError:
        port = default_port
    return f"{parts.hostname or '127.0.0.1'}:{port}"


def _url_user(url: str) -> str | None:
    from urllib.parse import urlsplit

    return urlsplit(url).username


def database_name(role: str, port: int) -> str:
    """``promshift_<role>_<port>``: one set of databases per Airflow port, as one set of state per PROMSHIFT_HOME."""
    if role not in DB_ROLES:
        raise ValueError(f"role must be one of {', '.join(DB_ROLES)}, got {role!r}")
    return f"promshift_{role}_{int(port)}"


@dataclass(frozen=True)
class CeleryServices:
    """Where the broker and the PostgreSQL server are, and the names this demo uses in them."""

    port: int  # the Airflow API server's port: it names the queue, the databases and the workers
    redis_url: str = DEFAULT_REDIS_URL
    pg_url: str = DEFAULT_PG_URL  # a SQLAlchemy URL of a maintenance database (CREATE/DROP DATABASE run there)
    workers: int = 2

    @classmethod
    def from_env(cls, port: int, *, workers: int = 2) -> CeleryServices:
        return cls(port=port, redis_url=os.environ.get("PROMSHIFT_REDIS_URL") or DEFAULT_REDIS_URL,
                   pg_url=os.environ.get("PROMSHIFT_PG_URL") or DEFAULT_PG_URL, workers=workers)

    @property
    def queue(self) -> str:
        return f"promshift-{self.port}"

    def worker_queues(self) -> list[str]:
        """Each worker's own queue (besides the common one): where the demo's policy pins parity shards."""
        return [f"{self.queue}-w{i}" for i in range(1, self.workers + 1)]

    def worker_names(self) -> list[str]:
        """Celery hostnames (``w1-<port>@<host>``); Airflow records the same as each task's hostname."""
        host = socket.gethostname()
        return [f"w{i}-{self.port}@{host}" for i in range(1, self.workers + 1)]

    def database_url(self, role: str, *, driver: str | None = None) -> str:
        """The SQLAlchemy URL of this demo's ``role`` database (``driver``: another one, e.g. ``psycopg_async``)."""
        from sqlalchemy import make_url

        url = make_url(self.pg_url).set(database=database_name(role, self.port))
        if driver:
            url = url.set(drivername=f"{url.get_backend_name()}+{driver}")
        return url.render_as_string(hide_password=False)

    # -- checks --------------------------------------------------------------------------
    def problem(self, timeout_s: float = 5.0) -> str | None:
        """Why the demo cannot run (Redis first, then PostgreSQL), in one line; None when both answer."""
        try:
            import redis

            client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:  # noqa: BLE001 - any failure to PING is "not reachable"
            return redis_problem(self.redis_url, exc)
        try:
            with self._admin(timeout_s) as conn:
                conn.execute("SELECT 1")
        except Exception as exc:  # noqa: BLE001 - refused, unknown host, wrong user: all one line
            return postgres_problem(self.pg_url, exc)
        return None

    def require(self) -> None:
        problem = self.problem()
        if problem:
            raise ServiceUnavailable(problem)

    # -- fresh state ---------------------------------------------------------------------
    def _admin(self, timeout_s: float = 10.0) -> Any:
        import psycopg
        from sqlalchemy import make_url

        url = make_url(self.pg_url)
        return psycopg.connect(host=url.host or "127.0.0.1", port=url.port or 5432, user=url.username,
                               password=url.password, dbname=url.database or "postgres",
                               connect_timeout=max(1, int(timeout_s)), autocommit=True)

    def recreate_databases(self) -> list[str]:
        """Drop (if this demo made them) and create its databases; returns their names.

        A database of that name that does not carry this demo's comment belongs to someone else: refused.
        """
        from psycopg import sql

        names = [database_name(role, self.port) for role in DB_ROLES]
        with self._admin() as conn:
            for name in names:
                row = conn.execute(
                    "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                    (name,)).fetchone()
                if row is not None:
                    if row[0] != DB_COMMENT:
                        raise ServiceUnavailable(
                            f"PostgreSQL already has a database {name} that promshift's demo did not create; "
                            "refusing to drop it (drop or rename it yourself, or use another PROMSHIFT_AIRFLOW_PORT)")
                    conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name),
                                                                           sql.Literal(DB_COMMENT)))
        log.info("PostgreSQL databases (re)created: %s", ", ".join(names))
        return names

    def drop_databases(self) -> list[str]:
        """Drop this demo's databases (only those carrying its comment); returns the names dropped."""
        from psycopg import sql

        dropped = []
        with self._admin() as conn:
            for name in (database_name(role, self.port) for role in DB_ROLES):
                row = conn.execute(
                    "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                    (name,)).fetchone()
                if row is not None and row[0] == DB_COMMENT:
                    conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
                    dropped.append(name)
        return dropped

    def clear_queue(self) -> int:
        """Drop tasks a previous demo on this port left in its queues (its databases are gone); how many queues."""
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=5, socket_timeout=5)
        try:
            return int(client.delete(self.queue, *self.worker_queues()))
        finally:
            client.close()

    def workers_answering(self, names: list[str], timeout_s: float = 3.0) -> set[str]:
        """The Celery workers among ``names`` that answer a ping over the broker now."""
        from celery import Celery

        app = Celery("promshift-demo-ping", broker=self.redis_url)
        try:
            replies = app.control.ping(destination=names, timeout=timeout_s) or []
        finally:
            app.close()
        return {name for reply in replies for name in reply if name in names}
