"""RE2 helpers: compile as Prometheus' regex engine would, and say why a pattern is refused."""

from __future__ import annotations

import functools
import re
from typing import Any

import re2

# --------------------------------------------------------------------------- regex helpers


def _compile_re2_uncached(pattern: str) -> Any:
    """Compile with RE2 without RE2 logging failures to stderr (we report them)."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


# Enough for every group's regex in a large catalog: a cache miss recompiles.
_compile_re2 = functools.lru_cache(maxsize=16_384)(_compile_re2_uncached)


def _re2_error(pattern: str) -> str | None:
    """Return RE2's complaint about ``pattern``, or None if it compiles."""
    try:
        _compile_re2(pattern)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        return detail.decode() if isinstance(detail, bytes) else str(detail)
    return None


def prometheus_fullmatch(pattern: str, text: str) -> bool | None:
    """Whether ``text`` matches ``pattern`` whole, as a Prometheus matcher (RE2: linear time, whatever the
    pattern); None when RE2 refuses the pattern. For every regex that comes from outside (query logs,
    dashboards, rules): Python's backtracking ``re`` can take exponential time on ``([A-Za-z_]+)+:``."""
    try:
        return _compile_re2(f"^(?:{pattern})$").search(text) is not None
    except re2.error:
        return None


# --------------------------------------------------------------------------- Go's regexp, as Prometheus runs it
#
# Prometheus compiles relabel regexes with Go's regexp, anchored as ``^(?:<regex>)$``. We compile
# with C++ RE2 (google-re2), which accepts a few things Go refuses. Each difference below was
# checked on this machine against Debian's promtool 2.42 (Go's regexp/syntax), see
# tests/unit/core/test_catalog_bad_inputs.py::test_go_regexp_differences_match_promtool:
# - ``\C`` (any byte): C++ RE2 accepts it, Go's package doc excludes it ("RE2 syntax, except \C").
# - ``(?<name>re)``: C++ RE2 accepts it; Go only since 1.22 (golang/go#58458), so Prometheus
#   builds from before 2024 (Debian's 2.42) reject it. ``(?P<name>re)`` works everywhere.
# - capture names outside ``[A-Za-z0-9_]+`` (``(?P<né>a)``): C++ RE2 accepts Unicode word
#   characters, Go's isValidCaptureName does not (golang/go#64678).
# - Unicode 14/15 scripts (``\p{Kawi}``, ``\p{Vithkuqi}``, ...): in google-re2's tables, not in
#   those of the Go that built Prometheus 2.42 (Go < 1.21 ships Unicode 13).
# - groups nested about 1,000 deep: Go refuses ("expression nests too deeply", maxHeight 1000,
#   counting Prometheus' own wrapping), C++ RE2 compiles them.
# - an unterminated ``\Q...``: harmless alone, but inside Prometheus' ``^(?:...)$`` it swallows the
#   closing ``)``; compiling the anchored form, as Prometheus does, catches it.
# Both engines refuse possessive quantifiers (``a*+``), lookaround, backreferences, ``\Z``, ``(?x)``.

# Scripts google-re2 knows that Go's Unicode 13 tables do not (Unicode 14 and 15 additions).
_NEWER_UNICODE_SCRIPTS = frozenset(
    {"Cypro_Minoan", "Old_Uyghur", "Tangsa", "Toto", "Vithkuqi", "Kawi", "Nag_Mundari"}
)
_GO_CAPTURE_NAME = re.compile(r"[A-Za-z0-9_]+")
# Far below Go's limit; no metric regex needs more.
MAX_GROUP_NESTING = 100


def _go_regexp_problem(pattern: str) -> str | None:
    """Why Go's regexp (Prometheus) would refuse ``pattern`` although C++ RE2 accepts it, or None."""
    depth = deepest = 0
    index, end = 0, len(pattern)
    in_class = False
    while index < end:
        char = pattern[index]
        if char == "\\" and index + 1 < end:
            escaped = pattern[index + 1]
            if escaped == "Q":  # literal text up to \E (or the end)
                stop = pattern.find("\\E", index + 2)
                index = end if stop < 0 else stop + 2
                continue
            if escaped == "C" and not in_class:
                return r"\C (match one byte) is C++ RE2 only: Go's regexp, which Prometheus uses, refuses it"
            if escaped in "pP" and index + 2 < end and pattern[index + 2] == "{":
                close = pattern.find("}", index + 3)
                name = pattern[index + 3 : close if close >= 0 else end].lstrip("^")
                if name in _NEWER_UNICODE_SCRIPTS:
                    return (f"\\p{{{name}}} is a Unicode 14/15 script: Go's regexp in the Prometheus builds we "
                            "target does not know it")
            index += 2
            continue
        if in_class:
            if char == "[" and pattern.startswith("[:", index):
                close = pattern.find(":]", index + 2)
                index = index + 1 if close < 0 else close + 2
                continue
            if char == "]":
                in_class = False
        elif char == "[":
            in_class = True
            index += 1
            if pattern.startswith("^", index):
                index += 1
            if pattern.startswith("]", index):  # a leading ] is a literal
                index += 1
            continue
        elif char == "(":
            if pattern.startswith("(?<", index) and not pattern.startswith(("(?<=", "(?<!"), index):
                return ("(?<name>...) needs Go 1.22; Prometheus built with an older Go refuses it: "
                        "write (?P<name>...)")
            if pattern.startswith("(?P<", index):
                close = pattern.find(">", index + 4)
                name = pattern[index + 4 : close] if close >= 0 else ""
                if close >= 0 and _GO_CAPTURE_NAME.fullmatch(name) is None:
                    return f"capture name {name!r}: Go's regexp allows only [A-Za-z0-9_] in names"
            if not pattern.startswith("(?", index) or pattern.startswith("(?P<", index):
                depth += 1
                deepest = max(deepest, depth)
        elif char == ")":
            depth = max(0, depth - 1)
        index += 1
    if deepest > MAX_GROUP_NESTING:
        return (f"capture groups nested {deepest} deep (at most {MAX_GROUP_NESTING}; Go's regexp refuses about "
                "1,000, counting Prometheus' own wrapping)")
    return None

