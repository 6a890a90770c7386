# ruff: noqa: F811 - the operator fixtures (env, audit, dag) are test_operators.py's, imported by name
"""Teams as FAB roles and groups, on a real FAB user database: FAB's own models (the FAB provider's) on SQLite
and PostgreSQL, read on the API server; a worker asks the API server over HTTP and holds no database login.

Users: alice and carol hold the role ``gpu-oncall`` themselves, bob through the group ``night-shift``; dave holds
only ``Viewer``; erin holds ``gpu-oncall`` but is inactive; ``promshift-svc`` (the workers' login) may read users.
carol triggers the run. The ids asked are FAB's (``User.get_id()``, what HITL assigns a request to and records as
the responder); four eyes and the trigger user's exclusion work on them, and FAB's auth manager lets exactly the
asked users answer.

The API server here is a real HTTP server on 127.0.0.1 (uvicorn in a thread): the board's own app under
``/promshift`` (its ``/api/teams/<team>`` route, Airflow's JWT resolution) and, as FAB's ``POST /auth/token``
does, a token route that refuses a body without username and password (400) and wrong or inactive credentials
(401), checking FAB's password hash. The real thing (``airflow api-server`` with the FAB provider's auth manager
and promshift's plugin) is tests/integration/test_fab_api_server.py, slow; this stand-in refuses what it refuses.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
import requests
import uvicorn
from airflow.api_fastapi import app as airflow_app
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.providers.fab.auth_manager.fab_auth_manager import FabAuthManager
from airflow.providers.fab.auth_manager.models import Group, Model, Role, User
from airflow.sdk.exceptions import AirflowFailException, TaskAwaitingInput
from fastapi import Body, FastAPI, HTTPException
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.fab_teams import (
    AB_GROUP,
    AB_GROUP_ROLE,
    AB_ROLE,
    AB_USER,
    AB_USER_GROUP,
    AB_USER_ROLE,
    MAX_ANSWER_BYTES,
    MAX_TEAM_MEMBERS,
    TEAMS_PATH,
    FabApiTeams,
    FabTeams,
)
from promshift.board import URL_PREFIX
from promshift.board.app import BoardSource, create_app
from promshift.core.approvers import Approver, ApproversError, UnknownTeam, resolve
from promshift.core.stages import Stage
from promshift.orchestration.approver_teams import api_server_url
from tests.unit.core.test_approvers import ask
from tests.unit.orchestration.test_operators import (  # noqa: F401 - fixtures
    GROUP,
    TRIGGERED_BY,
    audit,
    dag,
    env,
    hitl_event,
)

FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"  # the machine's PostgreSQL, trust on 127.0.0.1
SERVICE_USER, SERVICE_PASSWORD = "promshift-svc", "svc-password-0123"
USERS_READER = "UserReader"  # a FAB role granted "can read on Users"


def _user(db: Session, name: str, *, roles: list[Role] = (), groups: list[Group] = (),  # type: ignore[assignment]
          active: bool = True) -> User:
    user = User(first_name=name, last_name="test", username=name, email=f"{name}@example.com", active=active,
                password=generate_password_hash(f"{name}-password"))
    user.roles, user.groups = list(roles), list(groups)
    db.add(user)
    return user


@pytest.fixture(params=["sqlite", "postgresql"])
def fab_conn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The API server's database URL, empty: a SQLite file, or a throwaway PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fab.db'}"
        return
    name = f"promshift_fab_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.fail(f"local PostgreSQL at {PG_ADMIN_URL} is required for this test: {exc}")
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture
def fab_db(fab_conn: str) -> dict[str, Any]:
    """FAB's tables created from its models, and its users, roles and groups added through them."""
    engine = create_engine(fab_conn)
    Model.metadata.create_all(engine)
    with Session(engine, expire_on_commit=False) as db:
        oncall, viewer = Role(name="gpu-oncall"), Role(name="Viewer")
        night = Group(name="night-shift", label="night shift")
        night.roles = [oncall]
        db.add_all([oncall, viewer, night])
        users = {"alice": _user(db, "alice", roles=[oncall]),
                 "bob": _user(db, "bob", groups=[night]),
                 TRIGGERED_BY: _user(db, TRIGGERED_BY, roles=[oncall, viewer]),
                 "dave": _user(db, "dave", roles=[viewer]),
                 "erin": _user(db, "erin", roles=[oncall], active=False)}
        reader = Role(name=USERS_READER)
        service = _user(db, SERVICE_USER, roles=[reader])
        service.password = generate_password_hash(SERVICE_PASSWORD)
        db.commit()
    engine.dispose()
    return {"conn": fab_conn, "users": users}


