# ruff: noqa: F811 - the operator fixtures (env, audit, dag) are test_operators.py's, imported by name
"""FAB teams against the real thing: Airflow's own ``airflow api-server`` with the FAB provider's ``FabAuthManager``,
promshift's plugin (``plugins/``, the board under ``/promshift``) mounted as in production, on 127.0.0.1.

Set up only through FAB itself: ``airflow db migrate`` (Airflow's and FAB's tables), ``airflow users create`` (the
admin), then FAB's own REST API as that admin (``/auth/fab/v1/roles``, ``/auth/fab/v1/users``). FAB's CLI and REST
API can neither deactivate a user nor make a group (FAB's UI does both): those are written to FAB's tables, as
migrated by ``airflow db migrate``. The metadata database is PostgreSQL, as in a deployment (a throwaway database
on the machine's PostgreSQL): the board's reads of FAB's tables run on Airflow's own engine under their budget.

Users: alice and sre-carol (the trigger user) hold the role ``gpu-oncall``, bob holds it through the group
``night-shift``, erin holds it but is inactive; dave holds only ``Viewer``; ``promshift-svc`` and ``promshift-svc2``
hold ``promshift-reader`` (can read on Users), the workers' login. ``FabApiTeams`` logs in with FAB's
``POST /auth/token`` and reads the board's ``/promshift/api/teams/<team>`` with FAB's JWT.

About 3 min on this machine (two cores shared by a load of 12; 60 s of CPU), most of it Airflow's start-ups
(``db migrate``, ``users create``, ``api-server``, about 40 s each here): ``slow``, run by make e2e.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from airflow.providers.fab.auth_manager.models import Group, Role, User
from airflow.sdk.exceptions import TaskAwaitingInput
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.fab_teams import STATEMENT_TIMEOUT_S, TEAMS_PATH, TOKEN_PATH, FabApiTeams
from promshift.core.approvers import Approver, ApproversError, UnknownTeam
from promshift.local.stack.local import find_free_ports
from tests.unit.core.test_approvers import ask
from tests.unit.orchestration.test_operators import TRIGGERED_BY, audit, dag, env  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).parent / "airflow")
FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
ADMIN, ADMIN_PASSWORD = "admin", "admin-password-0123"
SERVICE_USER, SERVICE_PASSWORD = "promshift-svc", "svc-password-0123"
READER_ROLE = "promshift-reader"
# name: (roles, active)
USERS = {"alice": (["gpu-oncall"], True), TRIGGERED_BY: (["gpu-oncall", "Viewer"], True),
         "dave": (["Viewer"], True), "erin": (["gpu-oncall"], False),
         SERVICE_USER: ([READER_ROLE], True), "promshift-svc2": ([READER_ROLE], True), "bob": (["Public"], True)}
START_TIMEOUT_S = 240
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"  # the machine's PostgreSQL, trust on 127.0.0.1
FAB_CACHE_TTL_S = 2


def password(name: str) -> str:
    return SERVICE_PASSWORD if name == SERVICE_USER else f"{name}-password-0123"


@dataclass
class FabServer:
    base_url: str
    db_url: str
    leader: subprocess.Popen[bytes]
    setup_s: float
    phases: dict[str, float]

    def _write(self, sql: str, **params: Any) -> Any:
        engine = create_engine(self.db_url)
        try:
            with engine.begin() as db:
                return db.execute(text(sql), params)
        finally:
            engine.dispose()

    def ids(self) -> dict[str, str]:
        """FAB's user ids (``ab_user.id``, what ``User.get_id()`` gives HITL), by username."""
        return {name: str(uid) for uid, name in self._write("SELECT id, username FROM ab_user").all()}

    def deactivate(self, name: str) -> None:
        """What FAB's UI does to deactivate a user (its CLI and REST API cannot)."""
        assert self._write("UPDATE ab_user SET active = false WHERE username = :name", name=name).rowcount == 1

    def add_group(self, name: str, *, role: str, members: list[str]) -> None:
        """What FAB's UI does to make a group holding ``role`` (its CLI and REST API cannot): through FAB's models."""
        engine = create_engine(self.db_url)
        try:
            with Session(engine) as db:
                group = Group(name=name, label=name)
                group.roles = [db.scalars(select(Role).where(Role.name == role)).unique().one()]
                group.users = list(db.scalars(select(User).where(User.username.in_(members))).unique())
                assert len(group.users) == len(members)
                db.add(group)
                db.commit()
        finally:
            engine.dispose()


