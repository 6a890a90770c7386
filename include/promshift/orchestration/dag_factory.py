"""Build promshift's DAGs from the reviewed catalog: one migration DAG per target workspace (the group is chosen
in its trigger form), the waves that start dependent groups, the bake watch, and one DAG per by-hand action.

A DAG per group made a 1,000-group catalog 1,000 DAGs of 13 tasks: Airflow alone needs more than two CPU-seconds
to build that many tasks on every parse of the file. The DAGs here do not grow with the catalog: only the trigger
forms' list of groups does."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, AssetAlias, AssetAny, BaseOperator, Param, TriggerRule
from airflow.sdk.definitions._internal.types import NOTSET
from airflow.sdk.exceptions import AirflowFailException, ParamValidationError

from promshift.core.catalog import CATALOG_ERRORS_DAG_ID, MetricGroup, migration_dag_id
from promshift.orchestration.approval_operators import DecommissionApprovalOperator, MigrationApprovalOperator
from promshift.orchestration.assets import (  # noqa: F401 - the group assets' names, as the DAG files import them
    BAKED_ALIAS,
    CUT_OVER_ALIAS,
    baked_asset,
    cut_over_asset,
)
from promshift.orchestration.deadlines import migration_deadline
from promshift.orchestration.lifecycle_operators import (
    BakeCheckOperator,
    BakeWatchListOperator,
    DecommissionOperator,
    DecommissionPrepareOperator,
    FullRollbackOperator,
    RecommissionOperator,
    WavesReadyOperator,
)
from promshift.orchestration.migration_operators import (
    CompleteRunOperator,
    CutoverOperator,
    DeployDualWriteOperator,
    GateOperator,
    LatencyOperator,
    ParityOperator,
    ParityPlanOperator,
    ParitySamplesOperator,
    RollbackOperator,
    SnapshotConfigOperator,
    ValidateGroupOperator,
    WarmupOperator,
)

if TYPE_CHECKING:
    from airflow.sdk.definitions.mappedoperator import MappedOperator

# ``execution_timeout`` of every task: a backstop for a worker stuck in one call (a socket that never answers,
# a held lock), never the step's own budget. Each step ends well before it through its own budgets (HTTP
# timeouts, the latency policy's per-query ``timeout_s``, the decommission's ``verify_s``). Waits do not count:
# the warm-up and a scraper's creation are deferred (the trigger's timeout bounds them) and an approval waits
# for its ``response_timeout``; Airflow applies ``execution_timeout`` to each worker phase (execute, then
# execute_complete). A timed-out task fails like any failure: the migration DAG rolls back. Why each value:
EXECUTION_TIMEOUTS: dict[str, timedelta] = {
    # Reads the catalog and the audit, one request to each backend.
    "validate": timedelta(minutes=10),
    # Copies the source config (and the rules/dashboard to move) to the snapshot store.
    "snapshot": timedelta(minutes=10),
    # Edit, promtool check, reload and verify of one config; the managed collector's creation is deferred.
    "deploy_dual_write": timedelta(minutes=20),
    # The worker part only: read the policy and defer (the wait is the trigger's, warm-up timeout + 5 min).
    "warm_up": timedelta(minutes=10),
    # Lists the group's series on both sides to cut them into host shards.
    "parity_plan": timedelta(minutes=15),
    # One shard's samples on both sides: a large shard is the slowest read of a migration.
    "parity_samples": timedelta(minutes=30),
    # Reduces the shards' results (no backend calls) and records the verdict.
    "parity": timedelta(minutes=15),
    # Every window's queries × repeats, each at most the policy's timeout_s (60 s by default), run one probe at a
    # time per workspace (LATENCY_PROBES_PER_WORKSPACE): time waiting for the other probe does not count.
    "latency": timedelta(minutes=60),
    # Pure computation over the two verdicts and one audit write.
    "gate": timedelta(minutes=5),
    # Records the evidence shown and asks; the wait for the answer is response_timeout (approval_timeout).
    "approval": timedelta(minutes=10),
    # Routes reads (routing, dashboards, rules) to the target, each verified.
    "cutover": timedelta(minutes=20),
    # Records the end of the run and publishes the report.
    "done": timedelta(minutes=10),
    # Restores the snapshot (or removes our entry) on the source and verifies it: cut short only if truly hung.
    "rollback": timedelta(minutes=60),
    # One bake check (freshness, lag, series count, a short parity window); a hung one would hold the next run.
    "bake_check": timedelta(minutes=15),
    # Lists the groups the bake watch checks (one read of the audit's stage moves).
    "watched": timedelta(minutes=10),
    # Reads the audit's stage moves and names the dependent groups to start (no backend calls).
    "ready": timedelta(minutes=10),
    # Asks Airflow to start one group's migration run (one API call).
    "start": timedelta(minutes=5),
    # Measures what the drop frees (series per job) and gathers the bake evidence; for a retire, reads the source's
    # rules, query log and metric names (what retiring ends) and its usage.
    "prepare": timedelta(minutes=15),
    # The drop, promtool check, reload, and up to verify_s (2 scrape intervals + bake.max_lag) for both proofs.
    "decommission": timedelta(hours=2),
    # Removes the drop, promtool check, reload, verified.
    "recommission": timedelta(minutes=30),
    # Fails with the catalog's problems: no IO.
    "catalog_problems": timedelta(minutes=5),
    # Per target, one queue swap: two edits (each reloaded and verified) and up to its 5-minute proof deadline.
    "consolidate": timedelta(minutes=30),
    # The source's switch to agent mode (a restart), then up to a minute of proof on the target.
    "retire": timedelta(minutes=20),
    # The server restored (a restart), then the same proof.
    "unretire": timedelta(minutes=20),
}


def _limit(task_id: str) -> timedelta:
    """The backstop of a task (``EXECUTION_TIMEOUTS``)."""
    return EXECUTION_TIMEOUTS[task_id]


# Latency probes of groups that share a target workspace would skew each other's p95 and share its query quota. A
# migration DAG serves exactly one target workspace (connection), so its ``latency`` task takes at most this many
# task instances at once across all the DAG's runs (``max_active_tis_per_dag``): the bound needs no setup (no pool
# to create; a missing pool used to leave runs waiting at ``latency`` in silence).
LATENCY_PROBES_PER_WORKSPACE = 1


def _listed(groups: Sequence[MetricGroup], limit: int = 20) -> str:
    """The first ``limit`` group names, then how many in all: a DAG's docs stay short at 1,000 groups."""
    shown = ", ".join(f"`{g.name}`" for g in groups[:limit])
    return shown + (f" ... ({len(groups):,} in all)" if len(groups) > limit else "")