def _teams(fab_db: dict[str, Any]) -> FabTeams:
    return FabTeams(create_engine(fab_db["conn"]), source="FAB's user database")


def test_promshifts_tables_are_fabs_own() -> None:
    """The Core tables promshift reads name tables and columns FAB's models declare, with the same types."""
    for ours in (AB_USER, AB_ROLE, AB_GROUP, AB_USER_ROLE, AB_USER_GROUP, AB_GROUP_ROLE):
        theirs = Model.metadata.tables[ours.name]
        for column in ours.columns:
            assert column.name in theirs.columns, (ours.name, column.name)
            assert type(column.type)._type_affinity is type(theirs.columns[column.name].type)._type_affinity


def test_a_role_resolves_to_its_active_holders_direct_or_through_a_group_by_fab_id(fab_db: dict[str, Any]) -> None:
    users = fab_db["users"]
    members = _teams(fab_db).members("gpu-oncall")
    expected = [users[n] for n in ("alice", "bob", TRIGGERED_BY)]
    assert members == [Approver(u.get_id(), u.get_name()) for u in expected]
    assert all(m.id.isdigit() for m in members)  # FAB's numeric ids, not names
    assert users["dave"].get_id() not in {m.id for m in members}  # outside the role
    assert users["erin"].get_id() not in {m.id for m in members}  # inactive: cannot log in to answer
    # A group's name is a team too (when no role has it): its members.
    assert _teams(fab_db).members("night-shift") == [Approver(users["bob"].get_id(), "bob")]


def test_the_trigger_user_is_left_out_by_name_and_fabs_auth_manager_lets_only_the_asked_answer(
        fab_db: dict[str, Any]) -> None:
    users = fab_db["users"]
    # A run's triggering_user_name is FAB's username; the asked are ids: exclusion matches either.
    asked = resolve(["team:gpu-oncall"], _teams(fab_db), group=GROUP, exclude=[TRIGGERED_BY])
    assert [a.id for a in asked] == [users["alice"].get_id(), users["bob"].get_id()]
    assigned = {a.id for a in asked}
    manager = FabAuthManager()
    # Airflow's HITL route asks the auth manager with the request's assigned ids and the logged-in FAB user.
    assert manager.is_authorized_hitl_task(assigned_users=assigned, user=users["alice"])
    assert manager.is_authorized_hitl_task(assigned_users=assigned, user=users["bob"])
    assert not manager.is_authorized_hitl_task(assigned_users=assigned, user=users[TRIGGERED_BY])
    assert not manager.is_authorized_hitl_task(assigned_users=assigned, user=users["dave"])


def test_an_unknown_team_an_unreadable_database_and_a_huge_role_fail_in_one_line(fab_db: dict[str, Any],
                                                                                  tmp_path: Path) -> None:
    with pytest.raises(UnknownTeam, match="'gpu-nights' is neither a role nor a group in FAB's user database"):
        _teams(fab_db).members("gpu-nights")
    empty = tmp_path / "empty.db"
    create_engine(f"sqlite:///{empty}").connect().close()
    broken = FabTeams(create_engine(f"sqlite:///{empty}"), source="x")
    with pytest.raises(ApproversError, match="could not be read: no such table: ab_role") as err:
        broken.members("gpu-oncall")
    assert "\n" not in str(err.value)
    engine = create_engine(fab_db["conn"])
    with Session(engine) as db:
        viewer = db.query(Role).filter_by(name="Viewer").one()
        for i in range(MAX_TEAM_MEMBERS):
            _user(db, f"viewer-{i}", roles=[viewer])
        db.commit()
    engine.dispose()
    with pytest.raises(ApproversError, match=f"more than {MAX_TEAM_MEMBERS} active users"):
        _teams(fab_db).members("Viewer")


