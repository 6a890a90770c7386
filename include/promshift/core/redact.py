"""Redact credentials in URLs before anything is recorded: audit events, XCom, reports, logs, errors.

One pure function does it (``redact``, for any JSON-like value; ``redact_text`` for a string).
What counts as a credential in a URL:

- userinfo: ``https://user:TOKEN@host`` and ``https://TOKEN@host`` become ``https://REDACTED@host``;
- query parameters whose name starts with ``X-Amz-`` (presigned URLs) or contains ``token``,
  ``key``, ``password``, ``passwd``, ``secret``, ``signature``, ``credential`` or ``auth``, or
  is ``sig``/``pwd`` (case-insensitive): their value becomes ``REDACTED``.

Query parameters are redacted wherever ``?name=`` or ``&name=`` appears, so a path with a query
and no scheme (an error message's ``/api/v1/query?token=...``) is covered too. The config file
itself is never redacted: the remote_write URL has to work.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "REDACTED"

_SECRET_WORDS = ("token", "key", "password", "passwd", "secret", "signature", "credential", "auth")
_SECRET_NAMES = ("sig", "pwd")
# scheme://userinfo@ : userinfo runs up to the last '@' before the host's end ('/', '?', '#' or a space).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s\"'<>]*(?:@[^/?#@\s\"'<>]*)*)@")
_PARAM = re.compile(r"(?P<sep>[?&;])(?P<name>[A-Za-z0-9_.\-\[\]%]+)=(?P<value>[^&;#\s\"'<>]*)")


def is_secret_param(name: str) -> bool:
    """Whether a URL query parameter's value is a credential (see the module doc)."""
    lowered = name.lower()
    return (lowered.startswith("x-amz-") or lowered in _SECRET_NAMES
            or any(word in lowered for word in _SECRET_WORDS))


def _param(match: re.Match[str]) -> str:
    if not is_secret_param(match.group("name")) or not match.group("value"):
        return match.group(0)
    return f"{match.group('sep')}{match.group('name')}={REDACTED}"


def redact_text(text: str) -> str:
    """``text`` with every URL credential replaced by ``REDACTED``; everything else unchanged."""
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    if "=" in text:
        text = _PARAM.sub(_param, text)
    return text


def redact(value: Any) -> Any:
    """A copy of a JSON-like value (mappings, lists, tuples, strings) with URL credentials redacted.

    Keys are redacted like values. Other types pass through unchanged.
    """
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {redact(k): redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact(v) for v in value)
    return value