def _migration_doc(target: str, groups: Sequence[MetricGroup]) -> str:
    dependents = [g for g in groups if g.depends_on]
    return (
        f"# Migrate metric groups to the AMP workspace of connection `{target}`\n\n"
        "Choose the group in the form. validate → snapshot → deploy dual-write → warm-up (deferred) → parity "
        "(plan → mapped shards → reduce) → latency (one probe at a time on this workspace) → gate → on-call "
        "approval → cutover → done. Any failure, failed gate or rejection → rollback (restores the snapshot byte "
        "for byte).\n\n"
        "The form: `group`, `dry_run` (read only: nothing deployed, cut over or rolled back; the stage never "
        "moves), `change_ticket`, `warmup_override` (e.g. `10m`), `reason`. One run holds a group at a time: a "
        "second run of a group another run holds is refused by `validate` (skipped, recorded). "
        f"`{WAVES_DAG_ID}` starts a group with dependencies when they have all cut over"
        f"{' (' + str(len(dependents)) + ' here)' if dependents else ''}. Then `{BAKE_WATCH_DAG_ID}` bakes "
        f"it, and `promshift__decommission` (a second approval) retires it on the source. Each group's page on "
        "the migration board lists its runs here.\n\n"
        f"Groups: {_listed(groups)}."
    )


# (schema, default) pairs of form fields whose default jsonschema has accepted, as JSON: the check is pure.
_VALID_DEFAULTS: set[tuple[str, str]] = set()


class _FormFieldCopy:
    """``copy.deepcopy`` of one trigger-form Param: a new Param with a copy of its flat schema.

    Airflow deep-copies a DAG's Params into every task, once for each ``__init__`` in the operator's class
    hierarchy (``get_merged_defaults``): 13 tasks × 2–3 copies × the four form fields per group DAG, through
    ``copy``'s generic reduce-and-rebuild, was the largest part of the file's parse. ``copy.deepcopy`` looks
    ``__deepcopy__`` up on the instance, so the DAG's own fields carry this (a module-level class: the Param
    stays picklable). The schema's values are strings, numbers and booleans, so a plain copy of it is a deep
    copy; the copy is a Param like the original, serialized exactly as before."""

    __slots__ = ("field",)

    def __init__(self, field: Param) -> None:
        if not all(isinstance(v, str | int | float | bool) for v in field.schema.values()):
            raise TypeError(f"a form field's schema must be flat: {field.schema!r}")
        self.field = field

    def __call__(self, memo: dict[int, Any]) -> Param:
        field = self.field
        return _as_form_field(Param(field.value, field.description, schema=dict(field.schema), source=field.source))