# The statement budget is PostgreSQL's (fab_teams.budgeted); SQLite waits its busy timeout.
@pytest.mark.parametrize("fab_conn", ["postgresql"], indirect=True)
def test_a_locked_fab_table_fails_the_team_within_its_budget_and_leaves_the_pooled_connection_as_it_was(
        fab_db: dict[str, Any]) -> None:
    engine = create_engine(fab_db["conn"], pool_size=1, max_overflow=0)
    teams = FabTeams(engine, source="FAB's user database", statement_timeout_s=0.5)
    assert [a.name for a in teams.members("gpu-oncall")] == ["alice", "bob", TRIGGERED_BY]
    locker = create_engine(fab_db["conn"])
    with locker.connect() as other:
        other.execute(text("LOCK TABLE ab_user IN ACCESS EXCLUSIVE MODE"))  # held until this block's rollback
        started = time.monotonic()
        with pytest.raises(ApproversError, match="could not be read: canceling statement due to statement timeout"):
            teams.members("gpu-oncall")
        assert time.monotonic() - started < 3.0
        other.rollback()
    locker.dispose()
    # The budget was the transaction's: the pool's one connection (Airflow's, on an API server) has none left.
    with engine.connect() as db:
        assert db.scalar(text("SHOW statement_timeout")) == "0"
    assert len(teams.members("gpu-oncall")) == 3
    engine.dispose()


class FabLikeAuthManager(SimpleAuthManager):
    """Airflow's simple auth manager with FAB's rule for custom views: ``can read on Users`` is a FAB role's
    (here: holding ``USERS_READER`` in the FAB database); and, as FAB's ``deserialize_user`` (without its
    ``[fab] cache_ttl``), a token whose user is no longer active is refused (Airflow's 403 "Invalid JWT token").
    tests/integration/test_fab_api_server.py checks the real FabAuthManager does both."""

    engine: Engine

    def deserialize_user(self, token: dict[str, Any]) -> SimpleAuthManagerUser:
        with Session(self.engine) as db:
            found = db.scalars(select(User).where(User.username == token["sub"])).first()
            if found is None or not found.active:
                raise ValueError(f"User with id {token['sub']} is not active")
        return super().deserialize_user(token)

    def is_authorized_custom_view(self, *, method: Any, resource_name: str, user: Any) -> bool:
        if (method, resource_name) != ("GET", "Users"):
            return False
        with Session(self.engine) as db:
            found = db.scalars(select(User).where(User.username == user.get_name())).first()
            return bool(found and found.active and any(r.name == USERS_READER for r in found.roles))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TokenBody = Annotated[dict[str, Any], Body()]


