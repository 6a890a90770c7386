"""The audit store and ``promshift audit verify`` on SQLite and on the machine's local PostgreSQL.

Each tampering case is what someone who can write the audit database (but holds neither the
key nor the anchor store) could do; every one must end in BROKEN, exit 2, with its reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Column, MetaData, Table, create_engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from promshift.adapters.audit_anchor import SqlAuditAnchor, default_anchor
from promshift.adapters.audit_store import AuditStore, audit_events, event_row
from promshift.cli.audit import add_audit_commands
from promshift.core.audit import HMAC_SHA256_V2, SHA256_V1, AuditEvent, AuditKeyError, new_event
from promshift.core.stages import IllegalTransition, Stage

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
KEY = os.environ["PROMSHIFT_AUDIT_KEY"].encode()  # tests/conftest.py: the key every writer uses
ATTACKER_KEY = b"a-guessed-audit-key-987654321"


def fill(store: AuditStore, group: str = "gpu-memory") -> None:
    moves = [(Stage.PLANNED, Stage.DUAL_WRITING), (Stage.DUAL_WRITING, Stage.WARMING),
             (Stage.WARMING, Stage.VERIFIED)]
    for i, (frm, to) in enumerate(moves):
        store.append(group=group, run_id="r1", kind=f"step{i}", actor="promshift", at=T0 + timedelta(seconds=i),
                     evidence={"i": i}, stage_from=frm, stage_to=to)
    store.append(group=group, run_id="r1", kind="gate_failed", actor="promshift", at=T0 + timedelta(seconds=9),
                 evidence={"verdict": "FAILED"})


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_audit_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["audit", *argv])
    return int(args.handler(args))


# -- backends: SQLite files and throwaway PostgreSQL schemas ------------------------------------


@dataclass
class Backend:
    name: str
    url: str
    drop_guards: Callable[[Connection], None]


def _drop_sqlite_guards(conn: Connection) -> None:
    conn.execute(text("DROP TRIGGER IF EXISTS promshift_audit_no_update"))
    conn.execute(text("DROP TRIGGER IF EXISTS promshift_audit_no_delete"))


def _drop_pg_guards(conn: Connection) -> None:
    conn.execute(text("DROP TRIGGER IF EXISTS promshift_audit_append_only ON promshift_audit_events"))
    conn.execute(text("DROP TRIGGER IF EXISTS promshift_audit_no_truncate ON promshift_audit_events"))


@pytest.fixture
def pg_schemas() -> Iterator[Callable[[], str]]:
    """Throwaway schemas on the local PostgreSQL (trust auth on 127.0.0.1, database 'test'), dropped after."""
    made: list[str] = []
    try:
        admin = create_engine(PG_URL)
        with admin.connect():
            pass
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.fail(f"local PostgreSQL at {PG_URL} is required for this test: {exc}")

    def new() -> str:
        schema = f"promshift_test_{uuid.uuid4().hex[:8]}"
        with admin.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        made.append(schema)
        return f"{PG_URL}?options=-csearch_path%3D{schema}"

    yield new
    with admin.begin() as conn:
        for schema in made:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()


@pytest.fixture
def pg_url(pg_schemas: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> str:
    """An audit schema, with its anchor store in a second schema (as production keeps it apart)."""
    monkeypatch.setenv("PROMSHIFT_AUDIT_ANCHOR_URL", pg_schemas())
    return pg_schemas()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.delenv("PROMSHIFT_AUDIT_ANCHOR_URL", raising=False)
    if request.param == "sqlite":
        # The default anchor: anchors/audit-anchor.db beside the audit file.
        return Backend("sqlite", f"sqlite:///{tmp_path / 'audit.db'}", _drop_sqlite_guards)
    return Backend("postgresql", request.getfixturevalue("pg_url"), _drop_pg_guards)


# -- the tampering corpus -------------------------------------------------------------------------


def _insert(conn: Connection, events: list[AuditEvent]) -> None:
    for ev in events:
        conn.execute(audit_events.insert().values(**event_row(ev)))


def _forge(store: AuditStore, conn: Connection, steps: list[tuple[str, str | None, str | None]],
           key: bytes | None) -> None:
    prev = store.events()[-1]
    forged = []
    for kind, frm, to in steps:
        prev = new_event(prev=prev, group="gpu-memory", run_id="r1", kind=kind, stage_from=frm, stage_to=to,
                         actor="mallory", at=T0 + timedelta(minutes=5), evidence={"decision": "Approve"}, key=key)
        forged.append(prev)
    _insert(conn, forged)


def forged_approval_unkeyed(store: AuditStore, backend: Backend, conn: Connection) -> None:
    _forge(store, conn, [("approved", "verified", "approved")], key=None)


def forged_approval_wrong_key(store: AuditStore, backend: Backend, conn: Connection) -> None:
    _forge(store, conn, [("approved", "verified", "approved")], key=ATTACKER_KEY)


def forged_path_to_cut_over(store: AuditStore, backend: Backend, conn: Connection) -> None:
    _forge(store, conn, [("approved", "verified", "approved"), ("cut_over", "approved", "cut_over"),
                         ("run_complete", None, None)], key=ATTACKER_KEY)


def edited_evidence(store: AuditStore, backend: Backend, conn: Connection) -> None:
    backend.drop_guards(conn)
    conn.execute(text("UPDATE promshift_audit_events SET evidence='{\"verdict\":\"SUCCESSFUL\"}' WHERE seq=4"))


def deleted_trailing_events(store: AuditStore, backend: Backend, conn: Connection) -> None:
    """Delete the failed gate so the group reads as warming again."""
    backend.drop_guards(conn)
    conn.execute(text("DELETE FROM promshift_audit_events WHERE seq >= 3"))


def emptied_table(store: AuditStore, backend: Backend, conn: Connection) -> None:
    backend.drop_guards(conn)
    conn.execute(text("DELETE FROM promshift_audit_events"))


def dropped_table(store: AuditStore, backend: Backend, conn: Connection) -> None:
    conn.execute(text("DROP TABLE promshift_audit_events"))


def replaced_with_the_key(store: AuditStore, backend: Backend, conn: Connection) -> None:
    """Someone holding the key but not the anchor store writes a new history over the table."""
    backend.drop_guards(conn)
    conn.execute(text("DELETE FROM promshift_audit_events"))
    events: list[AuditEvent] = []
    for i in range(6):
        events.append(new_event(prev=events[-1] if events else None, group="gpu-memory", run_id="r1",
                                kind="forged", stage_from=None, stage_to=None, actor="mallory", at=T0,
                                evidence={"i": i}, key=KEY))
    _insert(conn, events)


TAMPERING = [
    pytest.param(forged_approval_unkeyed, "unkeyed (sha256-v1) after keyed events", id="forged-append-unkeyed"),
    pytest.param(forged_approval_wrong_key, "does not match its HMAC", id="forged-append-wrong-key"),
    pytest.param(forged_path_to_cut_over, "event seq 5: content does not match its HMAC", id="forged-path"),
    pytest.param(edited_evidence, "event seq 4: content does not match its HMAC", id="edited"),
    pytest.param(deleted_trailing_events, "the chain ends at seq 2 but seq 4 was anchored", id="deleted-trailing"),
    pytest.param(emptied_table, "the audit table is empty but 4 events were anchored", id="emptied"),
    pytest.param(dropped_table, "promshift_audit_events is missing but 4 events were anchored", id="dropped"),
    pytest.param(replaced_with_the_key, "event seq 4 does not match the anchored head", id="replaced"),
]


@pytest.mark.parametrize("tamper,reason", TAMPERING)
def test_verify_says_broken_with_the_reason(backend: Backend, tamper: Callable[..., None], reason: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    store = AuditStore(backend.url)
    fill(store)
    assert run_cli("verify", "--url", backend.url) == 0
    assert "audit chain OK: 4 events" in capsys.readouterr().out
    with store.engine.begin() as conn:
        tamper(store, backend, conn)
    store.engine.dispose()
    assert run_cli("verify", "--url", backend.url) == 2
    out, err = capsys.readouterr()
    first = out.splitlines()[0]
    assert first.startswith("audit chain BROKEN") and reason in first, out
    assert "Traceback" not in out + err
    assert run_cli("verify", "--url", backend.url, "--json") == 2
    details = json.loads(capsys.readouterr().out)
    assert details["ok"] is False and any(reason in p for p in details["problems"])
    assert details["anchor"] == {"seq": 4, "head": details["anchor"]["head"]}


def test_append_only_guards(backend: Backend) -> None:
    store = AuditStore(backend.url)
    fill(store)
    for sql in ("UPDATE promshift_audit_events SET actor='mallory'", "DELETE FROM promshift_audit_events"):
        with store.engine.connect() as conn, pytest.raises(DBAPIError, match="append-only"):
            conn.execute(text(sql))
    if backend.name == "postgresql":  # row triggers do not see TRUNCATE; a statement trigger does
        with store.engine.connect() as conn, pytest.raises(DBAPIError, match="append-only"):
            conn.execute(text("TRUNCATE promshift_audit_events"))
    anchor = default_anchor(backend.url)
    assert isinstance(anchor, SqlAuditAnchor)
    with anchor.engine.connect() as conn, pytest.raises(DBAPIError, match="append-only"):
        conn.execute(text("DELETE FROM promshift_audit_anchors"))


def test_append_read_verify(backend: Backend) -> None:
    heads = []
    store = AuditStore(backend.url, on_head=heads.append)
    fill(store)
    events = store.events(group="gpu-memory")
    assert [e.seq for e in events] == [1, 2, 3, 4] and {e.scheme for e in events} == {HMAC_SHA256_V2}
    assert events[0].at == T0 and events[0].at.tzinfo is not None
    assert store.stage_of("gpu-memory") == Stage.VERIFIED
    assert store.stage_of("never-seen") == Stage.PLANNED
    assert [h.seq for h in heads] == [1, 2, 3, 4] and heads[-1].head == events[-1].hash
    check = store.verify()
    assert check.ok and check.anchor == heads[-1] == check.head


def legacy_table(url: str) -> Table:
    """The audit table as releases before schemes created it (no ``scheme`` column)."""
    old = Table(audit_events.name, MetaData(),
                *[Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable, unique=c.unique)
                  for c in audit_events.c if c.name != "scheme"])
    engine = create_engine(url)
    old.metadata.create_all(engine)
    events: list[AuditEvent] = []
    for i in range(3):
        events.append(new_event(prev=events[-1] if events else None, group="gpu-memory", run_id="old",
                                kind=f"old{i}", stage_from=None, stage_to=None, actor="promshift",
                                at=T0 + timedelta(seconds=i), evidence={"i": i}, key=None))
    with engine.begin() as conn:
        for ev in events:
            conn.execute(old.insert().values(**{k: v for k, v in event_row(ev).items() if k != "scheme"}))
    engine.dispose()
    return old


def test_an_old_unkeyed_database_still_verifies_then_continues_keyed(
        backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    legacy_table(backend.url)
    assert run_cli("verify", "--url", backend.url) == 0
    out = capsys.readouterr().out
    assert "audit chain OK: 3 events" in out and f"seq 1..3: {SHA256_V1} (3 events)" in out
    assert "no anchored head" in out
    # A writer of this release adds the scheme column and continues the same chain, keyed and anchored.
    store = AuditStore(backend.url)
    store.append(group="gpu-memory", run_id="new", kind="note", actor="a", at=T0, evidence={})
    assert [e.scheme for e in store.events()] == [SHA256_V1] * 3 + [HMAC_SHA256_V2]
    if backend.name == "postgresql":  # the upgrade also closes TRUNCATE, which old row triggers let through
        with store.engine.connect() as conn, pytest.raises(DBAPIError, match="append-only"):
            conn.execute(text("TRUNCATE promshift_audit_events"))
    assert run_cli("verify", "--url", backend.url) == 0
    out = capsys.readouterr().out
    assert f"seq 1..3: {SHA256_V1}" in out and f"seq 4..4: {HMAC_SHA256_V2}" in out and "anchored head: seq 4" in out
    # ...and an unkeyed event after that is a forgery.
    with store.engine.begin() as conn:
        _forge(store, conn, [("approved", None, None)], key=None)
    assert run_cli("verify", "--url", backend.url) == 2


def test_verify_without_the_key_cannot_vouch_for_keyed_events(
        backend: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fill(AuditStore(backend.url))
    monkeypatch.delenv("PROMSHIFT_AUDIT_KEY")
    monkeypatch.setenv("PROMSHIFT_HOME", str(Path(os.environ.get("TMPDIR", "/tmp")) / uuid.uuid4().hex))
    assert run_cli("verify", "--url", backend.url) == 2
    assert "cannot be checked: no audit key was given" in capsys.readouterr().out
    with pytest.raises(AuditKeyError, match="no audit key: set the Airflow connection promshift_audit"):
        AuditStore(backend.url).append(group="g", run_id="r", kind="k", actor="a", at=T0, evidence={})


# -- files: missing and corrupt ---------------------------------------------------------------------


@pytest.mark.parametrize("command", [["verify"], ["verify", "--json"], ["show", "gpu-memory"]])
def test_a_missing_database_file_is_an_error_and_nothing_is_created(
        tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state" / "audit.db"
    assert run_cli(*command, "--url", f"sqlite:///{db}") == 66
    out, err = capsys.readouterr()
    assert "no audit database at" in out and "nothing created" in out and "Traceback" not in out + err
    assert not (tmp_path / "state").exists()


def _garbage(db: Path) -> None:
    db.write_bytes(b"this is not a database\n" * 100)


def _truncated(db: Path) -> None:
    store = AuditStore(f"sqlite:///{db}")
    for i in range(300):
        store.append(group="g", run_id="r", kind="k", actor="a", at=T0, evidence={"pad": "x" * 200, "i": i})
    store.engine.dispose()
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


def _zeroed_page(db: Path) -> None:
    store = AuditStore(f"sqlite:///{db}")
    for i in range(300):
        store.append(group="g", run_id="r", kind="k", actor="a", at=T0, evidence={"pad": "y" * 200, "i": i})
    store.engine.dispose()
    data = bytearray(db.read_bytes())
    data[8192:12288] = b"\xff" * 4096
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("corrupt", [_garbage, _truncated, _zeroed_page], ids=["garbage", "truncated", "page"])
def test_a_corrupt_file_is_reported_broken_without_a_traceback(
        tmp_path: Path, corrupt: Callable[[Path], None], capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "audit.db"
    corrupt(db)
    before = db.read_bytes()
    assert run_cli("verify", "--url", f"sqlite:///{db}") == 2
    out, err = capsys.readouterr()
    assert out.startswith("audit chain BROKEN") and "corrupt" in out and "Traceback" not in out + err
    assert db.read_bytes() == before  # opened read-only
    # show prints what it can read, never a traceback, and never hides the corruption.
    assert run_cli("show", "g", "--url", f"sqlite:///{db}") in (0, 2)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "corrupt" in out + err


def test_show_cli_lists_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    fill(AuditStore(url))
    assert run_cli("show", "gpu-memory", "--url", url) == 0
    out = capsys.readouterr().out
    assert "planned -> dual_writing" in out and "current stage of gpu-memory: verified" in out


def test_illegal_stage_history_is_caught_on_read(tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'a.db'}")
    store.append(group="g", run_id="r", kind="x", actor="a", at=T0, evidence={},
                 stage_from=Stage.PLANNED, stage_to=Stage.CUT_OVER)
    with pytest.raises(IllegalTransition):
        store.stage_of("g")


def test_a_server_database_must_name_its_anchor_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMSHIFT_AUDIT_ANCHOR_URL", raising=False)
    with pytest.raises(ValueError, match="set PROMSHIFT_AUDIT_ANCHOR_URL"):
        default_anchor("postgresql+psycopg://u:hunter2@db.example/audit")
    try:
        default_anchor("postgresql+psycopg://u:hunter2@db.example/audit")
    except ValueError as exc:
        assert "hunter2" not in str(exc)


# -- PostgreSQL: concurrency ------------------------------------------------------------------------


def test_postgres_concurrent_writers_keep_one_anchored_chain(pg_url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    store = AuditStore(pg_url)
    anchor = store.anchor
    assert isinstance(anchor, SqlAuditAnchor)

    def write(i: int) -> None:
        AuditStore(pg_url).append(group=f"g{i % 3}", run_id="r", kind="k", actor="a", at=T0, evidence={"i": i})

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(write, range(30)))
    check = store.verify()
    assert check.ok and check.events == 30, check.problems
    # Heads arrive out of order from racing writers; every one is anchored and the latest is the last event.
    assert check.anchor is not None and check.anchor.seq == 30 and check.anchor == check.head
    with anchor.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM promshift_audit_anchors")).scalar() == 30


def test_sqlite_legacy_triggers_keep_their_names(tmp_path: Path) -> None:
    """Existing tooling (and the tampering tests) drop the guards by these names."""
    db = tmp_path / "a.db"
    AuditStore(f"sqlite:///{db}")
    con = sqlite3.connect(db)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    con.close()
    assert names == {"promshift_audit_no_update", "promshift_audit_no_delete"}


def test_verify_json_on_an_intact_chain(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    store = AuditStore(backend.url)
    fill(store)
    assert run_cli("verify", "--url", backend.url, "--json") == 0
    details = json.loads(capsys.readouterr().out)
    last = store.events()[-1]
    assert details["ok"] is True and details["events"] == 4 and details["problems"] == []
    assert details["schemes"] == [{"scheme": HMAC_SHA256_V2, "first_seq": 1, "last_seq": 4, "events": 4}]
    assert details["anchor"] == details["head"] == {"seq": 4, "head": last.hash}
    assert details["anchor_store"]


def test_a_database_password_never_reaches_the_output(pg_schemas: Callable[[], str],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Trust auth ignores the password, so the URL works; verify, show and their errors must not print it."""
    secret = "s3cret-db-password"
    with_password = pg_schemas().replace("postgres@", f"postgres:{secret}@")
    monkeypatch.setenv("PROMSHIFT_AUDIT_ANCHOR_URL", pg_schemas().replace("postgres@", f"postgres:{secret}@"))
    store = AuditStore(with_password)
    fill(store)
    with store.engine.begin() as conn:
        dropped_table(store, Backend("postgresql", with_password, _drop_pg_guards), conn)
    for argv in (["verify"], ["verify", "--json"], ["show", "gpu-memory"]):
        run_cli(*argv, "--url", with_password)
    unreachable = with_password.replace("127.0.0.1:5432", "127.0.0.1:1")
    assert run_cli("verify", "--url", unreachable) == 2
    out, err = capsys.readouterr()
    assert "postgres:***@" in out and "is missing but 4 events were anchored" in out
    assert secret not in out + err


