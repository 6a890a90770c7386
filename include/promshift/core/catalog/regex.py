"""RE2 helpers: compile as Prometheus' regex engine would, and say why a pattern is refused."""

from __future__ import annotations

import functools
from typing import Any

import re2

# --------------------------------------------------------------------------- regex helpers


@functools.lru_cache(maxsize=256)
def _compile_re2(pattern: str) -> Any:
    """Compile with RE2 without RE2 logging failures to stderr (we report them)."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


def _re2_error(pattern: str) -> str | None:
    """Return RE2's complaint about ``pattern``, or None if it compiles."""
    try:
        _compile_re2(pattern)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        return detail.decode() if isinstance(detail, bytes) else str(detail)
    return None