class _FormFieldResolve:
    """``Param.resolve`` of one trigger-form Param of a DAG, its default checked once per process.

    A DAG with a schedule (a dependent group's assets) checks every Param's default when it is built, and
    jsonschema checks the schema itself against its metaschema each time: four times per DAG, the same four
    schemas and defaults in every group's DAG. The first check of a (schema, default) pair is jsonschema's; a
    pair it accepted is not checked again. A value to check (a run's own) is always checked by jsonschema."""

    __slots__ = ("field",)

    def __init__(self, field: Param) -> None:
        self.field = field

    def __call__(self, value: Any = NOTSET, suppress_exception: bool = False) -> Any:
        field = self.field
        if value is not NOTSET:
            return Param.resolve(field, value, suppress_exception)
        key = (json.dumps(field.schema, sort_keys=True), json.dumps(field.value, sort_keys=True))
        if key in _VALID_DEFAULTS:
            return field.value
        try:
            resolved = Param.resolve(field)
        except ParamValidationError:
            if suppress_exception:
                return None
            raise
        _VALID_DEFAULTS.add(key)
        return resolved


def _as_form_field(field: Param) -> Param:
    """``field`` with the two above, looked up on the instance before the class (``copy.deepcopy``; ParamsDict
    calls ``param.resolve()``). Its copies (each task's) carry them too: serializing a task compares and prints
    its Params, which resolves each one again, and that was five sixths of serializing a group's DAG."""
    field.__deepcopy__ = _FormFieldCopy(field)  # type: ignore[attr-defined]
    field.resolve = _FormFieldResolve(field)  # type: ignore[method-assign]
    return field


def _form_field(default: Any, *, description: str, **schema: str | int | bool) -> Param:
    return _as_form_field(Param(default, description=description, **schema))


def run_params_schema() -> dict[str, Param]:
    """The trigger form of every group DAG (checked again, with ``core.durations``, by ``validate``)."""
    from promshift.core.run_params import MAX_REASON_CHARS, MAX_TICKET_CHARS, WARMUP_OVERRIDE_PATTERN

    return {
        "dry_run": _form_field(False, type="boolean", title="Dry run",
                               description="Read only: validate, parity and latency on what both sides already "
                                           "hold; nothing deployed, cut over, routed or rolled back; the stage "
                                           "never moves."),
        "change_ticket": _form_field("", type="string", maxLength=MAX_TICKET_CHARS, title="Change ticket",
                                     description="The change record this run belongs to (kept in the audit)."),
        "warmup_override": _form_field("", type="string", pattern=WARMUP_OVERRIDE_PATTERN, maxLength=64,
                                       title="Warm-up override",
                                       description="A duration like 10m replacing the catalog's warm-up for this "
                                                   "run (at least one scrape interval); empty keeps the catalog's."),
        "reason": _form_field("", type="string", maxLength=MAX_REASON_CHARS, title="Reason",
                              description="Why this run was started (kept in the audit)."),
        "accept_short_history": _form_field(False, type="boolean", title="Accept short history",
                                            description="Switch every panel and move every rule at the cut-over "
                                                        "even when they read further back than the target holds "
                                                        "(from the dual-write on); kept in the audit and shown to "
                                                        "the approver. Off: those wait until the target covers "
                                                        "them."),
    }


def link(*tasks: BaseOperator | MappedOperator) -> None:
    """``tasks[0] >> tasks[1] >> ...`` for tasks built in the same ``with DAG(...)`` block.

    The edge sets ``>>`` fills, without its checks: Airflow's ``>>`` hashes the DAG for every task on either
    side to check that they share one, and a DAG's hash hashes each of its schedule's assets through JSON; at
    1,000 groups that was a tenth of the file's parse. The check is kept once, here, on the DAG."""
    for upstream, downstream in zip(tasks, tasks[1:], strict=False):
        if not (upstream.has_dag() and downstream.has_dag()) or upstream.dag is not downstream.dag:
            raise ValueError(f"{upstream.task_id!r} and {downstream.task_id!r} are not tasks of one DAG")
        upstream.downstream_task_ids.add(downstream.task_id)
        downstream.upstream_task_ids.add(upstream.task_id)


