"""Teams as FAB roles or groups: the team directory when Airflow runs the FAB auth manager.

A ``team:<name>`` approver is the FAB role ``<name>`` (whoever holds it directly, or through a FAB group that
holds it: FAB's own ``get_user_roles``) or, when no role has that name, the FAB group ``<name>``. Each member
is the id FAB's auth manager gives Airflow for that user (``User.get_id()``: ``str(ab_user.id)``), which is the
id HITL assigns a request to and records as ``responded_by``; its name is the username, the
``triggering_user_name`` of a run that user triggered (four eyes compares both). Inactive users cannot log in
and are left out.

The six ``ab_*`` tables are read with SQLAlchemy Core (their names and columns as FAB's models declare them,
checked against the FAB provider's own models in tests/unit/adapters/test_fab_teams.py), so a worker needs no FAB or
Flask installed: only a read-only login to the database that holds them (the metadata database by default),
named by an Airflow connection (``orchestration/approver_teams.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Boolean, Column, Integer, MetaData, String, Table, create_engine, select, union
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from promshift.core.approvers import Approver, ApproversError

# A team is an on-call rotation; a role held by hundreds (FAB's "Viewer") is not one, and HITL's request lists
# every assignee.
MAX_TEAM_MEMBERS = 100
CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_S = 10
# Airflow connection types -> SQLAlchemy drivers (the ones promshift's own databases use, and MySQL's).
DRIVERS = {"postgres": "postgresql+psycopg", "postgresql": "postgresql+psycopg", "mysql": "mysql+mysqldb",
           "sqlite": "sqlite"}

_FAB = MetaData()
AB_USER = Table("ab_user", _FAB, Column("id", Integer, primary_key=True), Column("username", String(512)),
                Column("active", Boolean))
AB_ROLE = Table("ab_role", _FAB, Column("id", Integer, primary_key=True), Column("name", String(64)))
AB_GROUP = Table("ab_group", _FAB, Column("id", Integer, primary_key=True), Column("name", String(100)))
AB_USER_ROLE = Table("ab_user_role", _FAB, Column("user_id", Integer), Column("role_id", Integer))
AB_USER_GROUP = Table("ab_user_group", _FAB, Column("user_id", Integer), Column("group_id", Integer))
AB_GROUP_ROLE = Table("ab_group_role", _FAB, Column("group_id", Integer), Column("role_id", Integer))


def fab_database_url(conn: Mapping[str, Any]) -> URL:
    """The SQLAlchemy URL of an Airflow connection's fields (``conn_type``, ``host``, ``port``, ``login``,
    ``password``, ``schema``); for ``sqlite`` the file is ``host`` (or ``schema``)."""
    conn_type = str(conn.get("conn_type") or "")
    driver = DRIVERS.get(conn_type)
    if driver is None:
        raise ApproversError(f"FAB's user database: connection type {conn_type!r} is not one of "
                             f"{', '.join(sorted(DRIVERS))}")
    if driver == "sqlite":
        path = conn.get("host") or conn.get("schema")
        if not path:
            raise ApproversError("FAB's user database: a sqlite connection names its file as host")
        return URL.create("sqlite", database=str(path))
    port = conn.get("port")
    return URL.create(driver, username=conn.get("login") or None, password=conn.get("password") or None,
                      host=conn.get("host") or None, port=int(port) if port else None,
                      database=conn.get("schema") or None)


def fab_engine(url: URL) -> Engine:
    """An engine with connect and statement time limits, and no pool (a task asks once)."""
    if url.get_backend_name() == "sqlite":
        args: dict[str, Any] = {"timeout": CONNECT_TIMEOUT_S}
    elif url.get_backend_name() == "postgresql":
        args = {"connect_timeout": CONNECT_TIMEOUT_S, "options": f"-c statement_timeout={STATEMENT_TIMEOUT_S}s"}
    else:
        args = {"connect_timeout": CONNECT_TIMEOUT_S}
    try:
        return create_engine(url, poolclass=NullPool, connect_args=args)
    except ImportError as exc:  # the driver is not installed on this worker
        raise ApproversError(f"FAB's user database: no driver for {url.drivername} here ({exc.name})") from None


class FabTeams:
    """``TeamDirectory`` over FAB's tables: a team is a FAB role (held directly or through a group), else a group."""

    def __init__(self, engine: Engine, *, source: str) -> None:
        self.engine = engine
        self.source = source

    def members(self, team: str) -> list[Approver]:
        try:
            with self.engine.connect() as db:
                role_id = db.scalar(select(AB_ROLE.c.id).where(AB_ROLE.c.name == team))
                if role_id is not None:
                    ids = union(
                        select(AB_USER_ROLE.c.user_id).where(AB_USER_ROLE.c.role_id == role_id),
                        select(AB_USER_GROUP.c.user_id)
                        .join(AB_GROUP_ROLE, AB_GROUP_ROLE.c.group_id == AB_USER_GROUP.c.group_id)
                        .where(AB_GROUP_ROLE.c.role_id == role_id))
                    what = "role"
                else:
                    group_id = db.scalar(select(AB_GROUP.c.id).where(AB_GROUP.c.name == team))
                    if group_id is None:
                        raise ApproversError(f"team {team!r} is neither a role nor a group in {self.source}")
                    ids = select(AB_USER_GROUP.c.user_id).where(AB_USER_GROUP.c.group_id == group_id)
                    what = "group"
                rows = db.execute(select(AB_USER.c.id, AB_USER.c.username)
                                  .where(AB_USER.c.id.in_(ids), AB_USER.c.active.is_(True))
                                  .order_by(AB_USER.c.id).limit(MAX_TEAM_MEMBERS + 1)).all()
        except SQLAlchemyError as exc:
            reason = str(getattr(exc, "orig", None) or exc.__class__.__name__).splitlines()[0][:200]
            raise ApproversError(f"team {team!r}: {self.source} could not be read: {reason}") from None
        if len(rows) > MAX_TEAM_MEMBERS:
            raise ApproversError(f"team {team!r}: the FAB {what} {team!r} in {self.source} has more than "
                                 f"{MAX_TEAM_MEMBERS} active users; a team is an on-call rotation")
        return [Approver(str(user_id), str(username)) for user_id, username in rows]
