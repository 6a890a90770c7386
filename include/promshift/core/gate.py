"""Gate policy: combine the evidence of every check into one decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from promshift.core.latency import LatencyResult
from promshift.core.parity import ParityResult
from promshift.core.verdicts import Measurement, Verdict, worst


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

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GateVerdict:
        """Read ``to_dict``'s form; an old record without ``action`` gets the one its verdict implies."""
        verdict = Verdict(d.get("verdict") or Verdict.INCONCLUSIVE)
        action = d.get("action") or (GateAction.ROLL_BACK if verdict in (Verdict.FAILED, Verdict.ERROR)
                                     else GateAction.ASK_APPROVAL)
        checks = tuple(sorted((name, Verdict(v)) for name, v in (d.get("checks") or {}).items()))
        return cls(verdict, GateAction(action), checks, str(d.get("reason") or ""))


@dataclass(frozen=True)
class GateEvidence:
    """What the gate decided and on what: recorded in the audit log, read back by the report.

    The latency part is kept without its individual runs (the table is the evidence); read back,
    it has none.
    """

    gate: GateVerdict
    parity: ParityResult
    latency: LatencyResult

    @classmethod
    def decide(cls, parity: ParityResult, latency: LatencyResult) -> GateEvidence:
        """The gate over the parity and latency results, with the evidence it decided on."""
        return cls(decide({"parity": parity.verdict, "latency": latency.verdict}), parity, latency)

    def not_passed(self) -> list[tuple[str, Measurement]]:
        """``(check, measurement)`` of every measurement that did not pass, parity first."""
        return ([("parity", m) for m in self.parity.not_passed()]
                + [("latency", m) for m in (self.latency.measurement,) if m.verdict != Verdict.SUCCESSFUL])

    def to_dict(self) -> dict[str, Any]:
        latency = self.latency.to_dict()
        del latency["runs"]  # the raw probe runs stay in XCom; the audit keeps the table
        return {"gate": self.gate.to_dict(), "parity": self.parity.to_dict(), "latency": latency}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GateEvidence:
        return cls(GateVerdict.from_dict(d.get("gate") or {}), ParityResult.from_dict(d.get("parity") or {}),
                   LatencyResult.from_dict(d.get("latency") or {}))


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
