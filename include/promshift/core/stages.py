"""The stage machine of a metric group: a transition table; illegal transitions raise."""

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
    DECOMMISSIONED = "decommissioned"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"


# Every legal move. ROLLED_BACK and FAILED are not terminal: a later run may try again,
# starting a fresh dual-write. WARMING -> APPROVED exists because INCONCLUSIVE evidence
# never verifies a group on its own; only a human can carry it forward.
TRANSITIONS: dict[Stage, frozenset[Stage]] = {
    Stage.PLANNED: frozenset({Stage.DUAL_WRITING, Stage.FAILED}),
    Stage.DUAL_WRITING: frozenset({Stage.WARMING, Stage.ROLLED_BACK, Stage.FAILED}),
    Stage.WARMING: frozenset({Stage.VERIFIED, Stage.APPROVED, Stage.ROLLED_BACK, Stage.FAILED}),
    Stage.VERIFIED: frozenset({Stage.APPROVED, Stage.ROLLED_BACK, Stage.FAILED}),
    Stage.APPROVED: frozenset({Stage.CUT_OVER, Stage.ROLLED_BACK, Stage.FAILED}),
    Stage.CUT_OVER: frozenset({Stage.DECOMMISSIONED, Stage.ROLLED_BACK}),
    Stage.DECOMMISSIONED: frozenset(),
    Stage.ROLLED_BACK: frozenset({Stage.DUAL_WRITING, Stage.FAILED}),
    Stage.FAILED: frozenset({Stage.DUAL_WRITING, Stage.ROLLED_BACK}),
}

# Stages from which a new run may start a dual-write.
STARTABLE: frozenset[Stage] = frozenset({Stage.PLANNED, Stage.ROLLED_BACK, Stage.FAILED})


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
