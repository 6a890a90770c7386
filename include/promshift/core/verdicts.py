"""Gate verdicts with Argo Rollouts' semantics: the worst of all measurements wins."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from promshift.core.evidence import json_safe


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


class Layer(StrEnum):
    """What kind of check a measurement is: a parity layer, the comparison window, or latency."""

    WINDOW = "window"
    COVERAGE = "coverage"
    HOST_COVERAGE = "host_coverage"
    AGGREGATES = "aggregates"
    LABELS = "labels"
    GOLDEN = "golden"  # the golden layer itself ("golden") and each query ("golden[panel]")
    SAMPLES = "samples"
    RULES = "rules"  # recording and alerting rules that move with the group ("rules" and "rules[<rule>]")
    LATENCY = "latency"

    @classmethod
    def of(cls, name: str) -> Layer:
        """The layer a measurement's name belongs to (``golden[GPU util]`` -> GOLDEN)."""
        try:
            return cls(name.split("[", 1)[0])
        except ValueError:
            raise ValueError(f"measurement {name!r} belongs to no known layer "
                             f"({', '.join(v.value for v in cls)})") from None


@dataclass(frozen=True)
class Measurement:
    """One check's result: what was asked (resolved PromQL), what came back, and the verdict.

    ``numbers`` is free-form evidence; ``to_dict`` writes its non-finite floats as text
    (``"NaN"``, ``"+Inf"``), so the audit store and XCom can hold it.
    """

    name: str
    verdict: Verdict
    reason: str
    queries: tuple[str, ...] = ()
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def layer(self) -> Layer:
        return Layer.of(self.name)

    def __post_init__(self) -> None:
        Layer.of(self.name)  # an unknown name is a bug here, not a surprise for the report

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layer": self.layer.value,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "queries": list(self.queries),
            "numbers": json_safe(self.numbers),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, name: str | None = None,
                  verdict: Verdict = Verdict.INCONCLUSIVE) -> Measurement:
        """Read ``to_dict``'s form back; ``name``/``verdict`` stand in where an old record lacks them."""
        return cls(str(d.get("name") or name or ""), Verdict(d.get("verdict") or verdict), str(d.get("reason") or ""),
                   tuple(d.get("queries") or ()), dict(d.get("numbers") or {}))
