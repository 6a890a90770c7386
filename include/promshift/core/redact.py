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

Beyond URLs' userinfo and parameters, secrets that live in a path or stand alone in a text:

- webhook paths, with or without scheme and host (an error page may echo the path alone): Slack's
  ``/services/T…/B…/<secret>`` (and ``hooks.slack.com/workflows|triggers/…``), and any path after
  ``/webhooks/`` or ``/webhook/`` (Discord, Teams, generic): the secret part becomes ``REDACTED``;
- well-known token shapes anywhere: GitHub (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_``,
  ``github_pat_``), GitLab (``glpat-``), Slack (``xoxb-``, ``xoxp-``, ...); and what follows
  ``Bearer``/``Basic`` in an Authorization header.

Every regex here is linear in the text (no nested quantifiers over the same characters).
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
_WEBHOOK_PATH = re.compile(r"(?P<keep>/services/|hooks\.slack\.com/(?:workflows|triggers)/|/webhooks?/)"
                           r"(?P<secret>[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*)")
_TOKEN = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,}|glpat-[A-Za-z0-9_\-]{16,}"
                    r"|xox[abposre]-[A-Za-z0-9\-]{8,})")
_AUTH_HEADER = re.compile(r"(?P<keep>\b(?:Bearer|Basic)\s+|\bAuthorization:\s*(?:token\s+)?)[A-Za-z0-9._~+/=\-]{8,}",
                          re.IGNORECASE)


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
    if "/services/" in text or "/webhook" in text or "hooks.slack.com/" in text:
        text = _WEBHOOK_PATH.sub(lambda m: f"{m.group('keep')}{REDACTED}", text)
    text = _TOKEN.sub(REDACTED, text)
    return _AUTH_HEADER.sub(lambda m: f"{m.group('keep')}{REDACTED}", text)


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
