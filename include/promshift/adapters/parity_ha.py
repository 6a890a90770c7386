"""Parity for a source that runs as replicas (an HA pair): the target against the replica its dedup kept.

The same plan / shards / reduce as ``ParityCheck`` (the DAG's ``parity_plan -> parity_samples[n] -> parity``, and
``run`` in one process), so both paths judge an HA pair alike:

- plan: the target's series are counted per replica label (``count by (<replica_label>)``: series of two replicas
  side by side, written without AMP's dedup labels, fail on coverage naming them); each replica's plan layers
  (coverage, aggregates, labels, golden) are compared with the target, and ``core.ha.plan_election`` picks the
  replica(s) the shards compare with. The plan carries the election (``ParityPlan.replicas``) and each shard
  names the replicas to compare (``replicas``).
- a shard: its hosts' raw samples against each named replica's Prometheus (one, unless the replicas agreed on
  every plan layer).
- reduce: each compared replica's whole result, elected by ``core.ha.judge_replicas`` with the doubled-replicas
  coverage.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.catalog import MetricGroup
from promshift.core.ha import REPLICAS_MEASUREMENT, ReplicaPlan, doubled_replicas, judge_replicas, plan_election
from promshift.core.parity import ParityPlan, ParityResult
from promshift.core.query_budget import QueryBudgetExhausted
from promshift.core.query_limits import QueryLimits
from promshift.core.verdicts import Measurement, Verdict

log = logging.getLogger(__name__)

# A shard's key naming the replicas it compares, and its output's key for every replica past the first.
SHARD_REPLICAS = "replicas"
OTHER_REPLICAS = "other_replicas"


@dataclass
class HaParityCheck:
    """Parity of ``group`` with ``sources``: (replica, its Prometheus) in preference order."""

    group: MetricGroup
    sources: Sequence[tuple[str, PrometheusClient]]
    target: PrometheusClient
    catalog_dir: Path | None = None
    # The target's per-query limits, as ``ParityCheck`` takes them (a callable is asked once, by the plan).
    limits: Any = None
    _checks: dict[str, ParityCheck] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError(f"group {self.group.name}: no replica to compare the target with")
        self.sources = list(self.sources)

    @property
    def replicas(self) -> list[str]:
        return [name for name, _ in self.sources]

    def check(self, replica: str) -> ParityCheck:
        """The whole parity check of the target against ``replica`` (one per replica, kept)."""
        if replica not in self._checks:
            client = dict(self.sources).get(replica)
            if client is None:
                raise ValueError(f"group {self.group.name}: replica {replica!r} is not one of {self.replicas}")
            self._checks[replica] = ParityCheck(self.group, client, self.target, catalog_dir=self.catalog_dir,
                                                limits=self.limits)
        return self._checks[replica]

    def source_for(self, plan: ParityPlan | Mapping[str, Any] | None) -> PrometheusClient:
        """The Prometheus the plan compares with (its first compared replica; no election: the first replica)."""
        replicas = plan.replicas if isinstance(plan, ParityPlan) else (plan or {}).get("replicas")
        compared = (replicas or {}).get("compared") or self.replicas[:1]
        return self.check(str(compared[0])).source

    def doubled(self, at: float) -> Measurement | None:
        """The coverage failure when the target holds series of more than one replica at ``at`` (else None)."""
        label = self.group.replicas.replica_label
        query = f"count by ({label}) ({self.group.selector()})"
        per_replica: dict[str, float] = {}
        for series in self.target.query(query, at=at).series:
            replica = str(series.labels.get(label, ""))
            per_replica[replica] = per_replica.get(replica, 0.0) + sum(v for _, v in series.points[-1:])
        return doubled_replicas(per_replica, replica_label=label, query=query)

    def plan(self, *, dual_write_since: float, now: float) -> ParityPlan:
        """Every replica's plan against the target, the election, and the shards of the replica(s) elected."""
        if callable(self.limits) and not isinstance(self.limits, QueryLimits):
            self.limits = self.limits()  # read once per run: every replica's plan and their shards use it
            self._checks.clear()
        try:
            doubled = self.doubled(now - self.group.parity.skip_recent_s)
        except PrometheusError as exc:
            doubled = Measurement(REPLICAS_MEASUREMENT, Verdict.ERROR, f"the target's series per replica: {exc}")
        except QueryBudgetExhausted as exc:  # never a pass, never an error: the plans below meet it too
            doubled = Measurement(REPLICAS_MEASUREMENT, Verdict.INCONCLUSIVE,
                                  f"the target's series per replica not counted: {exc}")
        plans = {replica: self.check(replica).plan(dual_write_since=dual_write_since, now=now)
                 for replica in self.replicas}
        policy = self.group.parity
        election = plan_election({n: p.measurements for n, p in plans.items()},
                                 replica_label=self.group.replicas.replica_label, failure_limit=policy.failure_limit,
                                 inconclusive_limit=policy.inconclusive_limit, doubled=doubled)
        log.info("parity %s: %s", self.group.name, election.reason)
        first = plans[election.compared[0]]
        cost = {k: sum(float(p.cost.get(k, 0.0)) for p in plans.values()) for k in first.cost}
        shards = tuple({**shard, SHARD_REPLICAS: list(election.compared)} for shard in first.shards)
        return replace(first, shards=shards, cost=cost, replicas=election.to_dict())

    def compare_shard(self, shard: dict[str, Any]) -> dict[str, Any]:
        """One mapped task's work: the shard's hosts against each replica it names (the first's output at the top,
        the others' under ``other_replicas``)."""
        names = [str(n) for n in shard.get(SHARD_REPLICAS) or self.replicas[:1]]
        plain = {k: v for k, v in shard.items() if k != SHARD_REPLICAS}
        outs = {name: self.check(name).compare_shard(dict(plain)) for name in names}
        out = {**outs[names[0]], "replica": names[0]}
        if len(names) > 1:
            out[OTHER_REPLICAS] = {name: outs[name] for name in names[1:]}
        return out

    def reduce(self, plan: ParityPlan | Mapping[str, Any], shards: Sequence[dict[str, Any]],
               extra: Sequence[Measurement] = ()) -> ParityResult:
        """Each compared replica's whole result (its plan layers, its shards' samples, ``extra``), elected with the
        doubled-replicas coverage. A plan without an election (a dry run's, no dual-write): the first replica's."""
        if not isinstance(plan, ParityPlan):
            plan = ParityPlan.from_dict(plan)
        if not plan.replicas:
            return self.check(self.replicas[0]).reduce(plan, shards, extra)
        election = ReplicaPlan.from_dict(plan.replicas)
        results: dict[str, ParityResult] = {}
        for i, name in enumerate(election.compared):
            own = plan if i == 0 else replace(plan, measurements=election.plans.get(name, ()))
            own_shards = shards if i == 0 else [dict((s.get(OTHER_REPLICAS) or {}).get(name) or {}) for s in shards]
            results[name] = self.check(name).reduce(own, own_shards, extra)
        result = judge_replicas(results, election)
        log.info("parity %s: %s", self.group.name,
                 next(m.reason for m in result.measurements if m.name == REPLICAS_MEASUREMENT))
        return result

    def run(self, *, dual_write_since: float, now: float) -> ParityResult:
        """Every layer in one process: the DAG's plan / shards / reduce, in a row."""
        plan = self.plan(dual_write_since=dual_write_since, now=now)
        return self.reduce(plan, [self.compare_shard(dict(shard)) for shard in plan.shards])
