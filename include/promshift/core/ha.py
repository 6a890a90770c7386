"""HA pairs: a source that runs as replicas, each writing the group, and AMP's de-duplication of them.

AMP keeps one replica's samples per cluster when every series carries ``cluster`` and ``__replica__``
("Deduplicating high availability metrics sent to Amazon Managed Service for Prometheus", AMP user guide; the lab's
rule is ``core.ingest_limits.ha_judge``). A source declared as replicas (the catalog's ``replicas:``,
``ReplicaPolicy``) gets those labels on every write path from ``dedup_relabel``: its replica label copied to
``__replica__`` and dropped (the workspace never stores ``__replica__``, so the kept series carry no replica at
all), its cluster label copied to ``cluster`` when it is named otherwise.

Parity then compares the target with each replica and keeps the one the target's dedup elected (``elect``): the
target passes when it matches one replica, the evidence names it. A target holding series of more than one
replica (written without dedup labels: every series twice, double the cost) fails on coverage naming them
(``doubled_replicas``), whatever the other layers say.

The DAG runs parity as a plan, mapped shards and a reduce: the plan compares every replica's plan layers with the
target and elects (``plan_election``: the replicas it matches, else the closest; ``ReplicaPlan`` is what the plan
XCom carries), the shards compare samples with those replicas only, and the reduce elects among their whole
results (``judge_replicas``). ``adapters.parity_ha`` runs the same three steps in one process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from promshift.core.catalog import ReplicaPolicy
from promshift.core.ingest_limits import HA_CLUSTER_LABEL, HA_REPLICA_LABEL
from promshift.core.parity import ParityResult, assess
from promshift.core.verdicts import Measurement, Verdict, worst

REPLICAS_MEASUREMENT = "coverage[replicas]"


def dedup_relabel(replicas: ReplicaPolicy) -> list[dict[str, Any]]:
    """The ``write_relabel_configs`` rules that give a replica's writes AMP's dedup labels (none without replicas).

    They run after the group's keep filter and see the source's external labels (Prometheus applies them before
    write relabelling): ``<replica_label>`` -> ``__replica__`` then dropped; ``<cluster_label>`` -> ``cluster``
    then dropped when it is another label."""
    if not replicas.enabled:
        return []
    rules: list[dict[str, Any]] = [
        {"source_labels": [replicas.replica_label], "target_label": HA_REPLICA_LABEL, "action": "replace"},
        {"regex": replicas.replica_label, "action": "labeldrop"},
    ]
    if replicas.cluster_label != HA_CLUSTER_LABEL:
        rules += [
            {"source_labels": [replicas.cluster_label], "target_label": HA_CLUSTER_LABEL, "action": "replace"},
            {"regex": replicas.cluster_label, "action": "labeldrop"},
        ]
    return rules


def doubled_replicas(series_per_replica: Mapping[str, float], *, replica_label: str,
                     query: str = "") -> Measurement | None:
    """FAILED on coverage when the target holds series of more than one replica (``{replica: series count}``, from
    ``count by (<replica_label>)`` on the target), else None. A series without the label counts under ``""``:
    what the dedup kept."""
    held = {r: n for r, n in series_per_replica.items() if r and n > 0}
    if len(held) < 2:
        return None
    names = sorted(held)
    total = sum(series_per_replica.values())
    once = max(held.values())
    return Measurement(REPLICAS_MEASUREMENT, Verdict.FAILED,
                       f"series count doubled: the target holds the series of {len(names)} replicas "
                       f"({', '.join(names)}, by {replica_label}): {total:.0f} series where one replica has "
                       f"{once:.0f}; write them with AMP's dedup labels (cluster + __replica__, the group's "
                       f"replicas:)",
                       (query,) if query else (),
                       {"replicas": {r: held[r] for r in names}, "replica_label": replica_label,
                        "target_series": total})


@dataclass(frozen=True)
class Outcome:
    """How the target compared with one replica: the verdict, how far off it was (a whole comparison's sample
    mismatches, or a plan's layers FAILED or ERROR) and the first measurement that did not pass ("name: reason")."""

    verdict: Verdict
    off: int = 0
    first: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "off": self.off, "first": self.first}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Outcome:
        return cls(Verdict(d["verdict"]), int(d.get("off") or 0), str(d.get("first") or ""))


