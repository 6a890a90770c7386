"""HA pairs on the DAG's parity path (core.ha): the plan elects the replica(s) the shards compare with and carries
the election in its XCom, the reduce elects among the compared replicas' whole results and adds the
doubled-replicas coverage."""

from __future__ import annotations

import json

from promshift.core.ha import (
    REPLICAS_MEASUREMENT,
    Outcome,
    ReplicaPlan,
    choose,
    doubled_replicas,
    elected_replica,
    judge_replicas,
    plan_election,
    plan_outcome,
)
from promshift.core.parity import ParityPlan, ParityResult, ParityWindow
from promshift.core.verdicts import Measurement, Verdict

OK, FAILED, INCONCLUSIVE = Verdict.SUCCESSFUL, Verdict.FAILED, Verdict.INCONCLUSIVE


def layers(*verdicts: Verdict) -> list[Measurement]:
    names = ["coverage", "host_coverage", "aggregates", "labels"]
    return [Measurement(name, v, f"{name} {v.value}") for name, v in zip(names, verdicts, strict=False)]


def through_xcom(plan: ReplicaPlan) -> ReplicaPlan:
    return ReplicaPlan.from_dict(json.loads(json.dumps(plan.to_dict())))


def test_a_plans_outcome_is_judged_as_a_result_and_counts_its_failed_layers() -> None:
    assert plan_outcome(layers(OK, OK, OK), failure_limit=0, inconclusive_limit=0) == Outcome(OK, 0, "")
    off = plan_outcome(layers(OK, FAILED, FAILED), failure_limit=0, inconclusive_limit=0)
    assert (off.verdict, off.off) == (FAILED, 2) and off.first == "host_coverage: host_coverage FAILED"
    # a tolerated failure still passes, and is still counted (a replica with none is nearer)
    tolerated = plan_outcome(layers(OK, FAILED), failure_limit=1, inconclusive_limit=0)
    assert (tolerated.verdict, tolerated.off) == (OK, 1)
    assert plan_outcome([], failure_limit=0, inconclusive_limit=0).verdict == INCONCLUSIVE  # no data never passes


def test_the_plan_elects_the_one_replica_the_target_matches_and_its_shards_compare_with_it_alone() -> None:
    plan = plan_election({"source-0": layers(OK, OK, FAILED), "source-1": layers(OK, OK, OK)},
                         replica_label="prometheus_replica", failure_limit=0, inconclusive_limit=0)
    assert plan.compared == ("source-1",) and plan.note.numbers["elected"] == "source-1"
    assert plan.plans == {}  # the first compared replica's layers are the plan's own
    back = through_xcom(plan)
    assert back == plan
    shown = plan.to_dict()
    assert shown["elected"] == "source-1" and shown["compared"] == ["source-1"]
    assert shown["outcomes"]["source-0"] == {"verdict": "FAILED", "off": 1, "first": "aggregates: aggregates FAILED"}
    assert shown["reason"].startswith("samples compared with replica source-1: the target matches replica source-1 "
                                      "(its dedup elected it); source-0: FAILED, source-1: SUCCESSFUL")


def test_replicas_that_agree_on_every_plan_layer_are_all_compared_sample_by_sample() -> None:
    plan = through_xcom(plan_election({"source-0": layers(OK, FAILED), "source-1": layers(OK, OK)},
                                      replica_label="r", failure_limit=1, inconclusive_limit=0))
    # both pass (one failure tolerated): the nearer first, the other's layers kept for its own result
    assert plan.compared == ("source-1", "source-0") and plan.note.numbers["elected"] is None
    assert [m.verdict for m in plan.plans["source-0"]] == [OK, FAILED]


def test_a_target_matching_no_replica_compares_the_closest_and_the_plan_names_each() -> None:
    plan = plan_election({"source-0": layers(FAILED, FAILED), "source-1": layers(OK, FAILED),
                          "source-2": layers(INCONCLUSIVE, OK)},
                         replica_label="r", failure_limit=0, inconclusive_limit=0)
    assert plan.compared == ("source-2",)  # INCONCLUSIVE is nearer than FAILED
    assert plan.note.verdict == INCONCLUSIVE
    assert "matches none of the replicas source-0, source-1, source-2" in plan.note.reason
    assert "source-1: FAILED (host_coverage: host_coverage FAILED)" in plan.note.reason


def result(verdict: Verdict, mismatches: int = 0) -> ParityResult:
    return ParityResult(verdict, (Measurement("samples", verdict, f"{mismatches} mismatches"),), mismatches=mismatches)


def test_the_reduce_elects_among_the_compared_replicas_and_names_the_ones_only_planned() -> None:
    plan = plan_election({"source-0": layers(OK, OK), "source-1": layers(OK, OK), "source-2": layers(FAILED)},
                         replica_label="r", failure_limit=0, inconclusive_limit=0)
    assert plan.compared == ("source-0", "source-1")
    got = judge_replicas({"source-0": result(FAILED, 12), "source-1": result(OK)}, through_xcom(plan))
    assert got.verdict == OK and elected_replica(got) == "source-1"  # the samples told them apart
    note = got.measurements[-1]
    assert note.name == REPLICAS_MEASUREMENT
    assert note.numbers["replicas"] == {"source-0": "FAILED", "source-1": "SUCCESSFUL", "source-2": "FAILED"}
    # the compared replica whose samples differ fails, naming every replica
    failed = judge_replicas({"source-0": result(FAILED, 12)},
                            plan_election({"source-0": layers(OK), "source-1": layers(FAILED)}, replica_label="r",
                                          failure_limit=0, inconclusive_limit=0))
    assert failed.verdict == FAILED and elected_replica(failed) is None
    assert "matches none of the replicas source-0, source-1" in failed.measurements[-1].reason


def test_a_doubled_target_fails_the_reduce_even_where_the_policy_tolerates_a_failed_layer() -> None:
    doubled = doubled_replicas({"source-0": 16, "source-1": 16}, replica_label="prometheus_replica", query="q")
    assert doubled is not None
    plan = through_xcom(plan_election({"source-0": layers(OK, FAILED)}, replica_label="prometheus_replica",
                                      failure_limit=1, inconclusive_limit=0, doubled=doubled))
    assert plan.doubled == doubled and "series count doubled" in plan.reason
    got = judge_replicas({"source-0": result(OK)}, plan)
    assert got.verdict == FAILED and got.measurements[-1] == doubled
    assert "source-0, source-1" in got.measurements[-1].reason


def test_choose_never_picks_a_replica_outside_the_compared_ones() -> None:
    outcomes = {"a": Outcome(FAILED, 1, "x"), "b": Outcome(FAILED, 9, "y")}
    assert choose(outcomes, among=["b"]).chosen == "b"
    assert choose(outcomes).chosen == "a"


def test_the_parity_plan_carries_the_election_through_its_xcom_and_a_plain_plan_has_none() -> None:
    window = ParityWindow(1000.0, 1600.0, 5.0)
    plain = ParityPlan(window, tuple(layers(OK)))
    assert "replicas" not in plain.to_dict() and ParityPlan.from_dict(plain.to_dict()).replicas is None
    election = plan_election({"source-0": layers(OK)}, replica_label="r", failure_limit=0, inconclusive_limit=0)
    ha = ParityPlan(window, tuple(layers(OK)), ({"hosts": ["h1"], "replicas": ["source-0"]},), 1,
                    replicas=election.to_dict())
    back = ParityPlan.from_dict(json.loads(json.dumps(ha.to_dict())))
    assert ReplicaPlan.from_dict(back.replicas or {}) == election
    assert back.shards[0]["replicas"] == ["source-0"]
