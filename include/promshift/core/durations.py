"""Prometheus-style durations ("30s", "1h30m", "500ms") to and from seconds.

The grammar is Prometheus' own (``model.ParseDuration``): integer amounts with
units ``y w d h m s ms``, each used at most once and in that order, so a value
copied from a Prometheus config or a query-tee flag means the same here.
A year is 365 days, as in Prometheus. A plain number (or numeric string) is
seconds, because the Prometheus HTTP API accepts that form too.
"""

from __future__ import annotations

import math
import re

__all__ = ["format_duration", "parse_duration"]

# Largest unit first; the order is also the only order the parser accepts.
_UNITS: tuple[tuple[str, float], ...] = (
    ("y", 365 * 86400.0),
    ("w", 7 * 86400.0),
    ("d", 86400.0),
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
    ("ms", 0.001),
)

# "ms" must be tried before "m" so that "500ms" is not read as "500m" + "s".
_DURATION_RE = re.compile(
    r"(?:(?P<y>\d+)y)?(?:(?P<w>\d+)w)?(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?"
    r"(?:(?P<m>\d+)m(?!s))?(?:(?P<s>\d+)s)?(?:(?P<ms>\d+)ms)?"
)
_PLAIN_SECONDS_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def parse_duration(text: str | int | float) -> float:
    """Return the number of seconds in a Prometheus-style duration.

    Accepts "1h30m", "500ms", "2d", "1w", "0", and plain non-negative numbers
    (int, float or numeric string) as seconds. Raises ``ValueError`` naming the
    bad input for anything else: empty strings, unknown or repeated units,
    units out of order ("30m1h"), fractions with a unit ("1.5h"), negatives,
    NaN/infinity and booleans (YAML turns ``yes`` into ``True``; that is never
    a duration).
    """
    if isinstance(text, bool):
        raise ValueError(f"invalid duration {text!r}: expected a string like '10m' or a number of seconds")
    if isinstance(text, int | float):
        seconds = float(text)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"invalid duration {text!r}: seconds must be a finite number >= 0")
        return seconds
    if not isinstance(text, str):
        raise ValueError(
            f"invalid duration {text!r}: expected a string like '10m' or a number of seconds, "
            f"got {type(text).__name__}"
        )
    if not text:
        raise ValueError("invalid duration '': empty string")
    if _PLAIN_SECONDS_RE.fullmatch(text):
        return float(text)
    match = _DURATION_RE.fullmatch(text)
    if match is None or not any(match.groupdict().values()):
        raise ValueError(
            f"invalid duration {text!r}: expected integer amounts with units y, w, d, h, m, s, ms "
            "in that order, each at most once (e.g. '1h30m', '500ms')"
        )
    total = 0.0
    for unit, unit_seconds in _UNITS:
        amount = match.group(unit)
        if amount is not None:
            total += int(amount) * unit_seconds
    return total


def format_duration(seconds: float) -> str:
    """Format seconds as the shortest Prometheus duration, e.g. 5400 -> "1h30m".

    Rounds to whole milliseconds (the smallest Prometheus unit), so
    ``parse_duration(format_duration(x)) == x`` for any millisecond-precise x.
    Zero is "0s". Raises ``ValueError`` for negative, NaN or infinite input.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"cannot format {seconds!r} as a duration: expected a number of seconds")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot format {seconds!r} as a duration: must be a finite number >= 0")
    # Integer milliseconds avoid float residue such as 0.30000000000000004.
    remaining_ms = round(seconds * 1000)
    if remaining_ms == 0:
        return "0s"
    parts: list[str] = []
    for unit, unit_seconds in _UNITS:
        unit_ms = round(unit_seconds * 1000)
        amount, remaining_ms = divmod(remaining_ms, unit_ms)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts)