def read_from_further_up(consumer: BaseOperator, producer: BaseOperator) -> None:
    """``consumer`` takes ``producer``'s output as an XComArg argument, but its edge from it is through the chain.

    Airflow adds a direct edge for every XComArg in a template field. A direct edge from a task already upstream
    through the chain changes no order, but it does change the graph, and the trigger rules' inputs (the
    rollback's ``one_failed`` would watch the snapshot too): the chain's ``link`` lines stay the only edges.
    Called after them; refuses to remove an edge the chain does not cover.
    """
    consumer.upstream_task_ids.discard(producer.task_id)
    producer.downstream_task_ids.discard(consumer.task_id)
    if producer.task_id not in consumer.get_flat_relative_ids(upstream=True):
        raise ValueError(f"{consumer.task_id!r} reads {producer.task_id!r}'s output but does not run after it")


def pair_tags(sources: Sequence[str], target: str) -> list[str]:
    """DAG tags naming the clusters and the workspace connection of a migration DAG: the UI filters on them."""
    return [*(f"source:{source}" for source in sorted(set(sources))), f"target:{target}"]


# Every DAG's retries: a task fails once before its run does (a retry resumes from what the audit log holds).
DEFAULT_ARGS = {"retries": 1, "retry_delay": timedelta(seconds=15), "owner": "promshift"}


def promshift_dag(dag_id: str, *, description: str, doc_md: str, schedule: Any, tags: Sequence[str],
                  **more: Any) -> DAG:
    """One of promshift's DAGs: its own start date, no catch-up, one run at a time (``more`` may say otherwise)
    and ``DEFAULT_ARGS``."""
    settings: dict[str, Any] = {"start_date": datetime(2026, 1, 1), "catchup": False, "max_active_runs": 1,
                                "default_args": dict(DEFAULT_ARGS), **more}
    return DAG(dag_id=dag_id, description=description, doc_md=doc_md, schedule=schedule,
               tags=["promshift", *tags], **settings)


def migration_targets(groups: Sequence[MetricGroup]) -> dict[str, list[MetricGroup]]:
    """The catalog's groups by target connection, in catalog order: one migration DAG each."""
    by_target: dict[str, list[MetricGroup]] = {}
    for group in groups:
        by_target.setdefault(group.target, []).append(group)
    return by_target


# Runs of different groups at once in one migration DAG (each group is held by one run at a time through the
# audit log, not by Airflow): a wave of this many groups migrates side by side; more wait queued.
MIN_ACTIVE_MIGRATIONS = 16


