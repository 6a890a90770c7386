"""The operators of a group's migration DAG: validate -> snapshot -> deploy -> warm-up -> parity, latency ->
gate -> (approval, in ``approval_operators``) -> cut-over -> complete, and the rollback; each a few lines over
the run ``orchestration.wiring`` builds."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from promshift.orchestration.links import MigrationReportLink
from promshift.orchestration.operators import (
    RUN_PARAMS,
    GroupStepOperator,
    Output,
    _now,
    emit_group_asset,
    given,
    publish_report,
    run_rollback,
)
from promshift.orchestration.wiring import audit_store, require_production_settings


class ValidateGroupOperator(GroupStepOperator):
    """Check the catalog entry, the group's stage and both backends; change nothing.

    Every failure is recorded as a ``validation_failed`` audit event with its one-line reason
    (the rollback then names it), including backends that cannot even be built: an AMP
    workspace that is not ACTIVE, credentials the control plane refuses, an unknown workspace.
    """

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.core.run_params import RunParamsError
        from promshift.steps.migration import GroupNotStartable

        require_production_settings(f"validate {self.task_id}")  # before the audit store is even opened
        try:
            self.run_params(context, strict=True)
            self.check_pair()
            self.check_promtool()
        except (RunParamsError, ValueError) as exc:
            self._record_failure(context, exc)
            raise AirflowFailException(str(exc)) from None
        try:
            migration = self.migration(context)
        except Exception as exc:
            self._record_failure(context, exc)
            raise
        try:
            return migration.validate(_now())  # records its own validation_failed or start_refused
        except GroupNotStartable as exc:
            raise AirflowSkipException(str(exc)) from exc

    def check_promtool(self) -> None:
        """When this source's config or rules are checked with promtool (a config file, or ``extra.rules``): refuse
        (ValueError, one line) a promtool older than the source Prometheus (``core.promtool``). A source that does
        not answer is left to ``validate``'s own readiness check."""
        from promshift.adapters.deploy import promtool_version
        from promshift.adapters.prometheus import PrometheusError
        from promshift.core.deploy import DeployError
        from promshift.core.promtool import promtool_problem
        from promshift.orchestration.hooks import PrometheusHook

        source = self.source_hook
        if not isinstance(source, PrometheusHook) or not (source.extra.get("config_path") or source.extra.get("rules")):
            return
        promtool = str(source.extra.get("promtool", "promtool"))
        try:
            version = str(source.prometheus_client().build_info()["version"])
        except PrometheusError as exc:
            self.log.warning("source version unknown (%s); promtool's version not compared", exc)
            return
        try:
            problem = promtool_problem(version, promtool_version(promtool), promtool=promtool)
        except DeployError as exc:
            raise ValueError(str(exc)) from None
        if problem:
            raise ValueError(problem)

    def _record_failure(self, context: Any, exc: Exception) -> None:
        from promshift.orchestration.hooks import PrometheusHook
        from promshift.steps.migration import record_validation_failed

        try:
            source = self.source_hook
            config_path = source.extra.get("config_path") if isinstance(source, PrometheusHook) else None
        except Exception:  # the source connection itself may be what failed
            config_path = None
        audit = audit_store(on_head=lambda head: self._publish_audit_head(context, head))
        reason = record_validation_failed(audit, group_name=self.group.name, run_id=context["run_id"], exc=exc,
                                          now=_now(), source_config_path=config_path,
                                          run_params={k: (context.get("params") or {}).get(k) for k in RUN_PARAMS})
        self.log.error("validation failed: %s", reason)


class SnapshotConfigOperator(GroupStepOperator):
    """Keep the source config's exact bytes for rollback."""

    def execute(self, context: Any) -> dict[str, Any]:
        return self.effects(context).snapshot(_now(), keep_moves=lambda: self._snapshot_moved(context))

    def _snapshot_moved(self, context: Any) -> None:
        """The group's rules (and their plan, promtool-checked) and dashboards, when configured, kept for rollback."""
        from promshift.steps.moves import record_move_failure

        migration = self.migration(context)
        for name, step in (("rules", self.rules_step(migration)), ("read_path", self.read_path_step(migration))):
            if step is None:
                self.log.info("%s: not configured", name)
                continue
            try:
                evidence = step.snapshot(_now())
            except Exception as exc:
                raise AirflowFailException(record_move_failure(migration, name, "snapshot", exc, _now())) from None
            self.log.info("%s snapshot kept: %s", name, evidence.get("ref") or (evidence.get("snapshot") or {}).get(
                "ref"))