class AnchorThatGoesDown(SqlAuditAnchor):
    """A real anchor store that becomes unreachable after ``up`` heads."""

    def __init__(self, url: str, up: int) -> None:
        super().__init__(url)
        self.up = up

    def record(self, seq: int, head: str) -> None:
        if seq > self.up:
            raise ConnectionError("anchor store unreachable")
        super().record(seq, head)


def test_an_anchor_outage_is_logged_and_verify_names_the_unprotected_events(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The event is committed first (an anchor ahead of the chain would read as truncation); the gap is visible."""
    anchor = AnchorThatGoesDown(f"sqlite:///{tmp_path / 'anchor.db'}", up=2)
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}", anchor=anchor)
    fill(store)
    assert [e.seq for e in store.events()] == [1, 2, 3, 4]
    assert "seq 4 is committed but its head was not anchored" in caplog.text
    check = store.verify()
    assert not check.ok and "2 events after the last anchored head (seq 2) are not anchored" in check.problems[0]
    check = store.verify(allow_unanchored_tail=True)
    assert check.ok and check.anchor is not None and check.anchor.seq == 2
    assert any("2 events after the last anchored head (seq 2)" in n for n in check.notes)


def test_latest_runs_reads_the_runs_that_say_where_each_group_stands_on_both_databases(backend: Backend) -> None:
    """The latest run, and the latest run with a validation / gate, per group, oldest first; runs that share an id
    across groups (bake-watch runs) are each group's own; nothing of the other runs. SQLite seeks two IN lists,
    PostgreSQL the (group, run id) pairs: the same answer."""
    store = AuditStore(backend.url)
    at = T0
    plan = [("g-a", "r1", "validated"), ("g-b", "r1", "validated"), ("g-a", "r1", "gate_passed"),
            ("g-a", "r2", "validated"), ("g-a", "shared", "bake_check"), ("g-b", "shared", "bake_check"),
            ("g-b", "r3", "notified"), ("g-a", "r4", "notified"), ("g-a", "shared", "bake_check")]
    for group, run_id, kind in plan:
        at += timedelta(minutes=1)
        store.append(group=group, run_id=run_id, kind=kind, actor="promshift", at=at, evidence={"n": 1})
    digests = store.latest_runs([frozenset({"validated"}), frozenset({"gate_passed"})])
    assert {g: [(e.run_id, e.kind) for e in d.events] for g, d in digests.items()} == {
        # g-a: its gate's run r1, its last validation's run r2, its latest run "shared" (both checks); not r4.
        "g-a": [("r1", "validated"), ("r1", "gate_passed"), ("r2", "validated"), ("shared", "bake_check"),
                ("shared", "bake_check")],
        # g-b: r1 (validated) and r3 (its latest event); not g-a's events of "shared", nor its own.
        "g-b": [("r1", "validated"), ("r3", "notified")],
    }
    assert {g: d.runs for g, d in digests.items()} == {"g-a": 4, "g-b": 3}
    assert digests["g-a"].last_event_at == at
