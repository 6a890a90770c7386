"""What moves with a group besides its samples: its rules and its dashboards' reads (issue 13's wiring).

Both are optional, driven by configuration (``orchestration.operators`` builds them from the
connections): a group without them behaves as before, and its report says ``not configured``.

- ``RulesStep`` (a ``RulesMove``): at the snapshot step both sides' rules are kept in the snapshot store
  (``rules_snapshot``, the plan checked by promtool there, before anything is deployed); after the warm-up
  the recording rules go to the target (``rules_records_added``); at cut-over the handoff
  (``rules_moved``, with counts).
- ``ReadPathStep`` (a ``ReadPathSwitch``): the dashboards kept at the snapshot step
  (``read_path_snapshot``), switched at cut-over (``read_path_switched``, with dashboards and panels).

Both restore from the group's latest snapshot, whichever run took it (the bake watch and the full
rollback run in other DAG runs): ``restore`` is a ``lifecycle`` read restorer ``(migration, *, reason,
now)``, idempotent (a snapshot already restored is not restored again), audited (``rules_restored``,
``read_path_restored``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from promshift.core.audit import AuditEvent
from promshift.core.deploy import snapshot_key
from promshift.core.events import MOVE_FAILED, EventKind
from promshift.core.horizon import Horizon, held_back, rule_reach
from promshift.core.ports import Blobs
from promshift.core.rules import RuleKind
from promshift.steps.migration import GroupMigration

NOT_CONFIGURED = "not configured"


def record_move_failure(migration: GroupMigration, what: str, step: str, exc: BaseException,
                        now: datetime) -> str:
    """Record ``<what>_move_failed`` / ``read_path_switch_failed`` for ``step``; returns the one-line reason."""
    from promshift.steps.migration import one_line

    reason = f"{what.replace('_', ' ')} {step} failed: {type(exc).__name__}: {one_line(exc)}"
    migration.record(MOVE_FAILED[what], now, {"step": step, "reason": reason,
                                              "evidence": getattr(exc, "evidence", None)})
    return reason


def move_failure_reason(migration: GroupMigration) -> str | None:
    """The reason of this run's last step when it is a failed move of rules or dashboards, else None."""
    from promshift.steps.migration import steps_of

    mine = steps_of(migration.audit.events(group=migration.group.name, run_id=migration.run_id))
    if mine and mine[-1].kind in MOVE_FAILED.values():
        return str(mine[-1].evidence_data.get("reason"))
    return None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _this_run(migration: GroupMigration, kind: EventKind) -> AuditEvent | None:
    found = [e for e in migration.audit.events(group=migration.group.name, run_id=migration.run_id)
             if e.kind == kind]
    return found[-1] if found else None


def _pending_snapshot(migration: GroupMigration, snapshot_kind: EventKind,
                      restored_kind: EventKind) -> AuditEvent | None:
    """The group's latest snapshot event, unless a restore of that run's snapshot was recorded after it."""
    events = migration.audit.events(group=migration.group.name)
    snaps = [i for i, e in enumerate(events) if e.kind == snapshot_kind]
    if not snaps:
        return None
    snap = events[snaps[-1]]
    if any(e.kind == restored_kind and e.evidence_data.get("snapshot_run_id") == snap.run_id
           for e in events[snaps[-1] + 1:]):
        return None
    return snap


