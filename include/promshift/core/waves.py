"""Waves at run time: which groups may start because every group they depend on has cut over.

Pure: the caller reads the stage moves from the audit log and starts the runs (``promshift__waves``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from promshift.core.catalog.model import MetricGroup
from promshift.core.stages import CUT_OVER_OR_LATER, STARTABLE, Stage, stage_from_moves

WAVE_RUN_PREFIX = "wave__"


@dataclass(frozen=True)
class WaveStart:
    """A dependent group to start, and the run id that start gets.

    The run id names the group and how many times each of its dependencies has entered ``cut_over``: every
    worker (and every retry) that finds the same cut-overs names the same run, so Airflow starts it once; a
    dependency that cuts over again (after a full rollback) makes a new one, as the dependency's asset event
    did when each group had its own DAG scheduled on it."""

    group: str
    run_id: str
    after: tuple[str, ...]


def _cut_overs(moves: Sequence[str]) -> int:
    return sum(1 for stage in moves if stage == Stage.CUT_OVER.value)


def ready_to_start(groups: Sequence[MetricGroup], moves: Mapping[str, Sequence[str]]) -> list[WaveStart]:
    """The groups with dependencies that may start now, in catalog order.

    ``moves``: every group's stages entered, oldest first (``AuditStore.stage_moves``). A group is ready when
    it is startable (planned, rolled back or failed) and every group it depends on is cut over or later. A
    group without dependencies is started by hand and is never returned. ``validate`` checks all of it again
    when the run starts (another run may hold the group by then)."""
    stages = {name: stage_from_moves(history) for name, history in moves.items()}
    ready: list[WaveStart] = []
    for group in groups:
        if not group.depends_on or stages.get(group.name, Stage.PLANNED) not in STARTABLE:
            continue
        if not all(stages.get(dep, Stage.PLANNED) in CUT_OVER_OR_LATER for dep in group.depends_on):
            continue
        key = ",".join(f"{dep}={_cut_overs(moves.get(dep, ()))}" for dep in sorted(group.depends_on))
        digest = hashlib.sha256(f"{group.name}|{key}".encode()).hexdigest()[:16]
        ready.append(WaveStart(group=group.name, run_id=f"{WAVE_RUN_PREFIX}{group.name}__{digest}",
                               after=tuple(group.depends_on)))
    return ready
