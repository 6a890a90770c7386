"""dcgm-exporter's counter list (its CSV format), parsed from text."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DcgmCounter:
    """One exported field: Prometheus name, type (gauge/counter) and HELP text."""

    name: str
    type: str
    help: str


def parse_counters(text: str) -> tuple[DcgmCounter, ...]:
    """Parse ``NAME, type, help`` lines; ``#`` starts a comment line."""
    counters = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3 or parts[1] not in ("gauge", "counter"):
            raise ValueError(f"dcgm counters line {lineno}: expected 'NAME, gauge|counter, help', got {raw!r}")
        counters.append(DcgmCounter(name=parts[0], type=parts[1], help=parts[2]))
    return tuple(counters)
