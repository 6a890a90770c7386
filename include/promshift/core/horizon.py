"""The history horizon: how far back a panel or a rule reads, and whether the target can answer it in full.

AMP accepts no backfill (samples older than its out-of-order window are refused), so the target's
history of a group starts at its dual-write. A panel that opens on the last 24 hours, switched two hours
after dual-write began, shows two hours; a rule reading ``[2h]`` moved after ten minutes evaluates on ten
minutes of data. So before a panel switches or a rule moves, its *reach* is worked out here, and only
what the target holds in full (dual-write age ≥ reach) goes; the rest waits, named, with the time it will
be ready, and the bake watch moves it once that time has passed.

Reach, in seconds before "now" (every part is named in ``Reach.parts``, for the board and the audit):

- a panel: its time range (the panel's ``timeFrom`` or else the dashboard's ``time.from``, ``now-24h``,
  ``now-7d/d``: a rounding adds one unit; a dashboard without ``time`` opens on Grafana's default 6 h),
  plus the panel's ``timeShift``, plus the longest look-back of its expressions (``core.promql``: range
  selectors, ``offset``, subqueries and their ranges), with Grafana's ``$__range`` standing for that range
  and ``$__interval``/``$__rate_interval`` for the step Grafana would pick (range / ``maxDataPoints``,
  1,000 when unset, never under the panel's ``interval`` or the scrape interval);
- a rule: the longest look-back of its expression, plus its ``for`` (an alert fires only after its
  condition held that long, so it reads that much more history before it can fire);
- ``@ <time>`` pins a read to a fixed instant: its reach is measured from that instant at ``now``.

A reach that cannot be worked out (an absolute dashboard range past the parser, an expression that does
not parse) is ``None``: it waits without a ready time until someone accepts short history for the group
(``accept_short_history``: recorded, shown to the approver) -- never a silent switch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from promshift.core.audit import AuditEvent
from promshift.core.events import EventKind
from promshift.core.promql import PromQLError, analyse, grafana_builtins, substitute

GRAFANA_DEFAULT_RANGE_S = 6 * 3600.0  # a dashboard without ``time`` opens on the last 6 hours
DEFAULT_MAX_DATA_POINTS = 1000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "M": 31 * 86400, "y": 366 * 86400}
_RELATIVE = re.compile(r"^now(?:-(\d+)([smhdwMy]))?(?:/([smhdwMy]))?$")
_DURATION = re.compile(r"^(\d+)([smhdwMy])$")
_PROM_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_PROM_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


class HorizonError(ValueError):
    """A reach that cannot be worked out (one line)."""


def grafana_relative_s(text: Any) -> float | None:
    """Seconds before now of a Grafana relative time (``now-24h``, ``now-7d/d``, ``now``), None if not one.

    A rounding (``/d``) can reach back one more unit (``now-1d/d`` at 23:59 starts almost 2 days back).
    """
    if not isinstance(text, str):
        return None
    m = _RELATIVE.match(text.strip())
    if m is None:
        return None
    back = int(m[1]) * _UNITS[m[2]] if m[1] else 0
    return float(back + (_UNITS[m[3]] if m[3] else 0))


def grafana_duration_s(text: Any) -> float | None:
    """Seconds of a Grafana panel duration (``timeFrom: "7d"``, ``timeShift: "1h"``), None when absent or unread."""
    if not isinstance(text, str) or not text.strip():
        return None
    m = _DURATION.match(text.strip().removeprefix("now-"))
    return float(int(m[1]) * _UNITS[m[2]]) if m else None


def prometheus_duration_s(text: Any) -> float | None:
    """Seconds of a Prometheus duration (``10m``, ``1h30m``); None when absent or not one."""
    if text is None:
        return None
    if not isinstance(text, str):
        return None
    parts = _PROM_DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        return None
    return float(sum(int(n) * _PROM_UNITS[u] for n, u in parts))


@dataclass(frozen=True)
class Reach:
    """How far back one panel or rule reads: ``reach_s`` (None: cannot tell) and the parts that add up to it."""

    kind: str  # "panel" or "rule"
    name: str  # "<dashboard> / <panel title>" or the rule's label
    reach_s: float | None
    parts: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "reach_s": self.reach_s, "parts": list(self.parts)}


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


def expression_lookback_s(expr: str, *, range_s: float = 0.0, step_s: float = 60.0, now: datetime | None = None,
                          variables: Mapping[str, str] | None = None) -> float:
    """The longest look-back of ``expr`` before each evaluation instant, in seconds (0: a plain selector).

    Grafana's built-ins are substituted for ``range_s`` and ``step_s``; other variables from ``variables``.
    ``@ start()`` reads are measured from the range's start (so they add ``range_s``), ``@ <time>`` from
    ``now``. Raises HorizonError when the expression does not parse.
    """
    text = substitute(expr, dict(variables or {}), builtins=grafana_builtins(step_s, max(range_s, 1.0))).expr
    try:
        reads = analyse(text).reads
    except PromQLError as exc:
        raise HorizonError(f"cannot tell how far back {expr[:80]!r} reads: {str(exc).splitlines()[0][:160]}") from None
    back = 0.0
    for read in reads:
        if read.anchor == "t":
            back = max(back, read.back_s)
        elif read.anchor == "start":
            back = max(back, read.back_s)  # + range_s: added by the caller, who reads the whole range anyway
        elif read.anchor == "end":
            back = max(back, read.back_s - range_s)
        elif read.anchor == "fixed" and read.at is not None:
            if now is None:
                raise HorizonError(f"{expr[:80]!r} reads at a fixed time (@): give now")
            back = max(back, now.timestamp() - read.at + read.back_s - range_s)
    return max(0.0, back)


def panel_reach(panel: Mapping[str, Any], exprs: Sequence[str], *, dashboard_time: Mapping[str, Any] | None,
                name: str, scrape_interval_s: float = 15.0, now: datetime | None = None,
                variables: Mapping[str, str] | None = None) -> Reach:
    """How far back one panel reads when its dashboard opens (see the module's rules)."""
    parts: list[str] = []
    own = grafana_duration_s(panel.get("timeFrom"))
    if own is not None:
        range_s: float | None = own
        parts.append(f"panel range {panel.get('timeFrom')}")
    elif dashboard_time is None:
        range_s = GRAFANA_DEFAULT_RANGE_S
        parts.append("Grafana's default range 6h (the dashboard sets none)")
    else:
        range_s = grafana_relative_s(dashboard_time.get("from"))
        to = grafana_relative_s(dashboard_time.get("to", "now"))
        if range_s is None or to is None:
            return Reach("panel", name, None, (f"dashboard range {dashboard_time.get('from')!r} to "
                                               f"{dashboard_time.get('to', 'now')!r} is not relative to now",))
        parts.append(f"dashboard range {dashboard_time.get('from')}")
    shift = grafana_duration_s(panel.get("timeShift")) or 0.0
    if shift:
        parts.append(f"time shift {panel.get('timeShift')}")
    points = panel.get("maxDataPoints")
    points = points if isinstance(points, int) and points > 0 else DEFAULT_MAX_DATA_POINTS
    floor = grafana_duration_s(panel.get("interval")) or scrape_interval_s
    step = max(floor, range_s / points)
    look = 0.0
    for expr in exprs:
        try:
            back = expression_lookback_s(expr, range_s=range_s, step_s=step, now=now, variables=variables)
        except HorizonError as exc:
            return Reach("panel", name, None, (*parts, str(exc)))
        if back > look:
            look = back
            worst = expr
    if look:
        parts.append(f"look-back {_hms(look)} ({worst[:80]})")
    return Reach("panel", name, range_s + shift + look, tuple(parts))


def rule_reach(expr: str, *, for_: Any = None, name: str, now: datetime | None = None) -> Reach:
    """How far back one rule reads at each evaluation: its expression's look-back plus its ``for``."""
    parts: list[str] = []
    try:
        look = expression_lookback_s(expr, now=now)
    except HorizonError as exc:
        return Reach("rule", name, None, (str(exc),))
    if look:
        parts.append(f"look-back {_hms(look)}")
    hold = prometheus_duration_s(for_) if for_ is not None else 0.0
    if for_ is not None and hold is None:
        return Reach("rule", name, None, (*parts, f"for {for_!r} is not a duration"))
    if hold:
        parts.append(f"for {for_}")
    return Reach("rule", name, look + (hold or 0.0), tuple(parts) or ("reads only the newest samples",))


# -- the split ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Horizon:
    """What a split needs of one group at one moment: when its dual-write began, now, and its acceptance.

    ``lab_clock_ahead_s`` (LAB ONLY; 0 everywhere else): the target's history is counted up to ``now`` plus this
    much (``counted_now``), as if that much more wall time had passed since dual-write began. The lab's lifecycle
    demo gives it to its bake watch so a day-long wait ends in minutes without shortening any panel or rule;
    ``now`` stays the wall clock, and every record of this horizon names the advance (``to_dict``).
    """

    dual_write_since: datetime
    now: datetime
    accept_short_history: bool = False
    scrape_interval_s: float = 15.0
    lab_clock_ahead_s: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.lab_clock_ahead_s < float("inf")):
            raise HorizonError(f"lab_clock_ahead_s must be a finite number of seconds >= 0, got "
                               f"{self.lab_clock_ahead_s!r}")

    @property
    def counted_now(self) -> datetime:
        """The instant the target's history is counted to: ``now``, plus the lab's clock advance if any."""
        return self.now + timedelta(seconds=self.lab_clock_ahead_s)

    def split(self, reaches: Iterable[Reach]) -> HorizonSplit:
        """``split_by_horizon`` of ``reaches`` at this horizon (its counted time, its acceptance)."""
        return split_by_horizon(reaches, dual_write_since=self.dual_write_since, now=self.counted_now,
                                accept_short_history=self.accept_short_history)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dual_write_since": self.dual_write_since.isoformat(), "now": self.now.isoformat(),
                               "accept_short_history": self.accept_short_history,
                               "scrape_interval_s": self.scrape_interval_s}
        if self.lab_clock_ahead_s:  # no record of a lab advance reads as wall-clock history
            out.update(lab_clock_ahead_s=self.lab_clock_ahead_s, counted_now=self.counted_now.isoformat(),
                       clock=f"LAB ONLY: history counted {_hms(self.lab_clock_ahead_s)} ahead of the wall clock")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Horizon:
        return cls(datetime.fromisoformat(str(data["dual_write_since"])), datetime.fromisoformat(str(data["now"])),
                   bool(data.get("accept_short_history")), float(data.get("scrape_interval_s") or 15.0),
                   float(data.get("lab_clock_ahead_s") or 0.0))


