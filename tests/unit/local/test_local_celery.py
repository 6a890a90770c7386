"""The celery demo's pre-flight: one line saying which service is missing and how to start it; its names."""

from __future__ import annotations

from pathlib import Path

import pytest

from promshift.local.celery_lab import (
    DB_COMMENT,
    CeleryServices,
    ServiceUnavailable,
    database_name,
    postgres_problem,
    redis_problem,
)
from promshift.local.stack.local import find_free_ports


def free_port() -> int:
    return find_free_ports(1)[0]


def test_redis_problem_names_the_service_the_address_and_how_to_start_it() -> None:
    line = redis_problem("redis://127.0.0.1:6399/5", ConnectionRefusedError(111, "Connection refused"))
    assert "\n" not in line
    assert line.startswith("Redis is not reachable at 127.0.0.1:6399 (ConnectionRefusedError:")
    assert "`service redis-server start`" in line and "broker" in line


def test_postgres_problem_names_the_user_and_never_a_password() -> None:
    line = postgres_problem("postgresql+psycopg://promshift:s3cret@db.example:6543/postgres",
                            "connection refused\nis the server running?")
    assert "\n" not in line
    assert line.startswith("PostgreSQL is not reachable at db.example:6543 as promshift (connection refused")
    assert "`service postgresql start`" in line
    assert "s3cret" not in line


def test_preflight_against_closed_ports_says_which_service_is_down() -> None:
    closed = free_port()
    redis_down = CeleryServices(port=28080, redis_url=f"redis://127.0.0.1:{closed}/5")
    problem = redis_down.problem(timeout_s=2)
    assert problem is not None and problem.startswith(f"Redis is not reachable at 127.0.0.1:{closed}")
    with pytest.raises(ServiceUnavailable, match="service redis-server start"):
        redis_down.require()
    # Redis answers on this machine (a python-svc machine starts it); PostgreSQL is pointed at a closed port.
    pg_down = CeleryServices(port=28080, pg_url=f"postgresql+psycopg://postgres@127.0.0.1:{closed}/postgres")
    problem = pg_down.problem(timeout_s=2)
    assert problem is not None and problem.startswith(f"PostgreSQL is not reachable at 127.0.0.1:{closed} as postgres")
    assert "service postgresql start" in problem


def test_both_services_answer_on_this_machine() -> None:
    assert CeleryServices(port=28080).problem() is None


def test_names_are_per_port() -> None:
    services = CeleryServices(port=28611)
    assert services.queue == "promshift-28611"
    assert services.worker_queues() == ["promshift-28611-w1", "promshift-28611-w2"]
    assert [database_name(r, 28611) for r in ("airflow", "audit", "anchor")] == [
        "promshift_airflow_28611", "promshift_audit_28611", "promshift_anchor_28611"]
    assert services.database_url("audit") == "postgresql+psycopg://postgres@127.0.0.1:5432/promshift_audit_28611"
    names = services.worker_names()
    assert len(names) == 2 and names[0].startswith("w1-28611@") and names[1].startswith("w2-28611@")
    with pytest.raises(ValueError):
        database_name("other", 1)


def test_a_database_the_demo_did_not_create_is_never_dropped() -> None:
    port = free_port()  # a port no demo uses: its database names are ours for this test alone
    services = CeleryServices(port=port)
    name = database_name("audit", port)
    with services._admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # the user's: no promshift comment
    try:
        with pytest.raises(ServiceUnavailable, match=f"already has a database {name} that promshift's demo did not"):
            services.recreate_databases()
        with services._admin() as conn:
            assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None
    finally:
        with services._admin() as conn:
            for role in ("airflow", "audit", "anchor"):
                conn.execute(f'DROP DATABASE IF EXISTS "{database_name(role, port)}" WITH (FORCE)')


def test_recreate_marks_its_databases_and_drops_its_own_on_the_next_demo() -> None:
    port = free_port()
    services = CeleryServices(port=port)
    try:
        names = services.recreate_databases()
        with services._admin() as conn:
            comments = dict(conn.execute(
                "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = ANY(%s)",
                (names,)).fetchall())
        assert comments == dict.fromkeys(names, DB_COMMENT)
        assert services.recreate_databases() == names  # its own: dropped and created again
    finally:
        with services._admin() as conn:
            for name in [database_name(r, port) for r in ("airflow", "audit", "anchor")]:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_celery_env_names_no_file_of_the_demos_home_for_workers(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers get the audit database and key through connection promshift_audit and one shared object store;
    only the API server (the board) gets PROMSHIFT_AUDIT_URL and the key file."""
    import json

    from promshift.local.demo import celery_env

    monkeypatch.delenv("PROMSHIFT_AUDIT_KEY", raising=False)  # the demo's own key file, as on a fresh machine
    key_file = tmp_path / "audit.key"
    key_file.write_text("k" * 64 + "\n")
    key_file.chmod(0o600)
    env, only = celery_env(tmp_path, audit_url="postgresql+psycopg://postgres@127.0.0.1:5432/promshift_audit_1",
                           anchor_url="postgresql+psycopg://postgres@127.0.0.1:5432/promshift_anchor_1",
                           key_env={"PROMSHIFT_AUDIT_KEY_FILE": str(key_file)}, common={"PROMSHIFT_PROFILE": "demo"})
    conn = json.loads(env["AIRFLOW_CONN_PROMSHIFT_AUDIT"])
    assert conn["extra"]["url"].endswith("/promshift_audit_1") and conn["password"] == "k" * 64
    assert env["PROMSHIFT_AUDIT_ANCHOR_URL"].endswith("/promshift_anchor_1")
    assert env["PROMSHIFT_SNAPSHOTS_URL"] == f"file://{tmp_path}/objects/snapshots"
    assert env["PROMSHIFT_REPORTS_URL"] == f"file://{tmp_path}/objects/reports"
    assert not {"PROMSHIFT_HOME", "PROMSHIFT_AUDIT_URL", "PROMSHIFT_AUDIT_KEY_FILE"} & set(env)
    assert env["PROMSHIFT_PROFILE"] == "demo"
    assert set(only) == {"api-server"}
    assert only["api-server"]["PROMSHIFT_AUDIT_URL"] == conn["extra"]["url"]


def test_demo_policy_pins_parity_shards_round_robin_and_leaves_other_tasks() -> None:
    from types import SimpleNamespace

    from promshift.local.demo_policy import SHARD_QUEUES_ENV, shard_queue, task_instance_mutation_hook

    queues = ["q-w1", "q-w2"]
    assert [shard_queue("parity_samples", i, queues) for i in range(5)] == ["q-w1", "q-w2", "q-w1", "q-w2", "q-w1"]
    assert shard_queue("parity_samples", -1, queues) is None  # the unexpanded task
    assert shard_queue("latency", 0, queues) is None
    assert shard_queue("parity_samples", 1, []) is None
    ti = SimpleNamespace(task_id="parity_samples", map_index=1, queue="default")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SHARD_QUEUES_ENV, "q-w1,q-w2")
        task_instance_mutation_hook(ti, None)
        assert ti.queue == "q-w2"
        other = SimpleNamespace(task_id="validate", map_index=-1, queue="default")
        task_instance_mutation_hook(other, None)
        assert other.queue == "default"
        mp.delenv(SHARD_QUEUES_ENV)
        unset = SimpleNamespace(task_id="parity_samples", map_index=0, queue="default")
        task_instance_mutation_hook(unset, None)
        assert unset.queue == "default"  # no policy outside the demo
