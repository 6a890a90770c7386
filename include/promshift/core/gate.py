"""Gate policy: combine the evidence of every check into one decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from promshift.core.verdicts import Verdict, worst


class GateAction(StrEnum):
    """What the DAG does next."""

    ASK_APPROVAL = "ask_approval"
    ROLL_BACK = "roll_back"


@dataclass(frozen=True)
class GateVerdict:
    """The gate's decision: the worst check verdict and what follows from it."""

    verdict: Verdict
    action: GateAction
    checks: tuple[tuple[str, Verdict], ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "action": self.action.value,
            "checks": {name: v.value for name, v in self.checks},
            "reason": self.reason,
        }


def decide(checks: Mapping[str, Verdict]) -> GateVerdict:
    """Decide from each check's verdict (e.g. ``{"parity": ..., "latency": ...}``).

    FAILED or ERROR rolls back. SUCCESSFUL and INCONCLUSIVE both go to a human:
    cutover is never automatic, and INCONCLUSIVE is never a pass — the approver
    sees it named in the request. A gate with no checks at all is INCONCLUSIVE.
    """
    overall = worst(checks.values())
    bad = sorted(name for name, v in checks.items() if v == overall and v != Verdict.SUCCESSFUL)
    if overall in (Verdict.FAILED, Verdict.ERROR):
        action = GateAction.ROLL_BACK
        reason = f"{overall.value}: {', '.join(bad)} did not pass; rolling back"
    elif overall == Verdict.INCONCLUSIVE:
        action = GateAction.ASK_APPROVAL
        what = ", ".join(bad) if bad else "no checks ran"
        reason = f"INCONCLUSIVE ({what}); a human must decide"
    else:
        action = GateAction.ASK_APPROVAL
        reason = "SUCCESSFUL: every check passed; waiting for on-call approval"
    return GateVerdict(
        verdict=overall,
        action=action,
        checks=tuple(sorted(checks.items())),
        reason=reason,
    )