def _first(measurements: Sequence[Measurement]) -> str:
    first = next((m for m in measurements if m.verdict != Verdict.SUCCESSFUL), None)
    return f"{first.name}: {first.reason[:160]}" if first else ""


def outcome_of(result: ParityResult) -> Outcome:
    """A whole comparison's outcome (every layer, the samples included)."""
    return Outcome(result.verdict, result.mismatches, _first(result.measurements))


def plan_outcome(measurements: Sequence[Measurement], *, failure_limit: int, inconclusive_limit: int) -> Outcome:
    """A plan's outcome (coverage, aggregates, labels, golden: every layer but the samples), judged as a result
    is (``core.parity.assess``); how far off: its layers FAILED or ERROR."""
    verdict = assess(measurements, failure_limit=failure_limit, inconclusive_limit=inconclusive_limit)
    off = sum(m.verdict in (Verdict.FAILED, Verdict.ERROR) for m in measurements)
    return Outcome(verdict, off, _first(measurements))


@dataclass(frozen=True)
class Election:
    """Which replica the target is compared with, and the ``coverage[replicas]`` measurement saying why."""

    matching: tuple[str, ...]  # the replicas the target matches (SUCCESSFUL), the nearest first
    chosen: str                # the one compared: the first matching, else the closest
    note: Measurement  # ``numbers.elected``: the replica the target's dedup kept, when exactly one matches


def choose(outcomes: Mapping[str, Outcome], among: Sequence[str] | None = None) -> Election:
    """The replica the target matches among ``among`` (default: every one), from each replica's outcome
    (``{replica: Outcome}``, in preference order; replicas outside ``among`` are named in the note, never chosen).

    One SUCCESSFUL: the target's dedup elected it. Several: their samples agree, all are recorded as ``matching``
    (the nearest first), none as elected. None: the closest (the least severe verdict, then the least off), the
    note carrying its verdict and naming every replica with how it compared."""
    names = [n for n in outcomes if among is None or n in among]
    if not names:
        raise ValueError("no replica to compare the target with")
    verdicts = {name: o.verdict.value for name, o in outcomes.items()}
    matching = sorted((n for n in names if outcomes[n].verdict == Verdict.SUCCESSFUL), key=lambda n: outcomes[n].off)
    if matching:
        if len(matching) == 1:
            said = f"the target matches replica {matching[0]} (its dedup elected it)"
        else:  # the replicas agree over the window: the one kept cannot be told apart, and either passes
            said = (f"the target matches replicas {', '.join(matching)}: they agree over the window, so the one its "
                    "dedup kept cannot be told apart")
        note = Measurement(REPLICAS_MEASUREMENT, Verdict.SUCCESSFUL,
                           said + "; " + ", ".join(f"{n}: {v}" for n, v in verdicts.items()),
                           numbers={"elected": matching[0] if len(matching) == 1 else None, "matching": matching,
                                    "replicas": verdicts})
        return Election(tuple(matching), matching[0], note)
    closest = min(names, key=lambda n: (outcomes[n].verdict.severity, outcomes[n].off))
    reasons = [f"{n}: {o.verdict.value}" + (f" ({o.first})" if o.first else "") for n, o in outcomes.items()]
    note = Measurement(REPLICAS_MEASUREMENT, outcomes[closest].verdict,
                       f"the target matches none of the replicas {', '.join(outcomes)}: " + "; ".join(reasons),
                       numbers={"elected": None, "closest": closest, "replicas": verdicts})
    return Election((), closest, note)


def with_replicas(result: ParityResult, note: Measurement, doubled: Measurement | None = None) -> ParityResult:
    """``result`` (the comparison with the chosen replica) with the replicas' measurements after its own layers (a
    reader of the first coverage measurement still finds the counts); each can only make the verdict worse."""
    extra = [note] + ([doubled] if doubled is not None else [])
    return replace(result, verdict=worst([result.verdict, *(m.verdict for m in extra)]),
                   measurements=(*result.measurements, *extra))


