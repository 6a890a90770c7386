"""dcgm-exporter's counter list (its CSV format), parsed from text."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("gauge", "counter", "label")


@dataclass(frozen=True)
class DcgmCounter:
    """One exported field: Prometheus name, kind (gauge/counter/label) and HELP text."""

    name: str
    kind: str
    help: str


def parse_counters(text: str) -> tuple[DcgmCounter, ...]:
    """Parse ``NAME, kind, help`` lines; ``#`` starts a comment line; names may carry stray spaces.

    Kind ``label`` fields (driver version and the like) become labels in dcgm-exporter,
    not metrics; they are returned too, and ``metrics()`` leaves them out.
    """
    counters: list[DcgmCounter] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3:
            raise ValueError(f"dcgm counters line {lineno}: expected 'NAME, kind, help', got {raw!r}")
        name, kind, help_text = parts
        if kind not in KINDS:
            raise ValueError(f"dcgm counters line {lineno}: unsupported metric type {kind!r} for {name}")
        if name in seen:
            raise ValueError(f"dcgm counters line {lineno}: duplicate counter {name}")
        seen.add(name)
        counters.append(DcgmCounter(name=name, kind=kind, help=help_text))
    return tuple(counters)


def metrics(counters: tuple[DcgmCounter, ...]) -> tuple[DcgmCounter, ...]:
    """Only the fields exported as Prometheus metrics (gauges and counters)."""
    return tuple(c for c in counters if c.kind != "label")
