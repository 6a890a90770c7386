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
    """Parse ``NAME, type, help`` lines; ``#`` starts a comment line.

    Type ``label`` fields (driver version and the like) become labels in dcgm-exporter,
    not metrics; they are returned too, and ``metrics()`` leaves them out.
    """
    counters = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3 or parts[1] not in ("gauge", "counter", "label"):
            raise ValueError(f"dcgm counters line {lineno}: expected 'NAME, gauge|counter|label, help', got {raw!r}")
        counters.append(DcgmCounter(name=parts[0], type=parts[1], help=parts[2]))
    return tuple(counters)


def metrics(counters: tuple[DcgmCounter, ...]) -> tuple[DcgmCounter, ...]:
    """Only the fields exported as Prometheus metrics (gauges and counters)."""
    return tuple(c for c in counters if c.type != "label")