@dataclass(frozen=True)
class Waiting:
    """A panel or rule held back: what it reaches, how much the target holds, and when it will be ready."""

    reach: Reach
    held_s: float
    ready_at: datetime | None  # None: its reach is unknown (only an accepted short history lets it go)

    def to_dict(self) -> dict[str, Any]:
        return {**self.reach.to_dict(), "target_holds_s": round(self.held_s, 1),
                "ready_at": None if self.ready_at is None else self.ready_at.isoformat()}


@dataclass(frozen=True)
class HorizonSplit:
    """What may move now and what waits, for one group at ``now``."""

    ready: tuple[Reach, ...]
    waiting: tuple[Waiting, ...]
    accepted_short: tuple[Reach, ...]  # would wait, but the group accepted short history

    @property
    def longest_s(self) -> float | None:
        reaches = [r.reach_s for r in (*self.ready, *self.accepted_short, *(w.reach for w in self.waiting))]
        return None if any(r is None for r in reaches) else max([0.0, *(r for r in reaches if r is not None)])

    def next_ready(self) -> datetime | None:
        times = [w.ready_at for w in self.waiting if w.ready_at is not None]
        return min(times) if times else None

    def to_dict(self) -> dict[str, Any]:
        return {"ready": [r.to_dict() for r in self.ready], "waiting": [w.to_dict() for w in self.waiting],
                "accepted_short": [r.to_dict() for r in self.accepted_short], "longest_s": self.longest_s}


