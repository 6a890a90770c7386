"""The board's overview and /metrics with 1,000 groups and a year of audit events, on SQLite and PostgreSQL.

    PYTHONPATH=include:. .venv/bin/python bench/board_scale/run.py [--groups 1000] [--days 365]
        [--bake-interval-min 15] [--bake-hours 24] [--backends sqlite postgresql] [--out FILE]

A catalog of ``--groups`` groups (bench/catalog/run.py's shape) and a year of events
(bench/board_scale/history.py: migrations, failed gates and reruns, approvals, a bake check every 15 minutes
for a day per cut-over, failed bakes, decommissions) are written through the audit store's schema and hash
chain; a baseline of 10 groups and a week is written beside them. Then the real board app (``create_app``,
Airflow's auth dependencies with the Simple auth manager, every group readable) answers through FastAPI's
TestClient:

- ``cold_s``: the first request of a new app (new ``BoardSource``, new engine, nothing cached in the process;
  the OS page cache holds the database, as on a server that has been up). ``/ (first start)``: on a database no
  board verified yet, the first request starts the whole chain verification on a thread and waits for it at most
  1 s (then shows "being verified"); ``/`` and ``/api/groups``: a server started after that goes on from the
  checkpoint the verification saved;
- ``chain_first_verify_s``: when that first whole verification ended (from the cold request's start);
- ``warm_s``: the median of the next 5 requests, once it ended (the steady state: new events verified
  incrementally, a whole verification in the background every 5 minutes).

for ``/`` (the overview page, HTML), ``/api/groups`` (its JSON) and ``/metrics``. Writes
``bench/results/board-scale.json``. PostgreSQL is the machine's (127.0.0.1:5432, database ``test``): each run
makes throwaway schemas and drops them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "board-scale.json"
sys.path[:0] = [str(REPO / "include"), str(REPO), str(REPO / "bench" / "catalog"), str(Path(__file__).parent)]
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="promshift-board-bench-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
KEY = "bench-only-audit-key-0123456789abcdef"
os.environ["PROMSHIFT_AUDIT_KEY"] = KEY
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
START = datetime(2025, 12, 1, tzinfo=UTC)


@contextmanager
def sqlite_urls(tmp: Path, name: str) -> Iterator[tuple[str, str]]:
    yield f"sqlite:///{tmp / name / 'audit.db'}", f"sqlite:///{tmp / name / 'anchor.db'}"


@contextmanager
def postgres_urls(tmp: Path, name: str) -> Iterator[tuple[str, str]]:
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_URL)
    schemas = [f"promshift_bench_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with admin.begin() as conn:
        for schema in schemas:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield tuple(f"{PG_URL}?options=-csearch_path%3D{s}" for s in schemas)  # type: ignore[misc]
    finally:
        with admin.begin() as conn:
            for schema in schemas:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


BACKENDS: dict[str, Callable[[Path, str], Any]] = {"sqlite": sqlite_urls, "postgresql": postgres_urls}


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = call()
    return time.perf_counter() - t0, out


def cpu_timed(call: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall and CPU seconds of ``call`` (CPU: the whole process, app thread included; the wall time on 2 shared
    cores grows with the machine's load, the CPU time much less)."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = call()
    return time.perf_counter() - t0, time.process_time() - c0, out


def measure(catalog_path: Path, audit_url: str, anchor_url: str, *, warm_repeats: int = 5) -> dict[str, Any]:
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.testclient import TestClient

    from promshift.adapters.audit_anchor import SqlAuditAnchor
    from promshift.adapters.audit_store import AuditStore
    from promshift.adapters.settings import load_catalog
    from promshift.board.app import BoardSource, create_app

    dag_ids = {g.dag_id for g in load_catalog(catalog_path, profile=None).groups}

    class EveryGroupReadable(SimpleAuthManager):  # type: ignore[type-arg]
        """Airflow's per-DAG filter over the bench catalog's DAG ids (the base class reads Airflow's DB)."""

        def get_authorized_dag_ids(self, *, user: Any, method: Any = "GET", session: Any = None) -> set[str]:
            return self.filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method=method)

    airflow_app._AuthManagerState.instance = EveryGroupReadable()
    out: dict[str, Any] = {}
    # /metrics first: it never verifies the chain, so its cold request shares the process with nothing. Then the
    # overview on a database no board ever verified (no checkpoint: the first start), then as a restarted server
    # finds it (the checkpoint the first one saved).
    for label, path in (("/metrics", "/metrics"), ("/ (first start)", "/"), ("/", "/"), ("/api/groups", "/api/groups")):
        class Source(BoardSource):
            @property
            def audit(self) -> AuditStore:
                with self._lock:
                    if self._audit is None:
                        self._audit = AuditStore(audit_url, anchor=SqlAuditAnchor(anchor_url))
                    return self._audit

        app = create_app(Source(catalog_path=catalog_path, audit_url=audit_url, profile=None,
                                run_states=lambda dag_id, run_ids: {}))
        app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer-vic", role="viewer")
        client = TestClient(app)
        started = time.perf_counter()
        cold, cold_cpu, response = cpu_timed(lambda path=path, client=client: client.get(path))
        assert response.status_code == 200, (path, response.status_code, response.text[:300])
        row: dict[str, Any] = {"cold_s": round(cold, 3), "cold_cpu_s": round(cold_cpu, 3)}
        watch = app.state.board._chain
        if watch is not None:
            # The first whole verification runs on a thread (the cold request waited for it at most 1 s): wait for
            # it, so the warm requests measure the steady state (new events verified incrementally).
            row["chain_pending_on_cold"] = ("being verified" in response.text if path == "/" else
                                            response.json()["chain"]["pending"])
            thread = watch._thread
            if thread is not None:
                thread.join()
            row["chain_first_verify_s"] = round(time.perf_counter() - started, 3)
        warm = [cpu_timed(lambda path=path, client=client: client.get(path))[:2] for _ in range(warm_repeats)]
        response = client.get(path)
        row.update({"warm_s": round(statistics.median(w for w, _ in warm), 3),
                    "warm_cpu_s": round(statistics.median(c for _, c in warm), 3), "bytes": len(response.content)})
        if path == "/api/groups":
            data = response.json()
            row["chain_ok"] = data["chain"]["ok"]
            row["chain_events"] = data["chain"]["events"]
            row["groups_shown"] = len(data["groups"])
            row["stage_problems"] = sum(1 for g in data["groups"] if g["stage_problem"])
            stages: dict[str, int] = {}
            for g in data["groups"]:
                stages[g["stage"]] = stages.get(g["stage"], 0) + 1
            row["stages"] = dict(sorted(stages.items()))
        out[label] = row
        app.state.board.audit.engine.dispose()
    return out


