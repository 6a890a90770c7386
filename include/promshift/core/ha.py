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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from promshift.core.catalog import ReplicaPolicy
from promshift.core.ingest_limits import HA_CLUSTER_LABEL, HA_REPLICA_LABEL
from promshift.core.parity import ParityResult
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


def elect(results: Mapping[str, ParityResult], *, doubled: Measurement | None = None) -> ParityResult:
    """One parity result from the target compared with each replica (``{replica: result}``, in preference order).

    The target's dedup kept one replica: a SUCCESSFUL comparison is the verdict, its replica recorded as elected
    when it is the only one matching (several matching: their samples agree, all are recorded as ``matching``, none
    as elected); every replica's verdict beside it. None SUCCESSFUL: the best one's result (the least severe verdict,
    then the fewest mismatches) with a coverage measurement naming every replica and how each compared. A
    ``doubled`` measurement (``doubled_replicas``) is added either way, and fails the result."""
    if not results:
        raise ValueError("no replica to compare the target with")
    verdicts = {name: r.verdict.value for name, r in results.items()}
    matching = [name for name, r in results.items() if r.verdict == Verdict.SUCCESSFUL]
    if matching:
        chosen = results[matching[0]]
        if len(matching) == 1:
            elected: str | None = matching[0]
            said = f"the target matches replica {elected} (its dedup elected it)"
        else:  # the replicas agree over the window: the one kept cannot be told apart, and either passes
            elected = None
            said = (f"the target matches replicas {', '.join(matching)}: they agree over the window, so the one its "
                    "dedup kept cannot be told apart")
        note = Measurement(REPLICAS_MEASUREMENT, Verdict.SUCCESSFUL,
                           said + "; " + ", ".join(f"{n}: {v}" for n, v in verdicts.items()),
                           numbers={"elected": elected, "matching": matching, "replicas": verdicts})
    else:
        elected, chosen = min(results.items(), key=lambda kv: (kv[1].verdict.severity, kv[1].mismatches))
        reasons = []
        for name, r in results.items():
            first = next(iter(r.not_passed()), None)
            reasons.append(f"{name}: {r.verdict.value}" + (f" ({first.name}: {first.reason[:160]})" if first else ""))
        note = Measurement(REPLICAS_MEASUREMENT, chosen.verdict,
                           f"the target matches none of the replicas {', '.join(results)}: " + "; ".join(reasons),
                           numbers={"elected": None, "closest": elected, "replicas": verdicts})
    # after the comparison's own layers: a reader of the first coverage measurement still finds the counts
    measurements = [*chosen.measurements, note] + ([doubled] if doubled is not None else [])
    verdict = worst([chosen.verdict, note.verdict] + ([doubled.verdict] if doubled is not None else []))
    return replace(chosen, verdict=verdict, measurements=tuple(measurements))


def elected_replica(result: ParityResult) -> str | None:
    """The replica ``elect`` recorded as kept by the target (None: none or several matched, or not an HA check)."""
    note = next((m for m in result.measurements if m.name == REPLICAS_MEASUREMENT), None)
    return None if note is None else note.numbers.get("elected")