def split_by_horizon(reaches: Iterable[Reach], *, dual_write_since: datetime, now: datetime,
                     accept_short_history: bool = False) -> HorizonSplit:
    """Split by whether the target's history (``now`` - ``dual_write_since``) covers each reach in full."""
    held = max(0.0, (now - dual_write_since).total_seconds())
    ready: list[Reach] = []
    waiting: list[Waiting] = []
    accepted: list[Reach] = []
    for reach in reaches:
        if reach.reach_s is not None and reach.reach_s <= held:
            ready.append(reach)
        elif accept_short_history:
            accepted.append(reach)
        else:
            at = None if reach.reach_s is None else dual_write_since + timedelta(seconds=reach.reach_s)
            waiting.append(Waiting(reach, held, at))
    return HorizonSplit(tuple(ready), tuple(waiting), tuple(accepted))


def decommission_short_by(longest_s: float | None, *, dual_write_since: datetime, now: datetime) -> float | None:
    """How many seconds of history a decommission would lose for the group's longest read (0: none); None: unknown.

    Until the target covers the longest read, dropping the group from the source loses what only the source
    holds: the decommission waits, or records that loss with its own approval.
    """
    if longest_s is None:
        return None
    return max(0.0, longest_s - max(0.0, (now - dual_write_since).total_seconds()))


