"""Free text people type (a reason, a change ticket, a comment): refused with control characters, shown escaped.

A right-to-left override (U+202E) makes "Approve ... evorppA" read backwards on the board and in mails; a line
or paragraph separator (U+2028/U+2029), a NUL or an escape sequence forges a new line or colours a terminal.
``unsafe_text`` names the first such character (for a refusal at input); ``shown`` escapes every one of them
(for whatever was stored before, or arrives by another way), so nothing displayed can be spoofed by them.
"""

from __future__ import annotations

import unicodedata

# Unicode categories that never belong in one line of free text: controls (Cc: NUL, ESC, CR, LF, DEL, C1),
# format characters (Cf: bidi overrides and isolates, zero-width joiners), separators of lines and paragraphs
# (Zl, Zp), surrogates and unassigned or private code points.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(value: str) -> str:
    """``value`` with every control, format (bidi) and separator character written as its escape (``\\u202e``)."""
    # Every unsafe category is one ``str.isprintable`` refuses (Other, Separator): the common case in one C call.
    if value.isprintable() or not any(_unsafe(ch) for ch in value):
        return value
    return "".join(_escape(ch) if _unsafe(ch) else ch for ch in value)


def unsafe_text(field: str, value: str) -> str | None:
    """None when ``value`` is safe one-line text; else one line naming ``field``, the character and where it is."""
    for index, ch in enumerate(value):
        if _unsafe(ch):
            name = unicodedata.name(ch, "a control character")
            return (f"{field} contains {_escape(ch)} ({name}) at character {index + 1}: control, bidirectional "
                    "and line-separator characters are refused in free text (they can make it read differently "
                    "than it is)")
    return None