class DeployDualWriteOperator(GroupStepOperator):
    """Add the group's remote_write entry (keep-filter), promtool-check, reload, verify.

    ``snapshot``: the snapshot task's output (what the deploy restores from if it fails).
    """

    template_fields: Sequence[str] = ("group_name", "snapshot")

    snapshot: Output

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.deploy import DeployStepFailed

        snap = given(self, "snapshot")
        try:
            out = self.effects(context).deploy(snap, _now())
        except DeployStepFailed as exc:
            raise AirflowFailException(str(exc)) from None
        if "waiting" not in out:
            return self._deployed(out)
        # Not live yet (a scraper, an object, a commit): defer until it is live (or failed).
        self.defer(trigger=self.deploy_trigger(out["waiting"]), method_name="execute_complete",
                   kwargs={"quota": out["quota"]},
                   timeout=timedelta(seconds=float(out["waiting"]["details"].get("timeout_s") or 900) + 300))

    def execute_complete(self, context: Any, event: dict[str, Any], quota: dict[str, Any] | None = None
                         ) -> dict[str, Any]:
        from promshift.steps.deploy import DeployStepFailed

        try:
            out = self.migration(context).finish_deploy(event, quota, _now(), snapshot_info=given(self, "snapshot"))
        except DeployStepFailed as exc:
            raise AirflowFailException(str(exc)) from None
        return self._deployed(out)

    def _deployed(self, out: dict[str, Any]) -> dict[str, Any]:
        self.log.info("%s live (%s); status history %s", self.deploy_kind, out.get("scraper_id") or
                      out.get("remote_write") or "-",
                      [c["status"] for c in (out.get("deploy") or {}).get("status_history") or ()])
        return out