class RulesStep:
    """One group's ``RulesMove`` through a run: snapshot, records, handoff; restore from any run."""

    def __init__(self, migration: GroupMigration, move: Any, blobs: Blobs) -> None:
        self.migration = migration
        self.move = move
        self.blobs = blobs

    def _selection_counts(self, plan: Any) -> dict[str, int]:
        sel = plan.selection
        return {"rules": len(sel.rules), "records": len(sel.only(RuleKind.RECORD).rules),
                "alerts": len(sel.only(RuleKind.ALERT).rules)}

    def snapshot(self, now: datetime) -> dict[str, Any]:
        """Both sides' rules in the snapshot store, and the plan (every promtool check) before any deploy.
        A retry keeps the first attempt's snapshot (taken before anything changed)."""
        done = _this_run(self.migration, EventKind.RULES_SNAPSHOT)
        if done is not None:
            return dict(done.evidence_data)
        snap = self.move.snapshot()
        plan = self.move.plan(snap)
        data = json.dumps(snap.to_dict(), sort_keys=True).encode()
        ref = self.blobs.put(snapshot_key(self.migration.group.name, self.migration.run_id, "rules.json"), data)
        evidence = {"ref": ref, "sha256": _sha256(data), **self._selection_counts(plan),
                    "files": list(plan.selection.files), "checks": dict(plan.checks),
                    "names": [getattr(r, "name", None) for r in plan.selection.rules]}
        self.migration.record(EventKind.RULES_SNAPSHOT, now, evidence)
        return evidence

    def _load(self, event: AuditEvent) -> Any:
        from promshift.steps.migration import SnapshotError

        data = self.blobs.get(str(event.evidence_data["ref"]))
        if _sha256(data) != event.evidence_data.get("sha256"):
            raise SnapshotError(f"rules snapshot {event.evidence_data['ref']} does not match its recorded sha256")
        return self.migration.probes.rules_snapshot(json.loads(data))

    def this_run(self) -> tuple[Any, Any]:
        """This run's rules snapshot (from the store, hash-checked) and its plan."""
        event = _this_run(self.migration, EventKind.RULES_SNAPSHOT)
        if event is None:
            raise RuntimeError("this run took no rules snapshot (the snapshot step records one)")
        snap = self._load(event)
        return snap, self.move.plan(snap)

    def add_records(self, now: datetime) -> dict[str, Any]:
        """The group's recording rules on the target (both sides record them until the handoff)."""
        snap, plan = self.this_run()
        result = self.move.add_records(plan, snap, now)
        evidence = {**self._selection_counts(plan), "result": result.to_dict() if result is not None else None}
        self.migration.record(EventKind.RULES_RECORDS_ADDED, now, evidence)
        return evidence

    def handoff(self, now: datetime, horizon: Horizon | None = None) -> dict[str, Any]:
        """The source drops the group's rules, the target loads them all (``RulesMove.handoff``); once per run.

        With ``horizon``, the rules move together only once the target holds every one's reach (its ranges and
        its ``for``): until then they all stay on the source, where the data is (a recording rule feeds alerts
        of the same group), and ``horizon_waiting`` names each with its ready time; the bake watch hands them
        off later (``handoff_when_ready``)."""
        done = _this_run(self.migration, EventKind.RULES_MOVED)
        if done is not None:
            return dict(done.evidence_data)
        snap, plan = self.this_run()
        return self._handoff(self.migration, snap, plan, now, horizon)

    def _handoff(self, migration: GroupMigration, snap: Any, plan: Any, now: datetime,
                 horizon: Horizon | None, *, record_wait: bool = True) -> dict[str, Any]:
        if horizon is not None and not plan.empty:
            split = horizon.split([rule_reach(r.expr, for_=r.body.get("for"), name=r.label, now=horizon.now)
                                   for r in plan.selection.rules])
            if split.waiting:
                evidence = {"what": "rules", "moved": False, "horizon": horizon.to_dict(),
                            "waiting": [w.to_dict() for w in split.waiting],
                            "ready": [r.to_dict() for r in split.ready],
                            "next_ready_at": None if split.next_ready() is None else split.next_ready().isoformat()}
                if record_wait:  # the bake watch's later looks change nothing: recorded once, at the cut-over
                    migration.record(EventKind.HORIZON_WAITING, now, evidence)
                return evidence
        out = self.move.handoff(plan, snap, now)
        evidence = {"moved": not plan.empty, **self._selection_counts(plan), "gap_s": out.get("gap_s"),
                    # what the bake watch looks for on the target (``lifecycle.moved_rules``)
                    "moved_rules": [{"kind": r.kind.value, "name": r.name, "group": r.group}
                                    for r in plan.selection.rules],
                    "source": out.get("source"), "target": out.get("target"),
                    "horizon": None if horizon is None else horizon.to_dict()}
        migration.record(EventKind.RULES_MOVED, now, evidence)
        return evidence

    def waiting(self, migration: GroupMigration | None = None) -> AuditEvent | None:
        """The group's rules still held back by the horizon: its latest ``horizon_waiting`` for rules, unless
        they moved or were restored since (then None)."""
        m = migration or self.migration
        return held_back(m.audit.events(group=m.group.name)).get("rules")

    def handoff_when_ready(self, migration: GroupMigration, horizon: Horizon, now: datetime) -> dict[str, Any] | None:
        """The bake watch's turn: hand off rules the horizon held back, once the target holds their reach."""
        held = self.waiting(migration)
        if held is None:
            return None
        event = _pending_snapshot(migration, EventKind.RULES_SNAPSHOT, EventKind.RULES_RESTORED)
        if event is None:
            return None
        snap = self._load(event)
        out = self._handoff(migration, snap, self.move.plan(snap), now, horizon, record_wait=False)
        if out.get("moved"):
            migration.record(EventKind.HORIZON_SWITCHED, now, {"what": "rules", "moved": out.get("moved_rules"),
                                                               "horizon": horizon.to_dict()})
        return out

    def restore(self, migration: GroupMigration | None = None, *, reason: str, now: datetime) -> dict[str, Any]:
        """Both sides back to the group's latest rules snapshot (target first); a no-op when already restored."""
        m = migration or self.migration
        event = _pending_snapshot(m, EventKind.RULES_SNAPSHOT, EventKind.RULES_RESTORED)
        if event is None:
            return {"changed": False, "detail": "no rules snapshot left to restore"}
        out = self.move.rollback(self._load(event), now)
        evidence = {"changed": True, "reason": reason, "snapshot_run_id": event.run_id,
                    "restored_identical": out["restored_identical"], "source": out["source"], "target": out["target"]}
        m.record(EventKind.RULES_RESTORED, now, evidence)
        return evidence


