"""Faults of shared state: 9 the audit database unreachable at a stage transition; 12 two runs of
one group at once; 13 two groups cutting over at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from promshift.adapters.deploy import FileConfigDeployer
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import load_catalog
from promshift.core.render import remote_write_name
from promshift.local.faults.env import (
    APPROVER,
    CATALOG,
    GROUP,
    OTHER_GROUP,
    PG_ADMIN_URL,
    PROFILE,
    Fault,
    FaultEnv,
    FaultResult,
    deploy,
    now,
    rollback,
    small_group,
)
from promshift.steps.migration import GroupMigration

# -- 9: the audit database unreachable at a stage transition ---------------------------------------------------


class TcpProxy:
    """127.0.0.1 proxy to PostgreSQL that can be cut (every connection closed, new ones refused) and resumed."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self.listener is not None:
            # shutdown first: close() alone leaves the socket listening while the accept thread is blocked in it
            # (Linux keeps the file open until accept returns), so the port could not be bound again on resume.
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            self.listener = None
        with self.lock:
            for s in self.conns:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
            self.conns.clear()


@contextlib.contextmanager
def pg_database(prefix: str) -> Iterator[str]:
    """A throwaway database on the local PostgreSQL (trust auth); its name."""
    from sqlalchemy import create_engine, text

    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def fault_audit_unreachable(env: FaultEnv) -> FaultResult:
    f = Fault(env, "audit database unreachable at a stage transition", "deploy_dual_write -> dual_writing")
    proxy = TcpProxy(("127.0.0.1", 5432))
    proxy.start()
    with pg_database("promshift_fault9") as db:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/{db}"
        audit = env.audit(url, "f9")

        class CutAfterWrite(FileConfigDeployer):
            def deploy(self, *args: Any, **kwargs: Any) -> Any:
                outcome = super().deploy(*args, **kwargs)
                proxy.cut()  # the file is written, reloaded and verified live; the audit database goes away
                return outcome

        from promshift.adapters.file_deployment import FileDeployment
        from promshift.core.deploy import group_entry, group_entry_record

        b, g = env.backends(), small_group()
        m = env.migration(audit, "manual__fault-9", group=g, backends=b, deployer=FileDeployment(
            CutAfterWrite(b.source_config_path, b.source, promtool=b.promtool),
            group_entry(g, b.target_remote_write_url, b.target_sigv4),
            record=group_entry_record(g, b.target_remote_write_url, b.target_sigv4), keep_others=True))
        m.validate(now())
        snap = m.snapshot(now())
        try:
            m.deploy_dual_write(snap, now())
            error = "none"
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        entry = remote_write_name(GROUP)
        while_down = {"file_is_snapshot": env.config_bytes() == f.original, "loaded": entry in env.loaded_entries()}
        proxy.start()  # the database is back; Airflow's rollback task runs
        audit.engine.dispose()
        rolled = rollback(m, snap)
        kinds = [e.kind for e in audit.events()]
        f.details.update(error=error, while_audit_down=while_down, rollback=rolled)
        result = f.finish(outcome=f"dual_write_deployed could not be appended ({error[:100]}); the deploy was undone "
                                  f"before the error rose (file is snapshot: {while_down['file_is_snapshot']}, "
                                  f"loaded: {while_down['loaded']}); rollback recorded once the database was back",
                          notes="PostgreSQL behind a local TCP proxy that was cut right after the deployer wrote, "
                                "reloaded and verified the entry (before the audit append); FIXED in migration.py: "
                                "before, the entry stayed deployed and live with no audit event",
                          audit=audit, must_have=("snapshot_taken", "rolled_back"),
                          extra_ok=while_down["file_is_snapshot"] and not while_down["loaded"]
                          and "dual_write_deployed" not in kinds and error != "none")
        audit.engine.dispose()
        proxy.cut()
    return result


# -- 12: two runs of one group at once ------------------------------------------------------------------------


