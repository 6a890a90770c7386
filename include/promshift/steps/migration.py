"""The steps of one metric group's migration, as plain Python around the pure core.

Airflow operators call these; tests can too, without Airflow. Every step that changes
something records an audit event with its evidence.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from promshift.core.audit import AuditEvent
from promshift.core.catalog import MetricGroup
from promshift.core.cost import (
    CostConfigError,
    CostEvidence,
    QueryCost,
    estimate_range_samples,
    project_monthly_cost,
)
from promshift.core.deploy import ConfigDeployer, DeployError, SnapshotStore, group_entry, group_entry_record
from promshift.core.durations import parse_duration
from promshift.core.errors import PrometheusError
from promshift.core.events import (
    APPROVAL_REFUSALS,
    GATE_DECIDED,
    RELEASES_GROUP,
    SIDE_EVENTS,
    WARMUP_ENDED,
    EventKind,
    approval_kind,
    claims_group,
)
from promshift.core.evidence import json_safe
from promshift.core.gate import GateAction, GateEvidence, GateVerdict
from promshift.core.inputs import CONFIG, parse_yaml_bounded
from promshift.core.latency import LatencyResult, ProbeRun, choose_step
from promshift.core.parity import ParityResult
from promshift.core.ports import AuditLog, Blobs, Probes, PrometheusProbe, Routing
from promshift.core.promql import widest_range_s
from promshift.core.redact import redact, redact_text
from promshift.core.render import (
    sha256_bytes,
)
from promshift.core.run_params import RunParams
from promshift.core.stages import CUT_OVER_OR_LATER, DUAL_WRITE_ON, STARTABLE, Stage, transition
from promshift.core.verdicts import Verdict
from promshift.core.warmup import observe_warmup  # noqa: F401 - where the tests and the bench look for it

log = logging.getLogger(__name__)


def steps_of(events: Sequence[AuditEvent]) -> list[AuditEvent]:
    """``events`` without side events (``core.events.SIDE_EVENTS``: notifications, and the report a step
    publishes after its own event): what a retried step compares its own last event with."""
    return [e for e in events if e.kind not in SIDE_EVENTS]


class GroupNotStartable(RuntimeError):
    """The group may not start now: past the point where a run starts (cut over, say), its wave is paused,
    a group it depends on is not cut over yet (recorded as ``start_refused``), or another run holds it."""


def holding_runs(events: Sequence[AuditEvent], *, before_seq: int | None = None) -> list[AuditEvent]:
    """The ``validated`` events of runs that still hold the group (one per run, oldest first): a run holds
    it until one of ``core.events.RELEASES_GROUP``.

    ``before_seq``: only claims made before that sequence number (the claims that win over it).
    """
    claims: dict[str, AuditEvent] = {}
    for ev in events:
        # A dry run changes nothing, so it never holds the group (``core.events.claims_group``).
        if claims_group(ev) and (before_seq is None or ev.seq < before_seq):
            claims.setdefault(ev.run_id, ev)
        elif ev.kind in RELEASES_GROUP:
            claims.pop(ev.run_id, None)
    return sorted(claims.values(), key=lambda e: e.seq)


class SnapshotError(DeployError):
    """A recorded snapshot file is missing, unreadable or no longer matches its hash."""


@dataclass(frozen=True)
class Backends:
    """Where the group's data lives: the self-hosted source and the AMP(-like) target."""

    source: PrometheusProbe
    target: PrometheusProbe
    source_config_path: str
    target_remote_write_url: str
    promtool: str = "promtool"
    # An AMP target: the remote_write entry's sigv4 block ({region, role_arn?}); None writes unsigned.
    target_sigv4: Mapping[str, str] | None = None
    # Why the target cannot be used now, or None; None here means its /-/ready (self-hosted Prometheus).
    target_ready: Callable[[], str | None] | None = None
    # (seconds, origin) of the target's retention from its control plane; None: ask the server, then the catalog.
    target_retention: Callable[[], tuple[float | None, str]] | None = None
    # The target's per-query limits (``core.query_limits``), read when parity or latency first needs them.
    target_limits: Callable[[], Any] | None = None
    # What the audit records about the target ({kind: amp, workspace_id, region}); never credentials.
    target_identity: Mapping[str, Any] = field(default_factory=dict)
    # The target's Alertmanager: alertname -> the alerts it holds active for it (``adapters.alertmanager``);
    # None: no Alertmanager known for the target (the bake's delivery check is then INCONCLUSIVE).
    target_alerts: Callable[[str], Sequence[Any]] | None = None
    # The target's discarded samples by reason: (since, now) -> {reason: n} (an AMP workspace's DiscardedSamples,
    # ``adapters.ingest_health``); None: the target publishes none (a self-hosted Prometheus).
    target_discards: Callable[[datetime, datetime], Mapping[str, float]] | None = None
    # A source that runs as replicas (the group's ``replicas.sources``): (replica, its Prometheus) in catalog order;
    # parity compares the target with the one its dedup kept (``Probes.ha_parity``). None: the one source.
    replica_sources: Callable[[], Sequence[tuple[str, PrometheusProbe]]] | None = None
    # The target workspace's configuration (``core.tenants.WorkspaceConfigurationPort``): where a group's tenant
    # limit is set. None: the target has none (a self-hosted Prometheus), and a group with a tenant is refused.
    workspace_configuration: Any = None

    def target_problem(self) -> str | None:
        if self.target_ready is not None:
            return self.target_ready()
        return None if self.target.ready() else f"{self.target.base_url} is unreachable or not ready"