class ReadPathStep:
    """One group's ``ReadPathSwitch`` through a run: snapshot, switch at cut-over; restore from any run."""

    def __init__(self, migration: GroupMigration, switch: Any) -> None:
        self.migration = migration
        self.switch_ = switch

    def snapshot(self, now: datetime) -> dict[str, Any]:
        done = _this_run(self.migration, EventKind.READ_PATH_SNAPSHOT)
        if done is not None:
            return dict(done.evidence_data)
        snap = self.switch_.snapshot(self.migration.run_id)
        evidence = {"kind": self.switch_.kind, "snapshot": snap}
        self.migration.record(EventKind.READ_PATH_SNAPSHOT, now, evidence)
        return evidence

    def switch(self, now: datetime, horizon: Horizon | None = None) -> dict[str, Any]:
        """The snapshotted dashboards' group panels to the target datasource; once per run.

        With ``horizon``, panels reading further back than the target holds wait (``horizon_waiting`` names
        each with its ready time); the bake watch switches them later (``switch_when_ready``)."""
        done = _this_run(self.migration, EventKind.READ_PATH_SWITCHED)
        if done is not None:
            return dict(done.evidence_data)
        event = _this_run(self.migration, EventKind.READ_PATH_SNAPSHOT)
        if event is None:
            raise RuntimeError("this run took no dashboard snapshot (the snapshot step records one)")
        out = self._switch(event, horizon)
        boards = _boards(out)
        evidence = {"switched": True, "kind": self.switch_.kind, "dashboards": len(boards),
                    "panels": sum(len(b.get("panels") or []) for b in boards), "result": out}
        self.migration.record(EventKind.READ_PATH_SWITCHED, now, evidence)
        self._record_waiting(self.migration, out, horizon, now)
        return evidence

    def _switch(self, event: AuditEvent, horizon: Horizon | None) -> dict[str, Any]:
        snapshot = event.evidence_data["snapshot"]
        return self.switch_.switch(snapshot, horizon) if horizon is not None else self.switch_.switch(snapshot)

    @staticmethod
    def _record_waiting(migration: GroupMigration, out: Mapping[str, Any], horizon: Horizon | None,
                        now: datetime) -> list[dict[str, Any]]:
        waiting = [w for b in _boards(out) for w in b.get("waiting") or ()]
        if waiting and horizon is not None:
            times = [w["horizon"]["ready_at"] for w in waiting if (w.get("horizon") or {}).get("ready_at")]
            migration.record(EventKind.HORIZON_WAITING, now, {
                "what": "read_path", "horizon": horizon.to_dict(), "waiting": waiting,
                "next_ready_at": min(times) if times else None})
        return waiting

    def waiting(self, migration: GroupMigration | None = None) -> AuditEvent | None:
        """The group's panels still held back by the horizon (its latest ``horizon_waiting`` for dashboards),
        unless a switch since left none waiting or the dashboards were restored."""
        m = migration or self.migration
        return held_back(m.audit.events(group=m.group.name)).get("read_path")

    def switch_when_ready(self, migration: GroupMigration, horizon: Horizon, now: datetime) -> dict[str, Any] | None:
        """The bake watch's turn: switch the panels the horizon held back whose ready time has passed."""
        if self.waiting(migration) is None:
            return None
        event = _pending_snapshot(migration, EventKind.READ_PATH_SNAPSHOT, EventKind.READ_PATH_RESTORED)
        if event is None:
            return None
        out = self._switch(event, horizon)
        still = [w for b in _boards(out) for w in b.get("waiting") or ()]
        before = {(w["path"], w["title"]) for w in self.waiting(migration).evidence_data.get("waiting") or ()}
        switched = sorted(before - {(w["path"], w["title"]) for w in still})
        evidence = {"what": "read_path", "switched": [{"path": p, "title": t} for p, t in switched],
                    "horizon": horizon.to_dict(), "result": out}
        if switched:
            migration.record(EventKind.HORIZON_SWITCHED, now, evidence)
        if still and switched:
            self._record_waiting(migration, out, horizon, now)
        return {**evidence, "waiting": still}

    def restore(self, migration: GroupMigration | None = None, *, reason: str, now: datetime) -> dict[str, Any]:
        m = migration or self.migration
        event = _pending_snapshot(m, EventKind.READ_PATH_SNAPSHOT, EventKind.READ_PATH_RESTORED)
        if event is None:
            return {"changed": False, "detail": "no dashboard snapshot left to restore"}
        out = self.switch_.restore(event.evidence_data["snapshot"])
        evidence = {"changed": True, "reason": reason, "snapshot_run_id": event.run_id, "result": out}
        m.record(EventKind.READ_PATH_RESTORED, now, evidence)
        return evidence


def _boards(out: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(out.get("files") if "files" in out else out.get("dashboards") or [])


def read_restorers(rules: RulesStep | None, read_path: ReadPathStep | None
                   ) -> list[tuple[str, Callable[..., Mapping[str, Any]]]]:
    """The restorers these steps add to ``lifecycle.DEFAULT_READ_RESTORERS`` (dashboards first, then rules)."""
    out: list[tuple[str, Callable[..., Mapping[str, Any]]]] = []
    if read_path is not None:
        out.append(("read_path", read_path.restore))
    if rules is not None:
        out.append(("rules", rules.restore))
    return out
