"""Waves at run time (``core.waves.ready_to_start``): which dependent groups may start, under which run id.

Pure: the stage moves are given as ``AuditStore.stage_moves`` returns them (every group's stages entered, oldest
first). The operators that read them from the audit log are tested in ``test_migration_dag``.
"""

from __future__ import annotations

import re

import pytest

from promshift.core.catalog import MetricGroup
from promshift.core.stages import CUT_OVER_OR_LATER, STARTABLE, Stage, current_stage
from promshift.core.waves import WAVE_RUN_PREFIX, ready_to_start

# Legal histories (stages entered, oldest first), named by the stage they end in.
CUT = ["dual_writing", "warming", "verified", "approved", "cut_over"]
HISTORIES: dict[Stage, list[str]] = {
    Stage.PLANNED: [],
    Stage.DUAL_WRITING: ["dual_writing"],
    Stage.WARMING: ["dual_writing", "warming"],
    Stage.VERIFIED: ["dual_writing", "warming", "verified"],
    Stage.APPROVED: ["dual_writing", "warming", "verified", "approved"],
    Stage.CUT_OVER: CUT,
    Stage.BAKING: [*CUT, "baking"],
    Stage.BAKED: [*CUT, "baking", "baked"],
    Stage.ROLLED_BACK_READS: [*CUT, "baking", "rolled_back_reads"],
    Stage.DECOMMISSIONED: [*CUT, "baking", "baked", "decommissioned"],
    Stage.RECOMMISSIONED: [*CUT, "baking", "baked", "decommissioned", "recommissioned"],
    Stage.ROLLED_BACK: ["dual_writing", "rolled_back"],
    Stage.FAILED: ["failed"],
}
RUN_ID = re.compile(rf"{WAVE_RUN_PREFIX}(?P<group>[a-z][a-z0-9-]*)__[0-9a-f]{{16}}")


def test_the_histories_end_where_they_say() -> None:
    assert set(HISTORIES) == set(Stage)
    for stage, history in HISTORIES.items():
        assert current_stage(Stage(s) for s in history) == stage


def names(starts: list) -> list[str]:
    return [s.group for s in starts]


@pytest.mark.parametrize("dep_stage", list(Stage))
def test_a_dependent_starts_only_once_its_dependency_is_cut_over_or_later(dep_stage: Stage) -> None:
    groups = [MetricGroup(name="base"), MetricGroup(name="dependent", depends_on=("base",))]
    starts = ready_to_start(groups, {"base": HISTORIES[dep_stage]})
    if dep_stage in CUT_OVER_OR_LATER:
        [start] = starts
        assert (start.group, start.after) == ("dependent", ("base",))
        assert RUN_ID.fullmatch(start.run_id) and RUN_ID.fullmatch(start.run_id)["group"] == "dependent"
    else:
        assert starts == [], dep_stage
    # Whatever the dependency's stage, the group it depends on (no dependencies) is never started here.
    assert "base" not in names(starts)


def test_every_dependency_must_be_cut_over() -> None:
    groups = [MetricGroup(name="a"), MetricGroup(name="b"), MetricGroup(name="c", depends_on=("a", "b"))]
    assert ready_to_start(groups, {"a": CUT}) == []
    assert ready_to_start(groups, {"a": CUT, "b": HISTORIES[Stage.APPROVED]}) == []
    assert ready_to_start(groups, {"a": HISTORIES[Stage.ROLLED_BACK_READS], "b": CUT}) == []
    [start] = ready_to_start(groups, {"a": CUT, "b": HISTORIES[Stage.BAKED]})
    assert (start.group, start.after) == ("c", ("a", "b"))


@pytest.mark.parametrize("own_stage", list(Stage))
def test_only_a_startable_dependent_is_started(own_stage: Stage) -> None:
    groups = [MetricGroup(name="base"), MetricGroup(name="dependent", depends_on=("base",))]
    starts = ready_to_start(groups, {"base": CUT, "dependent": HISTORIES[own_stage]})
    # Planned, rolled back or failed: a new run may start; running or done: left alone.
    assert names(starts) == (["dependent"] if own_stage in STARTABLE else []), own_stage


