"""The routing state in the audit database, on SQLite and on the machine's local PostgreSQL.

The concurrency tests start 8 processes at one barrier, each routing its own groups (and one
group they all share) against the same database: every entry must be there afterwards, and
the shared row must have counted every write. The same harness run against the old JSON
manifest's read-modify-write loses entries: that is the bug this store replaces.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, text

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.routing import RoutingError, RoutingStore, routing_table

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PROCESSES = 8
ROUNDS = 25
SHARED = "shared-group"


# -- backends: a SQLite file, a throwaway PostgreSQL database ------------------------------------


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A database ``promshift_test_<random>`` on the local PostgreSQL (trust auth), dropped after."""
    try:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect():
            pass
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.fail(f"local PostgreSQL at {PG_ADMIN_URL} is required for this test: {exc}")
    name = f"promshift_test_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return str(request.getfixturevalue("pg_database"))


# -- the API the migration uses ---------------------------------------------------------------------


def test_routes_read_back_in_the_old_manifests_shape_and_count_their_writes(url: str) -> None:
    store = RoutingStore(url)
    assert store.load() == {"groups": {}}
    assert store.read_from("gpu-memory") == "source" and store.get("gpu-memory") is None
    assert store.version("gpu-memory") == 0
    route = store.route("gpu-memory", read_from="target", url="http://amp/ws", at=T0, run_id="r1")
    assert route == {"read_from": "target", "url": "http://amp/ws", "since": T0.isoformat(), "run_id": "r1"}
    assert store.read_from("gpu-memory") == "target" and store.get("gpu-memory") == route
    later = T0 + timedelta(hours=1)
    back = store.route("gpu-memory", read_from="source", url="http://prom", at=later, run_id="r2")
    store.route("gpu-ecc", read_from="target", url="http://amp/ws", at=T0, run_id="r3")
    assert store.load() == {"groups": {"gpu-ecc": {"read_from": "target", "url": "http://amp/ws",
                                                   "since": T0.isoformat(), "run_id": "r3"},
                                       "gpu-memory": back}}
    assert (store.version("gpu-memory"), store.version("gpu-ecc")) == (2, 1)
    # A second store on the same database (another worker) sees the same rows.
    assert RoutingStore(url).load() == store.load()
    with pytest.raises(ValueError, match="read_from must be one of source, target"):
        store.route("gpu-memory", read_from="amp", url="x", at=T0, run_id="r4")
    assert store.read_from("gpu-memory") == "source"


def test_a_route_keeps_the_groups_source_and_target(url: str) -> None:
    store = RoutingStore(url)
    route = store.route("gpu-memory", read_from="target", url="http://amp/ws-b", at=T0, run_id="r1",
                        pair=("cluster_b", "amp_b"))
    assert route == {"read_from": "target", "url": "http://amp/ws-b", "since": T0.isoformat(), "run_id": "r1",
                     "source": "cluster_b", "target": "amp_b"}
    store.route("gpu-utilization", read_from="target", url="http://amp/ws-a", at=T0, run_id="r2",
                pair=("cluster_a", "amp_a"))
    groups = RoutingStore(url).load()["groups"]
    assert {name: (r["source"], r["target"]) for name, r in groups.items()} == {
        "gpu-memory": ("cluster_b", "amp_b"), "gpu-utilization": ("cluster_a", "amp_a")}
    # Back to the source: the pair stays with the route.
    back = store.route("gpu-memory", read_from="source", url="http://prom-b", at=T0, run_id="r3",
                       pair=("cluster_b", "amp_b"))
    assert store.get("gpu-memory") == back and back["source"] == "cluster_b"