def one(backend: str, tmp: Path, name: str, groups: int, shape: Any) -> dict[str, Any]:
    from catalog_run import catalog_text  # type: ignore[import-not-found]
    from history import plan_year, write_year  # type: ignore[import-not-found]
    from sqlalchemy import func, select

    from promshift.adapters.audit_anchor import SqlAuditAnchor
    from promshift.adapters.audit_store import AuditStore, audit_events
    from promshift.adapters.settings import load_catalog

    (tmp / name).mkdir(parents=True, exist_ok=True)
    catalog_path = tmp / name / "catalog.yaml"
    catalog_path.write_text(catalog_text(groups))
    catalog = load_catalog(catalog_path, profile=None)
    plan_s, planned = timed(lambda: plan_year(catalog, START, shape))
    with BACKENDS[backend](tmp, f"{name}-{backend}") as (audit_url, anchor_url):
        anchor = SqlAuditAnchor(anchor_url)
        store = AuditStore(audit_url, anchor=anchor)  # creates the schema the way a writer does
        write_s, _ = timed(lambda: write_year(store.engine, anchor, planned, KEY.encode()))
        with store.engine.connect() as conn:
            events = conn.execute(select(func.count()).select_from(audit_events)).scalar_one()
            by_kind = dict(conn.execute(select(audit_events.c.kind, func.count()).group_by(audit_events.c.kind)).all())
        store.engine.dispose()
        timings = measure(catalog_path, audit_url, anchor_url)
    print(f"{backend:>10} {name:>6} groups={groups:>5} events={events:>8} write={write_s:6.1f}s "
          f"load={os.getloadavg()[0]:.1f} "
          + " ".join(f"{p} cold={t['cold_s']:.3f}s ({t['cold_cpu_s']:.3f} cpu) warm={t['warm_s']:.3f}s "
                     f"({t['warm_cpu_s']:.3f} cpu)" for p, t in timings.items()), flush=True)
    return {"backend": backend, "scale": name, "groups": groups, "days": shape.days, "events": events,
            "events_by_kind": dict(sorted(by_kind.items())), "plan_s": round(plan_s, 2),
            "write_s": round(write_s, 2), "load_avg_1m": round(os.getloadavg()[0], 2), "timings": timings}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--bake-interval-min", type=float, default=15.0)
    parser.add_argument("--bake-hours", type=float, default=24.0)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"], choices=sorted(BACKENDS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--before", type=Path, help="an earlier result (e.g. before a fix) to keep beside this one")
    args = parser.parse_args(argv)
    import importlib.util

    spec = importlib.util.spec_from_file_location("catalog_run", REPO / "bench" / "catalog" / "run.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["catalog_run"] = module
    from history import Shape  # type: ignore[import-not-found]

    shape = Shape(days=args.days, bake_interval_s=args.bake_interval_min * 60, bake_period_s=args.bake_hours * 3600)
    baseline = Shape(days=7, bake_interval_s=shape.bake_interval_s, bake_period_s=shape.bake_period_s)
    rows = []
    with tempfile.TemporaryDirectory(prefix="promshift-board-bench-") as tmp:
        for backend in args.backends:
            rows.append(one(backend, Path(tmp), "base", 10, baseline))
            rows.append(one(backend, Path(tmp), "scale", args.groups, shape))
    result = {
        "what": "the board's overview (/, /api/groups) and /metrics through the real app (TestClient), cold "
                "(first request of a new app and engine) and warm (median of 5)",
        "budget_s": 2.0,
        "shape": {"days": args.days, "bake_interval_s": shape.bake_interval_s, "bake_period_s": shape.bake_period_s},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "note": "2 cores shared with other sessions: wall times grow with load_avg_1m; *_cpu_s is the "
                            "process's CPU time for the request (the app runs in the same process)"},
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": rows,
    }
    if args.before:
        before = json.loads(args.before.read_text())
        result["before"] = {"note": "the same bench on the code before this result's commit", "at": before["at"],
                            "runs": [{k: r[k] for k in ("backend", "scale", "groups", "events", "timings")}
                                     for r in before["runs"]]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