@pytest.fixture
def api_server(fab_db: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The API server on 127.0.0.1: FAB's token route and the board (mounted at /promshift) over ``fab_db``."""
    from airflow import settings
    from airflow.models.revoked_token import RevokedToken

    # Airflow's JWT check asks its metadata database whether a token was revoked (a logout): that one table.
    RevokedToken.__table__.create(settings.engine, checkfirst=True)
    engine = create_engine(fab_db["conn"])
    manager = FabLikeAuthManager()
    manager.engine = engine
    monkeypatch.setattr(airflow_app._AuthManagerState, "instance", manager)
    app = FastAPI()

    @app.post("/auth/token", status_code=201)
    def create_token(body: TokenBody) -> dict[str, str]:  # FAB's FABAuthManagerLogin.create_token
        username, password = body.get("username"), body.get("password")
        if not username or not password:
            raise HTTPException(400, "Username and password must be provided")
        with Session(engine) as db:
            user = db.scalars(select(User).where(User.username == username)).first()
            if user is None or not user.active or not check_password_hash(user.password, password):
                raise HTTPException(401, "Invalid credentials")
        return {"access_token": manager.generate_jwt(SimpleAuthManagerUser(username=username, role="viewer"))}

    board = BoardSource(catalog_path=Path(__file__).resolve().parents[3] / "catalog" / "metric_groups.yaml",
                        audit_url=f"sqlite:///{tmp_path / 'audit.db'}", profile=None,
                        run_states=lambda dag_id, run_ids: {},
                        teams=lambda: FabTeams(engine, source="FAB's users on the API server"))
    app.mount(URL_PREFIX, create_app(board))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the API server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    engine.dispose()


def _client(base: str, user: str = SERVICE_USER, password: str = SERVICE_PASSWORD) -> FabApiTeams:
    return FabApiTeams(base, username=user, password=password, source="the API server's FAB teams")


def test_the_api_server_refuses_what_fab_refuses(api_server: str, fab_db: dict[str, Any]) -> None:
    """FAB's token route: 400 without credentials, 401 wrong or inactive; the board's team route: 401 without a
    token, 403 with a forged one (Airflow's JWT check) or without can-read-on-Users, 404 an unknown or malformed
    team."""
    token_url = api_server + "/auth/token"
    assert requests.post(token_url, json={"username": SERVICE_USER}, timeout=5).status_code == 400
    wrong = {"username": SERVICE_USER, "password": "wrong"}
    assert requests.post(token_url, json=wrong, timeout=5).status_code == 401
    assert requests.post(token_url, json={"username": "erin", "password": "erin-password"},
                         timeout=5).status_code == 401  # inactive
    teams_url = api_server + TEAMS_PATH + "gpu-oncall"
    assert requests.get(teams_url, timeout=5).status_code == 401
    # A forged token: Airflow's own JWT check answers 403 (invalid JWT), before the route runs.
    assert requests.get(teams_url, headers={"Authorization": "Bearer not.a.jwt"}, timeout=5).status_code == 403
    dave = requests.post(token_url, json={"username": "dave", "password": "dave-password"}, timeout=5)
    assert dave.status_code == 201
    refused = requests.get(teams_url, headers={"Authorization": f"Bearer {dave.json()['access_token']}"}, timeout=5)
    assert refused.status_code == 403 and "can read on Users" in refused.json()["detail"]
    svc = requests.post(token_url, json={"username": SERVICE_USER, "password": SERVICE_PASSWORD}, timeout=5)
    auth = {"Authorization": f"Bearer {svc.json()['access_token']}"}
    answer = requests.get(teams_url, headers=auth, timeout=5)
    users = fab_db["users"]
    assert answer.status_code == 200 and answer.json() == {
        "team": "gpu-oncall", "members": [{"id": users[n].get_id(), "name": n} for n in ("alice", "bob", TRIGGERED_BY)]}
    assert requests.get(api_server + TEAMS_PATH + "gpu-nights", headers=auth, timeout=5).status_code == 404
    assert requests.get(api_server + TEAMS_PATH + "gpu%20oncall", headers=auth, timeout=5).status_code == 404
    # The service user deactivated after its login: its token is refused before the route runs.
    engine = create_engine(fab_db["conn"])
    with Session(engine) as db:
        db.query(User).filter_by(username=SERVICE_USER).update({"active": False})
        db.commit()
    engine.dispose()
    gone = requests.get(teams_url, headers=auth, timeout=5)
    assert gone.status_code == 403 and gone.json()["detail"] == "Invalid JWT token"


def test_a_worker_reads_a_team_through_the_api_server_in_fabs_ids(api_server: str, fab_db: dict[str, Any]) -> None:
    users = fab_db["users"]
    assert _client(api_server).members("gpu-oncall") == [
        Approver(users[n].get_id(), n) for n in ("alice", "bob", TRIGGERED_BY)]
    assert _client(api_server).members("night-shift") == [Approver(users["bob"].get_id(), "bob")]
    with pytest.raises(UnknownTeam, match="'gpu-nights' is neither a role nor a group"):
        _client(api_server).members("gpu-nights")


def test_a_refused_login_a_missing_permission_and_an_unreachable_server_fail_in_one_line(
        api_server: str) -> None:
    with pytest.raises(ApproversError, match=r"refused FAB user 'promshift-svc'.s login \(HTTP 401: Invalid") as err:
        _client(api_server, password="wrong-password-xyz").members("gpu-oncall")
    assert "wrong-password-xyz" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ApproversError, match=r"refused FAB user 'dave' \(HTTP 403.*can read on Users"):
        _client(api_server, user="dave", password="dave-password").members("gpu-oncall")
    closed = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ApproversError, match="could not be reached.*nobody is asked") as err:
        _client(closed).members("gpu-oncall")
    assert SERVICE_PASSWORD not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ApproversError, match="must start with http"):
        FabApiTeams("127.0.0.1:8080", username="u", password="p", source="x")


def test_an_oversized_or_malformed_answer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers too much, or something else than a team list, asks nobody."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answers: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: bytes, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self._send(b'{"access_token": "t"}', 201)

        def do_GET(self) -> None:  # noqa: N802
            self._send(answers[self.path.rsplit("/", 1)[1]])

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        answers["big"] = json.dumps({"team": "big", "members": [], "pad": "x" * MAX_ANSWER_BYTES}).encode()
        answers["other"] = json.dumps({"team": "someone-else", "members": []}).encode()
        answers["noid"] = json.dumps({"team": "noid", "members": [{"name": "alice"}]}).encode()
        answers["many"] = json.dumps({"team": "many", "members": [{"id": str(i), "name": f"u{i}"}
                                                                 for i in range(MAX_TEAM_MEMBERS + 1)]}).encode()
        for team, why in (("big", "larger than"), ("other", "not its team list"), ("noid", "without an id"),
                          ("many", f"more than {MAX_TEAM_MEMBERS}")):
            with pytest.raises(ApproversError, match=why):
                _client(base).members(team)
    finally:
        server.shutdown()
        server.server_close()