def test_a_table_from_before_pairs_gains_the_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {routing_table.name} (group_name VARCHAR(128) PRIMARY KEY, "
                          "read_from VARCHAR(16) NOT NULL, url VARCHAR(2048) NOT NULL, run_id VARCHAR(256) NOT NULL, "
                          "since VARCHAR(40) NOT NULL, updated_at VARCHAR(40) NOT NULL, version INTEGER NOT NULL)"))
        conn.execute(text(f"INSERT INTO {routing_table.name} VALUES ('gpu-memory', 'target', 'http://amp', 'old', "
                          f"'{T0.isoformat()}', '{T0.isoformat()}', 1)"))
    engine.dispose()
    store = RoutingStore(url)
    assert {"source_conn", "target_conn"} <= {c["name"] for c in inspect(store.engine).get_columns(
        routing_table.name)}
    assert store.get("gpu-memory") == {"read_from": "target", "url": "http://amp", "since": T0.isoformat(),
                                       "run_id": "old"}
    store.route("gpu-memory", read_from="source", url="http://prom", at=T0, run_id="new",
                pair=("promshift_source", "promshift_target"))
    assert store.get("gpu-memory")["target"] == "promshift_target" and store.version("gpu-memory") == 2


def test_the_table_lives_beside_the_audit_events(url: str) -> None:
    audit = AuditStore(url)
    store = RoutingStore(audit.url, engine=audit.engine)
    store.route("gpu-memory", read_from="target", url="http://amp", at=T0, run_id="r")
    tables = set(inspect(audit.engine).get_table_names())
    assert {"promshift_audit_events", routing_table.name} <= tables
    assert store.where.endswith(f"table {routing_table.name}")


def test_a_lost_table_raises_and_is_never_recreated_empty(url: str) -> None:
    store = RoutingStore(url)
    store.route("gpu-memory", read_from="target", url="http://amp", at=T0, run_id="r")
    with store.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {routing_table.name}"))
    for call in (lambda: store.read_from("gpu-memory"), store.load,
                 lambda: store.route("gpu-ecc", read_from="target", url="u", at=T0, run_id="r")):
        with pytest.raises(RoutingError, match="routing store .* is unreadable or corrupt"):
            call()
    assert not inspect(store.engine).has_table(routing_table.name)


def test_an_unreachable_database_is_a_routing_error_without_the_password() -> None:
    with pytest.raises(RoutingError, match="cannot be opened") as excinfo:
        RoutingStore("postgresql+psycopg://promshift:s3cret-pw@127.0.0.1:1/promshift")
    assert "s3cret-pw" not in str(excinfo.value) and "***" in str(excinfo.value)


def test_a_database_without_an_upsert_is_refused_before_anything_is_written() -> None:
    with pytest.raises(RoutingError, match="mysql is not supported"):
        RoutingStore("mysql+pymysql://root@127.0.0.1:3306/test")


def test_an_old_manifest_is_imported_once_and_never_overrides_the_store(url: str, tmp_path: Path) -> None:
    manifest = tmp_path / "routing.json"
    old = {"read_from": "target", "url": "http://amp/old", "since": T0.isoformat(), "run_id": "old"}
    manifest.write_text(json.dumps({"groups": {"gpu-memory": old, "gpu-ecc": old}}))
    store = RoutingStore(url)
    newer = store.route("gpu-ecc", read_from="source", url="http://prom", at=T0 + timedelta(days=1), run_id="new")
    assert store.import_manifest(manifest) == ["gpu-memory"]
    assert store.load()["groups"] == {"gpu-memory": old, "gpu-ecc": newer}
    assert store.import_manifest(manifest) == []  # already there
    assert store.import_manifest(tmp_path / "absent.json") == []
    manifest.write_text('{"groups": {"gpu-memory": ')
    with pytest.raises(RoutingError, match="routing manifest .* is unreadable or corrupt"):
        store.import_manifest(manifest)
    assert manifest.read_text() == '{"groups": {"gpu-memory": '  # left as it was


# -- concurrency: 8 processes at once ----------------------------------------------------------------


def _route_with_store(where: str, group: str, at: datetime, run_id: str) -> None:
    _STORES[where].route(group, read_from="target", url=f"http://amp/{group}", at=at, run_id=run_id)


