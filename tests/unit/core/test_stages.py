from __future__ import annotations

import pytest

from promshift.core.stages import (
    BAKE_WATCHED,
    CUT_OVER_OR_LATER,
    DUAL_WRITE_ON,
    STARTABLE,
    TRANSITIONS,
    IllegalTransition,
    Stage,
    current_stage,
    transition,
)

UP_TO_CUT_OVER = [Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER]


def test_happy_path_is_legal() -> None:
    path = [*UP_TO_CUT_OVER, Stage.BAKING, Stage.BAKED, Stage.DECOMMISSIONED]
    assert current_stage(path) == Stage.DECOMMISSIONED


@pytest.mark.parametrize("frm,to", [
    (Stage.PLANNED, Stage.CUT_OVER),
    (Stage.WARMING, Stage.CUT_OVER),
    (Stage.VERIFIED, Stage.CUT_OVER),
    (Stage.DECOMMISSIONED, Stage.DUAL_WRITING),
    (Stage.CUT_OVER, Stage.WARMING),
    # Decommission needs a finished bake (and its second approval).
    (Stage.CUT_OVER, Stage.DECOMMISSIONED),
    (Stage.BAKING, Stage.DECOMMISSIONED),
    # Baked only through baking; a read rollback only after the bake watch started.
    (Stage.CUT_OVER, Stage.BAKED),
    (Stage.APPROVED, Stage.ROLLED_BACK_READS),
    # A decommissioned group's source no longer scrapes it: reads cannot return there at once.
    (Stage.DECOMMISSIONED, Stage.ROLLED_BACK),
    (Stage.DECOMMISSIONED, Stage.ROLLED_BACK_READS),
    # Re-cut-over after a read rollback goes to cut_over (and bakes again), never straight to baked.
    (Stage.ROLLED_BACK_READS, Stage.BAKED),
])
def test_illegal_transitions_raise_with_names(frm: Stage, to: Stage) -> None:
    with pytest.raises(IllegalTransition) as exc:
        transition("gpu-memory", frm, to)
    assert "gpu-memory" in str(exc.value)
    assert f"{frm.value} -> {to.value}" in str(exc.value)


def test_every_stage_can_be_left() -> None:
    """No dead end: even a decommissioned group can be recommissioned."""
    assert all(TRANSITIONS[s] for s in Stage)
    assert TRANSITIONS[Stage.DECOMMISSIONED] == frozenset({Stage.RECOMMISSIONED})


def test_rollback_reachable_from_every_live_stage() -> None:
    for s in (Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER, Stage.BAKING,
              Stage.BAKED, Stage.ROLLED_BACK_READS, Stage.RECOMMISSIONED):
        assert transition("g", s, Stage.ROLLED_BACK) == Stage.ROLLED_BACK


def test_a_failed_bake_rolls_reads_back_then_recuts_or_rolls_back() -> None:
    failed_bake = [*UP_TO_CUT_OVER, Stage.BAKING, Stage.ROLLED_BACK_READS]
    assert current_stage(failed_bake) == Stage.ROLLED_BACK_READS
    assert current_stage([*failed_bake, Stage.CUT_OVER, Stage.BAKING, Stage.BAKED]) == Stage.BAKED
    assert current_stage([*failed_bake, Stage.ROLLED_BACK, Stage.DUAL_WRITING]) == Stage.DUAL_WRITING


def test_a_decommission_is_undone_by_recommissioning() -> None:
    done = [*UP_TO_CUT_OVER, Stage.BAKING, Stage.BAKED, Stage.DECOMMISSIONED]
    assert current_stage([*done, Stage.RECOMMISSIONED]) == Stage.RECOMMISSIONED
    assert current_stage([*done, Stage.RECOMMISSIONED, Stage.DECOMMISSIONED]) == Stage.DECOMMISSIONED
    assert current_stage([*done, Stage.RECOMMISSIONED, Stage.ROLLED_BACK]) == Stage.ROLLED_BACK


def test_a_rolled_back_group_can_start_again_but_cut_over_cannot() -> None:
    assert Stage.ROLLED_BACK in STARTABLE and Stage.PLANNED in STARTABLE
    assert not STARTABLE & (CUT_OVER_OR_LATER | {Stage.ROLLED_BACK_READS})
    assert current_stage([Stage.DUAL_WRITING, Stage.ROLLED_BACK, Stage.DUAL_WRITING]) == Stage.DUAL_WRITING


def test_stage_sets_agree_with_the_table() -> None:
    # Dependents may start once a dependency reads from the target: cut_over and every stage after it.
    assert CUT_OVER_OR_LATER == {Stage.CUT_OVER, Stage.BAKING, Stage.BAKED, Stage.DECOMMISSIONED,
                                 Stage.RECOMMISSIONED}
    assert Stage.ROLLED_BACK_READS not in CUT_OVER_OR_LATER
    # Dual-write is on from the deploy until a full rollback; a decommissioned source writes nothing.
    assert Stage.DECOMMISSIONED not in DUAL_WRITE_ON and Stage.ROLLED_BACK_READS in DUAL_WRITE_ON
    assert not DUAL_WRITE_ON & STARTABLE
    assert BAKE_WATCHED == {Stage.CUT_OVER, Stage.BAKING}


def test_history_with_an_illegal_step_is_rejected() -> None:
    with pytest.raises(IllegalTransition):
        current_stage([Stage.DUAL_WRITING, Stage.APPROVED, Stage.CUT_OVER, Stage.VERIFIED])