def _tail(path: Path) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(lines[-15:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the process group this test started (its leader's), never anything else."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    try:  # the group's other members (uvicorn's worker) after the leader
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _airflow(args: list[str], env: dict[str, str], log: Path) -> None:
    with log.open("ab") as out:
        proc = subprocess.Popen([AIRFLOW, *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        rc = proc.wait(timeout=START_TIMEOUT_S)
    finally:
        _stop(proc)
    assert rc == 0, f"airflow {' '.join(args[:2])} failed ({rc}):\n{_tail(log)}"


@pytest.fixture(scope="module")
def airflow_db() -> Iterator[str]:
    """A throwaway PostgreSQL database on the machine's PostgreSQL (as a deployment's metadata database)."""
    name = f"promshift_fab_api_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.fail(f"local PostgreSQL at {PG_ADMIN_URL} is required for this test: {exc}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture(scope="module")
def fab_server(tmp_path_factory: pytest.TempPathFactory, airflow_db: str) -> Iterator[FabServer]:
    """``airflow api-server`` under the FAB auth manager with promshift's plugin, its users made through FAB."""
    started = time.monotonic()
    home = tmp_path_factory.mktemp("fab-airflow")
    port, worker_log_port, trigger_log_port = find_free_ports(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PROMSHIFT_"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__AUTH_MANAGER": FAB_AUTH_MANAGER,
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__FERNET_KEY": "",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db,
        # Airflow derives asyncpg from postgresql://; psycopg (v3) serves the async engine too.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": airflow_db.replace("+psycopg:", "+psycopg_async:"),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": os.urandom(32).hex(),
        # FAB keeps a token's user (and so its roles) this long before reading it again (default 30 s).
        "AIRFLOW__FAB__CACHE_TTL": str(FAB_CACHE_TTL_S),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_log_port),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_log_port),
        # The board as a deployment runs it: this checkout's package, its own audit database.
        "PYTHONPATH": str(REPO / "include"),
        "PROMSHIFT_HOME": str(home / "promshift"),
        "PROMSHIFT_AUDIT_KEY": "test-only-audit-key-0123456789abcdef",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    phases = {}
    _airflow(["db", "migrate"], env, home / "migrate.log")
    phases["db migrate"] = time.monotonic() - started
    _airflow(["users", "create", "--username", ADMIN, "--password", ADMIN_PASSWORD, "--role", "Admin",
              "--firstname", "a", "--lastname", "admin", "--email", "admin@example.com"], env, home / "users.log")
    phases["users create"] = time.monotonic() - started - sum(phases.values())
    log = home / "api-server.log"
    with log.open("ab") as out:
        leader = subprocess.Popen([AIRFLOW, "api-server"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert leader.poll() is None, f"airflow api-server exited ({leader.returncode}):\n{_tail(log)}"
            assert time.monotonic() < deadline, f"airflow api-server did not answer in time:\n{_tail(log)}"
            try:
                if requests.get(base + "/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        phases["api-server start"] = time.monotonic() - started - sum(phases.values())
        admin = _login(base, ADMIN, ADMIN_PASSWORD)
        for role, actions in (("gpu-oncall", []),
                              (READER_ROLE, [{"action": {"name": "can_read"}, "resource": {"name": "Users"}}])):
            made = requests.post(base + "/auth/fab/v1/roles", headers=admin, timeout=30,
                                 json={"name": role, "actions": actions})
            assert made.status_code == 200, made.text
        for name, (roles, _active) in USERS.items():
            made = requests.post(base + "/auth/fab/v1/users", headers=admin, timeout=30, json={
                "username": name, "email": f"{name}@example.com", "first_name": name, "last_name": "test",
                "password": password(name), "roles": [{"name": r} for r in roles]})
            assert made.status_code == 200, made.text
        server = FabServer(base, airflow_db, leader, setup_s=time.monotonic() - started, phases=phases)
        for name, (_roles, active) in USERS.items():
            if not active:
                server.deactivate(name)
        server.add_group("night-shift", role="gpu-oncall", members=["bob"])
        yield server
    finally:
        _stop(leader)


def _login(base: str, user: str, secret: str) -> dict[str, str]:
    answer = requests.post(base + TOKEN_PATH, json={"username": user, "password": secret}, timeout=30)
    assert answer.status_code == 201, answer.text
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


def _client(server: FabServer, user: str = SERVICE_USER, secret: str = SERVICE_PASSWORD) -> FabApiTeams:
    return FabApiTeams(server.base_url, username=user, password=secret, source="the API server's FAB teams")


def test_the_api_server_listens_on_127_0_0_1_only(fab_server: FabServer) -> None:
    leader = psutil.Process(fab_server.leader.pid)
    listening = [c.laddr for p in [leader, *leader.children(recursive=True)]
                 for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    print(f"real FAB API server ready in {fab_server.setup_s:.1f} s:",
          ", ".join(f"{name} {took:.1f} s" for name, took in fab_server.phases.items()))


def test_a_worker_reads_a_fab_role_by_fabs_ids_through_fabs_real_token_route(fab_server: FabServer) -> None:
    ids = fab_server.ids()
    members = _client(fab_server).members("gpu-oncall")
    # FAB's numeric ids (what HITL assigns and records), bob through his group, erin left out (inactive), dave
    # outside the role.
    assert members == [Approver(ids["alice"], "alice"), Approver(ids[TRIGGERED_BY], TRIGGERED_BY),
                       Approver(ids["bob"], "bob")]
    assert all(m.id.isdigit() for m in members)
    assert {ids["erin"], ids["dave"]}.isdisjoint(m.id for m in members)
    # FAB's built-in roles are teams too; an unknown name is neither a role nor a group.
    assert [m.name for m in _client(fab_server).members("Viewer")] == [TRIGGERED_BY, "dave"]
    # A group's name is a team too (no role has it).
    assert _client(fab_server).members("night-shift") == [Approver(ids["bob"], "bob")]
    with pytest.raises(UnknownTeam, match="'gpu-nights' is neither a role nor a group"):
        _client(fab_server).members("gpu-nights")


def test_a_locked_fab_table_fails_the_team_within_the_api_servers_budget(fab_server: FabServer) -> None:
    """The board's read runs on Airflow's own engine under a 5 s statement budget: a table held by another
    transaction answers 503 in one line, and Airflow's pooled connection is left without the budget."""
    client = _client(fab_server)
    assert len(client.members("gpu-oncall")) == 3
    engine = create_engine(fab_server.db_url)
    try:
        with engine.connect() as other:
            # A group's members are read for every role team; FAB's own login and JWT check do not read this table.
            other.execute(text("LOCK TABLE ab_user_group IN ACCESS EXCLUSIVE MODE"))
            started = time.monotonic()
            with pytest.raises(ApproversError) as err:
                client.members("gpu-oncall")
            took = time.monotonic() - started
            other.rollback()
    finally:
        engine.dispose()
    assert str(err.value) == (
        "team 'gpu-oncall': the API server's FAB teams answered HTTP 503: team 'gpu-oncall': FAB's users on the API "
        "server could not be read: canceling statement due to statement timeout")
    assert STATEMENT_TIMEOUT_S <= took < STATEMENT_TIMEOUT_S + 10, took
    assert len(client.members("gpu-oncall")) == 3
    health = requests.get(fab_server.base_url + "/api/v2/monitor/health", timeout=30).json()
    assert health["metadatabase"]["status"] == "healthy"


def test_the_board_asks_the_permission_fabs_own_users_api_asks(fab_server: FabServer) -> None:
    """``can read on Users`` (FAB's action ``can_read`` on its resource ``Users``): the service user may list FAB's
    users and read a team; dave (Viewer) may do neither, and is refused in one line."""
    base = fab_server.base_url
    svc, dave = _login(base, SERVICE_USER, SERVICE_PASSWORD), _login(base, "dave", password("dave"))
    assert requests.get(base + "/auth/fab/v1/users", headers=svc, timeout=30).status_code == 200
    assert requests.get(base + "/auth/fab/v1/users", headers=dave, timeout=30).status_code == 403
    assert requests.get(base + TEAMS_PATH + "gpu-oncall", headers=dave, timeout=30).status_code == 403
    assert requests.get(base + TEAMS_PATH + "gpu-oncall", timeout=30).status_code == 401
    with pytest.raises(ApproversError) as err:
        _client(fab_server, "dave", password("dave")).members("gpu-oncall")
    assert str(err.value) == ("team 'gpu-oncall': the API server refused FAB user 'dave' (HTTP 403: reading a "
                              "team's members needs the permission can read on Users)")
    # FAB refuses a permission name it does not know: the one asked is FAB's own.
    bogus = requests.post(base + "/auth/fab/v1/roles", headers=_login(base, ADMIN, ADMIN_PASSWORD), timeout=30,
                          json={"name": "bogus", "actions": [{"action": {"name": "can_read"},
                                                              "resource": {"name": "Userz"}}]})
    assert bogus.status_code >= 400


def test_a_wrong_password_and_an_inactive_user_fail_the_login_in_one_line(fab_server: FabServer) -> None:
    with pytest.raises(ApproversError) as err:
        _client(fab_server, secret="wrong-password-xyz").members("gpu-oncall")
    assert str(err.value) == ("the API server's FAB teams: the API server refused FAB user 'promshift-svc''s login "
                              "(HTTP 401: Invalid credentials)")
    with pytest.raises(ApproversError, match=r"refused FAB user 'erin'.s login \(HTTP 401: Invalid credentials\)$"):
        _client(fab_server, "erin", password("erin")).members("gpu-oncall")
    # A body without a password is FAB's 400, before any user is looked up.
    assert requests.post(fab_server.base_url + TOKEN_PATH, json={"username": SERVICE_USER},
                         timeout=30).status_code == 400


def test_a_service_user_deactivated_after_its_login_is_refused_within_fabs_cache_ttl(fab_server: FabServer) -> None:
    """FAB reads a token's user again once its ``[fab] cache_ttl`` has passed: the JWT a worker holds stops working
    then (not at once) when FAB deactivates its user, in one line without the permission hint."""
    client = _client(fab_server, "promshift-svc2", password("promshift-svc2"))
    assert len(client.members("gpu-oncall")) == 3
    fab_server.deactivate("promshift-svc2")
    deadline = time.monotonic() + FAB_CACHE_TTL_S + 10
    while True:
        try:
            client.members("gpu-oncall")  # the same token: the login is not asked again
        except ApproversError as exc:
            refused = str(exc)
            break
        assert time.monotonic() < deadline, "FAB still answers a deactivated user's token"
        time.sleep(0.5)
    assert refused == ("team 'gpu-oncall': the API server refused FAB user 'promshift-svc2' (HTTP 403: "
                       "Invalid JWT token); the token from its login was refused")


def test_the_approval_asks_the_real_fab_role_without_the_trigger_user(
        fab_server: FabServer, dag: Any, audit: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's approval, configured as in a FAB deployment (the auth manager and the connection
    ``promshift_fab_api``): HITL is asked alice and bob by FAB's ids; sre-carol triggered the run and is left
    out."""
    from airflow.providers.standard.operators import hitl

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", FAB_AUTH_MANAGER)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_FAB_API", json.dumps(
        {"conn_type": "http", "host": fab_server.base_url, "login": SERVICE_USER, "password": SERVICE_PASSWORD}))
    monkeypatch.delenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", raising=False)
    captured: dict[str, Any] = {}
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kwargs: captured.update(kwargs))
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(TaskAwaitingInput):
        approval.execute(ctx)
    ids = fab_server.ids()
    assert captured["assigned_users"] == [{"id": ids["alice"], "name": "alice"}, {"id": ids["bob"], "name": "bob"}]
