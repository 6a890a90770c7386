"""Teams as FAB roles or groups: the team directory when Airflow runs the FAB auth manager.

A ``team:<name>`` approver is the FAB role ``<name>`` (whoever holds it directly, or through a FAB group that
holds it: FAB's own ``get_user_roles``) or, when no role has that name, the FAB group ``<name>``. Each member
is the id FAB's auth manager gives Airflow for that user (``User.get_id()``: ``str(ab_user.id)``), which is the
id HITL assigns a request to and records as ``responded_by``; its name is the username, the
``triggering_user_name`` of a run that user triggered (four eyes compares both). Inactive users cannot log in
and are left out.

Two halves, so that no worker holds a login to the metadata database (Airflow 3's task isolation):

- ``FabTeams`` runs **on the API server** (the board's ``/promshift/api/teams/<team>``), over the API server's
  own database engine: the six ``ab_*`` tables read with SQLAlchemy Core (their names and columns as FAB's
  models declare them, checked against the FAB provider's models in tests/unit/adapters/test_fab_teams.py).
- ``FabApiTeams`` runs **on a worker**: it logs in with FAB's own token route (``POST /auth/token``, a FAB
  service user's name and password from an Airflow connection) and asks the board's route with that JWT.

FAB's REST API (``/auth/fab/v1/users``, ``/auth/fab/v1/roles``, provider 3.10) cannot be the directory itself:
its ``UserResponse`` carries no user id (HITL needs FAB's numeric id) and no groups, and its pages are cut to
``[api] maximum_page_limit``. The board's route asks for the same permission FAB's ``GET /auth/fab/v1/users``
does (``can read on Users``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import requests
from sqlalchemy import Boolean, Column, Integer, MetaData, String, Table, select, text, union
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from promshift.core.approvers import TEAM_NAME_RE, Approver, ApproversError, UnknownTeam

# A team is an on-call rotation; a role held by hundreds (FAB's "Viewer") is not one, and HITL's request lists
# every assignee.
MAX_TEAM_MEMBERS = 100
# The API server's reads of FAB's tables: a locked or huge table answers within this, or the team is unreadable.
STATEMENT_TIMEOUT_S = 5.0
# The worker's call to the API server: connect and read budgets, and the answer's size.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 20.0
MAX_ANSWER_BYTES = 1 << 20
# Where the board serves a team's members (the board is mounted at /promshift on the API server).
TEAMS_PATH = "/promshift/api/teams/"
TOKEN_PATH = "/auth/token"

_FAB = MetaData()
AB_USER = Table("ab_user", _FAB, Column("id", Integer, primary_key=True), Column("username", String(512)),
                Column("active", Boolean))
AB_ROLE = Table("ab_role", _FAB, Column("id", Integer, primary_key=True), Column("name", String(64)))
AB_GROUP = Table("ab_group", _FAB, Column("id", Integer, primary_key=True), Column("name", String(100)))
AB_USER_ROLE = Table("ab_user_role", _FAB, Column("user_id", Integer), Column("role_id", Integer))
AB_USER_GROUP = Table("ab_user_group", _FAB, Column("user_id", Integer), Column("group_id", Integer))
AB_GROUP_ROLE = Table("ab_group_role", _FAB, Column("group_id", Integer), Column("role_id", Integer))


class FabTeams:
    """``TeamDirectory`` over FAB's tables (on the API server): a team is a FAB role (held directly or through a
    group), else a group."""

    def __init__(self, engine: Engine, *, source: str, statement_timeout_s: float = STATEMENT_TIMEOUT_S) -> None:
        self.engine = engine
        self.source = source
        self.statement_timeout_s = statement_timeout_s

    def members(self, team: str) -> list[Approver]:
        try:
            with self.engine.connect() as db, db.begin():
                budgeted(db, self.statement_timeout_s)
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
                        raise UnknownTeam(f"team {team!r} is neither a role nor a group in {self.source}")
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


def budgeted(db: Connection, timeout_s: float) -> None:
    """Bound every statement of ``db``'s open transaction to ``timeout_s`` on PostgreSQL (a transaction-local
    ``statement_timeout``: the pooled connection goes back to Airflow as it was). Not bounded here: MySQL (its
    ``max_execution_time`` is per session, not per transaction; not tested on this machine) and SQLite (a
    single-machine lab; it waits at most its busy timeout)."""
    if db.dialect.name == "postgresql":
        db.execute(text("SELECT set_config('statement_timeout', :ms, true)"),
                   {"ms": str(max(1, int(timeout_s * 1000)))})


class FabApiTeams:
    """``TeamDirectory`` on a worker: the API server's answer for a team, with a JWT from FAB's token route.

    Every failure is one ``ApproversError`` line naming the API server (never the password or the token); an
    unreachable API server or a refused login asks nobody: there is no fallback to the database.
    """

    def __init__(self, base_url: str, *, username: str, password: str, source: str,
                 session: requests.Session | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ApproversError(f"{source}: the API server's URL must start with http:// or https://, "
                                 f"got {base_url[:80]!r}")
        if not username or not password:
            raise ApproversError(f"{source}: names no FAB user and password to log in with")
        self.base_url = base_url.rstrip("/")
        self.source = source
        self._username = username
        self._password = password
        self._token: str | None = None
        self._session = session or requests.Session()

    def __repr__(self) -> str:
        return f"FabApiTeams({self.base_url!r})"

    def _send(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        where = f"{self.source}: {method} {self.base_url}{path.split('?')[0]}"
        try:
            with self._session.request(method, self.base_url + path, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
                                       stream=True, allow_redirects=False, **kwargs) as resp:
                body = resp.raw.read(MAX_ANSWER_BYTES + 1, decode_content=True)
                status = resp.status_code
        except requests.RequestException as exc:
            raise ApproversError(f"{where}: the API server could not be reached ({exc.__class__.__name__}); "
                                 "nobody is asked") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise ApproversError(f"{where}: the answer is larger than {MAX_ANSWER_BYTES:,} bytes")
        try:
            answer = json.loads(body) if body else None
        except ValueError:
            answer = None
        return status, answer

    @staticmethod
    def _detail(answer: Any) -> str:
        detail = answer.get("detail") if isinstance(answer, Mapping) else None
        return " ".join(str(detail).split())[:200] if detail else ""

    def _login(self) -> str:
        if self._token is None:
            status, answer = self._send("POST", TOKEN_PATH,
                                        json={"username": self._username, "password": self._password})
            token = answer.get("access_token") if isinstance(answer, Mapping) else None
            if status not in (200, 201) or not isinstance(token, str) or not token:
                raise ApproversError(f"{self.source}: the API server refused FAB user {self._username!r}'s login "
                                     f"(HTTP {status}{': ' + self._detail(answer) if self._detail(answer) else ''})")
            self._token = token
        return self._token

    def members(self, team: str) -> list[Approver]:
        if not TEAM_NAME_RE.fullmatch(team):
            raise ApproversError(f"team name {team!r} must match {TEAM_NAME_RE.pattern}")
        token = self._login()
        status, answer = self._send("GET", TEAMS_PATH + quote(team, safe=""),
                                    headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        detail = self._detail(answer)
        if status == 404 and detail:
            raise UnknownTeam(f"team {team!r}: {detail}")
        if status in (401, 403):
            # The board names the permission it asks; Airflow refuses the token itself before the board runs (403
            # "Invalid JWT token": its FAB user deactivated since the login, FAB noticing within [fab] cache_ttl; a
            # revoked token; 401 "Token Expired").
            need = "" if "can read on Users" in detail else "; the token from its login was refused"
            raise ApproversError(f"team {team!r}: the API server refused FAB user {self._username!r} (HTTP {status}"
                                 f"{': ' + detail if detail else ''}){need}")
        if status != 200:
            raise ApproversError(f"team {team!r}: {self.source} answered HTTP {status}"
                                 f"{': ' + detail if detail else ''}")
        return _members_of(answer, team=team, source=self.source)


def _members_of(answer: Any, *, team: str, source: str) -> list[Approver]:
    """The members of the board's answer ``{"team": ..., "members": [{"id": ..., "name": ...}]}``, checked."""
    members = answer.get("members") if isinstance(answer, Mapping) else None
    if not isinstance(members, list) or answer.get("team") != team:
        raise ApproversError(f"team {team!r}: {source} answered something that is not its team list")
    if len(members) > MAX_TEAM_MEMBERS:
        raise ApproversError(f"team {team!r}: {source} lists {len(members)} members, more than {MAX_TEAM_MEMBERS}")
    out = []
    for m in members:
        if not (isinstance(m, Mapping) and isinstance(m.get("id"), str) and m["id"]
                and isinstance(m.get("name"), str) and m["name"]):
            raise ApproversError(f"team {team!r}: {source} lists a member without an id and a name")
        out.append(Approver(m["id"], m["name"]))
    return out


def team_answer(team: str, members: list[Approver]) -> dict[str, Any]:
    """The board's answer for a team (what ``FabApiTeams`` reads)."""
    return {"team": team, "members": [{"id": m.id, "name": m.name} for m in members]}
