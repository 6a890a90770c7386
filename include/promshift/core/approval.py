"""The approval decision, pure: what an approver's answer (or its absence) amounts to, and why.

One function decides every branch the approval task records: the request timed out, the approver also
triggered the run (four eyes), the evidence changed after it was shown, the evidence shown is not the gate
evidence the audit log holds (unverifiable), a rejection, and an approval. The task records the decision
(``decision`` is the audit's) and fails with ``message`` unless the decision approves.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

APPROVE = "Approve"
REJECT = "Reject"


@dataclass(frozen=True)
class Answer:
    """What came back: the chosen option (None: no answer, ``error`` says why), who answered (their id and name,
    ``by`` as recorded), the comment, and who triggered the run (their user name, or None)."""

    choice: str | None
    by: str
    comment: str = ""
    responder: Collection[str | None] = ()
    triggered_by: str | None = None
    error: str | None = None
    error_type: str | None = None


@dataclass(frozen=True)
class Evidence:
    """The evidence's hashes: ``shown`` (recorded when the question was asked), ``current`` (now), and
    ``recorded`` (the gate evidence the audit log holds for the run; ``audited`` False when the evidence shown is
    not an audited gate's, the decommission's); ``where`` names that audit event for the message."""

    shown: str | None
    current: str | None
    recorded: str | None = None
    audited: bool = False
    where: str = "no gate event recorded"


@dataclass(frozen=True)
class Decision:
    """``decision``: what the audit records (``timeout``, ``refused_four_eyes``, ``refused_evidence_changed``,
    ``refused_evidence_unverified``, or the option chosen); ``approved``; ``message``: why the task fails (None
    when approved); ``extra``: what the audit records besides (``recorded_sha256`` of an unverifiable one)."""

    decision: str
    approved: bool
    message: str | None
    extra: dict[str, Any] = field(default_factory=dict)


def decide_approval(answer: Answer, evidence: Evidence) -> Decision:
    """The decision on ``answer``; only an approval by someone else than the run's trigger user, of evidence that
    has not changed since it was shown and (when audited) is the gate evidence the audit log holds, approves."""
    if answer.error is not None or answer.choice is None:
        return Decision("timeout", False, f"approval not given: {answer.error_type}")
    by, choice = answer.by, answer.choice
    if choice == APPROVE:
        # triggering_user_name is the user's *name*; HITL records the *id* (equal only under the Simple auth
        # manager), so the responder matches on either.
        if answer.triggered_by and answer.triggered_by in set(answer.responder):
            return Decision("refused_four_eyes", False,
                            f"{by} triggered this run and cannot also approve it (four-eyes rule)")
        if evidence.shown != evidence.current:
            return Decision("refused_evidence_changed", False,
                            f"{by} approved evidence sha256 {evidence.shown or '(none recorded)'}, but the evidence is "
                            f"now {evidence.current}: it changed after it was shown, so the approval is refused")
        if evidence.audited and evidence.shown != evidence.recorded:
            return Decision("refused_evidence_unverified", False,
                            f"{by} approved evidence sha256 {evidence.shown}, but this run's gate evidence in the "
                            f"audit log ({evidence.where}) hashes to {evidence.recorded or '(nothing)'}: the approver "
                            "was not shown it, so the approval is refused",
                            {"recorded_sha256": evidence.recorded or "(none recorded)"})
        return Decision(choice, True, None)
    return Decision(choice, False, f"rejected by {by}: {answer.comment or 'no comment'}")