def fault_two_runs_one_group(env: FaultEnv) -> FaultResult:
    from promshift.steps.migration import GroupNotStartable

    f = Fault(env, "two runs of one group triggered at once", "validate")
    url = env.sqlite_url("f12")
    env.audit(url, "f12")  # create the database once
    runs = {rid: env.migration(env.audit(url, "f12"), rid) for rid in ("manual__fault-12-a", "manual__fault-12-b")}
    barrier = threading.Barrier(len(runs))
    outcome: dict[str, str] = {}

    def validate(rid: str) -> None:
        barrier.wait()
        try:
            runs[rid].validate(now())
            outcome[rid] = "validated"
        except GroupNotStartable as exc:
            outcome[rid] = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001
            outcome[rid] = f"error: {type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=validate, args=(rid,)) for rid in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [rid for rid, o in outcome.items() if o == "validated"]
    losers = [rid for rid in runs if rid not in winners]
    results: dict[str, Any] = {}
    for rid in losers:  # the refused run's rollback task: nothing was snapshotted, nothing to do
        results[rid] = rollback(runs[rid], None)
    if winners:
        m = runs[winners[0]]
        # While the winner holds the group, a late third run is refused too.
        late = env.migration(env.audit(url, "f12"), "manual__fault-12-late")
        try:
            late.validate(now())
            results["late"] = "validated (wrong)"
        except GroupNotStartable as exc:
            results["late"] = f"refused: {str(exc)[:100]}"
        rollback(late, None)
        snap = m.snapshot(now())
        m.deploy_dual_write(snap, now())
        results[winners[0]] = rollback(m, snap)
    audit = env.audit(url, "f12")
    from promshift.orchestration.dag_factory import build_migration_dag, migration_targets

    # The group's migration DAG as the DAG file builds it: one per target connection, shared by its groups.
    catalog = load_catalog(CATALOG, profile=PROFILE)
    target = catalog.get(GROUP).target
    members = migration_targets(catalog.groups)[target]
    max_active = build_migration_dag(members, target=target, catalog_path=CATALOG, profile=PROFILE).max_active_runs
    f.details.update(validate=outcome, results=results, dag_max_active_runs=max_active, dag_groups=len(members))
    won = results.get(winners[0], {}) if winners else {}
    return f.finish(outcome=f"{len(winners)} run validated, {len(losers)} refused (GroupNotStartable: the group "
                            f"is held by the first claim in the audit chain); late run {results.get('late', '-')[:8]}; "
                            f"winner rolled back identical={won.get('restored_identical')}",
                    notes="two GroupMigration runs (own audit-store engines, one SQLite file) validated at once from "
                          "two threads behind a barrier; FIXED in migration.py: a run now holds its group from its "
                          "validated event until it completes or rolls back. That claim is the only guard: the "
                          f"group's migration DAG is its target's, shared by {len(members)} group(s), and lets "
                          f"{max_active} runs at once (room for a run of every group)",
                    audit=audit, must_have=("validated", "validation_failed", "rollback_not_needed", "rolled_back"),
                    extra_ok=len(winners) == 1 and max_active >= len(members) and str(
                        results.get("late", "")).startswith("refused") and won.get("restored_identical") is True)


# -- 13: two groups cutting over at once --------------------------------------------------------------------------


ROLLBACK_KEYS = ("method", "restored_identical", "kept_changes_since_snapshot", "own_entry_removed",
                 "remote_write_still_live")


def fault_two_groups_cut_over(env: FaultEnv) -> FaultResult:
    groups = (small_group(GROUP), small_group(OTHER_GROUP))
    f = Fault(env, "two groups cutting over at once", "cutover", groups=groups)
    with pg_database("promshift_fault13") as db:
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
        stores = [env.audit(url, "f13") for _ in groups]
        ms = [env.migration(store, f"manual__fault-13-{g.name}", group=g) for store, g in zip(stores, groups,
                                                                                                 strict=True)]
        snaps = []
        for m in ms:  # each group dual-writes, warms up and is approved (the source file: one deploy at a time)
            snap, _ = deploy(m)
            snaps.append(snap)
            m.start_warmup(now())
            m.record_approval(decision="Approve", by=APPROVER, comment="fault 13", now=now())
        barrier = threading.Barrier(len(ms))
        cut: dict[str, Any] = {}

        def cutover(m: GroupMigration) -> None:
            barrier.wait()
            try:
                cut[m.group.name] = m.cutover(now())["routing"]
            except Exception as exc:  # noqa: BLE001
                cut[m.group.name] = f"error: {type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=cutover, args=(m,)) for m in ms]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        routing = RoutingStore(url, engine=stores[0].engine)
        both = {g.name: routing.read_from(g.name) for g in groups}
        # Both roll back, the first-deployed group first: its snapshot predates the other group's entry.
        rolled = [m.rollback(s, reason="fault 13: end", now=now()) for m, s in zip(ms, snaps, strict=True)]
        audit = env.audit(url, "f13")
        f.details.update(cut_over=cut, read_from_after_cutover=both,
                         rollbacks=[{k: r.get(k) for k in ROLLBACK_KEYS} for r in rolled])
        result = f.finish(outcome=f"both cut over at once: read_from {both}; both rolled back (first group first: "
                                  f"{rolled[0]['method']}, kept {rolled[0].get('kept_changes_since_snapshot')}); "
                                  "source back to the bytes before either",
                          notes="two GroupMigrations on their own engines against one PostgreSQL database "
                                "(127.0.0.1:5432, a throwaway database), cutover() from two threads behind a barrier; "
                                "FIXED in migration.py: a rollback whose snapshot predates another group's entry "
                                "removes only its own entry (before, it wrote its snapshot back and dropped the other "
                                "group's live entry, and the other's later rollback resurrected the first's)",
                          audit=audit, must_have=("cut_over", "rolled_back"),
                          extra_ok=both == {g.name: "target" for g in groups}
                          and [e.kind for e in audit.events()].count("cut_over") == 2)
        for store in [*stores, audit]:
            store.engine.dispose()
    return result
