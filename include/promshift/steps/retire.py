"""Retire a source Prometheus once every group it carries has baked: it becomes an agent that only forwards.

Over core ports only (``core.ports``): the audit log, the source's mode switch, what the source still does,
the target's sample times. Every step is an audit event under the group ``source:<conn>`` (no stage moves: a
source has no stage); every step reads the current state first, so a retry after a crash reaches the same end.

1. ``prepare``: refused (one line naming them) unless every group of the source has baked; then what retiring
   ends, by name (rules still evaluated, metrics still read in the query log since the last bake ended, metrics
   no group carries, panels and rules the history horizon still holds back) and the source's CPU and memory
   now. Shown to the approver.
1b. ``consolidate`` (before the approval, so the approver sees it done): per target, every baked group's own
   ``remote_write`` entry merged into one by the lossless queue swap (``steps.queues.QueueCap.consolidate``), so the
   agent forwards through one queue per target; where it may not run, the per-group entries stay and one line
   says why. Never blocks the retire.
2. ``retire``: refused unless every name of what it ends is accepted by name (the form's field, checked here
   on resume, not only when asked); the switch; the proof: a query per group on the target (no gap beyond
   ``core.retire.allowed_gap_s`` across the restart), the source answering 422, its usage after.
3. ``unretire``: the server restored byte for byte (config bytes and command line), the target without a gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from promshift.core.events import EventKind
from promshift.core.horizon import waiting_list
from promshift.core.ports import AuditLog, SampleTimes, SourceModeSwitch, SourceObserver
from promshift.core.queues import MERGEABLE_STAGES
from promshift.core.redact import redact_text
from promshift.core.retire import (
    RetireEnds,
    allowed_gap_s,
    longest_gap,
    parse_acceptances,
    retire_decision,
    unowned_metrics,
)
from promshift.core.stages import Stage
from promshift.steps.queues import QueueCap

# A group is done with its source once baked (or decommissioned on top of that, or recommissioned after).
BAKED_STAGES = frozenset({Stage.BAKED, Stage.DECOMMISSIONED, Stage.RECOMMISSIONED})
ACTOR = "promshift"


class RetireRefused(RuntimeError):
    """Retiring may not go ahead (one line, recorded)."""


class RetireFailed(RuntimeError):
    """The switch or its proof failed (recorded; the switch put the server back when it could)."""


def source_group(conn_id: str) -> str:
    """The audit log's group for a source's own events."""
    return f"source:{conn_id}"


@dataclass(frozen=True)
class SourceQueues:
    """One target of the source, for the consolidation: its connection and what builds its queue swap (``build()``:
    the ``QueueCap`` of the path, None where the path adds no source queue, and the path's kind for the reason)."""

    target: str
    build: Callable[[], tuple[QueueCap | None, str]]


@dataclass
class RetireSource:
    """One source (its connection id) and the groups of the catalog that read from it."""

    conn_id: str
    groups: Sequence[Any]  # core.catalog.MetricGroup of this source
    audit: AuditLog
    switch: SourceModeSwitch
    source: SourceObserver
    target: SampleTimes | Mapping[str, SampleTimes]  # one target, or each group's (by group name)
    run_id: str
    scrape_interval_s: float
    clock: Callable[[], float] = field(default=time.time)
    sleep: Callable[[float], None] = field(default=time.sleep)
    queues: Sequence[SourceQueues] = ()  # each target's queue swap (the consolidation before the switch)

    @property
    def group(self) -> str:
        return source_group(self.conn_id)

    def record(self, kind: EventKind, at: datetime, evidence: Mapping[str, Any]) -> None:
        self.audit.append(group=self.group, run_id=self.run_id, kind=kind, actor=ACTOR, at=at,
                          evidence=dict(evidence), stage_from=None, stage_to=None)

    # ------------------------------------------------------------------ prepare

    def not_baked(self) -> list[str]:
        return [f"{g.name} ({self.audit.stage_of(g.name).value})" for g in self.groups
                if self.audit.stage_of(g.name) not in BAKED_STAGES]

    def last_baked_at(self) -> float | None:
        times = [e.at.timestamp() for g in self.groups for e in self.audit.events(group=g.name)
                 if e.kind == EventKind.BAKED]
        return max(times) if times else None

    def ends(self, now: datetime) -> tuple[RetireEnds, dict[str, Any]]:
        """What retiring ends, and how it was read (the reads' window and notes)."""
        since = self.last_baked_at() or now.timestamp()
        reads, notes = self.source.reads(since, now.timestamp())
        owned = list(self.groups)
        history = tuple(f"{g.name}/{w['kind']}:{w['name']}" for g in self.groups
                        for w in waiting_list(self.audit.events(group=g.name)))
        ends = RetireEnds(
            rules=tuple(sorted(self.source.rules())),
            reads=tuple(sorted(set(reads))),
            unowned_metrics=unowned_metrics(self.source.stored_metrics(),
                                            lambda name: any(g.claims(name) for g in owned)),
            history=history)
        return ends, {"reads_since": since, "reads_until": now.timestamp(), "notes": notes[:20]}

    def prepare(self, now: datetime) -> dict[str, Any]:
        if not self.groups:
            why = f"no group of the catalog reads from {self.conn_id}: nothing to retire it after"
            self.record(EventKind.SOURCE_RETIRE_REFUSED, now, {"reason": why})
            raise RetireRefused(why)
        mode = self.switch.mode()
        if mode == "agent":
            return {"source": self.conn_id, "mode": "agent", "already": True, "groups": [g.name for g in self.groups]}
        waiting = self.not_baked()
        if waiting:
            why = f"not every group of {self.conn_id} has baked: {', '.join(waiting)}"
            self.record(EventKind.SOURCE_RETIRE_REFUSED, now, {"reason": why, "not_baked": waiting})
            raise RetireRefused(why)
        ends, how = self.ends(now)
        prepared = {"source": self.conn_id, "mode": mode, "groups": [g.name for g in self.groups],
                    "ends": ends.as_dict(), "names": ends.names(), "read": how, "usage_before": self.source.usage()}
        self.record(EventKind.SOURCE_RETIRE_PREPARED, now, prepared)
        return prepared

    # ------------------------------------------------------------------ consolidate

    def consolidate(self, now: datetime) -> dict[str, Any]:
        """Per target, every mergeable group's own entry merged into one (``QueueCap.consolidate``); recorded as
        ``source_queues_consolidated`` with a line per target. Nothing here blocks the retire: a target whose swap
        cannot be built or may not run keeps its per-group entries, and its line says why."""
        if self.switch.mode() == "agent":  # a retry after the switch: the agent's entries stay as they are
            return {"already_agent": True, "targets": {}, "lines": []}
        targets: dict[str, dict[str, Any]] = {}
        for queues in self.queues:
            names = [g.name for g in self.groups
                     if g.target == queues.target and self.audit.stage_of(g.name) in MERGEABLE_STAGES]
            try:
                cap, path = queues.build()
            except Exception as exc:  # noqa: BLE001 - the swap cannot be built (a target unreachable): never blocks
                targets[queues.target] = {"state": "kept", "members": [], "entries_before": None,
                                          "entries_after": None, "reason": "the queue swap cannot be built: "
                                          + redact_text(first_line(exc))}
                continue
            if cap is None:
                targets[queues.target] = {"state": "kept", "members": [], "entries_before": 0, "entries_after": 0,
                                          "reason": f"the {path} path adds no source queue"}
                continue
            targets[queues.target] = cap.consolidate(groups=names, record=self.record, path=path)
        lines = [consolidation_line(t, r) for t, r in targets.items()]
        ended = datetime.fromtimestamp(self.clock(), tz=UTC)  # after every swap's removal was verified
        result = {"targets": targets, "lines": lines, "started_at": now.isoformat(), "ended_at": ended.isoformat()}
        self.record(EventKind.SOURCE_QUEUES_CONSOLIDATED, ended, result)
        return result

    # ------------------------------------------------------------------ retire

    def retire(self, now: datetime, *, accepted: Any, approval: Mapping[str, Any] | None = None,
               settle_s: float = 60.0) -> dict[str, Any]:
        if self.switch.mode() != "agent":  # on a retry after the switch: the checks were passed then
            waiting = self.not_baked()
            if waiting:
                raise self._refuse(now, f"not every group of {self.conn_id} has baked: {', '.join(waiting)}")
            ends, _how = self.ends(now)
            decision = retire_decision(ends, parse_acceptances(accepted))
            if not decision.ok:
                raise self._refuse(now, decision.line(), blocking=list(decision.blocking),
                                   unknown_acceptances=list(decision.unknown_acceptances))
            self.record(EventKind.SOURCE_RETIRE_APPROVED, now,
                        {"accepted": list(decision.accepted), "unknown_acceptances": list(decision.unknown_acceptances),
                         "approval": dict(approval or {})})
        before = self.source.usage()
        began = self.clock()
        try:
            change = self.switch.to_agent()
        except Exception as exc:
            self.record(EventKind.SOURCE_RETIRE_FAILED, now, {"step": "switch", "error": str(exc)[:500]})
            raise RetireFailed(f"the switch to agent mode failed: {str(exc).splitlines()[0][:300]}") from None
        proof = self.prove(began, settle_s=settle_s, expect_agent=True)
        proof.update({"change": change.as_dict(), "usage_before": before})
        ok = proof["target_receiving"] and not proof["source_storing"]
        self.record(EventKind.SOURCE_RETIRED if ok else EventKind.SOURCE_RETIRE_FAILED, now, proof)
        if not ok:
            raise RetireFailed(f"{self.conn_id} is an agent but the proof failed: {proof['lines']}")
        return proof

    def _target(self, group: str) -> SampleTimes:
        return self.target[group] if isinstance(self.target, Mapping) else self.target

    def _refuse(self, now: datetime, why: str, **evidence: Any) -> RetireRefused:
        self.record(EventKind.SOURCE_RETIRE_REFUSED, now, {"reason": why, **evidence})
        return RetireRefused(why)

    def prove(self, began: float, *, settle_s: float, expect_agent: bool) -> dict[str, Any]:
        """A query per group on the target from just before the switch until it has two scrapes after it (or
        ``settle_s``); the source's answer to a query; its usage now."""
        allowed = allowed_gap_s(self.scrape_interval_s)
        since = began - self.scrape_interval_s
        deadline = self.clock() + max(settle_s, 3 * self.scrape_interval_s)
        gaps: dict[str, float | None] = {}
        while True:
            now = self.clock()
            window = now - since + 1.0
            gaps = {g.name: longest_gap(self._target(g.name).sample_times(g.selector(), window),
                                        since=since, until=now)
                    for g in self.groups}
            fresh = all(v is not None and v <= allowed for v in gaps.values())
            if (fresh and now - began >= 2 * self.scrape_interval_s) or now > deadline:
                break
            self.sleep(min(2.0, self.scrape_interval_s / 2))
        status, text = self.source.query_answer()
        storing = status == 200
        receiving = all(v is not None and v <= allowed for v in gaps.values())
        lines = [f"{name}: longest gap {'no data' if v is None else f'{v:.1f}s'} (allowed {allowed:.0f}s)"
                 for name, v in gaps.items()]
        lines.append(f"source answers a query with {status}: {text[:80]}")
        return {"mode": self.switch.mode(), "target_receiving": receiving, "source_storing": storing,
                "gaps_s": gaps, "allowed_gap_s": allowed, "query_status": status, "query_answer": text[:200],
                "usage_after": self.source.usage(), "lines": lines, "expect_agent": expect_agent}

    # ------------------------------------------------------------------ unretire

    def unretire(self, now: datetime, *, reason: str, settle_s: float = 60.0) -> dict[str, Any]:
        began = self.clock()
        try:
            change = self.switch.restore()
        except Exception as exc:
            self.record(EventKind.SOURCE_UNRETIRE_FAILED, now, {"error": str(exc)[:500], "reason": reason})
            raise RetireFailed(f"the restore failed: {str(exc).splitlines()[0][:300]}") from None
        proof = self.prove(began, settle_s=settle_s, expect_agent=False)
        proof.update({"change": change.as_dict(), "reason": reason,
                      "byte_identical": bool(change.byte_identical) if change.changed else None})
        ok = proof["target_receiving"] and proof["source_storing"] and (not change.changed or change.byte_identical)
        self.record(EventKind.SOURCE_UNRETIRED if ok else EventKind.SOURCE_UNRETIRE_FAILED, now, proof)
        if not ok:
            raise RetireFailed(f"{self.conn_id} restored, but not cleanly: {proof['lines']}")
        return proof


def consolidation_line(target: str, result: Mapping[str, Any]) -> str:
    """One line of what the consolidation did on one target (the approval's evidence, the report)."""
    before, after = result.get("entries_before"), result.get("entries_after")
    if result.get("state") == "merged":
        members = result.get("members") or []
        return (f"{target}: {before} promshift queues -> {after}: {len(members)} groups in one entry "
                f"({', '.join(members[:10])}{' …' if len(members) > 10 else ''}), proven on the target")
    if result.get("state") == "already":
        return f"{target}: {result.get('reason')}"
    return f"{target}: {before} per-group entries kept: {result.get('reason')}"


def first_line(exc: BaseException) -> str:
    """An error's first line, bounded (a secret in it is redacted by the caller, on entry)."""
    text = str(exc).splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
