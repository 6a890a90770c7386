"""What a person may set when triggering a group's DAG from the UI, checked (pure: no Airflow here).

- ``dry_run`` (default false): read-only. Nothing is deployed, cut over, routed, notified or rolled back;
  the group's stage never moves. Validation runs as usual (from any stage: it changes nothing) and says
  what would refuse a real run; parity and latency read what both sides already hold (a group that is
  dual-writing already, from its recorded ``dual_write_since``), else parity is INCONCLUSIVE
  "dry run: not dual-writing" (a check without data never passes); the gate's verdict is recorded as
  ``dry_run_gate``; every skipped side effect is recorded as a ``dry_run_step`` event; no approval is
  asked, and the run ends at the approval step with a ``dry_run_complete`` event (cut-over and its
  asset never happen). A FAILED gate still fails the run, so the answer shows in the UI.
- ``change_ticket``: the change record this run belongs to (free text, kept in the audit).
- ``warmup_override``: a Prometheus duration ("10m") replacing the catalog's warm-up for this run; empty
  keeps the catalog's. At least one scrape interval, at most the catalog's ``warmup.timeout`` stretched by
  the same amount (the timeout keeps its margin over the duration).
- ``reason``: why the run was started (free text, kept in the audit).
- ``accept_short_history`` (default false): switch every panel and move every rule at the cut-over even when
  the target's history (from the dual-write on) is shorter than what it reads (``core.horizon``); recorded
  with the run's parameters and shown to the approver. Left false, those wait until the target covers them.

Free text (``change_ticket``, ``reason``) with a control, bidirectional-override or line-separator character
is refused naming the character (``core.text``): U+202E would make it read backwards on the board and in mails.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from promshift.core.durations import format_duration, parse_duration
from promshift.core.text import unsafe_text

# What the trigger form accepts for warmup_override (the JSON-schema pattern); the value is then
# parsed by core.durations, which is the authority (units in order, each at most once).
WARMUP_OVERRIDE_PATTERN = r"^$|^([0-9]+(y|w|d|h|m|s|ms))+$"
MAX_TICKET_CHARS = 200
MAX_REASON_CHARS = 1000
MAX_WARMUP_OVERRIDE_S = 7 * 86400.0


class RunParamsError(ValueError):
    """A trigger-form value that cannot be used; the message is one line naming the field."""


@dataclass(frozen=True)
class RunParams:
    dry_run: bool = False
    change_ticket: str = ""
    warmup_override: str = ""
    warmup_override_s: float | None = None
    reason: str = ""
    accept_short_history: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def warmup(self, duration_s: float, timeout_s: float) -> tuple[float, float]:
        """(duration, timeout) of the warm-up for this run: the override, with the catalog's margin kept."""
        if self.warmup_override_s is None:
            return duration_s, timeout_s
        return self.warmup_override_s, self.warmup_override_s + max(0.0, timeout_s - duration_s)


def _text(params: Mapping[str, Any], name: str, limit: int) -> str:
    value = params.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RunParamsError(f"param {name!r} must be a string, got {type(value).__name__}")
    unsafe = unsafe_text(f"param {name!r}", value)
    if unsafe:
        raise RunParamsError(unsafe)
    if len(value) > limit:
        raise RunParamsError(f"param {name!r} must be at most {limit} characters, got {len(value)}")
    return value.strip()


def parse_run_params(params: Mapping[str, Any] | None, *, scrape_interval_s: float) -> RunParams:
    """The checked trigger values; unknown keys (Airflow's own, other tasks') are ignored. Raises RunParamsError."""
    params = params or {}
    dry_run = params.get("dry_run", False)
    if dry_run is None:
        dry_run = False
    if not isinstance(dry_run, bool):
        raise RunParamsError(f"param 'dry_run' must be true or false, got {dry_run!r:.40}")
    short = params.get("accept_short_history", False)
    if short is None:
        short = False
    if not isinstance(short, bool):
        raise RunParamsError(f"param 'accept_short_history' must be true or false, got {short!r:.40}")
    override = _text(params, "warmup_override", 64)
    seconds = None
    if override:
        if not re.fullmatch(WARMUP_OVERRIDE_PATTERN, override):
            raise RunParamsError(f"param 'warmup_override' must be a duration like '10m', got {override!r}")
        try:
            seconds = parse_duration(override)
        except ValueError as exc:
            raise RunParamsError(f"param 'warmup_override': {exc}") from None
        if seconds < scrape_interval_s:
            raise RunParamsError(f"param 'warmup_override' must be at least one scrape interval "
                                 f"({format_duration(scrape_interval_s)}), got {override!r}")
        if seconds > MAX_WARMUP_OVERRIDE_S:
            raise RunParamsError(f"param 'warmup_override' must be at most "
                                 f"{format_duration(MAX_WARMUP_OVERRIDE_S)}, got {override!r}")
    return RunParams(dry_run=dry_run, change_ticket=_text(params, "change_ticket", MAX_TICKET_CHARS),
                     warmup_override=override, warmup_override_s=seconds,
                     reason=_text(params, "reason", MAX_REASON_CHARS), accept_short_history=short)
