"""What a migration run's steps do to the world, chosen once per task by the wiring (``orchestration.wiring``).

A real run's effects (``LiveEffects``) take the snapshot, deploy, wait for the warm-up, keep the rules' snapshot,
record the gate by moving the stage, cut over and restore. A dry run's (``DryRunEffects``) read what they need and
record what they would have done (``dry_run_step``; the gate's verdict as ``dry_run_gate``, the stage never moves):
nothing is deployed, kept, routed, notified or restored. The operators run the same code over either; only the
wiring reads ``dry_run`` to choose (with validate's claim and the approval's skip, the only places that do).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from promshift.core.events import EventKind
from promshift.core.gate import GateVerdict
from promshift.core.latency import LatencyResult
from promshift.core.parity import ParityResult
from promshift.core.render import remote_write_name


class LiveEffects:
    """A real run: every step changes what it is for, audited by the step itself."""

    # Said before a message about something a real run does (nothing: it does it).
    label = ""
    # Said before the gate's refusal: a real run's refusal rolls back.
    refusal_label = ""

    def __init__(self, migration: Any, deploy_kind: str) -> None:
        self.migration = migration
        self.deploy_kind = deploy_kind

    def snapshot(self, now: datetime, *, keep_moves: Callable[[], None]) -> dict[str, Any]:
        """Keep the deploy's snapshot, then what moves with the group (``keep_moves``: rules, dashboards)."""
        out: dict[str, Any] = self.migration.snapshot(now)
        keep_moves()
        return out

    def deploy(self, snapshot_info: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """The group's dual-write (``GroupMigration.deploy_dual_write``): ``{"waiting": ...}`` when it must be
        followed."""
        return self.migration.deploy_dual_write(snapshot_info, now)  # type: ignore[no-any-return]

    def start_warmup(self, now: datetime, *, duration_s: float, timeout_s: float,
                     deployed: Mapping[str, Any] | None) -> bool:
        """Start the warm-up (``warmup_started``); True: the caller follows it until the target caught up."""
        self.migration.start_warmup(now)
        return True

    def rules_plan(self, step: Any) -> Any:
        """The rules this run moves: the plan of its own stored snapshot."""
        return step.this_run()[1]

    def gate(self, parity: ParityResult | Mapping[str, Any], latency: LatencyResult | Mapping[str, Any],
             now: datetime) -> GateVerdict:
        """Decide and record the gate, moving the stage when it passes (``GroupMigration.gate``)."""
        return self.migration.gate(parity, latency, now)  # type: ignore[no-any-return]

    def skipped(self, step: str) -> str | None:
        """Why ``step`` does nothing in this run (None: it runs)."""
        return None

    def rollback_recorded(self, reason: str, now: datetime) -> dict[str, Any] | None:
        """None: a real run rolls back (the snapshot, what moved with the group, the routing)."""
        return None


class DryRunEffects(LiveEffects):
    """A dry run: read only. Each step records what it would have done; nothing is written anywhere else."""

    label = "dry run: "
    refusal_label = "dry run (nothing to roll back): "

    def snapshot(self, now: datetime, *, keep_moves: Callable[[], None]) -> dict[str, Any]:
        return self.migration.record_dry_run(  # type: ignore[no-any-return]
            "snapshot", now, would=f"keep the group's {self.deploy_kind} config for rollback")

    def deploy(self, snapshot_info: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """Deploy nothing; hand parity and latency the live dual-write's start, if the group has one."""
        since = self.migration.existing_dual_write_since()
        evidence = self.migration.record_dry_run(
            "deploy_dual_write", now, would=f"deploy the group's dual-write ({self.deploy_kind}, "
            f"remote_write {remote_write_name(self.migration.group.name)})", stage=self.migration.stage().value,
            existing_dual_write_since=since)
        return {**evidence, "dual_write_since": since}

    def start_warmup(self, now: datetime, *, duration_s: float, timeout_s: float,
                     deployed: Mapping[str, Any] | None) -> bool:
        self.migration.record_dry_run(
            "warm_up", now, would=f"dual-write {duration_s:g}s and wait (at most {timeout_s:g}s) for the target "
            "to catch up", existing_dual_write_since=(deployed or {}).get("dual_write_since"))
        return False

    def rules_plan(self, step: Any) -> Any:
        """What the move would take now, read from the source and kept nowhere."""
        return step.move.plan(step.move.snapshot())

    def gate(self, parity: ParityResult | Mapping[str, Any], latency: LatencyResult | Mapping[str, Any],
             now: datetime) -> GateVerdict:
        """The verdict, recorded (``dry_run_gate``); the stage never moves in a dry run."""
        decided = self.migration.decide_gate(parity, latency)
        self.migration.record(EventKind.DRY_RUN_GATE, now, {**decided.to_dict(), "dry_run": True})
        return decided.gate  # type: ignore[no-any-return]

    def skipped(self, step: str) -> str | None:
        return f"dry run: no {step}"

    def rollback_recorded(self, reason: str, now: datetime) -> dict[str, Any] | None:
        """Nothing was deployed: restore nothing, route nothing, tell nobody; say what a rollback would do."""
        return self.migration.record_dry_run(  # type: ignore[no-any-return]
            "rollback", now, would="restore the snapshot and route reads to the source", reason=reason,
            performed=False)