def build_migration_dag(groups: Sequence[MetricGroup], *, target: str, catalog_path: str | Path,
                        profile: str | None = None) -> DAG:
    """``promshift__migrate__<target>``: the migration of any of ``groups`` (all with that target), the group
    chosen in the trigger form. Cheap: no network or database work happens here."""
    if not groups or any(g.target != target for g in groups):
        raise ValueError(f"a migration DAG is built for groups of target {target!r} only")
    # The group (and so its source connection) is the form's: each task takes it when it renders (choose_group),
    # and refuses a group the catalog now sends to another workspace (its latency bound, connection: this DAG's).
    common = dict(group_name=None, catalog_path=str(catalog_path), profile=profile, target_conn_id=target,
                  dag_target=target)
    with promshift_dag(
        migration_dag_id(target),
        description=f"Migrate a metric group to the AMP workspace of connection {target}",
        doc_md=_migration_doc(target, groups),
        schedule=None,
        params={"group": group_param(groups), **run_params_schema()},
        max_active_runs=max(MIN_ACTIVE_MIGRATIONS, len(groups)),
        tags=["migration", *pair_tags([g.source for g in groups], target)],
        # A run still going past its groups' longest warm-up + approval timeouts plus a margin for the steps'
        # work: recorded (run_overdue) and its owners told, from the triggerer (``orchestration.deadlines``).
        deadline=migration_deadline(groups, catalog_path=catalog_path, profile=profile),
    ) as dag:
        validate = ValidateGroupOperator(task_id="validate", execution_timeout=_limit("validate"), **common)
        # Each task's inputs are upstream outputs as XComArgs (``task.output``), resolved when Airflow renders it.
        snapshot = SnapshotConfigOperator(task_id="snapshot", execution_timeout=_limit("snapshot"), **common)
        deploy = DeployDualWriteOperator(task_id="deploy_dual_write", execution_timeout=_limit("deploy_dual_write"),
                                         snapshot=snapshot.output, **common)
        warm_up = WarmupOperator(task_id="warm_up", execution_timeout=_limit("warm_up"), deployed=deploy.output,
                                 **common)
        parity_plan = ParityPlanOperator(task_id="parity_plan", execution_timeout=_limit("parity_plan"),
                                         deployed=deploy.output, **common)
        # Dynamic task mapping: one task per host shard, so more workers share a large check.
        parity_samples = ParitySamplesOperator.partial(
            task_id="parity_samples", execution_timeout=_limit("parity_samples"), **common).expand(
            shard=parity_plan.output)
        # none_failed: with zero shards the mapped task is skipped, and the reducer still runs.
        parity = ParityOperator(task_id="parity", execution_timeout=_limit("parity"),
                                trigger_rule=TriggerRule.NONE_FAILED,
                                plan=parity_plan.output["plan"], shards=parity_samples.output, **common)
        latency = LatencyOperator(task_id="latency", execution_timeout=_limit("latency"), deployed=deploy.output,
                                  max_active_tis_per_dag=LATENCY_PROBES_PER_WORKSPACE, **common)
        gate = GateOperator(task_id="gate", execution_timeout=_limit("gate"), retries=0, parity=parity.output,
                            latency=latency.output, **common)
        approval = MigrationApprovalOperator(
            task_id="approval", execution_timeout=_limit("approval"),
            gate_evidence=gate.output,
            approvers=None,  # the chosen group's (users and teams), resolved when the question is asked
            # Replaced by the chosen group's approval_timeout when the question is asked.
            response_timeout=timedelta(seconds=max(g.approval_timeout_s for g in groups)),
            # Reject, timeout and the four-eyes refusal raise AirflowFailException: never retried.
            # The retry is for Airflow failing the task by itself: in 3.3.2 an answer that resumes the
            # task before the scheduler has processed the pausing worker's exit can find the resumed
            # task QUEUED, and the scheduler then fails it as "changed externally". Asking again beats
            # rolling back an approved migration.
            retries=1,
            retry_delay=timedelta(seconds=5),
            **common,
        )
        cutover = CutoverOperator(task_id="cutover", execution_timeout=_limit("cutover"),
                                  outlets=[AssetAlias(CUT_OVER_ALIAS)], **common)
        done = CompleteRunOperator(task_id="done", execution_timeout=_limit("done"), **common)
        rollback = RollbackOperator(task_id="rollback", execution_timeout=_limit("rollback"),
                                    trigger_rule=TriggerRule.ONE_FAILED, snapshot=snapshot.output, **common)
        link(validate, snapshot, deploy, warm_up, parity_plan, parity_samples, parity, latency, gate, approval,
             cutover, done)
        for step in (deploy, warm_up, parity_plan, parity_samples, parity, latency, gate, approval, cutover):
            link(step, rollback)
        for consumer, producer in ((parity_plan, deploy), (parity, parity_plan), (latency, deploy), (gate, parity),
                                   (rollback, snapshot)):
            read_from_further_up(consumer, producer)
    return dag


def build_migration_dags(groups: Sequence[MetricGroup], *, catalog_path: str | Path,
                         profile: str | None = None) -> list[DAG]:
    """One migration DAG per target connection of ``groups``."""
    return [build_migration_dag(members, target=target, catalog_path=catalog_path, profile=profile)
            for target, members in migration_targets(groups).items()]


# --------------------------------------------------------------------------- waves

WAVES_DAG_ID = "promshift__waves"


def build_waves_dag(groups: Sequence[MetricGroup], *, catalog_path: str | Path, profile: str | None = None) -> DAG:
    """``promshift__waves``: on any cut-over of a group others depend on, start each dependent group whose
    dependencies have all cut over (``core.waves``), in its target's migration DAG.

    The cut-over assets are what each dependent group's own DAG was scheduled on; a start's run id is the same
    for every worker that sees the same cut-overs, so a group is started once (a second start of that run id is
    skipped), and ``validate`` still checks the dependencies' stages when the run starts."""
    dependencies = sorted({dep for group in groups for dep in group.depends_on})
    dependents = [g for g in groups if g.depends_on]
    listing = "\n".join(f"- `{g.name}` after {', '.join(f'`{d}`' for d in g.depends_on)}" for g in dependents[:50])
    more = f"\n- ... {len(dependents) - 50:,} more" if len(dependents) > 50 else ""
    with promshift_dag(
        WAVES_DAG_ID,
        description="Start metric groups whose dependencies have all cut over",
        doc_md=("# Waves: start dependent groups\n\nRuns when a group that others depend on cuts over (its "
                "`cut_over` asset). Reads every group's stage from the audit log and starts, in its target's "
                "migration DAG, each group whose dependencies are all cut over and which is not running or "
                "done.\n\n" + (listing + more if dependents else "No group of the catalog depends on another.")),
        schedule=AssetAny(*(cut_over_asset(dep) for dep in dependencies)) if dependencies else None,
        tags=["waves"],
    ) as dag:
        ready = WavesReadyOperator(task_id="ready", execution_timeout=_limit("ready"),
                                   catalog_path=str(catalog_path), profile=profile)
        # One start per ready group (none: skipped). A run id that exists already was started by an earlier
        # wave run or try: skipped, not failed.
        TriggerDagRunOperator.partial(
            task_id="start", execution_timeout=_limit("start"), skip_when_already_exists=True,
            wait_for_completion=False, map_index_template="{{ task.conf['group'] }}",
        ).expand_kwargs(ready.output)
    return dag