def dual_write_since(events: Sequence[AuditEvent]) -> datetime | None:
    """When the group's current dual-write began: its latest ``dual_write_deployed`` not undone by a rollback
    since (a rollback of reads keeps dual-write on; a full rollback ends it). None: not dual-writing."""
    since = None
    for e in events:
        if e.kind == EventKind.DUAL_WRITE_DEPLOYED:
            since = since or e.at
        elif e.kind == EventKind.ROLLED_BACK:
            since = None
    return since


# What ends a wait besides a switch, by what waits: the move done some other way, or a rollback.
_ENDS_WAIT = {"read_path": (EventKind.READ_PATH_RESTORED,), "rules": (EventKind.RULES_MOVED, EventKind.RULES_RESTORED)}


def held_back(events: Sequence[AuditEvent]) -> dict[str, AuditEvent]:
    """What the horizon still holds back for a group (``read_path``, ``rules``): each one's latest
    ``horizon_waiting``, unless a later event ended it (a ``horizon_switched`` of it that left nothing waiting,
    its move done, or a rollback)."""
    held: dict[str, AuditEvent] = {}
    for e in events:
        what = e.evidence_data.get("what") if e.kind in (EventKind.HORIZON_WAITING, EventKind.HORIZON_SWITCHED) \
            else None
        if e.kind == EventKind.HORIZON_WAITING and what in _ENDS_WAIT:
            held[str(what)] = e
        for name, ends in _ENDS_WAIT.items():
            if e.kind in ends or (e.kind == EventKind.HORIZON_SWITCHED and what == name):
                held.pop(name, None)
    return held


def waiting_list(events: Sequence[AuditEvent]) -> list[dict[str, Any]]:
    """Every panel and rule still waiting for the target's history, with its ready time (the board's list)."""
    out: list[dict[str, Any]] = []
    for what, event in held_back(events).items():
        for item in event.evidence_data.get("waiting") or ():
            if what == "read_path":
                horizon = item.get("horizon") or {}
                out.append({"kind": "panel", "name": f"{item.get('title') or item.get('path')}",
                            "where": str(horizon.get("name") or ""), "ready_at": horizon.get("ready_at"),
                            "reach_s": horizon.get("reach_s"), "since_run": event.run_id})
            else:
                out.append({"kind": "rule", "name": str(item.get("name")), "where": "",
                            "ready_at": item.get("ready_at"), "reach_s": item.get("reach_s"),
                            "since_run": event.run_id})
    return sorted(out, key=lambda w: (w["ready_at"] is None, str(w["ready_at"]), w["name"]))
