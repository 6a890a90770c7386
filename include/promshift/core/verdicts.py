"""Gate verdicts with Argo Rollouts' semantics: the worst of all measurements wins."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    """Outcome of one measurement or of a whole gate."""

    SUCCESSFUL = "SUCCESSFUL"
    INCONCLUSIVE = "INCONCLUSIVE"
    ERROR = "ERROR"
    FAILED = "FAILED"

    @property
    def severity(self) -> int:
        # Argo Rollouts orders phases Successful < Inconclusive < Error < Failed.
        return _SEVERITY[self]


_SEVERITY = {
    Verdict.SUCCESSFUL: 0,
    Verdict.INCONCLUSIVE: 1,
    Verdict.ERROR: 2,
    Verdict.FAILED: 3,
}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The worst verdict; no verdicts at all is INCONCLUSIVE (no data never passes)."""
    found = list(verdicts)
    if not found:
        return Verdict.INCONCLUSIVE
    return max(found, key=lambda v: v.severity)


@dataclass(frozen=True)
class Measurement:
    """One check's result: what was asked (resolved PromQL), what came back, and the verdict."""

    name: str
    verdict: Verdict
    reason: str
    queries: tuple[str, ...] = ()
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "queries": list(self.queries),
            "numbers": self.numbers,
        }
