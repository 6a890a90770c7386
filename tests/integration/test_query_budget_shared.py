"""Two workers (processes, each with its own engine) take from one workspace's query budget on one database, at
once: together they never get more than the budget, on a SQLite file and on the machine's PostgreSQL."""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select, text

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
T = 1_800_000_000.0
PER_MINUTE, PER_RUN, TRIES = 40, 70, 60


def consume(url: str, run_key: str, per_minute: int | None, per_run: int | None,
            start: multiprocessing.synchronize.Event, out: multiprocessing.Queue) -> None:
    """One worker: ``TRIES`` takes within the minute at T (its own clock); reports how many it was granted."""
    from promshift.adapters.query_budget import QueryBudgetLedger
    from promshift.core.query_budget import QueryBudget

    ledger = QueryBudgetLedger(url)
    budget = QueryBudget(per_minute=per_minute, per_run=per_run)
    start.wait(30)
    granted = sum(ledger.take(budget, workspace="promshift_target", run_key=run_key, now=T + i * 0.5).ok
                  for i in range(TRIES))
    out.put(granted)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'audit.db'}"
        return
    admin = create_engine(PG_URL)
    schema = f"promshift_test_{uuid.uuid4().hex[:8]}"
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()


def run_workers(url: str, run_keys: list[str], *, per_minute: int | None, per_run: int | None) -> list[int]:
    from promshift.adapters.query_budget import QueryBudgetLedger

    QueryBudgetLedger(url)  # the table, before the race
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=consume, args=(url, key, per_minute, per_run, start, out)) for key in run_keys]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return results


def test_two_workers_of_two_runs_share_the_minute_and_never_exceed_it(url: str) -> None:
    from promshift.adapters.query_budget import query_budget_counts

    results = run_workers(url, ["dag_a/run1", "dag_b/run1"], per_minute=PER_MINUTE, per_run=PER_RUN)
    # 120 tries in one minute by two workers: 40 granted in all, however they interleave.
    assert sum(results) == PER_MINUTE
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = {r.scope: r.used for r in conn.execute(select(query_budget_counts))}
    engine.dispose()
    assert rows["minute:promshift_target"] == PER_MINUTE
    # however they interleave (one worker may take the whole minute before the other starts: no row for it)
    assert rows.get("run:promshift_target:dag_a/run1", 0) + rows.get("run:promshift_target:dag_b/run1", 0) == PER_MINUTE


def test_two_workers_of_one_run_share_its_budget(url: str) -> None:
    results = run_workers(url, ["dag_a/run1", "dag_a/run1"], per_minute=None, per_run=PER_RUN)
    assert sum(results) == PER_RUN  # of 120 tries


def test_a_worker_whose_clock_lags_counts_in_the_newer_minute(tmp_path: Path) -> None:
    from promshift.adapters.query_budget import QueryBudgetLedger
    from promshift.core.query_budget import QueryBudget

    ledger = QueryBudgetLedger(f"sqlite:///{tmp_path / 'audit.db'}")
    budget = QueryBudget(per_minute=2)
    assert ledger.take(budget, workspace="ws", run_key="a", now=T + 60.2).ok  # a clock a little ahead
    assert ledger.take(budget, workspace="ws", run_key="b", now=T + 59.9).ok
    assert not ledger.take(budget, workspace="ws", run_key="b", now=T + 59.95).ok  # not a fresh minute T
