"""The stage machine of a metric group: a transition table; illegal transitions raise.

The whole life of a group (the table below is the authority; this is the picture)::

    planned -> dual_writing -> warming -> verified -> approved -> cut_over -> baking -> baked -> decommissioned
                               warming -> approved  (INCONCLUSIVE evidence: only a human carries it on)
    baking | baked | recommissioned -> rolled_back_reads -> cut_over | rolled_back
    decommissioned -> recommissioned -> decommissioned | rolled_back_reads | rolled_back
    any live stage up to baked -> rolled_back -> dual_writing (a new run);  failed -> dual_writing | rolled_back

- ``cut_over``: reads (and, through adapters, rules and dashboards) go to the target; dual-write stays on.
- ``baking``: the bake watch has started checking the cut-over group (freshness, remote-write lag, series
  count, a short parity window) every ``bake.interval``.
- ``baked``: every bake check was clean for ``bake.period``; the group may be decommissioned.
- ``rolled_back_reads``: a bake check failed (or a human asked): reads, rules and dashboards went back to
  the source, dual-write stays on so nothing is lost; from here either a re-cut-over (``cut_over``) or the
  full rollback (``rolled_back``, dual-write removed).
- ``decommissioned``: after a second approval the source drops the group's series at scrape time
  (``metric_relabel_configs``); the target is the only copy.
- ``recommissioned``: the decommission was rolled back: the drop is removed, the source scrapes and stores
  the group again, reads stay on the target. The source has a gap for the decommissioned time (it never
  stored those samples); the target has the whole history. From here: decommission again (a new second
  approval), read rollback, or full rollback.

Every live stage but ``decommissioned`` can be rolled back fully (``rolled_back``); a decommissioned
group is recommissioned first (its source must scrape again before reads can return).
``rolled_back`` and ``failed`` are not terminal: a later run may try again from a fresh dual-write.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Stage(StrEnum):
    """Where a metric group stands in its migration."""

    PLANNED = "planned"
    DUAL_WRITING = "dual_writing"
    WARMING = "warming"
    VERIFIED = "verified"
    APPROVED = "approved"
    CUT_OVER = "cut_over"
    BAKING = "baking"
    BAKED = "baked"
    ROLLED_BACK_READS = "rolled_back_reads"
    DECOMMISSIONED = "decommissioned"
    RECOMMISSIONED = "recommissioned"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"


# Every legal move. WARMING -> APPROVED exists because INCONCLUSIVE evidence never verifies a
# group on its own; only a human can carry it forward.
TRANSITIONS: dict[Stage, frozenset[Stage]] = {
    Stage.PLANNED: frozenset({Stage.DUAL_WRITING, Stage.FAILED}),
    Stage.DUAL_WRITING: frozenset({Stage.WARMING, Stage.ROLLED_BACK, Stage.FAILED}),
    Stage.WARMING: frozenset({Stage.VERIFIED, Stage.APPROVED, Stage.ROLLED_BACK, Stage.FAILED}),
    Stage.VERIFIED: frozenset({Stage.APPROVED, Stage.ROLLED_BACK, Stage.FAILED}),
    Stage.APPROVED: frozenset({Stage.CUT_OVER, Stage.ROLLED_BACK, Stage.FAILED}),
    Stage.CUT_OVER: frozenset({Stage.BAKING, Stage.ROLLED_BACK}),
    # A failed bake check returns reads to the source automatically (dual-write stays on).
    Stage.BAKING: frozenset({Stage.BAKED, Stage.ROLLED_BACK_READS, Stage.ROLLED_BACK}),
    Stage.BAKED: frozenset({Stage.DECOMMISSIONED, Stage.ROLLED_BACK_READS, Stage.ROLLED_BACK}),
    Stage.ROLLED_BACK_READS: frozenset({Stage.CUT_OVER, Stage.ROLLED_BACK}),
    # Undoing a decommission re-adds the scrape on the source; reads stay on the target.
    Stage.DECOMMISSIONED: frozenset({Stage.RECOMMISSIONED}),
    Stage.RECOMMISSIONED: frozenset({Stage.DECOMMISSIONED, Stage.ROLLED_BACK_READS, Stage.ROLLED_BACK}),
    Stage.ROLLED_BACK: frozenset({Stage.DUAL_WRITING, Stage.FAILED}),
    Stage.FAILED: frozenset({Stage.DUAL_WRITING, Stage.ROLLED_BACK}),
}

# Stages from which a new run may start a dual-write.
STARTABLE: frozenset[Stage] = frozenset({Stage.PLANNED, Stage.ROLLED_BACK, Stage.FAILED})

# A group in one of these has been cut over (reads on the target): its dependents may start.
CUT_OVER_OR_LATER: frozenset[Stage] = frozenset(
    {Stage.CUT_OVER, Stage.BAKING, Stage.BAKED, Stage.DECOMMISSIONED, Stage.RECOMMISSIONED})

# The group's own remote_write entry (or scraper) is live in these: the target holds its data.
DUAL_WRITE_ON: frozenset[Stage] = frozenset(
    {Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER, Stage.BAKING,
     Stage.BAKED, Stage.ROLLED_BACK_READS, Stage.RECOMMISSIONED})

# The bake watch checks groups in these.
BAKE_WATCHED: frozenset[Stage] = frozenset({Stage.CUT_OVER, Stage.BAKING})


class IllegalTransition(ValueError):
    """A move the transition table does not allow."""

    def __init__(self, group: str, current: Stage, target: Stage) -> None:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "none"
        super().__init__(
            f"group {group!r}: illegal transition {current.value} -> {target.value} (allowed from "
            f"{current.value}: {allowed})"
        )
        self.group = group
        self.current = current
        self.target = target


def transition(group: str, current: Stage, target: Stage) -> Stage:
    """Return ``target`` if the table allows ``current -> target``, else raise IllegalTransition."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(group, current, target)
    return target


def current_stage(history: Iterable[Stage]) -> Stage:
    """The stage after replaying ``history`` (stages entered, oldest first) from PLANNED.

    Replaying checks every step, so a history with an illegal move is rejected rather
    than silently trusted.
    """
    stage = Stage.PLANNED
    for entered in history:
        stage = transition("history", stage, entered)
    return stage


def stage_from_moves(moves: Iterable[str]) -> Stage:
    """``current_stage`` of a group's stage moves as the audit stores them (``AuditStore.stage_moves``: the
    stages' values, oldest first); ValueError for an unknown stage or an illegal move."""
    return current_stage(Stage(move) for move in moves)
