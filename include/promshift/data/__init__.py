"""Data shipped inside the package (read by production code and by the local stack alike)."""

from __future__ import annotations

from importlib import resources

from promshift.core.dcgm import DcgmCounter, parse_counters

DCGM_COUNTERS_CSV = "dcgm_default_counters.csv"


def load_dcgm_counters() -> tuple[DcgmCounter, ...]:
    """dcgm-exporter's ``default-counters.csv`` as shipped in the package (comments and blank lines skipped)."""
    return parse_counters(resources.files(__name__).joinpath(DCGM_COUNTERS_CSV).read_text(encoding="utf-8"))
