"""The operators of the lifecycle after cut-over: the bake watch, the waves, and the by-hand DAGs (decommission
with its second approval in ``approval_operators``, recommission, full rollback)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from promshift.orchestration.operators import (
    GroupStepOperator,
    Output,
    _EveryGroupTask,
    _now,
    emit_group_asset,
    given,
    run_rollback,
)
from promshift.orchestration.wiring import GROUP_PARAM, lab_bake_watch_clock_ahead_s

# --------------------------------------------------------------------------- after cut-over: the bake watch


class BakeCheckOperator(GroupStepOperator):
    """One bake check of a cut-over group (``lifecycle.GroupLifecycle``); skips a group not cut over or baking.

    A failed check has already returned the group's reads to the source (``rolled_back_reads``) when this
    task fails; the owners are told (``bake_failed``).
    """

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.core.stages import BAKE_WATCHED
        from promshift.steps.lifecycle import GroupLifecycle, RestoreReadsFailed

        migration = self.migration(context)
        stage = migration.stage()
        if stage not in BAKE_WATCHED:
            raise AirflowSkipException(f"group {self.group_name!r} is {stage.value}: the bake watch checks only "
                                       f"{', '.join(sorted(s.value for s in BAKE_WATCHED))}")
        from promshift.steps.lifecycle import DEFAULT_READ_RESTORERS

        lifecycle = GroupLifecycle(migration, deploy=self.deploy,
                                   read_restorers=[*DEFAULT_READ_RESTORERS, *self.moved_restorers(migration)],
                                   horizon_moves=self.horizon_moves(),
                                   horizon_clock_ahead_s=lab_bake_watch_clock_ahead_s())
        try:
            out = lifecycle.bake_check(_now())
        except RestoreReadsFailed as exc:
            self.tell_owners(context, "bake_failed", check="restore_reads", reason=str(exc))
            raise AirflowFailException(str(exc)) from None
        self.log.info("bake check of %s: %s (%s)", self.group_name, out["outcome"],
                      (out.get("check") or {}).get("reason"))
        if out["outcome"] == "rolled_back_reads":
            check = out.get("check") or {}
            failed = [m["name"] for m in check.get("measurements", []) if m["verdict"] in ("FAILED", "ERROR")]
            self.tell_owners(context, "bake_failed", check=", ".join(failed) or "bake", reason=out["reason"])
            raise AirflowFailException(f"{out['reason']}; reads returned to the source, dual-write stays on")
        if out["outcome"] == "baked":
            from promshift.orchestration.assets import baked_asset

            emit_group_asset(self, context, baked_asset(self.group_name), {"group": self.group_name,
                                                                            "clean_since": out.get("clean_since")})
        return out


class BakeWatchListOperator(_EveryGroupTask):
    """The groups the bake watch checks now (cut over or baking), each with its connections: the mapped
    ``bake_check``'s arguments. A group no longer in the catalog is left out (its DAG-file list is the
    catalog's)."""

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from promshift.core.stages import BAKE_WATCHED, stage_from_moves

        catalog, moves = self.catalog_and_moves()
        watched = []
        for group in catalog.groups:
            history = moves.get(group.name)  # none: planned, never watched
            if history and stage_from_moves(history) in BAKE_WATCHED:
                watched.append({"group_name": group.name, "source_conn_id": group.source,
                                "target_conn_id": group.target})
        self.log.info("bake watch: %s group(s) cut over or baking: %s", len(watched),
                      ", ".join(w["group_name"] for w in watched[:20]) or "none")
        return watched


class WavesReadyOperator(_EveryGroupTask):
    """The dependent groups to start now (``core.waves.ready_to_start``), as the mapped start's arguments: each
    group's target migration DAG, the run id every worker names for the same cut-overs, and its form."""

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from promshift.core.waves import ready_to_start

        catalog, moves = self.catalog_and_moves()
        groups = {g.name: g for g in catalog.groups}
        starts = ready_to_start(catalog.groups, moves)
        for start in starts:
            self.log.info("starting %s (%s cut over) as run %s", start.group, ", ".join(start.after), start.run_id)
        return [{"trigger_dag_id": groups[s.group].dag_id, "trigger_run_id": s.run_id,
                 "conf": {GROUP_PARAM: s.group, "reason": f"wave: {', '.join(s.after)} cut over"}}
                for s in starts]


# --------------------------------------------------------------------------- decommission (second approval)


def _decommission(step: GroupStepOperator, context: Any, *, accept_history_loss: bool = False) -> Any:
    from promshift.steps.lifecycle import Decommission

    return Decommission(step.migration(context), deploy=step.deploy, accept_history_loss=accept_history_loss)


