# ruff: noqa: F811 - the operator fixtures (env, audit, dag) are test_operators.py's, imported by name
"""Teams as FAB roles and groups, on a real FAB user database: FAB's own models (the FAB provider's) on SQLite.

Users: alice and carol hold the role ``gpu-oncall`` themselves, bob through the group ``night-shift``; dave holds
only ``Viewer``; erin holds ``gpu-oncall`` but is inactive. carol triggers the run. The ids asked are FAB's
(``User.get_id()``, what HITL assigns a request to and records as the responder); four eyes and the trigger
user's exclusion work on them, and FAB's auth manager lets exactly the asked users answer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.fab.auth_manager.fab_auth_manager import FabAuthManager
from airflow.providers.fab.auth_manager.models import Group, Model, Role, User
from airflow.sdk.exceptions import AirflowFailException, TaskAwaitingInput
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.fab_teams import (
    AB_GROUP,
    AB_GROUP_ROLE,
    AB_ROLE,
    AB_USER,
    AB_USER_GROUP,
    AB_USER_ROLE,
    MAX_TEAM_MEMBERS,
    STATEMENT_TIMEOUT_S,
    FabTeams,
    fab_database_url,
    fab_engine,
)
from promshift.core.approvers import Approver, ApproversError, resolve
from promshift.core.stages import Stage
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


def _user(db: Session, name: str, *, roles: list[Role] = (), groups: list[Group] = (),  # type: ignore[assignment]
          active: bool = True) -> User:
    user = User(first_name=name, last_name="test", username=name, email=f"{name}@example.com", active=active,
                password="not-a-hash")
    user.roles, user.groups = list(roles), list(groups)
    db.add(user)
    return user


@pytest.fixture(params=["sqlite", "postgresql"])
def fab_conn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """An Airflow connection's fields naming an empty database: a SQLite file, or a throwaway PostgreSQL database."""
    if request.param == "sqlite":
        yield {"conn_type": "sqlite", "host": str(tmp_path / "fab.db")}
        return
    name = f"promshift_fab_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.fail(f"local PostgreSQL at {PG_ADMIN_URL} is required for this test: {exc}")
    yield {"conn_type": "postgres", "host": "127.0.0.1", "port": 5432, "login": "postgres", "schema": name}
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture
def fab_db(fab_conn: dict[str, Any]) -> dict[str, Any]:
    """FAB's tables created from its models, and its users, roles and groups added through them."""
    engine = create_engine(fab_database_url(fab_conn))
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
        db.commit()
    engine.dispose()
    return {"conn": fab_conn, "users": users}


def _teams(fab_db: dict[str, Any]) -> FabTeams:
    return FabTeams(fab_engine(fab_database_url(fab_db["conn"])), source="FAB's user database")


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
    if fab_db["conn"]["conn_type"] == "postgres":  # a slow database fails the ask, it does not hang it
        with _teams(fab_db).engine.connect() as db:
            assert db.execute(text("SHOW statement_timeout")).scalar() == f"{STATEMENT_TIMEOUT_S}s"


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
    with pytest.raises(ApproversError, match="'gpu-nights' is neither a role nor a group in FAB's user database"):
        _teams(fab_db).members("gpu-nights")
    empty = tmp_path / "empty.db"
    create_engine(f"sqlite:///{empty}").connect().close()
    broken = FabTeams(fab_engine(fab_database_url({"conn_type": "sqlite", "host": str(empty)})), source="x")
    with pytest.raises(ApproversError, match="could not be read: no such table: ab_role") as err:
        broken.members("gpu-oncall")
    assert "\n" not in str(err.value)
    engine = create_engine(fab_database_url(fab_db["conn"]))
    with Session(engine) as db:
        viewer = db.query(Role).filter_by(name="Viewer").one()
        for i in range(MAX_TEAM_MEMBERS):
            _user(db, f"viewer-{i}", roles=[viewer])
        db.commit()
    engine.dispose()
    with pytest.raises(ApproversError, match=f"more than {MAX_TEAM_MEMBERS} active users"):
        _teams(fab_db).members("Viewer")


def test_connection_fields_become_a_url_without_printing_the_password() -> None:
    url = fab_database_url({"conn_type": "postgres", "host": "db.internal", "port": 5432, "login": "fab_reader",
                            "password": "s3cret", "schema": "airflow"})
    assert url.render_as_string(hide_password=False) == \
        "postgresql+psycopg://fab_reader:s3cret@db.internal:5432/airflow"
    assert "s3cret" not in str(url)
    with pytest.raises(ApproversError, match="'http' is not one of"):
        fab_database_url({"conn_type": "http", "host": "x"})
    with pytest.raises(ApproversError, match="names its file as host"):
        fab_database_url({"conn_type": "sqlite"})
    # mysqlclient is in no requirements file: a worker without the driver is told so in one line.
    with pytest.raises(ApproversError, match=r"no driver for mysql\+mysqldb here \(MySQLdb\)"):
        fab_engine(fab_database_url({"conn_type": "mysql", "host": "db.internal", "schema": "airflow"}))


@pytest.fixture
def fab_env(fab_db: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A deployment on FAB: its auth manager configured, the read-only connection to its tables; HITL captured."""
    from airflow.providers.standard.operators import hitl

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", FAB_AUTH_MANAGER)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_FAB_USERS", json.dumps(fab_db["conn"]))
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
    monkeypatch.delenv("AIRFLOW_CONN_PROMSHIFT_FAB_USERS")
    monkeypatch.setenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", json.dumps({"gpu-oncall": ["7", "8"]}))
    approval, ctx = ask(dag, audit, ["team:gpu-oncall"])
    with pytest.raises(TaskAwaitingInput):
        approval.execute(ctx)
    assert [a["id"] for a in fab_env["assigned_users"]] == ["7", "8"]
