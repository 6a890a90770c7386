"""HaParityCheck's mapped steps against local HTTP servers answering as Prometheus: a shard compares the replicas
its plan named (and only those), the reduce elects among them by their samples and names every replica, and the
target's series per replica label make a doubled write FAILED."""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from promshift.adapters.parity_ha import HaParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.core.catalog import MetricGroup, ReplicaPolicy
from promshift.core.ha import REPLICAS_MEASUREMENT, elected_replica, plan_election
from promshift.core.parity import ParityPlan, ParityWindow
from promshift.core.verdicts import Measurement, Verdict
from tests.fakes import as_promshift_sent

T = 1_767_225_600.0
WINDOW = ParityWindow(T, T + 60.0, 5.0, 5.0)
SERIES = {"__name__": "DCGM_FI_DEV_FB_USED", "Hostname": "h1", "gpu": "0"}


class SeriesPrometheus:
    """Answers range queries with one series whose value at ``t`` is ``value(t)``, instant queries with
    ``vector``; records every query it was sent."""

    def __init__(self, value: Callable[[float], float], vector: list[tuple[dict[str, str], float]] = ()) -> None:
        self.value, self.vector = value, list(vector)
        self.queries: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                form = as_promshift_sent(dict(urllib.parse.parse_qsl(
                    self.rfile.read(int(self.headers["Content-Length"])).decode())))
                outer.queries.append((self.path, form["query"]))
                if self.path == "/api/v1/query_range":
                    start, end, step = (float(form[k]) for k in ("start", "end", "step"))
                    points = [[start + i * step, str(outer.value(start + i * step))]
                              for i in range(int((end - start) / step) + 1)]
                    data = {"resultType": "matrix", "result": [{"metric": SERIES, "values": points}]}
                else:
                    data = {"resultType": "vector", "result": [{"metric": labels, "value": [T, str(v)]}
                                                               for labels, v in outer.vector]}
                body = json.dumps({"status": "success", "data": data}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def range_queries(self) -> list[str]:
        return [q for path, q in self.queries if path == "/api/v1/query_range"]


@pytest.fixture
def servers() -> Iterator[Callable[..., SeriesPrometheus]]:
    made: list[SeriesPrometheus] = []

    def make(value: Callable[[float], float], vector: list[tuple[dict[str, str], float]] = ()) -> SeriesPrometheus:
        made.append(SeriesPrometheus(value, vector))
        return made[-1]

    yield make
    for server in made:
        server.server.shutdown()


def group() -> MetricGroup:
    g = load_catalog(profile="demo").get("gpu-memory")
    return dataclasses.replace(g, replicas=ReplicaPolicy("prometheus_replica", "cluster",
                                                         (("source-0", "src0"), ("source-1", "src1"))))


def kept(t: float) -> float:
    return 1000.0 + t % 7  # what the target holds: the replica its dedup kept


def other(t: float) -> float:
    return 1000.0 + (t + 2) % 7  # the other replica: the same series, scraped on its own phase


def ha_check(servers: Callable[..., SeriesPrometheus], target: SeriesPrometheus, *values: Callable[[float], float]
             ) -> tuple[HaParityCheck, list[SeriesPrometheus]]:
    replicas = [servers(v) for v in values]
    sources = [(f"source-{i}", PrometheusClient(s.url)) for i, s in enumerate(replicas)]
    return HaParityCheck(group(), sources, PrometheusClient(target.url)), replicas


def shard(*replicas: str) -> dict[str, Any]:
    return {"hosts": ["h1"], "start": WINDOW.start, "end": WINDOW.end, "step": WINDOW.step, "replicas": list(replicas)}


def plan(*compared_ok: str, others: tuple[str, ...] = ()) -> ParityPlan:
    """A plan whose layers matched the replicas ``compared_ok`` (and not ``others``), with one shard of h1."""
    ok = [Measurement("coverage", Verdict.SUCCESSFUL, "counts equal")]
    bad = [Measurement("coverage", Verdict.FAILED, "counts differ")]
    election = plan_election({**{n: ok for n in compared_ok}, **{n: bad for n in others}},
                             replica_label="prometheus_replica", failure_limit=0, inconclusive_limit=0)
    return ParityPlan(WINDOW, tuple(ok), (shard(*election.compared),), 1, replicas=election.to_dict())


def test_a_shard_compares_the_replica_its_plan_elected_and_no_other(servers: Callable[..., SeriesPrometheus]) -> None:
    target = servers(kept)
    check, (r0, r1) = ha_check(servers, target, other, kept)
    out = check.compare_shard(shard("source-1"))
    assert out["replica"] == "source-1" and "other_replicas" not in out
    assert r1.range_queries() and not r0.queries  # the replica the target kept, alone
    assert out["series_compared"] == 1 and out["points_compared"] == 13 and out["mismatches"] == 0
    json.dumps(out)  # a mapped task's XCom


def test_replicas_the_plan_could_not_tell_apart_are_each_compared_and_the_reduce_elects_by_samples(
        servers: Callable[..., SeriesPrometheus]) -> None:
    target = servers(kept)
    check, (r0, r1) = ha_check(servers, target, other, kept)
    the_plan = plan("source-0", "source-1")
    out = check.compare_shard(dict(the_plan.shards[0]))
    assert r0.range_queries() and r1.range_queries()
    assert out["replica"] == "source-0" and out["mismatches"] > 0
    assert out["other_replicas"]["source-1"]["mismatches"] == 0
    result = check.reduce(json.loads(json.dumps(the_plan.to_dict())), [json.loads(json.dumps(out))])
    assert result.verdict == Verdict.SUCCESSFUL, [m.reason for m in result.not_passed()]
    assert elected_replica(result) == "source-1"
    assert result.series_compared == 1 and result.mismatches == 0  # source-1's samples, not source-0's
    note = next(m for m in result.measurements if m.name == REPLICAS_MEASUREMENT)
    assert note.numbers["replicas"] == {"source-0": "FAILED", "source-1": "SUCCESSFUL"}


def test_a_target_matching_no_compared_replica_fails_naming_each(servers: Callable[..., SeriesPrometheus]) -> None:
    target = servers(lambda t: 5.0)
    check, _ = ha_check(servers, target, other, kept)
    the_plan = plan("source-1", others=("source-0",))
    result = check.reduce(the_plan, [check.compare_shard(dict(the_plan.shards[0]))])
    assert result.verdict == Verdict.FAILED and elected_replica(result) is None
    note = next(m for m in result.measurements if m.name == REPLICAS_MEASUREMENT)
    assert note.verdict == Verdict.FAILED
    assert note.reason.startswith("the target matches none of the replicas source-1, source-0: source-1: FAILED")
    assert "source-0: FAILED (coverage: counts differ)" in note.reason


def test_the_target_holding_both_replicas_series_is_measured_per_replica_label(
        servers: Callable[..., SeriesPrometheus]) -> None:
    doubled_target = servers(kept, [({"prometheus_replica": "source-0"}, 16), ({"prometheus_replica": "source-1"}, 16)])
    check, _ = ha_check(servers, doubled_target, kept)
    m = check.doubled(T)
    assert m is not None and m.verdict == Verdict.FAILED and "source-0, source-1" in m.reason
    assert doubled_target.queries == [("/api/v1/query", f"count by (prometheus_replica) ({group().selector()})")]
    deduplicated = servers(kept, [({}, 16)])  # the dedup kept one: no replica label stored
    assert HaParityCheck(group(), [("source-0", PrometheusClient(deduplicated.url))],
                         PrometheusClient(deduplicated.url)).doubled(T) is None


def test_a_plan_without_an_election_reduces_against_the_first_replica_and_never_passes(
        servers: Callable[..., SeriesPrometheus]) -> None:
    check, _ = ha_check(servers, servers(kept), kept, other)
    dry = ParityPlan(None, (Measurement("window", Verdict.INCONCLUSIVE, "the group is not dual-writing"),))
    result = check.reduce(dry.to_dict(), [])
    assert result.verdict == Verdict.INCONCLUSIVE
    assert check.source_for(dry.to_dict()) is check.check("source-0").source
    assert check.source_for(plan("source-1", others=("source-0",))) is check.check("source-1").source
    with pytest.raises(ValueError, match="replica 'source-9' is not one of"):
        check.check("source-9")
    with pytest.raises(ValueError, match="no replica to compare the target with"):
        HaParityCheck(group(), [], PrometheusClient("http://127.0.0.1:0"))


def test_a_spent_query_budget_ends_the_ha_plan_inconclusive_never_failed_or_passed() -> None:
    from promshift.core.query_budget import QueryBudgetExhausted

    def spent() -> None:
        raise QueryBudgetExhausted("query budget of workspace 'ws' spent: 5 of 5 queries per check run used")

    clients = [PrometheusClient("http://127.0.0.1:0") for _ in range(3)]
    for client in clients:
        client.before_query = spent
    check = HaParityCheck(group(), [("source-0", clients[0]), ("source-1", clients[1])], clients[2])
    the_plan = check.plan(dual_write_since=T - 3600, now=T)
    assert the_plan.window is None and the_plan.shards == ()
    doubled = the_plan.replicas["doubled"]
    assert doubled["verdict"] == "INCONCLUSIVE" and "5 of 5 queries per check run used" in doubled["reason"]
    result = check.reduce(json.loads(json.dumps(the_plan.to_dict())), [])
    assert result.verdict == Verdict.INCONCLUSIVE
    assert {m.verdict for m in result.measurements} == {Verdict.INCONCLUSIVE}
