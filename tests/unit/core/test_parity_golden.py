"""``rewrite_comparison``: an original read on the source against its rewrite over recorded series on the target."""

from __future__ import annotations

from promshift.core.parity import rewrite_comparison
from promshift.core.verdicts import Verdict

NODE = (("Hostname", "n1"),)
OTHER = (("Hostname", "n2"),)
STEP = 30.0


def _series(values: list[float], start: float = 1000.0) -> list[tuple[float, float]]:
    return [(start + i * STEP, v) for i, v in enumerate(values)]


def _compare(source: dict, target: dict, behind: tuple[float, float] = (1, 1)):
    return rewrite_comparison("golden[fleet.json/Node temp]", "max by (Hostname) (T)",
                              "max by (Hostname) (Hostname:T:max)", source, target, behind=behind, step=STEP,
                              abs_tol=1e-9, rel_tol=1e-9)


VALUES = [float(v) for v in (60, 61, 63, 62, 65, 64, 66, 67, 66, 68, 70, 71)]


def test_the_same_values_on_the_recordings_grid_pass_and_both_queries_are_the_evidence() -> None:
    m = _compare({NODE: _series(VALUES)}, {NODE: _series(VALUES)})
    assert m.verdict == Verdict.SUCCESSFUL, m.reason
    assert m.queries == ("max by (Hostname) (T)", "max by (Hostname) (Hostname:T:max)")
    assert m.numbers["points_compared"] == len(VALUES)


def test_a_point_one_evaluation_behind_is_a_scrape_that_landed_as_the_rule_evaluated() -> None:
    target = _series(VALUES)
    target[5] = (target[5][0], VALUES[4])  # the rule missed the scrape the original saw
    m = _compare({NODE: _series(VALUES)}, {NODE: target})
    assert m.verdict == Verdict.SUCCESSFUL and m.numbers["points_one_evaluation_behind"] == 1


def test_a_recording_planted_wrong_fails_naming_the_read_the_series_and_the_instant() -> None:
    m = _compare({NODE: _series(VALUES)}, {NODE: _series([v + 1 for v in VALUES])})
    assert m.verdict == Verdict.FAILED
    assert m.name == "golden[fleet.json/Node temp]"
    assert '{Hostname="n1"} at 1000.0: target 61.0, source 60.0' in m.reason and "the recording is wrong" in m.reason


def test_one_point_off_is_noise_the_comparison_cannot_call_never_failed() -> None:
    target = _series(VALUES)
    target[6] = (target[6][0], 99.0)  # outside the original's value then and one evaluation earlier
    m = _compare({NODE: _series(VALUES)}, {NODE: target})
    assert m.verdict == Verdict.INCONCLUSIVE and m.numbers["points_outside"] == 1


def test_values_between_the_two_evaluations_are_timing_when_rare_and_a_wrong_recording_when_most() -> None:
    rising = [float(v) for v in range(0, 120, 10)]
    nudged = _series(rising)
    nudged[3] = (nudged[3][0], rising[3] - 5)  # between the original then and one evaluation earlier
    assert _compare({NODE: _series(rising)}, {NODE: nudged}).verdict == Verdict.SUCCESSFUL
    some = [(t, v - 5 if i % 4 == 1 else v) for i, (t, v) in enumerate(_series(rising))]
    assert _compare({NODE: _series(rising)}, {NODE: some}).verdict == Verdict.INCONCLUSIVE
    most = [(t, v - 5 if i else v) for i, (t, v) in enumerate(_series(rising))]
    m = _compare({NODE: _series(rising)}, {NODE: most})
    assert m.verdict == Verdict.FAILED and "the recording is wrong" in m.reason


def test_a_series_the_rewrite_lacks_fails_and_no_data_behind_is_inconclusive() -> None:
    m = _compare({NODE: _series(VALUES), OTHER: _series(VALUES)}, {NODE: _series(VALUES)})
    assert m.verdict == Verdict.FAILED and 'lacks 1 series' in m.reason and 'Hostname="n2"' in m.reason
    m = _compare({NODE: _series(VALUES)}, {NODE: _series(VALUES)}, behind=(0, 0))
    assert m.verdict == Verdict.INCONCLUSIVE and "recording rules deployed" in m.reason
    m = _compare({NODE: _series(VALUES)}, {NODE: _series(VALUES[:3])})
    assert m.verdict == Verdict.INCONCLUSIVE and "too few to tell" in m.reason


def test_a_target_that_aligns_its_grid_to_the_step_is_read_as_the_evaluation_each_point_holds() -> None:
    """A backend that answers range queries on its own step-aligned grid (points 7 s after each evaluation here):
    each of its points holds the recording's latest evaluation, compared with the source's original there."""
    shifted = [(t + 7.0, v) for t, v in _series(VALUES)]
    m = rewrite_comparison("golden[x]", "max by (Hostname) (T)", "max by (Hostname) (Hostname:T:max)",
                           {NODE: _series(VALUES)}, {NODE: shifted}, behind=(1, 1), step=STEP, abs_tol=1e-9,
                           rel_tol=1e-9, phase=1000.0 + 5 * STEP)
    assert m.verdict == Verdict.SUCCESSFUL and m.numbers["points_compared"] == len(VALUES), m.reason
    # Without the phase those points match no instant of the source's.
    unphased = rewrite_comparison("golden[x]", "e", "r", {NODE: _series(VALUES)}, {NODE: shifted}, behind=(1, 1),
                                  step=STEP, abs_tol=1e-9, rel_tol=1e-9)
    assert unphased.verdict == Verdict.INCONCLUSIVE
    wrong = [(t, v + 1) for t, v in shifted]
    m = rewrite_comparison("golden[x]", "e", "r", {NODE: _series(VALUES)}, {NODE: wrong}, behind=(1, 1), step=STEP,
                           abs_tol=1e-9, rel_tol=1e-9, phase=1000.0)
    assert m.verdict == Verdict.FAILED