# --------------------------------------------------------------------------- the bake watch

BAKE_WATCH_DAG_ID = "promshift__bake_watch"


def build_bake_watch_dag(groups: Sequence[MetricGroup], *, catalog_path: str | Path,
                         profile: str | None = None) -> DAG:
    """``promshift__bake_watch``: every ``bake.interval`` (the shortest of any group), one check per group that
    is cut over or baking.

    ``watched`` lists those groups from the audit's stage moves; ``bake_check`` (mapped, one per group, named by
    it) checks the target copy (freshness, remote-write lag, series count, a short parity window), records
    ``bake_check``, and moves the group to ``baked`` after a clean ``bake.period`` (emitting
    ``promshift://group/<name>/baked``) or back to ``rolled_back_reads`` on a failed check.
    """
    interval_s = min(group.bake.interval_s for group in groups)
    listing = "\n".join(f"- `{g.name}`: every {g.bake.interval_s:g}s, baked after {g.bake.period_s:g}s clean"
                         for g in groups[:50]) + (f"\n- ... {len(groups) - 50:,} more" if len(groups) > 50 else "")
    with promshift_dag(
        BAKE_WATCH_DAG_ID,
        description="Watch cut-over metric groups until they are baked (or roll their reads back)",
        doc_md=("# Bake watch of migrated metric groups\n\nChecks each cut-over group's target copy: freshness, "
                "remote-write lag, series count, a short parity window. A failed check returns the group's reads "
                "to the source (dual-write stays on) and tells its owners; a clean bake period makes it `baked` "
                "and emits its `baked` asset.\n\n" + listing),
        schedule=timedelta(seconds=interval_s),
        tags=["bake-watch"],
    ) as dag:
        watched = BakeWatchListOperator(task_id="watched", execution_timeout=_limit("watched"),
                                        catalog_path=str(catalog_path), profile=profile)
        # One check per watched group (none: skipped), each with the group's own connections.
        BakeCheckOperator.partial(
            task_id="bake_check", execution_timeout=_limit("bake_check"), catalog_path=str(catalog_path),
            profile=profile, outlets=[AssetAlias(BAKED_ALIAS)], map_index_template="{{ task.group_name }}",
        ).expand_kwargs(watched.output)
    return dag


# --------------------------------------------------------------------------- decommission (second approval)


# One DAG per action for every group: the group is chosen in the trigger form (a DAG per group and action made a
# 1,000-group catalog 4,001 DAGs). The operators read it from ``params.group`` and check it against the catalog.
DECOMMISSION_DAG_ID = "promshift__decommission"
RECOMMISSION_DAG_ID = "promshift__recommission"
FULL_ROLLBACK_DAG_ID = "promshift__rollback"


def group_param(groups: Sequence[MetricGroup]) -> Param:
    """The form's ``group`` field: one of the catalog's groups (Airflow refuses any other at trigger time; the
    first task checks it again against the catalog as it is when the run starts)."""
    return Param(type="string", enum=[g.name for g in groups], title="Metric group",
                 description="The catalog group this run acts on.")