class WarmupOperator(GroupStepOperator):
    """Defer to WarmupTrigger until the target has caught up; fail on timeout or error.

    ``deployed``: the deploy task's output (when the dual-write started).
    """

    template_fields: Sequence[str] = ("group_name", "deployed")

    deployed: Output

    def execute(self, context: Any) -> None:
        from promshift.orchestration.triggers import WarmupTrigger

        deployed = given(self, "deployed")
        params = self.run_params(context)
        policy = self.group.warmup
        duration_s, timeout_s = params.warmup(policy.duration_s, policy.timeout_s)
        if not self.effects(context).start_warmup(_now(), duration_s=duration_s, timeout_s=timeout_s,
                                                  deployed=deployed):
            return  # nothing to wait for (a dry run)
        self.defer(
            trigger=WarmupTrigger(
                group_name=self.group.name,
                selector=self.group.selector(),
                source_conn_id=self.source_conn_id,
                target_conn_id=self.target_conn_id,
                started_at=float(deployed["dual_write_since"]),
                min_duration_s=duration_s,
                timeout_s=timeout_s,
                max_lag_s=policy.max_lag_s if self.deploy.source_queue else None,
                poll_interval_s=policy.poll_interval_s,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=timeout_s + 300),
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        migration = self.migration(context)
        migration.finish_warmup(event, _now())
        if event.get("status") != "ready":
            raise AirflowFailException(f"warm-up {event.get('status')}: {event.get('reason')}")
        self.log.info("warm-up done: %s", event.get("reason"))
        from promshift.steps.moves import record_move_failure

        rules = self.rules_step(migration)
        if rules is not None:  # the recording rules on the target now: its alerts will find them at the handoff
            try:
                added = rules.add_records(_now())
            except Exception as exc:
                raise AirflowFailException(record_move_failure(migration, "rules", "add_records", exc,
                                                               _now())) from None
            self.log.info("recording rules on the target: %s", added["records"])
        return event


class _ParityStep(GroupStepOperator):
    """A step of the DAG's parity chain, over the check ``parity_check`` builds (``orchestration.wiring``): against
    the group's source, or the replica the target kept when the source runs as replicas (``adapters.parity_ha``)."""


class ParityPlanOperator(_ParityStep):
    """Coverage and label layers, and the host shards the mapped sample tasks will compare; for a source declared
    as replicas, the replica the target kept and why (the plan's ``replicas``: its shards compare with it).

    ``deployed``: the deploy task's output (the parity window starts at the dual-write's start).
    """

    template_fields: Sequence[str] = ("group_name", "deployed")

    deployed: Output

    def execute(self, context: Any) -> list[dict[str, Any]]:
        deployed = given(self, "deployed")
        if deployed.get("dual_write_since") is None:  # a dry run of a group that is not dual-writing
            from promshift.core.parity import Measurement, ParityPlan
            from promshift.core.verdicts import Verdict

            # A check without data never passes: nothing of the group is on the target to compare.
            why = (f"{self.effects(context).label}the group is not dual-writing "
                   f"({self.migration(context).stage().value}), so the target holds nothing of it to compare")
            self.log.info("parity window: INCONCLUSIVE %s", why)
            context["ti"].xcom_push(key="plan", value=ParityPlan(None, (Measurement("window", Verdict.INCONCLUSIVE,
                                                                                      why),)).to_dict())
            return []
        plan = self.parity_check(context).plan(dual_write_since=float(deployed["dual_write_since"]),
                                        now=_now().timestamp())
        for m in plan.measurements:
            self.log.info("parity %s: %s %s", m.name, m.verdict.value, m.reason)
        if plan.replicas:
            self.log.info("parity replicas: %s", plan.replicas["reason"])
        self.log.info("%s shard(s) of %s hosts for the samples layer", len(plan.shards), plan.hosts_total)
        context["ti"].xcom_push(key="plan", value=plan.to_dict())
        return [dict(shard) for shard in plan.shards]


class ParitySamplesOperator(_ParityStep):
    """One shard of the samples layer (a mapped task): compare its hosts' raw samples."""

    template_fields: Sequence[str] = ("group_name", "shard")

    def __init__(self, *, shard: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard = shard

    def execute(self, context: Any) -> dict[str, Any]:
        if not self.shard:
            raise AirflowFailException("no shard given; this task is meant to be mapped over parity_plan")
        result = self.parity_check(context).compare_shard(self.shard)
        self.log.info("hosts %s: %s series, %s points, %s mismatches, %s missing series%s", self.shard["hosts"],
                      result.get("series_compared"), result.get("points_compared"), result.get("mismatches"),
                      result.get("missing_series"), f"; {result['budget_spent']}" if result.get("budget_spent") else "")
        return result


class ParityOperator(_ParityStep):
    """Reduce: merge the plan's layers and every shard into one parity verdict.

    ``plan``: the parity plan task's XCom ``plan``; ``shards``: the mapped samples tasks' outputs (Airflow
    resolves a mapped task's output to a sequence of every shard's value: empty when there were no shards).
    """

    template_fields: Sequence[str] = ("group_name", "plan", "shards")

    plan: Output
    shards: Output

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.core.report import parity_log_table

        plan = given(self, "plan")
        shards = [s for s in given(self, "shards") or [] if s]
        check = self.parity_check()
        result = check.reduce(plan, shards, extra=self._rules_layer(context, plan, check))
        self.log.info("parity %s\n%s", result.verdict.value, parity_log_table(result))
        return result.to_dict()


    def _rules_layer(self, context: Any, plan: dict[str, Any] | None, check: Any) -> list[Any]:
        """The rules layer when the group's rules move with it: each moved rule's expression on both sides over
        the parity window (``rules_parity``), the source being the one the plan compared with (``parity_source``);
        no window (a dry run without dual-write): none, as for samples."""
        from promshift.adapters.rules_deploy import rules_parity
        from promshift.core.deploy_kinds import group_for_deploy
        from promshift.core.parity import noise_allowance
        from promshift.core.verdicts import Measurement, Verdict
        from promshift.steps.migration import one_line

        window = (plan or {}).get("window")
        migration = self.migration(context)
        step = self.rules_step(migration)
        if step is None or not window:
            return []
        try:
            rules_plan = self.effects(context).rules_plan(step)  # a dry run's: read now, kept nowhere
            # The samples layer's policy and noise allowance: the deploy path's mode (independent on the scraper).
            policy = group_for_deploy(self.group, self.deploy).parity
            return rules_parity(self.parity_source(check, plan), self.target_hook.prometheus_client(),
                                rules_plan.selection, start=float(window["start"]), end=float(window["end"]),
                                step=float(window["step"]), abs_tol=policy.abs_tolerance,
                                rel_tol=policy.rel_tolerance, ignore_labels=policy.ignore_labels,
                                rename_labels=policy.rename_labels, noise_k=noise_allowance(policy.mode),
                                aggregates=self.group.aggregations, recording_step=self.group.scrape_interval_s)
        except Exception as exc:  # noqa: BLE001 - a layer that could not be measured is ERROR, never a pass
            return [Measurement("rules", Verdict.ERROR, f"rules not compared: {type(exc).__name__}: {one_line(exc)}")]


class LatencyOperator(GroupStepOperator):
    """Time each window's golden queries on both backends.

    ``deployed``: the deploy task's output (the latency window starts at the dual-write's start).
    """

    template_fields: Sequence[str] = ("group_name", "deployed")

    deployed: Output

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.core.report import cost_table, latency_table

        deployed = given(self, "deployed") or {}
        migration = self.migration(context)
        self.gated(migration.backends.target, context)  # the workspace's query budget, for the probe's queries
        result = migration.latency(_now(), dual_write_since=deployed.get("dual_write_since"))
        self.log.info("latency %s\n%s", result.verdict.value, latency_table(result.windows))
        if result.cost is not None:
            self.log.info("projected monthly AMP cost\n%s", cost_table(result.cost))
        return result.to_dict()


class GateOperator(GroupStepOperator):
    """Worst verdict wins: FAILED/ERROR fail this task (and so roll back); otherwise ask a human.

    Its XCom is the gate's whole evidence (``core.gate.GateEvidence``: verdict, parity, latency) exactly as the
    audit log recorded it: what the approval shows, hashes, and checks against the audit on the answer.
    ``parity`` and ``latency``: those tasks' outputs.
    """

    template_fields: Sequence[str] = ("group_name", "parity", "latency")

    parity: Output
    latency: Output

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.core.gate import GateAction

        parity, latency = given(self, "parity"), given(self, "latency")
        migration = self.migration(context)
        effects = self.effects(context)
        verdict = effects.gate(parity, latency, _now())
        self.log.info("gate: %s", verdict.reason)
        if verdict.action == GateAction.ROLL_BACK:
            raise AirflowFailException(f"{effects.refusal_label}gate {verdict.verdict.value}: {verdict.reason}")
        recorded = migration.gate_event()
        return dict(recorded.evidence_data)

class CutoverOperator(GroupStepOperator):
    """Route the group's reads to the target; emits the group's ``cut_over`` asset (through its alias)."""

    def execute(self, context: Any) -> dict[str, Any]:
        skipped = self.effects(context).skipped("cut-over")
        if skipped:  # never reached in a dry run (the approval skips first); a skip emits no asset
            raise AirflowSkipException(skipped)
        from promshift.steps.moves import record_move_failure

        migration = self.migration(context)
        # What the target can answer in full moves now; the rest waits for its history (core.horizon).
        horizon = self.horizon(migration, context, _now())
        # The rules first (the source drops them, the target loads them), then the dashboards, then routing;
        # each is audited and done once per run, so a retry resumes where the first attempt stopped.
        rules = self.rules_step(migration)
        if rules is not None:
            try:
                moved = rules.handoff(_now(), horizon)
            except Exception as exc:
                record_move_failure(migration, "rules", "handoff", exc, _now())
                raise
            if "waiting" in moved:
                self.log.info("rules wait for the target's history (first ready at %s)", moved.get("next_ready_at"))
            else:
                self.log.info("rules moved: %s (%s recording, %s alerting)", moved["rules"], moved["records"],
                              moved["alerts"])
        read_path = self.read_path_step(migration)
        if read_path is not None:
            try:
                switched = read_path.switch(_now(), horizon)
            except Exception as exc:
                record_move_failure(migration, "read_path", "switch", exc, _now())
                raise
            self.log.info("read path switched: %s dashboard(s), %s panel(s)", switched["dashboards"],
                          switched["panels"])
        result = migration.cutover(_now())
        from promshift.orchestration.assets import cut_over_asset

        emit_group_asset(self, context, cut_over_asset(self.group_name), {"group": self.group_name,
                                                                           "run_id": context["run_id"]})
        return result


class CompleteRunOperator(GroupStepOperator):
    """Close a cut-over run; as a leaf it also makes a rolled-back run end as failed."""

    operator_extra_links = (MigrationReportLink(),)

    def execute(self, context: Any) -> dict[str, Any]:
        migration = self.migration(context)
        result = migration.complete(_now())
        publish_report(self, context, migration)
        return result


class RollbackOperator(GroupStepOperator):
    """Restore the snapshot byte for byte and record why; runs when any step failed or was rejected.

    ``snapshot``: the snapshot task's output; None when it never ran (validate failed) or kept nothing (a
    dry run), as Airflow resolves a missing return value. Rendered again when a deferred restore resumes.
    """

    ui_color = "#fde8e8"
    needs_target = False
    operator_extra_links = (MigrationReportLink(),)
    template_fields: Sequence[str] = ("group_name", "snapshot")

    snapshot: Output

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.moves import move_failure_reason

        migration = self.migration(context)
        reason = move_failure_reason(migration) or migration.failure_reason()
        recorded = self.effects(context).rollback_recorded(reason, _now())
        if recorded is not None:  # a dry run: nothing was deployed, so nothing is restored, routed or told
            publish_report(self, context, migration)
            return recorded
        snap = given(self, "snapshot")
        moved_errors = self._restore_moved(context, migration, reason)
        result = run_rollback(self, context, reason, lambda: migration.rollback(snap, reason=reason, now=_now()))
        if "waiting" in result:  # the restore must be followed: defer until it is live (or failed)
            self.defer(trigger=self.deploy_trigger(result["waiting"]), method_name="execute_complete",
                       kwargs={"reason": reason, "moved_errors": list(moved_errors)},
                       timeout=timedelta(seconds=float(result["waiting"]["details"].get("timeout_s") or 900) + 300))
        return self._finish(context, result, reason, moved_errors)

    def execute_complete(self, context: Any, event: dict[str, Any], reason: str = "",
                         moved_errors: Sequence[str] = ()) -> dict[str, Any]:
        migration = self.migration(context)
        result = run_rollback(self, context, reason, lambda: migration.finish_rollback(
            event, given(self, "snapshot"), reason=reason, now=_now()))
        return self._finish(context, result, reason, moved_errors)

    def _finish(self, context: Any, result: dict[str, Any], reason: str, moved_errors: Sequence[str]
                ) -> dict[str, Any]:
        """The rollback's outcome, the same for every deploy kind: tell the owners, publish the report, fail when
        what moved with the group or the deploy itself was not restored."""
        migration = self.migration(context)
        if moved_errors:
            self.tell_owners(context, "rollback_failed", reason=reason, error="; ".join(moved_errors))
            publish_report(self, context, migration)
            raise AirflowFailException("rollback did not restore what moved with the group: " + "; ".join(moved_errors))
        self.tell_owners(context, "rolled_back", reason=reason, result=result)
        self.log.info("rollback because %s: performed=%s restored_identical=%s", reason, result["performed"],
                      result["restored_identical"])
        publish_report(self, context, migration)
        if result["performed"] and not result["restored_identical"] and not result.get("own_entry_removed"):
            raise AirflowFailException(f"rollback did not restore the source config identically "
                                       f"({self.deploy_kind}, {result.get('method')})")
        if result.get("own_entry_removed"):
            self.log.info("the source changed since the snapshot (%s kept); only our entry was removed",
                          result.get("kept_changes_since_snapshot"))
        return result

    def _restore_moved(self, context: Any, migration: Any, reason: str) -> list[str]:
        """This run's dashboards, then rules, back to their snapshots (when this run took them); each failure
        is recorded (``<name>_restore_failed``) and returned, after every one was tried."""
        from promshift.core.events import RESTORE_FAILED, EventKind
        from promshift.steps.migration import one_line

        mine = {e.kind for e in migration.audit.events(group=self.group_name, run_id=migration.run_id)}
        errors: list[str] = []
        for name, kind, build in (("read_path", EventKind.READ_PATH_SNAPSHOT, self.read_path_step),
                                  ("rules", EventKind.RULES_SNAPSHOT, self.rules_step)):
            if kind not in mine:
                continue
            try:
                step = build(migration)
                if step is None:
                    raise RuntimeError(f"this run moved {name} but its configuration is gone")
                out = step.restore(reason=reason, now=_now())
                self.log.info("%s restored: %s", name, out.get("changed"))
            except Exception as exc:  # noqa: BLE001 - every restore is tried; the rollback then fails with them
                error = f"{name}: {type(exc).__name__}: {one_line(exc)}"
                migration.record(RESTORE_FAILED[name], _now(), {"reason": reason, "error": error,
                                                                    "evidence": getattr(exc, "evidence", None)})
                errors.append(error)
        return errors