class GroupMigration:
    """One DAG run's work on one metric group."""

    def __init__(self, group: MetricGroup, backends: Backends, *, audit: AuditLog, routing: Routing, run_id: str,
                 actor: str = "promshift", catalog_dir: Path | None = None, snapshot_blobs: Blobs | None = None,
                 run_params: RunParams | None = None,
                 deployer: ConfigDeployer | Callable[[], ConfigDeployer] | None = None,
                 snapshots: SnapshotStore | None = None, quota: Any = None, probes: Probes | None = None,
                 source_file: Callable[[], Any] | None = None, queues: Any = None) -> None:
        """Every outside system comes in through a port (``core.ports``), wired by ``orchestration.compose`` (for a
        task, ``orchestration.wiring``): ``deployer``, the group's ConfigDeployer (or what builds it when first
        needed: one switch on the kind, in the wiring); ``snapshots``, where its snapshots go; ``quota``, the
        workspace's pre-flight; ``snapshot_blobs``, where the decommission keeps its snapshot; ``probes``, the
        measurements; ``source_file``, what builds the source's config file deployer (the decommission's drop);
        ``queues``, the source's queue cap and swap (``steps.queues.QueueCap``: the deploy's pre-flight, the
        rollback's leave of a merged entry)."""
        self.group = group
        # What the trigger form asked for (dry run, change ticket, warm-up override, reason).
        self.run_params = run_params or RunParams()
        self.backends = backends
        self.audit = audit
        self.routing = routing
        # Where snapshots go: an object store every worker reads.
        self._snapshot_blobs = snapshot_blobs
        self.run_id = run_id
        self.actor = actor
        self.catalog_dir = catalog_dir
        self._deployer = deployer
        self._snapshots = snapshots
        self._quota = quota
        self._probes = probes
        self._source_file = source_file
        self._queues = queues

    # -- helpers -------------------------------------------------------------------------
    def _port(self, value: Any, name: str) -> Any:
        if value is None:
            raise RuntimeError(f"no {name} is wired into this run (orchestration.compose wires every port)")
        return value

    @property
    def snapshot_blobs(self) -> Blobs:
        return self._port(self._snapshot_blobs, "snapshot blob store")  # type: ignore[no-any-return]

    @property
    def probes(self) -> Probes:
        return self._port(self._probes, "probes")  # type: ignore[no-any-return]

    @property
    def source_file(self) -> Any:
        """The source's config file and the server that loads it: what the decommission's scrape drop edits."""
        return self._port(self._source_file, "source config file")()

    @functools.cached_property
    def deploy_step(self) -> Any:
        """The one deploy driver (``steps.deploy.DeployStep``) over this run's deployer and snapshot store."""
        from promshift.steps.deploy import DeployStep

        deployer = self._port(self._deployer, "deployer")
        store = self._port(self._snapshots, "snapshot store")
        if callable(deployer) and not isinstance(deployer, ConfigDeployer):
            deployer = deployer()
        return DeployStep(self, deployer, store, quota=self._quota, queues=self._queues)

    def entry(self) -> dict[str, Any]:
        return group_entry(self.group, self.backends.target_remote_write_url, self.backends.target_sigv4)

    def entry_record(self) -> dict[str, Any]:
        return group_entry_record(self.group, self.backends.target_remote_write_url, self.backends.target_sigv4)

    def stage(self) -> Stage:
        return self.audit.stage_of(self.group.name)

    def recorded(self, kind: EventKind, to: Stage) -> AuditEvent | None:
        """This run's ``kind`` event that moved the group to ``to``, if it is still the group's latest move.

        That is what a retried step finds when its first attempt recorded the transition and
        then failed: the step already happened, so the retry resumes instead of moving the
        stage again (which the table would refuse). Another run's event, or one the group has
        moved on from since, is not this step's and returns None.
        """
        moves = [e for e in self.audit.events(group=self.group.name) if e.stage_to]
        if not moves:
            return None
        last = moves[-1]
        if last.run_id == self.run_id and last.kind == kind and last.stage_to == to.value:
            return last
        return None

    def record(self, kind: EventKind, now: datetime, evidence: Mapping[str, Any], *, to: Stage | None = None,
               actor: str | None = None) -> AuditEvent:
        """Append an audit event; with ``to``, also move the stage (checked by the table).

        Returns the appended event: its ``seq`` and ``hash`` are the chain's new (anchored) head.
        A transition this run already recorded as the group's latest move (a retried step, see
        ``recorded``) is not appended again: the recorded event is returned.
        """
        # No URL credentials in the audit log, ever; NaN/±Inf (a NaN lag, say) as text, not a failed append.
        evidence = json_safe(redact(evidence))
        if to is not None and (done := self.recorded(kind, to)) is not None:
            log.info("audit: %s %s -> %s was already recorded by this run (seq %s); not recording it again",
                     self.group.name, kind, to.value, done.seq)
            return done
        current = self.stage() if to else None
        if to is not None and current is not None:
            transition(self.group.name, current, to)
        return self.audit.append(group=self.group.name, run_id=self.run_id, kind=kind, actor=actor or self.actor,
                                 at=now, evidence=evidence, stage_from=current, stage_to=to)

    # -- steps ---------------------------------------------------------------------------
    @property
    def dry_run(self) -> bool:
        return self.run_params.dry_run

    def start_blockers(self, stage: Stage) -> list[str]:
        """Why a real run may not start now (one line each): the group's stage, a paused wave, or a
        dependency that is not cut over yet (waves are enforced at run time, not only in the catalog)."""
        blockers = []
        if stage not in STARTABLE:
            blockers.append(f"group {self.group.name!r} is {stage.value}; a new migration run starts only from "
                            f"{sorted(s.value for s in STARTABLE)}")
        if self.group.wave_paused:
            blockers.append(f"wave {self.group.wave} is paused in the catalog (defaults.paused_waves)")
        for dependency in self.group.depends_on:
            dep_stage = self.audit.stage_of(dependency)
            if dep_stage not in CUT_OVER_OR_LATER:
                blockers.append(f"group {self.group.name!r} depends on {dependency!r}, which is {dep_stage.value}: "
                                "it must be cut over first")
        return blockers

    def validate(self, now: datetime) -> dict[str, Any]:
        """Check the group may start and both backends answer; nothing is changed yet.

        A refusal to start (``start_blockers``) is recorded as ``start_refused`` and raised as
        GroupNotStartable. A dry run changes nothing, so it starts from any stage: what would refuse
        a real run is recorded in its ``validated`` event (``would_refuse``).
        """
        stage = self.stage()
        blockers = self.start_blockers(stage)
        if self.dry_run:  # the claim: a dry run changes nothing, so it claims nothing and may run beside one
            return self._failure_recorded(now, lambda: self._validate(
                stage, now, dry_run={"dry_run": True, "would_refuse": blockers}))
        self._refuse_to_start(stage, now, blockers)
        return self._failure_recorded(now, lambda: self._claim(stage, now))

    def _claim(self, stage: Stage, now: datetime) -> dict[str, Any]:
        """Validate and claim the group for this run (its ``validated`` event), unless another run holds it."""
        self._refuse_if_held()
        evidence = self._validate(stage, now)
        # Two runs that validated at once: the chain orders their claims, and the earlier one wins.
        self._refuse_if_held(before_seq=self._my_claim_seq())
        return evidence

    def _failure_recorded(self, now: datetime, check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``check()``; whatever it raises is recorded as ``validation_failed`` first."""
        try:
            return check()
        except Exception as exc:
            self.record_validation_failed(exc, now)
            raise

    def _refuse_to_start(self, stage: Stage, now: datetime, blockers: Sequence[str]) -> None:
        """Record a refusal to start (``start_refused``) and raise GroupNotStartable, when anything blocks it."""
        if not blockers:
            return
        self.record(EventKind.START_REFUSED, now, {
            "reason": blockers[0], "blockers": list(blockers), "stage": stage.value, "wave": self.group.wave,
            "depends_on": {d: self.audit.stage_of(d).value for d in self.group.depends_on},
            "run_params": self.run_params.to_dict()})
        raise GroupNotStartable("; ".join(blockers))

    def existing_dual_write_since(self) -> float | None:
        """When the group's live dual-write began (its latest ``dual_write_deployed``), if it is live now."""
        if self.stage() not in DUAL_WRITE_ON:
            return None
        deployed = [e for e in self.audit.events(group=self.group.name) if e.kind == EventKind.DUAL_WRITE_DEPLOYED]
        since = deployed[-1].evidence_data.get("dual_write_since") if deployed else None
        return float(since) if since is not None else None

    def record_dry_run(self, step: str, now: datetime, would: str, **details: Any) -> dict[str, Any]:
        """A step a dry run skipped: what it would have done (``dry_run_step``, no stage move)."""
        evidence = {"dry_run": True, "step": step, "would": would, **details}
        self.record(EventKind.DRY_RUN_STEP, now, evidence)
        return redact(evidence)

    def _my_claim_seq(self) -> int | None:
        mine = [e.seq for e in self.audit.events(group=self.group.name, run_id=self.run_id)
                if e.kind == EventKind.VALIDATED]
        return mine[-1] if mine else None

    def _refuse_if_held(self, *, before_seq: int | None = None) -> None:
        """Refuse (``GroupNotStartable``) while another run holds the group (see ``holding_runs``)."""
        others = [e for e in holding_runs(self.audit.events(group=self.group.name), before_seq=before_seq)
                  if e.run_id != self.run_id]
        if others:
            held = others[0]
            raise GroupNotStartable(f"group {self.group.name!r} is held by run {held.run_id!r} (validated "
                                    f"{held.at.isoformat()}, audit seq {held.seq}); a second run starts only "
                                    "after that run completes or rolls back")

    def _validate(self, stage: Stage, now: datetime, *, dry_run: Mapping[str, Any] | None = None) -> dict[str, Any]:
        problems = []
        if not self.backends.source.ready():
            problems.append(f"source {self.backends.source.base_url} is unreachable or not ready")
        target_problem = self.backends.target_problem()
        if target_problem:
            problems.append(f"target {target_problem}")
        if self.backends.source_config_path and not Path(self.backends.source_config_path).is_file():
            problems.append(f"source config {self.backends.source_config_path} does not exist")
        if problems:
            raise RuntimeError(redact_text("; ".join(problems)))
        # What the keep filter will ship (with aggregations: their level's series, recorded only once deployed).
        series = self.backends.source.scalar(self.group.shipped_series_query()) or 0
        evidence = {"stage": stage.value, "selector": self.group.selector(), "source_series": int(series),
                    "source": self.backends.source.base_url, "target": self.backends.target.base_url,
                    # The group's (source, target) connections: with the group, the key of its route and quota.
                    "connections": {"source": self.group.source, "target": self.group.target}}
        if self.backends.target_identity:
            evidence["target_backend"] = dict(self.backends.target_identity)
        if series == 0:
            raise RuntimeError(f"the source has no series for {self.group.selector()}; nothing to migrate")
        evidence["run_params"] = self.run_params.to_dict()
        evidence.update(dry_run or {})  # a dry run's validated event: what would refuse a real run
        self.record(EventKind.VALIDATED, now, evidence)
        return redact(evidence)

    def record_validation_failed(self, exc: BaseException, now: datetime) -> str:
        """Record why validation failed (``validation_failed``); return that one-line reason."""
        return record_validation_failed(self.audit, group_name=self.group.name, run_id=self.run_id, exc=exc, now=now,
                                        source_config_path=self.backends.source_config_path, actor=self.actor,
                                        run_params=self.run_params.to_dict())

    def snapshot(self, now: datetime) -> dict[str, Any]:
        """Keep what the deploy will change (the source config's exact bytes, the scraper, the object) for rollback
        (``DeployStep.snapshot``)."""
        return self.deploy_step.snapshot(now)

    def _load_snapshot(self, info: Mapping[str, Any]) -> Any:
        """The stored snapshot, checked against the hash recorded when it was taken (``SnapshotError``)."""
        from promshift.steps.deploy import SnapshotLost

        try:
            snapshot = self.deploy_step.load(info)
        except SnapshotLost as exc:
            raise SnapshotError(str(exc)) from None
        return _Loaded(snapshot.content.encode("utf-8"), snapshot.sha256)

    def deploy_dual_write(self, snapshot_info: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """Deploy the group's dual-write (``DeployStep.start``): the evidence once it is live at once (the file
        path), else ``{"waiting": <DeployResult dict>, "quota"}`` for a trigger to follow (``finish_deploy``).

        Idempotent for a retry of this run: a recorded ``dual_write_deployed`` is re-confirmed live and returned.
        """
        from promshift.core.deploy import DeployResult
        from promshift.steps.deploy import final_event

        step = self.deploy_step
        done = step.recorded_deploy()
        if done is not None:
            return done
        out = step.start(snapshot_info, now)
        result = DeployResult.from_dict(out["deploy"])
        if not result.state.final:
            return {"waiting": out["deploy"], "quota": out["quota"]}
        return step.finish(final_event(result), out["quota"], now, snapshot_info=snapshot_info)

    def finish_deploy(self, event: Mapping[str, Any], quota: Mapping[str, Any] | None, now: datetime,
                      snapshot_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A followed deploy's final event (``DeployStep.finish``)."""
        return self.deploy_step.finish(event, quota, now, snapshot_info=snapshot_info)

    def start_warmup(self, now: datetime) -> None:
        policy = self.group.warmup
        duration_s, timeout_s = self.run_params.warmup(policy.duration_s, policy.timeout_s)
        evidence: dict[str, Any] = {"policy": _policy_dict(policy)}
        if self.run_params.warmup_override_s is not None:  # the trigger form's warm-up, for this run only
            evidence["override"] = {"warmup_override": self.run_params.warmup_override, "duration_s": duration_s,
                                    "timeout_s": timeout_s}
        self.record(EventKind.WARMUP_STARTED, now, evidence, to=Stage.WARMING)

    def finish_warmup(self, event: Mapping[str, Any], now: datetime) -> None:
        # The trigger ends with ready, timeout or error; anything else is recorded as an error, with the event.
        self.record(WARMUP_ENDED.get(str(event.get("status")), EventKind.WARMUP_ERROR), now, dict(event))

    def parity(self, *, dual_write_since: float, now: datetime) -> ParityResult:
        """Coverage, label parity and raw samples of a deterministic host sample (see ParityCheck); a source
        declared as replicas: the target against the replica its dedup kept (``core.ha``)."""
        if self.group.replicas.enabled and self.backends.replica_sources is not None:
            return self.probes.ha_parity(self.group, self.backends.replica_sources(), self.backends.target,
                                         catalog_dir=self.catalog_dir, limits=self.backends.target_limits).run(
                dual_write_since=dual_write_since, now=now.timestamp())
        return self.probes.parity(self.group, self.backends.source, self.backends.target,
                                  catalog_dir=self.catalog_dir, limits=self.backends.target_limits).run(
            dual_write_since=dual_write_since, now=now.timestamp())

    def latency(self, now: datetime, *, dual_write_since: float | None = None) -> LatencyResult:
        """Each window's golden queries on both backends (see LatencyProbe), plus the cost projection."""
        probe = self.probes.latency(self.backends.source, self.backends.target, self.group.latency,
                                    min_step_s=self.group.parity.step_s,
                                    target_retention=self.backends.target_retention,
                                    target_limits=self.backends.target_limits)
        queries = list(self.group.latency.queries) or [f"count({self.group.selector()})"]
        result = probe.run(now=now.timestamp(), queries=queries, dual_write_since=dual_write_since,
                           history_selector=self.group.selector(), group=self.group)
        try:
            cost = self.cost_projection(result.runs)
        except (PrometheusError, CostConfigError, OSError, ValueError) as exc:
            log.warning("cost projection unavailable: %s", exc)
            cost = CostEvidence.unavailable(str(exc))
        return result.with_cost(cost)

    def cost_projection(self, runs: Sequence[ProbeRun]) -> CostEvidence:
        """Monthly AMP cost of the group: ingestion, storage, and its golden queries at dashboard refresh.

        Samples per query are the target's own count (``stats=all``) for the longest window
        measured; without it they are estimated from series x window / scrape interval.
        """
        policy = self.group.latency
        series = int(self.backends.source.scalar(f"count({self.group.selector()})") or 0)
        scrape_s = scrape_interval_s(self.backends.source.config_text())
        longest = max(policy.windows, key=lambda w: w.seconds)
        costs = []
        for query in policy.queries or [f"count({self.group.selector()})"]:
            measured = [r.samples for r in runs if r.backend == "target" and r.window == longest.name
                        and r.query == query and r.ok and r.samples is not None]
            if measured:
                samples, exact = sorted(measured)[len(measured) // 2], True
            else:
                # A range query counts samples per step (as Prometheus' totalQueryableSamples does).
                step = choose_step(longest.seconds, min_step_s=self.group.parity.step_s)
                samples = estimate_range_samples(series=series, range_s=longest.seconds, step_s=step,
                                                 scrape_interval_s=scrape_s,
                                                 selector_window_s=widest_range_s(query))
                exact = False
            costs.append(QueryCost(query=query, window_s=longest.seconds, samples_processed=samples, measured=exact))
        projection = project_monthly_cost(
            active_series=series, scrape_interval_s=scrape_s, retention_days=policy.retention_s / 86_400,
            queries=costs, dashboard_refresh_s=policy.dashboard_refresh_s,
            dashboard_viewers=policy.dashboard_viewers, prices=self.probes.amp_prices())
        return CostEvidence(projection, active_series=series, scrape_interval_s=scrape_s, window=longest.name,
                            dashboard_refresh_s=policy.dashboard_refresh_s, dashboard_viewers=policy.dashboard_viewers)

    def gate(self, parity: ParityResult | Mapping[str, Any], latency: LatencyResult | Mapping[str, Any],
             now: datetime) -> GateVerdict:
        """Decide and record the gate (a real run's: ``steps.effects`` records a dry run's); ``parity``/``latency``
        are the results or their XCom (``to_dict``) form."""
        decided = self.decide_gate(parity, latency)
        verdict, evidence = decided.gate, decided.to_dict()
        if verdict.verdict == Verdict.SUCCESSFUL:
            self.record(EventKind.GATE_PASSED, now, evidence, to=Stage.VERIFIED)
        elif verdict.action == GateAction.ASK_APPROVAL:
            self.record(EventKind.GATE_INCONCLUSIVE, now, evidence)
        else:
            self.record(EventKind.GATE_FAILED, now, evidence)
        return verdict

    @staticmethod
    def decide_gate(parity: ParityResult | Mapping[str, Any], latency: LatencyResult | Mapping[str, Any]
                    ) -> GateEvidence:
        """The gate's decision on the results or their XCom (``to_dict``) form; nothing recorded."""
        if not isinstance(parity, ParityResult):
            parity = ParityResult.from_dict(parity)
        if not isinstance(latency, LatencyResult):
            latency = LatencyResult.from_dict(latency)
        return GateEvidence.decide(parity, latency)

    def gate_event(self) -> AuditEvent | None:
        """This run's latest gate decision as the audit log holds it (``gate_*``, or a dry run's ``dry_run_gate``):
        its evidence is the ``GateEvidence`` the gate decided on, the same the gate task hands on as its XCom."""
        decided = [e for e in self.audit.events(group=self.group.name, run_id=self.run_id)
                   if e.kind in GATE_DECIDED or e.kind == EventKind.DRY_RUN_GATE]
        return decided[-1] if decided else None

    def record_evidence_shown(self, *, evidence_sha256: str, approvers: Sequence[str], now: datetime,
                                  board_url: str | None = None) -> AuditEvent:
        """The approval was asked for on evidence hashing to ``evidence_sha256`` (shown in the HITL body)."""
        evidence: dict[str, Any] = {"evidence_sha256": evidence_sha256, "approvers": list(approvers)}
        if board_url:
            evidence["board_url"] = board_url
        return self.record(EventKind.EVIDENCE_SHOWN, now, evidence)

    def approval_request(self) -> AuditEvent | None:
        """This run's latest ``evidence_shown`` event: the evidence the approver was shown."""
        asked = [e for e in self.audit.events(group=self.group.name)
                 if e.run_id == self.run_id and e.kind == EventKind.EVIDENCE_SHOWN]
        return asked[-1] if asked else None

    def record_approval(self, *, decision: str, by: str, comment: str, now: datetime,
                        hitl: Mapping[str, Any] | None = None, evidence_sha256: str | None = None,
                        current_sha256: str | None = None, recorded_sha256: str | None = None,
                        prefix: str = "", form: Mapping[str, Any] | None = None) -> None:
        """``hitl`` names Airflow's HITL record the answer came from, so the two can be compared.

        ``prefix`` names another approval than the cut-over's (``decommission_``): its events are
        ``<prefix>approved`` / ``<prefix>approval_<decision>`` and never move the stage.

        ``evidence_sha256`` is the hash of the evidence the approver was shown; ``current_sha256``
        the evidence's hash when the answer arrived, recorded when it differs (a refused approval);
        ``recorded_sha256`` the hash of the gate evidence the audit log holds for this run, recorded when it
        differs from the one shown (a refused approval: the approver was not shown the audited evidence).
        ``form``: the approver's other form fields (the decommission's ``accept_history_loss``), recorded as given.
        """
        evidence: dict[str, Any] = {**dict(form or {}), "decision": decision, "by": by, "comment": comment}
        if hitl is not None:
            evidence["hitl"] = dict(hitl)
        if evidence_sha256 is not None:
            evidence["evidence_sha256"] = evidence_sha256
        if current_sha256 is not None and current_sha256 != evidence_sha256:
            evidence["current_sha256"] = current_sha256
        if recorded_sha256 is not None and recorded_sha256 != evidence_sha256:
            evidence["recorded_sha256"] = recorded_sha256
        kind = approval_kind(decision, prefix=prefix)
        moves = decision == "Approve" and not prefix
        self.record(kind, now, evidence, to=Stage.APPROVED if moves else None, actor=by)

    def cutover(self, now: datetime) -> dict[str, Any]:
        """Route the group's reads to the target in the routing store (one transaction on the group's row)."""
        done = self.recorded(EventKind.CUT_OVER, Stage.CUT_OVER)
        if done is not None and self.routing.read_from(self.group.name) == "target":
            return redact(done.evidence_data)
        route = self.routing.route(self.group.name, read_from="target", url=self.backends.target.base_url,
                                   at=now, run_id=self.run_id, pair=self.group.pair)
        evidence = {"routing": route, "manifest": self.routing.where}
        self.record(EventKind.CUT_OVER, now, evidence, to=Stage.CUT_OVER)
        return redact(evidence)

    def complete(self, now: datetime) -> dict[str, Any]:
        """Close a successful run: the group reads from the target and keeps dual-writing."""
        evidence = {"routing": self.routing.get(self.group.name),
                    "next": "bake, then decommission the group on the source (a later run)"}
        self.record(EventKind.RUN_COMPLETE, now, evidence)
        return redact(evidence)

    def failure_reason(self) -> str:
        """Why this run is rolling back, in plain words, from the run's own audit events."""
        for ev in reversed(self.audit.events(group=self.group.name, run_id=self.run_id)):
            data = ev.evidence_data
            if ev.kind == EventKind.GATE_FAILED or (ev.kind == EventKind.DRY_RUN_GATE and
                                                    GateEvidence.from_dict(data).gate.action == GateAction.ROLL_BACK):
                gate = GateEvidence.from_dict(data)
                parts = [f"{check} {m.verdict.value} ({m.name}: {m.reason})" for check, m in gate.not_passed()]
                return "; ".join(parts) or gate.gate.reason
            if ev.kind in APPROVAL_REFUSALS:
                return (f"approval {data['decision']} by {data['by']}"
                        + (f": {data['comment']}" if data.get("comment") else ""))
            # The deploy path's own refusal (AWS's reason).
            if ev.kind in (EventKind.DEPLOY_FAILED, EventKind.QUOTA_REFUSED, EventKind.QUEUE_CAP_REFUSED):
                return f"{ev.kind.replace('_', ' ')}: {data.get('reason')}"
            if ev.kind in (EventKind.WARMUP_TIMEOUT, EventKind.WARMUP_ERROR, EventKind.WARMUP_FAILED):
                return f"warm-up {data.get('status')}: {data.get('reason')}"
            if ev.kind == EventKind.VALIDATION_FAILED:
                return f"validation failed: {data.get('reason')}"
        return "a step failed before the gate; see that task's log"

    def rollback(self, snapshot_info: Mapping[str, Any] | None, *, reason: str, now: datetime) -> dict[str, Any]:
        """Put the snapshot back through the deploy driver (``DeployStep.restore``), then route reads to the source.

        Without a snapshot nothing was deployed (``rollback_not_needed``). A restore that is final at once (the
        file path) is recorded here (``rolled_back``); one that must be followed returns
        ``{"waiting": <DeployResult dict>}`` for a trigger, and ``finish_rollback`` records it.
        """
        from promshift.steps.deploy import final_event

        if not snapshot_info:
            mine = steps_of(self.audit.events(group=self.group.name, run_id=self.run_id))
            if mine and mine[-1].kind == EventKind.ROLLBACK_NOT_NEEDED:  # a retry: already recorded
                return redact(mine[-1].evidence_data)
            evidence = {"performed": False, "restored_identical": None, "reason": reason,
                        "detail": "no snapshot was taken, so nothing was deployed"}
            self.record(EventKind.ROLLBACK_NOT_NEEDED, now, evidence)
            return evidence
        result = self.deploy_step.restore(snapshot_info, reason=reason, now=now)
        if not result.state.final:
            return {"waiting": result.to_dict()}
        return self.deploy_step.finish_rollback(final_event(result), snapshot_info, reason=reason, now=now)

    def finish_rollback(self, event: Mapping[str, Any], snapshot_info: Mapping[str, Any], *, reason: str,
                        now: datetime) -> dict[str, Any]:
        """A followed restore's final event (``DeployStep.finish_rollback``)."""
        return self.deploy_step.finish_rollback(event, snapshot_info, reason=reason, now=now)


@dataclass(frozen=True)
class _Loaded:
    """A stored snapshot's bytes and hash, as read back."""

    data: bytes
    sha256: str


def one_line(exc: BaseException) -> str:
    """An exception as one line: its first line, else its class name (messages here never carry secrets)."""
    text = str(exc).strip()
    return " ".join(text.splitlines()[0].split()) if text else exc.__class__.__name__


def record_validation_failed(audit: AuditLog, *, group_name: str, run_id: str, exc: BaseException, now: datetime,
                             source_config_path: str | None = None, actor: str = "promshift",
                             run_params: Mapping[str, Any] | None = None) -> str:
    """Append a ``validation_failed`` event: the one-line reason, whether a retry may pass, and the source
    config's sha256 (nothing was deployed: a later check can compare it). Returns the reason.

    Also called by the validate operator when the backends cannot even be built (an AMP workspace
    that is not ACTIVE, refused credentials, ...), before any GroupMigration exists.
    """
    reason = one_line(exc)
    evidence: dict[str, Any] = {"reason": reason, "error": exc.__class__.__name__,
                                "retryable": bool(getattr(exc, "retryable", False))}
    # The AWS error code, also when the operator re-raised an AmpError as a non-retryable failure.
    code = getattr(exc, "code", None) or getattr(exc.__context__, "code", None)
    if code:
        evidence["code"] = str(code)
    if source_config_path and Path(source_config_path).is_file():
        evidence["source_config_sha256"] = sha256_bytes(Path(source_config_path).read_bytes())
    if run_params is not None:
        evidence["run_params"] = dict(run_params)
    audit.append(group=group_name, run_id=run_id, kind=EventKind.VALIDATION_FAILED, actor=actor, at=now,
                 evidence=json_safe(redact(evidence)), stage_from=None, stage_to=None)
    return reason


def record_event(audit: AuditLog, *, group_name: str, run_id: str, kind: EventKind, evidence: Mapping[str, Any],
                 now: datetime, actor: str = "promshift") -> AuditEvent:
    """Append a stage-less event (no transition), redacted and JSON-safe, as ``record_validation_failed`` does."""
    return audit.append(group=group_name, run_id=run_id, kind=kind, actor=actor, at=now,
                        evidence=json_safe(redact(dict(evidence))), stage_from=None, stage_to=None)


def scrape_interval_s(config_text: str) -> float:
    """The global scrape interval of a loaded Prometheus config (Prometheus' default is 1m)."""
    data = parse_yaml_bounded(config_text, CONFIG) or {}
    return parse_duration((data.get("global") or {}).get("scrape_interval", "1m"))


def _policy_dict(policy: Any) -> dict[str, Any]:
    return dataclasses.asdict(policy)