def build_by_hand_dags(groups: Sequence[MetricGroup], *, catalog_path: str | Path, profile: str | None = None
                       ) -> tuple[DAG, DAG, DAG]:
    """``promshift__decommission`` (prepare -> second approval -> drop at scrape, verified),
    ``promshift__recommission`` (remove the drop; reads stay on the target) and ``promshift__rollback`` (a
    cut-over group all the way back). By hand only; the group is the trigger form's ``group``."""
    common = dict(group_name=None, catalog_path=str(catalog_path), profile=profile)
    listed = _listed(groups)

    def by_hand(dag_id: str, kind: str, description: str, doc_md: str, reason: str | None = None) -> DAG:
        """A DAG that only a person starts, for the group chosen in its form; ``reason``: the form's Reason
        field's description."""
        params: dict[str, Param] = {"group": group_param(groups)}
        if reason:
            params["reason"] = Param("", type="string", maxLength=1000, title="Reason", description=reason)
        # One run at a time (promshift_dag's): two runs of one group must not race. A decommission waiting for
        # its approval holds the next one back.
        return promshift_dag(dag_id, description=description, doc_md=f"{doc_md}\n\nGroups: {listed}.",
                             schedule=None, tags=[kind], params=params)

    with by_hand(
        DECOMMISSION_DAG_ID, "decommission", "Decommission a metric group on the source (after its bake)",
        ("# Decommission a group on the source\n\nChoose the group in the form. After a clean bake (`baked`), a "
         "second approval (the bake evidence and what the drop frees; the group's own approvers and "
         "`approval_timeout`), then a `metric_relabel_configs` drop of the group in each scrape job that carries "
         "it: snapshot, promtool check, reload, verified live; undone at once if the target stops receiving the "
         "group. Refused on the remote_write path (the source is then the target's only writer). Undo with "
         f"`{RECOMMISSION_DAG_ID}`."),
    ) as decommission:
        prepare = DecommissionPrepareOperator(task_id="prepare", execution_timeout=_limit("prepare"), retries=0,
                                              **common)
        longest = max((g.approval_timeout_s for g in groups), default=3600.0)
        approval = DecommissionApprovalOperator(
            task_id="approval", execution_timeout=_limit("approval"), prepared=prepare.output, approvers=None,
            # Replaced by the chosen group's approval_timeout when the question is asked.
            response_timeout=timedelta(seconds=longest), retries=1, retry_delay=timedelta(seconds=5), **common)
        decommission_step = DecommissionOperator(task_id="decommission", execution_timeout=_limit("decommission"),
                                                 approval=approval.output, **common)
        prepare >> approval >> decommission_step
    with by_hand(
        RECOMMISSION_DAG_ID, "recommission", "Undo the decommission of a metric group (the source scrapes it again)",
        ("# Recommission a group\n\nChoose the group in the form. Removes the decommission's drop: the source "
         "scrapes and stores the group again; reads stay on the target. The source never stored the group while "
         "it was decommissioned (the gap is recorded); the target holds that history."),
        reason="Why the decommission is undone (kept in the audit).",
    ) as recommission:
        RecommissionOperator(task_id="recommission", execution_timeout=_limit("recommission"), **common)
    with by_hand(
        FULL_ROLLBACK_DAG_ID, "rollback", "Roll a metric group all the way back after its cut-over (by hand)",
        ("# Roll a group back after its cut-over\n\nChoose the group in the form. From `cut_over`, `baking`, "
         "`baked`, `rolled_back_reads` or `recommissioned`: reads back to the source (every read-path restorer), "
         "then the group's own remote_write entry removed by name (never a whole-file restore: other groups' "
         "entries stay), promtool-checked, reloaded, verified gone; `rolled_back`."),
        reason="Why the group goes back to the source (kept in the audit).",
    ) as rollback:
        FullRollbackOperator(task_id="rollback", execution_timeout=_limit("rollback"), **common)
    return decommission, recommission, rollback


# --------------------------------------------------------------------------- retire a whole source


RETIRE_DAG_ID = "promshift__retire"
UNRETIRE_DAG_ID = "promshift__unretire"


