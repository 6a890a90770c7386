from __future__ import annotations

import pytest

from promshift.core.stages import STARTABLE, TRANSITIONS, IllegalTransition, Stage, current_stage, transition


def test_happy_path_is_legal() -> None:
    path = [Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER,
            Stage.DECOMMISSIONED]
    assert current_stage(path) == Stage.DECOMMISSIONED


@pytest.mark.parametrize("frm,to", [
    (Stage.PLANNED, Stage.CUT_OVER),
    (Stage.WARMING, Stage.CUT_OVER),
    (Stage.VERIFIED, Stage.CUT_OVER),
    (Stage.DECOMMISSIONED, Stage.DUAL_WRITING),
    (Stage.CUT_OVER, Stage.WARMING),
])
def test_illegal_transitions_raise_with_names(frm: Stage, to: Stage) -> None:
    with pytest.raises(IllegalTransition) as exc:
        transition("gpu-memory", frm, to)
    assert "gpu-memory" in str(exc.value)
    assert f"{frm.value} -> {to.value}" in str(exc.value)


def test_every_stage_but_decommissioned_can_be_left() -> None:
    assert all(TRANSITIONS[s] for s in Stage if s != Stage.DECOMMISSIONED)
    assert TRANSITIONS[Stage.DECOMMISSIONED] == frozenset()


def test_rollback_reachable_from_every_live_stage() -> None:
    for s in (Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER):
        assert transition("g", s, Stage.ROLLED_BACK) == Stage.ROLLED_BACK


def test_a_rolled_back_group_can_start_again_but_cut_over_cannot() -> None:
    assert Stage.ROLLED_BACK in STARTABLE and Stage.PLANNED in STARTABLE
    assert Stage.CUT_OVER not in STARTABLE
    assert current_stage([Stage.DUAL_WRITING, Stage.ROLLED_BACK, Stage.DUAL_WRITING]) == Stage.DUAL_WRITING


def test_history_with_an_illegal_step_is_rejected() -> None:
    with pytest.raises(IllegalTransition):
        current_stage([Stage.DUAL_WRITING, Stage.APPROVED, Stage.CUT_OVER, Stage.VERIFIED])
