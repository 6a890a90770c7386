"""promshift's own metrics, in Prometheus' text exposition format, from the catalog and the audit log.

The board serves them at ``/promshift/metrics`` under the board's auth rules (a caller sees only the groups whose
DAG it may read). One pass over the audit events; nothing is kept between scrapes, so every API server answers
the same. Times are the audit events' own (``*_timestamp_seconds``): alert rules compare them with ``time()``,
so the exporter needs no clock.

- ``promshift_groups{stage,wave}``: how many groups stand in each stage (every stage, zeros included).
- ``promshift_group_stage{group,wave,stage}`` = 1, and ``promshift_group_stage_entered_timestamp_seconds``.
- ``promshift_gate_verdicts_total{group,verdict}``; ``promshift_gate_duration_seconds_{sum,count}{group}``:
  from the warm-up's end to the gate's decision, per run.
- ``promshift_approval_waiting_since_timestamp_seconds{group,run_id}``: a gate asked a human and nothing
  answered or ended the run yet.
- ``promshift_bake_failures_total{group}`` (reads returned to the source by a failed bake check),
  ``promshift_rollbacks_total{group,outcome}`` (``rolled_back``, ``failed``), and
  ``promshift_rollback_failed{group}`` = 1 while the group's last rollback is one that failed.
- ``promshift_audit_events`` and ``promshift_audit_last_event_timestamp_seconds``.

The board reads only the stage moves and the events of ``FOLDED_KINDS`` (and the log's totals by SQL), not the
whole log: bake checks, most of a year's events, change none of these.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from promshift.board.evidence import _ASKS_APPROVAL, _CLOSES_APPROVAL
from promshift.core.audit import AuditEvent
from promshift.core.events import GATE_DECIDED, EventKind
from promshift.core.stages import Stage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_VERDICT = {EventKind.GATE_PASSED: "passed", EventKind.GATE_INCONCLUSIVE: "inconclusive",
            EventKind.GATE_FAILED: "failed"}
_ROLLBACK = {EventKind.ROLLED_BACK: "rolled_back", EventKind.ROLLBACK_FAILED: "failed"}
_WARMUP_ENDS = (EventKind.WARMUP_READY, EventKind.WARMUP_TIMEOUT, EventKind.WARMUP_ERROR, EventKind.WARMUP_FAILED)
# Every kind ``_fold`` reads besides stage moves: a reader may pass only these (and every event with a ``stage_to``),
# with the log's totals beside them (``exposition(totals=...)``); a bake check, the bulk of a year, is none of them.
FOLDED_KINDS = frozenset({*_WARMUP_ENDS, *GATE_DECIDED, *_ASKS_APPROVAL, *_CLOSES_APPROVAL,
                          EventKind.READS_ROLLED_BACK, *_ROLLBACK})


@dataclass
class _Group:
    stage: str = Stage.PLANNED.value
    entered: float | None = None
    verdicts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    gate_sum: float = 0.0
    gate_count: int = 0
    bake_failures: int = 0
    rollbacks: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    last_rollback: str | None = None
    waiting: dict[str, float] = field(default_factory=dict)  # run id -> asked at
    warmup_end: dict[str, float] = field(default_factory=dict)  # run id -> warm-up ended at


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _line(name: str, labels: dict[str, object], value: float) -> str:
    inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
    number = repr(float(value)) if value != int(value) else str(int(value))
    return f"{name}{{{inner}}} {number}" if inner else f"{name} {number}"


def _fold(groups: dict[str, _Group], events: Iterable[AuditEvent]) -> tuple[int, float | None]:
    count, last = 0, None
    for ev in events:
        count += 1
        at = ev.at.timestamp()
        last = at if last is None or at > last else last
        g = groups.get(ev.group)
        if g is None:
            continue
        kind = ev.kind
        if ev.stage_to:
            g.stage, g.entered = ev.stage_to, at
        if kind in _WARMUP_ENDS:
            g.warmup_end[ev.run_id] = at
        if kind in GATE_DECIDED:
            g.verdicts[_VERDICT[EventKind(kind)]] += 1
            started = g.warmup_end.pop(ev.run_id, None)
            if started is not None:
                g.gate_sum += max(0.0, at - started)
                g.gate_count += 1
        if kind in _ASKS_APPROVAL:
            g.waiting[ev.run_id] = at
        elif kind in _CLOSES_APPROVAL:
            g.waiting.pop(ev.run_id, None)
        if kind == EventKind.READS_ROLLED_BACK:
            g.bake_failures += 1
        if kind in _ROLLBACK:
            g.rollbacks[_ROLLBACK[EventKind(kind)]] += 1
            g.last_rollback = kind
    return count, last


def exposition(groups: Sequence[tuple[str, int]], events: Iterable[AuditEvent], *,
               totals: tuple[int, datetime | None] | None = None) -> str:
    """The text exposition for ``groups`` (name, wave) from the audit ``events`` (oldest first, any groups).

    ``totals`` (the log's event count and latest time): ``events`` may then be only the stage moves and the events
    of ``FOLDED_KINDS``; without it they must be the whole log."""
    state = {name: _Group() for name, _ in groups}
    waves = dict(groups)
    count, last = _fold(state, events)
    if totals is not None:
        count, last = totals[0], (totals[1].timestamp() if totals[1] else None)
    out: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])

    family("promshift_groups", "gauge", "Metric groups in each stage, by wave.")
    per_stage: dict[tuple[str, int], int] = defaultdict(int)
    for name, g in state.items():
        per_stage[(g.stage, waves[name])] += 1
    for wave in sorted(set(waves.values())):
        for stage in Stage:
            out.append(_line("promshift_groups", {"stage": stage.value, "wave": wave},
                             per_stage.get((stage.value, wave), 0)))
    family("promshift_group_stage", "gauge", "1 for the stage each group stands in.")
    for name, g in state.items():
        out.append(_line("promshift_group_stage", {"group": name, "wave": waves[name], "stage": g.stage}, 1))
    family("promshift_group_stage_entered_timestamp_seconds", "gauge", "When the group entered its stage.")
    for name, g in state.items():
        if g.entered is not None:
            out.append(_line("promshift_group_stage_entered_timestamp_seconds", {"group": name, "stage": g.stage},
                             g.entered))
    family("promshift_gate_verdicts_total", "counter", "Gate decisions, by verdict.")
    for name, g in state.items():
        for verdict in ("passed", "inconclusive", "failed"):
            out.append(_line("promshift_gate_verdicts_total", {"group": name, "verdict": verdict},
                             g.verdicts.get(verdict, 0)))
    family("promshift_gate_duration_seconds", "summary", "From the warm-up's end to the gate's decision.")
    for name, g in state.items():
        out.append(_line("promshift_gate_duration_seconds_sum", {"group": name}, g.gate_sum))
        out.append(_line("promshift_gate_duration_seconds_count", {"group": name}, g.gate_count))
    family("promshift_approval_waiting_since_timestamp_seconds", "gauge",
           "An approval a gate asked for and nobody answered yet: when it was asked.")
    for name, g in state.items():
        for run_id, since in sorted(g.waiting.items()):
            out.append(_line("promshift_approval_waiting_since_timestamp_seconds",
                             {"group": name, "run_id": run_id}, since))
    family("promshift_bake_failures_total", "counter", "Bake checks that failed and returned reads to the source.")
    for name, g in state.items():
        out.append(_line("promshift_bake_failures_total", {"group": name}, g.bake_failures))
    family("promshift_rollbacks_total", "counter", "Rollbacks, by outcome.")
    for name, g in state.items():
        for outcome in ("rolled_back", "failed"):
            out.append(_line("promshift_rollbacks_total", {"group": name, "outcome": outcome},
                             g.rollbacks.get(outcome, 0)))
    family("promshift_rollback_failed", "gauge", "1 while the group's last rollback is one that failed.")
    for name, g in state.items():
        out.append(_line("promshift_rollback_failed", {"group": name},
                         int(g.last_rollback == EventKind.ROLLBACK_FAILED)))
    family("promshift_audit_events", "gauge", "Events in the audit log.")
    out.append(_line("promshift_audit_events", {}, count))
    if last is not None:
        family("promshift_audit_last_event_timestamp_seconds", "gauge", "The newest audit event's time.")
        out.append(_line("promshift_audit_last_event_timestamp_seconds", {}, last))
    return "\n".join(out) + "\n"