def test_groups_without_dependencies_are_never_returned() -> None:
    groups = [MetricGroup(name="a"), MetricGroup(name="b"), MetricGroup(name="c")]
    everything_cut = {"a": CUT, "b": HISTORIES[Stage.BAKED]}
    assert ready_to_start(groups, everything_cut) == []
    assert ready_to_start(groups, {}) == []


def test_ready_groups_come_in_catalog_order_each_with_its_own_run_id() -> None:
    groups = [MetricGroup(name="z-dep", depends_on=("base",)), MetricGroup(name="base"),
              MetricGroup(name="a-dep", depends_on=("base",)), MetricGroup(name="later", depends_on=("a-dep",))]
    starts = ready_to_start(groups, {"base": CUT})
    assert names(starts) == ["z-dep", "a-dep"]  # ``later`` waits for a-dep, which has not even started
    assert starts[0].run_id != starts[1].run_id
    assert all(RUN_ID.fullmatch(s.run_id)["group"] == s.group for s in starts)


def test_the_run_id_is_stable_for_the_same_cut_overs() -> None:
    groups = [MetricGroup(name="base"), MetricGroup(name="dependent", depends_on=("base",))]
    [first] = ready_to_start(groups, {"base": CUT})
    # Another worker, a retry, a later wave run: the same cut-overs name the same run (Airflow starts it once).
    assert ready_to_start(groups, {"base": list(CUT)}) == [first]
    # The dependency moving on after its cut-over (baking, baked) is still the same cut-over.
    [later] = ready_to_start(groups, {"base": HISTORIES[Stage.BAKED]})
    assert later.run_id == first.run_id
    # Another group's moves do not change it either.
    [other] = ready_to_start([*groups, MetricGroup(name="x")], {"base": CUT, "x": HISTORIES[Stage.BAKING]})
    assert other.run_id == first.run_id
    # A dependent that ran and rolled back keeps that run id: the same cut-over does not start it again.
    [again] = ready_to_start(groups, {"base": CUT, "dependent": HISTORIES[Stage.ROLLED_BACK]})
    assert again.run_id == first.run_id


def test_the_order_of_the_dependencies_does_not_change_the_run_id() -> None:
    one = ready_to_start([MetricGroup(name="a"), MetricGroup(name="b"), MetricGroup(name="c", depends_on=("a", "b"))],
                         {"a": CUT, "b": CUT})
    two = ready_to_start([MetricGroup(name="a"), MetricGroup(name="b"), MetricGroup(name="c", depends_on=("b", "a"))],
                         {"a": CUT, "b": CUT})
    assert one[0].run_id == two[0].run_id


@pytest.mark.parametrize("recut", [
    pytest.param([*CUT, "rolled_back", *CUT], id="after-a-full-rollback"),
    pytest.param([*CUT, "baking", "rolled_back_reads", "cut_over"], id="after-its-reads-came-back"),
])
def test_a_dependency_that_cuts_over_again_makes_a_new_run_id(recut: list[str]) -> None:
    groups = [MetricGroup(name="base"), MetricGroup(name="dependent", depends_on=("base",))]
    [first] = ready_to_start(groups, {"base": CUT})
    # The dependent ran after the first cut-over and rolled back; the dependency cut over again.
    [second] = ready_to_start(groups, {"base": recut, "dependent": HISTORIES[Stage.ROLLED_BACK]})
    assert second.group == "dependent" and second.run_id != first.run_id
    assert RUN_ID.fullmatch(second.run_id)
    # Stable again from there.
    assert ready_to_start(groups, {"base": recut}) == [second]


def test_a_second_dependency_cutting_over_again_changes_the_run_id_too() -> None:
    groups = [MetricGroup(name="a"), MetricGroup(name="b"), MetricGroup(name="c", depends_on=("a", "b"))]
    [first] = ready_to_start(groups, {"a": CUT, "b": CUT})
    [second] = ready_to_start(groups, {"a": CUT, "b": [*CUT, "rolled_back", *CUT]})
    assert second.run_id != first.run_id
