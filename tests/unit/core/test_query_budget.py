"""The per-workspace query budget: the accounting (core), the ledger's gate (SQLite here), and the checks ending
INCONCLUSIVE, never FAILED, when it is spent (a scripted local Prometheus that counts what it receives)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.latency_probe import LatencyProbe
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.query_budget import QueryBudgetLedger, WorkspaceQueryGate, query_gate
from promshift.core.query_budget import (
    BudgetCount,
    QueryBudget,
    QueryBudgetError,
    QueryBudgetExhausted,
    minute_of,
    take,
)
from promshift.core.verdicts import Verdict
from tests.unit.adapters.test_latency_probe import ok_matrix, policy, servers  # noqa: F401 - servers is a fixture
from tests.unit.orchestration.test_operators import dag, env, make_context  # noqa: F401 - fixtures

T = 1_800_000_000.0  # a minute's start
assert T % 60 == 0


# -- the accounting -------------------------------------------------------------------------------


def test_a_minute_holds_per_minute_queries_and_the_next_minute_starts_from_zero() -> None:
    budget = QueryBudget(per_minute=2)
    minute = run = None
    for _ in range(2):
        grant = take(budget, workspace="ws", minute=minute, run=run, now=T + 10)
        assert grant.ok
        minute, run = grant.minute, grant.run
    assert minute == BudgetCount(T, 2)
    refused = take(budget, workspace="ws", minute=minute, run=run, now=T + 45)
    assert not refused.ok and refused.wait_s == pytest.approx(15.0)
    assert refused.reason == "query budget of workspace 'ws' spent: 2 of 2 queries per minute used"
    assert refused.minute == minute  # nothing taken
    nxt = take(budget, workspace="ws", minute=minute, run=run, now=T + 60)
    assert nxt.ok and nxt.minute == BudgetCount(T + 60, 1) and nxt.run == BudgetCount(0.0, 3)


def test_a_spent_run_budget_refuses_without_a_wait_and_before_the_minute_is_touched() -> None:
    budget = QueryBudget(per_minute=100, per_run=3)
    refused = take(budget, workspace="ws", minute=BudgetCount(T, 1), run=BudgetCount(0.0, 3), now=T + 1)
    assert not refused.ok and refused.wait_s is None
    assert "3 of 3 queries per check run used" in str(refused.reason)
    assert take(budget, workspace="ws", minute=None, run=BudgetCount(0.0, 2), now=T, queries=2).ok is False
    assert take(QueryBudget(), workspace="ws", minute=None, run=BudgetCount(0.0, 10**6), now=T).ok


def test_minutes_are_clock_minutes() -> None:
    assert minute_of(T + 59.999) == T and minute_of(T + 60) == T + 60


@pytest.mark.parametrize(("data", "error"), [
    ({"per_minute": 0}, "per_minute must be an integer from 1"),
    ({"per_run": "10"}, "per_run must be an integer"),
    ({"per_run": True}, "per_run must be an integer"),
    ({"per_minute": 10, "max_wait": "2h"}, "max_wait must be from 0s to 1h"),
    ({"max_wait": "soon"}, "max_wait"),
    ({"max_wait": 30}, "max_wait must be a duration with its unit (such as '30s'), got 30"),
    ({"max_wait": "30"}, "max_wait must be a duration with its unit"),
    ({"per_minuet": 5}, "unknown key(s) per_minuet"),
    ([1], "must be a mapping"),
])
def test_bad_settings_are_refused_naming_the_field(data: Any, error: str) -> None:
    with pytest.raises(QueryBudgetError, match=None) as caught:
        QueryBudget.from_mapping(data)
    assert error in str(caught.value)


def test_settings_from_a_connection_extra() -> None:
    assert QueryBudget.from_mapping({"per_minute": 120, "per_run": 2000, "max_wait": "90s"}) == QueryBudget(
        120, 2000, 90.0)
    assert not QueryBudget.from_mapping(None).limited
    assert query_gate({}, workspace="promshift_target", run_key="r") is None


# -- the gate on a real ledger (SQLite file) ------------------------------------------------------


@pytest.fixture
def ledger(tmp_path: Path) -> QueryBudgetLedger:
    return QueryBudgetLedger(f"sqlite:///{tmp_path / 'audit.db'}")


def test_the_gate_waits_for_the_next_minute_then_refuses_past_max_wait(ledger: QueryBudgetLedger) -> None:
    now = [T + 50.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    gate = WorkspaceQueryGate(ledger, QueryBudget(per_minute=2, max_wait_s=30.0), workspace="ws", run_key="r1",
                              clock=lambda: now[0], sleep=sleep)
    gate(), gate()
    gate()  # the minute is spent: waits ~10 s for the next one
    assert slept == [pytest.approx(10.05)] and gate.taken == 3
    gate()
    with pytest.raises(QueryBudgetExhausted, match="2 of 2 queries per minute used after waiting 10s"):
        gate()  # the next minute is ~60 s away: more than the 30 s max_wait left
    assert len(slept) == 1


def test_the_run_budget_is_shared_by_gates_of_one_run_and_separate_for_another(ledger: QueryBudgetLedger) -> None:
    budget = QueryBudget(per_run=3)
    a = WorkspaceQueryGate(ledger, budget, workspace="ws", run_key="dag/run1")
    b = WorkspaceQueryGate(ledger, budget, workspace="ws", run_key="dag/run1")  # a mapped shard on another worker
    a(), b(), a()
    with pytest.raises(QueryBudgetExhausted, match="3 of 3 queries per check run used"):
        b()
    WorkspaceQueryGate(ledger, budget, workspace="ws", run_key="dag/run2")()
    WorkspaceQueryGate(ledger, budget, workspace="other-ws", run_key="dag/run1")()


# -- the checks end INCONCLUSIVE ------------------------------------------------------------------


def test_a_latency_probe_whose_budget_runs_out_is_inconclusive_and_sends_no_more(
        servers: Any, ledger: QueryBudgetLedger) -> None:  # noqa: F811
    src, tgt = servers(lambda n: ok_matrix()), servers(lambda n: ok_matrix())
    target = PrometheusClient(tgt.url)
    target.before_query = WorkspaceQueryGate(ledger, QueryBudget(per_run=3), workspace="promshift_target",
                                             run_key="dag/run1")
    result = LatencyProbe(PrometheusClient(src.url), target, policy(), min_step_s=15, backoff_s=0.01).run(
        now=1e6, queries=["avg(DCGM_FI_DEV_GPU_UTIL)"], dual_write_since=None)
    assert result.verdict == Verdict.INCONCLUSIVE
    outcome = result.windows[0].outcome
    assert "query budget of workspace 'promshift_target' spent: 3 of 3 queries per check run used" in outcome
    # runtimeinfo (retention) is one of the three; the budget is never exceeded on the wire.
    assert len(tgt.requests) + len(tgt.instant) <= 3


def test_a_parity_shard_that_meets_the_budget_makes_the_samples_layer_inconclusive() -> None:
    from promshift.adapters.parity_check import ParityCheck, ParityPlan, ParityWindow
    from promshift.adapters.settings import load_catalog

    group = load_catalog().get("gpu-utilization")
    check = ParityCheck(group, PrometheusClient("http://127.0.0.1:0"), PrometheusClient("http://127.0.0.1:0"))

    def spent() -> None:
        raise QueryBudgetExhausted("query budget of workspace 'ws' spent: 5 of 5 queries per check run used")

    check.target.before_query = spent
    check.source.before_query = spent
    shard = check.compare_shard({"hosts": ["h1"], "start": T, "end": T + 600})
    assert shard["budget_spent"].startswith("query budget of workspace 'ws' spent")
    plan = ParityPlan(ParityWindow(T, T + 600, 30.0), (), ({"hosts": ["h1"]},), 1, {})
    result = check.reduce(plan, [shard])
    samples = next(m for m in result.measurements if m.name == "samples")
    assert samples.verdict == Verdict.INCONCLUSIVE and "5 of 5 queries per check run used" in samples.reason
    assert result.verdict == Verdict.INCONCLUSIVE
    whole = check.plan(dual_write_since=T - 7200, now=T)
    assert whole.window is None and whole.measurements[0].verdict == Verdict.INCONCLUSIVE
    assert "5 of 5 queries per check run used" in whole.measurements[0].reason


# -- the wiring: the target connection's extra.query_budget in front of the parity and latency clients ---------


def test_the_target_connection_extra_puts_the_budget_in_front_of_the_parity_client(
        env: Any, dag: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    import json

    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1",
        "extra": {"remote_write_url": "http://127.0.0.1:1/api/v1/write",
                  "query_budget": {"per_run": 1, "max_wait": "0s"}}}))
    op = dag.get_task("parity_plan")
    check = op.parity_check(make_context())
    gate = check.target.before_query
    assert isinstance(gate, WorkspaceQueryGate) and check.source.before_query is None
    assert gate.workspace == "promshift_target" and gate.run_key == f"{op.group.dag_id}/{make_context()['run_id']}"
    gate()
    with pytest.raises(QueryBudgetExhausted, match="1 of 1 queries per check run used"):
        check.target.query("up")  # refused before anything is sent (the port would refuse it otherwise)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1", "extra": {"query_budget": {"per_run": 0}}}))
    with pytest.raises(ValueError, match="extra.query_budget.per_run must be an integer"):
        op.parity_check(make_context())
