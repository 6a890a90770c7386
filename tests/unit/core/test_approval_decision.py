"""``core.approval.decide_approval``: one test per branch of the approval decision."""

from __future__ import annotations

from promshift.core.approval import APPROVE, REJECT, Answer, Evidence, decide_approval

SAME = Evidence(shown="a" * 64, current="a" * 64, recorded="a" * 64, audited=True, where="audit seq 7")


def approve(by: str = "oncall-alice", **kw: object) -> Answer:
    return Answer(APPROVE, by, "looks good", responder=(by, by.title()), **kw)  # type: ignore[arg-type]


def test_an_approval_of_the_shown_audited_evidence_by_someone_else_approves() -> None:
    decided = decide_approval(approve(triggered_by="sre-carol"), SAME)
    assert (decided.decision, decided.approved, decided.message, decided.extra) == (APPROVE, True, None, {})


def test_a_rejection_fails_with_the_comment() -> None:
    decided = decide_approval(Answer(REJECT, "oncall-alice", "too noisy"), SAME)
    assert (decided.decision, decided.approved) == (REJECT, False)
    assert decided.message == "rejected by oncall-alice: too noisy"
    assert decide_approval(Answer(REJECT, "bob"), SAME).message == "rejected by bob: no comment"


def test_no_answer_is_a_timeout() -> None:
    decided = decide_approval(Answer(None, "nobody", "timed out", error="timed out", error_type="HITLTimeoutError"),
                              SAME)
    assert (decided.decision, decided.approved) == ("timeout", False)
    assert decided.message == "approval not given: HITLTimeoutError"


def test_the_run_s_trigger_user_cannot_approve_it_by_id_or_by_name() -> None:
    for triggered_by in ("oncall-alice", "Oncall-Alice"):
        decided = decide_approval(approve(triggered_by=triggered_by), SAME)
        assert (decided.decision, decided.approved) == ("refused_four_eyes", False)
        assert "four-eyes" in str(decided.message)
    # The same user rejecting their own run is recorded as a rejection, not refused.
    assert decide_approval(Answer(REJECT, "sre-carol", responder=("sre-carol",), triggered_by="sre-carol"),
                           SAME).decision == REJECT


def test_evidence_changed_after_it_was_shown_is_refused() -> None:
    changed = Evidence(shown="a" * 64, current="b" * 64, recorded="a" * 64, audited=True)
    decided = decide_approval(approve(), changed)
    assert (decided.decision, decided.approved) == ("refused_evidence_changed", False)
    assert "changed after it was shown" in str(decided.message) and "b" * 64 in str(decided.message)
    nothing_shown = decide_approval(approve(), Evidence(shown=None, current="b" * 64))
    assert nothing_shown.decision == "refused_evidence_changed" and "(none recorded)" in str(nothing_shown.message)


def test_evidence_that_is_not_the_audited_gate_s_is_unverifiable() -> None:
    forged = Evidence(shown="a" * 64, current="a" * 64, recorded="c" * 64, audited=True, where="audit seq 9")
    decided = decide_approval(approve(), forged)
    assert (decided.decision, decided.approved) == ("refused_evidence_unverified", False)
    assert decided.extra == {"recorded_sha256": "c" * 64} and "audit seq 9" in str(decided.message)
    missing = decide_approval(approve(), Evidence(shown="a" * 64, current="a" * 64, recorded=None, audited=True))
    assert missing.extra == {"recorded_sha256": "(none recorded)"} and "(nothing)" in str(missing.message)
    # The decommission's evidence is not an audited gate's: no such check.
    assert decide_approval(approve(), Evidence(shown="a" * 64, current="a" * 64, audited=False)).approved