def build_retire_dags(groups: Sequence[MetricGroup], *, catalog_path: str | Path, profile: str | None = None
                      ) -> tuple[DAG, DAG]:
    """``promshift__retire`` (prepare -> consolidate -> approval -> retire) and ``promshift__unretire``: a whole
    source, chosen in the form among the catalog's source connections."""
    from promshift.orchestration.retire_operators import (
        RetireApprovalOperator,
        RetireConsolidateOperator,
        RetireOperator,
        RetirePrepareOperator,
        UnretireOperator,
    )
    from promshift.orchestration.wiring import SOURCE_PARAM

    sources = sorted({g.source for g in groups})
    common = dict(catalog_path=str(catalog_path), profile=profile)
    source = Param(type="string", enum=sources, title="Source connection",
                   description="The source Prometheus to retire (every group reading from it must have baked).")
    with promshift_dag(
        RETIRE_DAG_ID, description="Retire a source Prometheus: an agent that only forwards (after every bake)",
        doc_md=("# Retire a source\n\nChoose the source connection in the form. Refused unless every group of it "
                "has baked. Merges each target's per-group write queues into one (the lossless queue swap; kept, "
                "with the reason, where it cannot run). Shows what retiring ends (rules it evaluates, metrics "
                "still read in its query log since the last bake, metrics no group carries), each blocking unless "
                "the approver names it in `accept`; then the source becomes a Prometheus agent (forwarder only) "
                "and the run proves the target still receives every group without a gap, the source answers "
                f"queries with 422, and its memory and CPU before/after. Undo with `{UNRETIRE_DAG_ID}`. "
                "docs/lifecycle.md.\n\n"
                f"Sources: {', '.join(sources)}."),
        schedule=None, tags=["retire"], params={SOURCE_PARAM: source},
    ) as retire:
        prepare = RetirePrepareOperator(task_id="prepare", execution_timeout=_limit("prepare"), retries=0,
                                        **common)
        longest = max((g.approval_timeout_s for g in groups), default=3600.0)
        consolidate = RetireConsolidateOperator(task_id="consolidate", execution_timeout=_limit("consolidate"),
                                                prepared=prepare.output, retries=1,
                                                retry_delay=timedelta(seconds=10), **common)
        approval = RetireApprovalOperator(task_id="approval", execution_timeout=_limit("approval"),
                                          prepared=prepare.output, consolidated=consolidate.output,
                                          response_timeout=timedelta(seconds=longest), retries=0, **common)
        step = RetireOperator(task_id="retire", execution_timeout=_limit("retire"), approval=approval.output,
                              retries=1, retry_delay=timedelta(seconds=10), **common)
        prepare >> consolidate >> approval >> step
    with promshift_dag(
        UNRETIRE_DAG_ID, description="Undo a retirement: the source a server again, byte for byte",
        doc_md=("# Unretire a source\n\nChoose the source connection in the form. Restores the server's config "
                "bytes and command line saved before the switch, proves them byte-identical and the target "
                "without a gap."),
        schedule=None, tags=["retire"],
        params={SOURCE_PARAM: source, "reason": Param("", type="string", maxLength=1000, title="Reason",
                                                      description="Why the source is a server again (audited).")},
    ) as unretire:
        UnretireOperator(task_id="unretire", execution_timeout=_limit("unretire"), retries=1,
                         retry_delay=timedelta(seconds=10), **common)
    return retire, unretire


# --------------------------------------------------------------------------- catalog errors

# Shown in full up to here; the rest is counted (``promshift catalog check`` lists everything).
_MAX_SHOWN_PROBLEMS = 200


def _shown(problems: Sequence[str]) -> list[str]:
    shown = [" ".join(problem.split()) for problem in problems[:_MAX_SHOWN_PROBLEMS]]
    if len(problems) > _MAX_SHOWN_PROBLEMS:
        shown.append(f"... and {len(problems) - _MAX_SHOWN_PROBLEMS:,} more: run `promshift catalog check`")
    return shown


class CatalogErrorsOperator(BaseOperator):
    """Fails with the catalog's problems, so they show in the task log and the run's state."""

    def __init__(self, *, problems: Sequence[str], catalog_path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.problems = list(problems)
        self.catalog_path = catalog_path

    def execute(self, context: Any) -> None:
        shown = _shown(self.problems)
        for problem in shown:
            self.log.error("catalog problem: %s", problem)
        raise AirflowFailException(f"the catalog {self.catalog_path} has {len(self.problems)} problem(s); "
                                   "fix them and the missing DAGs come back:\n" + "\n".join(shown))


def build_catalog_errors_dag(
    *, problems: Sequence[str], catalog_path: str | Path, missing_groups: Sequence[str] = ()
) -> DAG:
    """The ``promshift__catalog_errors`` DAG: every catalog problem in its docs, one task that fails with them.

    Built instead of the DAGs of groups with problems (``missing_groups``), so a bad group shows in
    the UI rather than silently removing DAGs; good groups keep their own DAGs.
    """
    count = len(problems)
    # Inside a fenced block: a problem quotes catalog text, which must not become markdown or HTML.
    listing = "\n".join(_shown(problems)).replace("```", "'''")
    missing = ", ".join(missing_groups[:_MAX_SHOWN_PROBLEMS]).replace("`", "'") or "none"
    doc = (
        f"# The promshift catalog has {count} problem{'s' if count != 1 else ''}\n\n"
        f"Catalog: `{catalog_path}`. Without a DAG until this is fixed: {missing}.\n"
        "`promshift catalog check` prints the same list; every other group keeps its DAG.\n\n"
        f"```\n{listing}\n```\n"
    )
    with DAG(
        dag_id=CATALOG_ERRORS_DAG_ID,
        description=f"{count} problem{'s' if count != 1 else ''} in the metric-group catalog",
        doc_md=doc,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        tags=["promshift", "catalog-errors"],
        # Retrying cannot fix the catalog.
        default_args={"retries": 0, "owner": "promshift"},
    ) as dag:
        CatalogErrorsOperator(task_id="catalog_problems", execution_timeout=_limit("catalog_problems"),
                              problems=problems, catalog_path=str(catalog_path))
    return dag