class DecommissionPrepareOperator(GroupStepOperator):
    """Refuse what may not be decommissioned (recorded); else measure what the drop frees and gather the bake
    evidence the second approver is shown, with the history the drop would lose (panels and rules still reading
    further back than the target holds): the approver accepts that in the form (``accept_history_loss``) or the
    decommission is refused."""

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.core.events import EventKind

        self.choose_group(context)
        d = _decommission(self, context)
        m = d.migration
        why = d.refusal(history=False)
        if why is not None:
            m.record(EventKind.DECOMMISSION_REFUSED, _now(), {"reason": why, "stage": m.stage().value})
            raise AirflowFailException(why)
        baked = [e for e in m.audit.events(group=self.group_name) if e.kind == EventKind.BAKED]
        bake = baked[-1].evidence_data if baked else {}
        summary = {"at": baked[-1].at.isoformat() if baked else None, "checks": bake.get("checks"),
                   "clean_since": bake.get("clean_since"), "period_s": bake.get("period_s"),
                   "last_check": (bake.get("last_check") or {}).get("reason")}
        now = _now()
        return {"freed": d.measure(now), "bake": summary, "history_loss": d.history_loss(now)}

class DecommissionOperator(GroupStepOperator):
    """Drop the group at scrape on the source, verified live; undone by itself if the target would not survive.

    ``approval``: the second approval's output (its decision, by whom, the comment).
    """

    template_fields: Sequence[str] = ("group_name", "approval")

    def __init__(self, *, approval: Output = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.approval = approval

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.lifecycle import DecommissionFailed, DecommissionRefused

        self.choose_group(context)
        approval = given(self, "approval") or {}
        # The approver's own acceptance, from the form (a boolean; anything else is no acceptance); the step checks
        # the history loss again now, so a panel that started waiting after the answer still refuses.
        accepted = approval.get("accept_history_loss") is True
        try:
            return _decommission(self, context, accept_history_loss=accepted).decommission(_now(), approval=approval)
        except (DecommissionRefused, DecommissionFailed) as exc:
            raise AirflowFailException(str(exc)) from None


class RecommissionOperator(GroupStepOperator):
    """Undo a decommission: remove the drop; reads stay on the target; the source's history gap is recorded."""

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.lifecycle import DecommissionRefused

        self.choose_group(context)
        reason = str((context.get("params") or {}).get("reason") or "manual recommission")
        try:
            return _decommission(self, context).recommission(_now(), reason=reason)
        except DecommissionRefused as exc:
            raise AirflowFailException(str(exc)) from None


class FullRollbackOperator(GroupStepOperator):
    """By hand, from a cut-over group (e.g. after ``rolled_back_reads``): reads back to the source and the group's
    own dual-write undone through the deploy driver, for every deploy kind (``lifecycle.full_rollback``); a
    restore that must be followed (an object, a commit, a scraper) defers; the owners are told."""

    ui_color = "#fde8e8"
    needs_target = False

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.lifecycle import DEFAULT_READ_RESTORERS, full_rollback

        self.choose_group(context)
        reason = self._reason(context)
        migration = self.migration(context)
        result = self._rolled_back(context, reason, lambda: full_rollback(
            migration, _now(), reason=reason,
            read_restorers=[*DEFAULT_READ_RESTORERS, *self.moved_restorers(migration)]))
        if "waiting" in result:
            self.defer(trigger=self.deploy_trigger(result["waiting"]), method_name="execute_complete",
                       kwargs={"snapshot": result["snapshot"], "extra": result["extra"]},
                       timeout=timedelta(seconds=float(result["waiting"]["details"].get("timeout_s") or 900) + 300))
        return self._told(context, reason, result)

    def execute_complete(self, context: Any, event: dict[str, Any], snapshot: dict[str, Any] | None = None,
                         extra: dict[str, Any] | None = None) -> dict[str, Any]:
        from promshift.steps.lifecycle import finish_full_rollback

        self.choose_group(context)
        reason = self._reason(context)
        migration = self.migration(context)
        result = self._rolled_back(context, reason, lambda: finish_full_rollback(
            migration, event, snapshot, reason=reason, now=_now(), extra=extra or {}))
        return self._told(context, reason, result)

    def deploying_run_id(self, context: Any) -> str:
        """The run that deployed the group's dual-write: its change is what this rollback undoes (the git deploy
        reverts that run's own commit, byte for byte, rather than removing the entry by name)."""
        from promshift.steps.lifecycle import deploying_run

        return deploying_run(self.migration(context)) or str(context["run_id"])

    @staticmethod
    def _reason(context: Any) -> str:
        return str((context.get("params") or {}).get("reason") or "") or "full rollback by hand"

    def _rolled_back(self, context: Any, reason: str, rollback: Any) -> dict[str, Any]:
        from promshift.steps.lifecycle import DecommissionRefused

        return run_rollback(self, context, reason, rollback, refusals=(DecommissionRefused,))

    def _told(self, context: Any, reason: str, result: dict[str, Any]) -> dict[str, Any]:
        self.tell_owners(context, "rolled_back", reason=reason, result=result)
        return result