def elect(results: Mapping[str, ParityResult], *, doubled: Measurement | None = None,
          outcomes: Mapping[str, Outcome] | None = None) -> ParityResult:
    """One parity result from the target compared with each replica (``{replica: result}``, in preference order).

    A SUCCESSFUL comparison is the verdict (``choose``), every replica's verdict beside it; none SUCCESSFUL: the
    closest one's result with a coverage measurement naming every replica and how each compared. ``outcomes``:
    how replicas compared that have no whole result here (a plan's, ``plan_outcome``), named in the note, in
    their preference order. A ``doubled`` measurement (``doubled_replicas``) is added either way, and fails the
    result."""
    if not results:
        raise ValueError("no replica to compare the target with")
    every = {**(outcomes or {}), **{name: outcome_of(r) for name, r in results.items()}}
    order = list(outcomes or {}) + [name for name in results if name not in (outcomes or {})]
    election = choose({name: every[name] for name in order}, among=list(results))
    return with_replicas(results[election.chosen], election.note, doubled)


@dataclass(frozen=True)
class ReplicaPlan:
    """The parity plan's election for a source declared as replicas (the plan XCom's ``replicas``).

    Every replica's plan (coverage, aggregates, labels, golden) was compared with the target; ``compared`` are
    the replicas whose raw samples the shards compare: every replica the target matched on those layers (they
    agree: the samples decide), else the closest alone. ``plans`` holds the plan layers of ``compared`` beyond
    the first (the first's are the plan's own measurements); ``doubled``: the coverage failure when the target
    holds series of more than one replica (``doubled_replicas``), measured once by the plan."""

    replica_label: str
    outcomes: Mapping[str, Outcome]   # every replica's plan, in preference order
    compared: tuple[str, ...]
    note: Measurement                 # the plan's election (``choose``): which replica and why
    doubled: Measurement | None = None
    plans: Mapping[str, tuple[Measurement, ...]] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        compared = ", ".join(self.compared)
        return (f"samples compared with replica{'s' if len(self.compared) > 1 else ''} {compared}: {self.note.reason}"
                + (f"; {self.doubled.reason}" if self.doubled is not None else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"replica_label": self.replica_label, "compared": list(self.compared),
                "elected": self.note.numbers.get("elected"), "reason": self.reason,
                "outcomes": {n: o.to_dict() for n, o in self.outcomes.items()}, "note": self.note.to_dict(),
                "doubled": self.doubled.to_dict() if self.doubled is not None else None,
                "plans": {n: [m.to_dict() for m in ms] for n, ms in self.plans.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplicaPlan:
        return cls(str(d["replica_label"]), {n: Outcome.from_dict(o) for n, o in (d.get("outcomes") or {}).items()},
                   tuple(d.get("compared") or ()), Measurement.from_dict(d["note"]),
                   Measurement.from_dict(d["doubled"]) if d.get("doubled") else None,
                   {n: tuple(Measurement.from_dict(m) for m in ms) for n, ms in (d.get("plans") or {}).items()})


def plan_election(plans: Mapping[str, Sequence[Measurement]], *, replica_label: str, failure_limit: int,
                  inconclusive_limit: int, doubled: Measurement | None = None) -> ReplicaPlan:
    """The replicas the shards compare, from each replica's plan layers (``{replica: measurements}``, in
    preference order): every one the target matches, else the closest (``choose``)."""
    outcomes = {n: plan_outcome(ms, failure_limit=failure_limit, inconclusive_limit=inconclusive_limit)
                for n, ms in plans.items()}
    election = choose(outcomes)
    compared = election.matching or (election.chosen,)
    return ReplicaPlan(replica_label, outcomes, compared, election.note, doubled,
                       {n: tuple(plans[n]) for n in compared[1:]})


def judge_replicas(results: Mapping[str, ParityResult], plan: ReplicaPlan) -> ParityResult:
    """The verdict of an HA parity run: the whole comparison with each compared replica (``results``, every layer),
    the others as their plan compared, elected (``elect``) and the doubled-replicas coverage added."""
    return elect(results, doubled=plan.doubled, outcomes=plan.outcomes)


def elected_replica(result: ParityResult) -> str | None:
    """The replica ``elect`` recorded as kept by the target (None: none or several matched, or not an HA check)."""
    note = next((m for m in result.measurements if m.name == REPLICAS_MEASUREMENT), None)
    return None if note is None else note.numbers.get("elected")