def _route_with_json_manifest(where: str, group: str, at: datetime, run_id: str) -> None:
    """The routing.json write this store replaces (``RoutingManifest.route`` until now): load the
    whole file, set one group, replace the file atomically. Atomic, but a read-modify-write."""
    path = Path(where)
    data = json.loads(path.read_bytes()) if path.exists() else {"groups": {}}
    data["groups"][group] = {"read_from": "target", "url": f"http://amp/{group}", "since": at.isoformat(),
                             "run_id": run_id}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".routing-")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)


_STORES: dict[str, RoutingStore] = {}


def _worker(kind: str, where: str, index: int, barrier: Any, errors: Any) -> None:
    try:
        if kind == "store":
            _STORES[where] = RoutingStore(where)  # each process opens its own, as each worker does
        route: Callable[[str, str, datetime, str], None] = (
            _route_with_store if kind == "store" else _route_with_json_manifest)
        barrier.wait(timeout=120)
        for r in range(ROUNDS):
            route(where, f"g{index}-{r}", T0 + timedelta(seconds=r), f"run-{index}")
            if kind == "store":
                route(where, SHARED, T0 + timedelta(seconds=r), f"run-{index}")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        errors.put(f"process {index}: {type(exc).__name__}: {exc}")
        raise


def run_at_once(kind: str, where: str) -> None:
    """``PROCESSES`` processes released together, each routing ``ROUNDS`` groups of its own."""
    # fork: the workers start at once without re-importing; each opens its own engine (none is inherited in use).
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(PROCESSES)
    errors = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(kind, where, i, barrier, errors)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    reported = []
    while not errors.empty():
        reported.append(errors.get())
    assert not alive and not reported and all(p.exitcode == 0 for p in procs), (reported, [p.exitcode for p in procs])


def expected_groups() -> set[str]:
    return {f"g{i}-{r}" for i in range(PROCESSES) for r in range(ROUNDS)}


@pytest.mark.integration  # starts a process
def test_groups_routed_at_once_by_many_processes_all_keep_their_entry(url: str) -> None:
    store = RoutingStore(url)  # the table exists before the workers start, as after the first run
    store.route("pre-existing", read_from="target", url="http://amp/pre", at=T0, run_id="earlier")
    run_at_once("store", url)
    groups = store.load()["groups"]
    assert set(groups) == expected_groups() | {SHARED, "pre-existing"}
    for i in range(PROCESSES):
        for r in range(ROUNDS):
            assert groups[f"g{i}-{r}"] == {"read_from": "target", "url": f"http://amp/g{i}-{r}",
                                           "since": (T0 + timedelta(seconds=r)).isoformat(), "run_id": f"run-{i}"}
    # One row all 8 processes wrote, ROUNDS times each: no write was lost even on the same row.
    assert store.version(SHARED) == PROCESSES * ROUNDS
    assert groups["pre-existing"]["run_id"] == "earlier"


@pytest.mark.integration  # starts a process
def test_workers_that_create_the_table_at_once_all_succeed(url: str) -> None:
    """No table yet: every process creates it on open, at the same time (the first run on a new database)."""
    run_at_once("store", url)
    assert set(RoutingStore(url).load()["groups"]) == expected_groups() | {SHARED}


@pytest.mark.integration  # starts a process
def test_the_old_json_manifest_loses_entries_under_the_same_load(tmp_path: Path) -> None:
    """The bug being fixed, shown: the same 8 processes against routing.json drop groups.

    A loss needs two processes to interleave their read and write, which is a matter of
    scheduling; three attempts are allowed, and every one so far has lost entries.
    """
    lost: set[str] = set()
    for attempt in range(3):
        manifest = tmp_path / f"routing-{attempt}.json"
        run_at_once("json", str(manifest))
        lost = expected_groups() - set(json.loads(manifest.read_bytes())["groups"])
        if lost:
            break
    assert lost, "the JSON manifest kept every entry in 3 attempts"