def test_the_connection_names_the_api_server() -> None:
    assert api_server_url("http", "http://airflow-api-server:8080/", None, None) == "http://airflow-api-server:8080"
    assert api_server_url("http", "airflow-api-server", 8080, "https") == "https://airflow-api-server:8080"
    assert api_server_url("http", "airflow-api-server", None, "") == "http://airflow-api-server"
    with pytest.raises(ApproversError, match="names no host"):
        api_server_url("http", "", None, None)


@pytest.fixture
def fab_env(api_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A deployment on FAB: its auth manager configured, the workers' connection to the API server (no database
    login); HITL captured."""
    from airflow.providers.standard.operators import hitl

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", FAB_AUTH_MANAGER)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_FAB_API", json.dumps(
        {"conn_type": "http", "host": api_server, "login": SERVICE_USER, "password": SERVICE_PASSWORD}))
    monkeypatch.delenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", raising=False)
    captured: dict[str, Any] = {}
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kwargs: captured.update(kwargs))
    return captured


def test_the_approval_asks_the_fab_role_without_the_trigger_user_and_keeps_four_eyes(
        dag: Any, audit: AuditStore, fab_db: dict[str, Any], fab_env: dict[str, Any]) -> None:
    users = fab_db["users"]
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(TaskAwaitingInput):
        approval.execute(ctx)
    alice, bob, carol = (users[n] for n in ("alice", "bob", TRIGGERED_BY))
    assert fab_env["assigned_users"] == [{"id": alice.get_id(), "name": "alice"}, {"id": bob.get_id(), "name": "bob"}]
    [shown] = [e for e in audit.events(group=GROUP) if e.kind == "evidence_shown"]
    assert shown.evidence_data["approvers"] == [alice.get_id(), bob.get_id()]
    # Had the trigger user answered anyway (say, as an admin Airflow lets through), HITL records FAB's id and
    # username: four eyes refuses on either.
    with pytest.raises(AirflowFailException, match="four-eyes"):
        approval.execute_complete(ctx, hitl_event("Approve", {"id": carol.get_id(), "name": carol.get_name()}))
    assert audit.stage_of(GROUP) != Stage.APPROVED


def test_an_asked_fab_user_approves(dag: Any, audit: AuditStore, fab_db: dict[str, Any],
                                    fab_env: dict[str, Any]) -> None:
    bob = fab_db["users"]["bob"]
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(TaskAwaitingInput):
        approval.execute(ctx)
    approval.execute_complete(ctx, hitl_event("Approve", {"id": bob.get_id(), "name": bob.get_name()}))
    assert audit.stage_of(GROUP) == Stage.APPROVED


def test_without_the_connection_fab_falls_back_to_the_variable(dag: Any, audit: AuditStore, fab_db: dict[str, Any],
                                                               fab_env: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_PROMSHIFT_FAB_API")
    monkeypatch.setenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", json.dumps({"gpu-oncall": ["7", "8"]}))
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(TaskAwaitingInput):
        approval.execute(ctx)
    assert [a["id"] for a in fab_env["assigned_users"]] == ["7", "8"]


def test_an_unreachable_api_server_asks_nobody_and_never_reads_the_database(
        dag: Any, audit: AuditStore, fab_db: dict[str, Any], fab_env: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The approval fails in one line before asking; the Variable or the database are not tried instead."""
    monkeypatch.setenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", json.dumps({"gpu-oncall": ["7", "8"]}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_FAB_API", json.dumps(
        {"conn_type": "http", "host": f"http://127.0.0.1:{_free_port()}", "login": SERVICE_USER,
         "password": SERVICE_PASSWORD}))
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(AirflowFailException, match="could not be reached.*nobody is asked") as err:
        approval.execute(ctx)
    assert "\n" not in str(err.value) and SERVICE_PASSWORD not in str(err.value)
    assert "assigned_users" not in fab_env
    assert audit.stage_of(GROUP) != Stage.APPROVED


def test_the_board_serves_teams_only_under_fab_from_the_api_servers_own_database(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow import settings

    from promshift.board.app import api_server_fab_teams

    monkeypatch.setattr(airflow_app._AuthManagerState, "instance", SimpleAuthManager())
    assert api_server_fab_teams() is None  # the route then answers 404
    monkeypatch.setattr(airflow_app._AuthManagerState, "instance", FabAuthManager())
    directory = api_server_fab_teams()
    assert isinstance(directory, FabTeams) and directory.engine is settings.engine
