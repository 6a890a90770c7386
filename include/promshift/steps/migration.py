"""The steps of one metric group's migration, as plain Python around the pure core.

Airflow operators call these; tests can too, without Airflow. Every step that changes
something records an audit event with its evidence.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.blobs import Blobs, LocalBlobs
from promshift.adapters.deploy import ConfigSnapshot, DeployError, FileConfigDeployer, FileDeployOutcome
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.adapters.routing import RoutingError, RoutingStore
from promshift.adapters.snapshot_store import snapshot_key
from promshift.core.audit import AuditEvent
from promshift.core.catalog import MetricGroup
from promshift.core.cost import (
    CostConfigError,
    CostEvidence,
    QueryCost,
    estimate_range_samples,
    project_monthly_cost,
)
from promshift.core.durations import parse_duration
from promshift.core.events import (
    APPROVAL_REFUSALS,
    GATE_DECIDED,
    RELEASES_GROUP,
    SIDE_EVENTS,
    WARMUP_ENDED,
    EventKind,
    approval_kind,
)
from promshift.core.evidence import json_safe
from promshift.core.gate import GateAction, GateEvidence, GateVerdict
from promshift.core.inputs import CONFIG, parse_yaml_bounded
from promshift.core.latency import LatencyResult, ProbeRun, choose_step
from promshift.core.parity import ParityResult
from promshift.core.promql import widest_range_s
from promshift.core.redact import redact, redact_text
from promshift.core.render import (
    RenderError,
    add_remote_write,
    remote_write_entry,
    remote_write_name,
    remote_write_names,
    remove_remote_write,
    sha256_bytes,
)
from promshift.core.run_params import RunParams
from promshift.core.stages import CUT_OVER_OR_LATER, DUAL_WRITE_ON, STARTABLE, TRANSITIONS, Stage, transition
from promshift.core.verdicts import Verdict
from promshift.core.warmup import WarmupObservation, parse_remote_write_lag

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
        # A dry run changes nothing, so it never holds the group.
        if (ev.kind == EventKind.VALIDATED and not ev.evidence_data.get("dry_run")
                and (before_seq is None or ev.seq < before_seq)):
            claims.setdefault(ev.run_id, ev)
        elif ev.kind in RELEASES_GROUP:
            claims.pop(ev.run_id, None)
    return sorted(claims.values(), key=lambda e: e.seq)


class SnapshotError(RuntimeError):
    """A recorded snapshot file is missing, unreadable or no longer matches its hash."""


@dataclass(frozen=True)
class Backends:
    """Where the group's data lives: the self-hosted source and the AMP(-like) target."""

    source: PrometheusClient
    target: PrometheusClient
    source_config_path: str
    target_remote_write_url: str
    promtool: str = "promtool"
    # An AMP target: the remote_write entry's sigv4 block ({region, role_arn?}); None writes unsigned.
    target_sigv4: Mapping[str, str] | None = None
    # Why the target cannot be used now, or None; None here means its /-/ready (self-hosted Prometheus).
    target_ready: Callable[[], str | None] | None = None
    # (seconds, origin) of the target's retention from its control plane; None: ask the server, then the catalog.
    target_retention: Callable[[], tuple[float | None, str]] | None = None
    # What the audit records about the target ({kind: amp, workspace_id, region}); never credentials.
    target_identity: Mapping[str, Any] = field(default_factory=dict)
    # The target's Alertmanager: alertname -> the alerts it holds active for it (``adapters.alertmanager``);
    # None: no Alertmanager known for the target (the bake's delivery check is then INCONCLUSIVE).
    target_alerts: Callable[[str], Sequence[Any]] | None = None
    # The target's discarded samples by reason: (since, now) -> {reason: n} (an AMP workspace's DiscardedSamples,
    # ``adapters.ingest_health``); None: the target publishes none (a self-hosted Prometheus).
    target_discards: Callable[[datetime, datetime], Mapping[str, float]] | None = None
    # A source that runs as replicas (the group's ``replicas.sources``): (replica, its Prometheus) in catalog order;
    # parity compares the target with the one its dedup kept (``adapters.parity_ha``). None: the one source.
    replica_sources: Callable[[], Sequence[tuple[str, PrometheusClient]]] | None = None
    # The target workspace's configuration (``core.tenants.WorkspaceConfigurationPort``): where a group's tenant
    # limit is set. None: the target has none (a self-hosted Prometheus), and a group with a tenant is refused.
    workspace_configuration: Any = None

    def target_problem(self) -> str | None:
        if self.target_ready is not None:
            return self.target_ready()
        return None if self.target.ready() else f"{self.target.base_url} is unreachable or not ready"


def observe_warmup(*, group_name: str, selector: str, source: PrometheusClient, target: PrometheusClient,
                   elapsed_s: float, read_discards: Callable[[datetime, datetime], Any] | None = None,
                   now: datetime | None = None) -> WarmupObservation:
    """Poll both sides once: series counts of the group, the group's remote-write queue lag and failed samples,
    and (``read_discards``: an AMP target) the workspace's discarded samples since the dual-write began."""
    from promshift.adapters.ingest_health import with_ingestion_health

    count = f"count({selector})"
    src = source.scalar(count) or 0.0
    tgt = target.scalar(count) or 0.0
    lag, failed = parse_remote_write_lag(source.metrics_text(), remote_write_name(group_name))
    obs = WarmupObservation(elapsed_s=elapsed_s, source_series=int(src), target_series=int(tgt),
                            lag_s=lag, failed_samples=failed)
    if now is None:
        return obs
    return with_ingestion_health(obs, read_discards=read_discards, source=source, target=target, selector=selector,
                                 since=now - timedelta(seconds=elapsed_s), now=now)


class GroupMigration:
    """One DAG run's work on one metric group."""

    def __init__(self, group: MetricGroup, backends: Backends, *, audit: AuditStore, routing: RoutingStore,
                 snapshots_dir: str | Path, run_id: str, actor: str = "promshift",
                 catalog_dir: Path | None = None, snapshot_blobs: Blobs | None = None,
                 run_params: RunParams | None = None) -> None:
        self.group = group
        # What the trigger form asked for (dry run, change ticket, warm-up override, reason).
        self.run_params = run_params or RunParams()
        self.backends = backends
        self.audit = audit
        self.routing = routing
        self.snapshots_dir = Path(snapshots_dir)
        # Where snapshots go: an object store every worker reads (operators), else ``snapshots_dir``.
        self.snapshot_blobs: Blobs = snapshot_blobs or LocalBlobs(self.snapshots_dir)
        self.run_id = run_id
        self.actor = actor
        self.catalog_dir = catalog_dir

    # -- helpers -------------------------------------------------------------------------
    @property
    def deployer(self) -> FileConfigDeployer:
        return FileConfigDeployer(self.backends.source_config_path, self.backends.source,
                                  promtool=self.backends.promtool)

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
        if blockers and not self.dry_run:
            self.record(EventKind.START_REFUSED, now, {
                "reason": blockers[0], "blockers": blockers, "stage": stage.value, "wave": self.group.wave,
                "depends_on": {d: self.audit.stage_of(d).value for d in self.group.depends_on},
                "run_params": self.run_params.to_dict()})
            raise GroupNotStartable("; ".join(blockers))
        try:
            if not self.dry_run:  # a dry run changes nothing: it may run beside a run that holds the group
                self._refuse_if_held()
            evidence = self._validate(stage, now, would_refuse=blockers)
            # Two runs that validated at once: the chain orders their claims, and the earlier one wins.
            if not self.dry_run:
                self._refuse_if_held(before_seq=self._my_claim_seq())
            return evidence
        except Exception as exc:
            self.record_validation_failed(exc, now)
            raise

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

    def _validate(self, stage: Stage, now: datetime, *, would_refuse: Sequence[str] = ()) -> dict[str, Any]:
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
        series = self.backends.source.scalar(f"count({self.group.selector()})") or 0
        evidence = {"stage": stage.value, "selector": self.group.selector(), "source_series": int(series),
                    "source": self.backends.source.base_url, "target": self.backends.target.base_url,
                    # The group's (source, target) connections: with the group, the key of its route and quota.
                    "connections": {"source": self.group.source, "target": self.group.target}}
        if self.backends.target_identity:
            evidence["target_backend"] = dict(self.backends.target_identity)
        if series == 0:
            raise RuntimeError(f"the source has no series for {self.group.selector()}; nothing to migrate")
        evidence["run_params"] = self.run_params.to_dict()
        if self.dry_run:
            evidence.update(dry_run=True, would_refuse=list(would_refuse))
        self.record(EventKind.VALIDATED, now, evidence)
        return redact(evidence)

    def record_validation_failed(self, exc: BaseException, now: datetime) -> str:
        """Record why validation failed (``validation_failed``); return that one-line reason."""
        return record_validation_failed(self.audit, group_name=self.group.name, run_id=self.run_id, exc=exc, now=now,
                                        source_config_path=self.backends.source_config_path, actor=self.actor,
                                        run_params=self.run_params.to_dict())

    def snapshot(self, now: datetime) -> dict[str, Any]:
        """Keep the source config's exact bytes so any later failure can restore them.

        The snapshot file gets the source's mode or stricter (never wider than 0644, and never
        executable): it holds the same credentials as the config.
        """
        snap = self.deployer.snapshot()
        ref = self.snapshot_blobs.put(snapshot_key(self.group.name, self.run_id, "yml"), snap.data,
                                      mode=(snap.mode if snap.mode is not None else 0o600) & 0o644)
        info = {"snapshot_path": ref, "config_path": snap.path, "sha256": snap.sha256,
                "bytes": len(snap.data), "mode": f"{snap.mode:04o}" if snap.mode is not None else None,
                "uid": snap.uid, "gid": snap.gid}
        self.record(EventKind.SNAPSHOT_TAKEN, now, info)
        return info

    def _load_snapshot(self, info: Mapping[str, Any]) -> ConfigSnapshot:
        """The snapshot's bytes, checked against the hash recorded when it was taken."""
        path = str(info["snapshot_path"])
        try:
            data = self.snapshot_blobs.get(path)
        except OSError as exc:
            raise SnapshotError(f"snapshot {path} cannot be read: {exc.strerror or exc}") from None
        if sha256_bytes(data) != info["sha256"]:
            raise SnapshotError(f"snapshot {path} does not match its recorded hash "
                                f"({sha256_bytes(data)[:12]} != {str(info['sha256'])[:12]})")
        mode = info.get("mode")
        return ConfigSnapshot.of(info["config_path"], data, mode=int(mode, 8) if mode else None,
                                 uid=info.get("uid"), gid=info.get("gid"))

    def deploy_dual_write(self, snapshot_info: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """Add the group's own remote_write entry with a keep-filter; verify it is live.

        Idempotent for a retry of this run: when the ``dual_write_deployed`` event is already
        recorded, the entry is re-verified live and the recorded evidence returned; when the
        config file already holds exactly this deploy's bytes (the edit happened, its event
        did not), it is verified live (reloaded if need be) and recorded once, not redeployed.
        """
        snap = self._load_snapshot(snapshot_info)
        tenant = self.set_tenant_limit()  # before any edit: a refused tenant leaves nothing deployed
        entry = remote_write_entry(group_name=self.group.name, name_regex=self.group.name_regex(),
                                   drop_labels=self.group.drop_labels, replicas=self.group.replicas,
                                   url=self.backends.target_remote_write_url, sigv4=self.backends.target_sigv4)
        new_data = add_remote_write(snap.data, entry)
        done = self.recorded(EventKind.DUAL_WRITE_DEPLOYED, Stage.DUAL_WRITING)
        if done is not None:
            self._verify_live(entry["name"])
            return redact(done.evidence_data)
        deployer = self.deployer
        resumed = deployer.real_path.read_bytes() == new_data != snap.data
        if resumed:
            log.warning("%s already holds remote_write %s from an earlier attempt of this run; verifying it",
                        deployer.config_path, entry["name"])
            result = FileDeployOutcome(before_sha256=snap.sha256, after_sha256=sha256_bytes(new_data),
                                  live_remote_writes=self._verify_live(entry["name"]))
        else:
            try:
                result = deployer.deploy(new_data, snapshot=snap, expect_remote_writes={entry["name"]})
            except DeployError as exc:
                # Not deployed (the deployer put the snapshot back): say so in the audit, with the reason.
                self.record(EventKind.DEPLOY_FAILED, now, {
                    "reason": redact_text(str(exc)), "remote_write": entry["name"],
                    "config_sha256": sha256_bytes(deployer.real_path.read_bytes()), "snapshot_sha256": snap.sha256})
                raise
        evidence = {"remote_write": entry["name"], "keep_regex": self.group.name_regex(),
                    "url": self.backends.target_remote_write_url, "config_before_sha256": result.before_sha256,
                    "config_after_sha256": result.after_sha256,
                    "live_remote_writes": list(result.live_remote_writes),
                    "dual_write_since": now.timestamp()}
        if "sigv4" in entry:
            evidence["sigv4"] = entry["sigv4"]
        if self.group.drop_labels:
            evidence["drop_labels"] = list(self.group.drop_labels)
        if tenant:
            evidence["tenant"] = tenant
        if self.group.replicas.enabled:
            evidence["replicas"] = {"replica_label": self.group.replicas.replica_label,
                                    "cluster_label": self.group.replicas.cluster_label}
        if resumed:
            evidence["resumed"] = "the config already held this entry from an earlier attempt; verified live"
        try:
            self.record(EventKind.DUAL_WRITE_DEPLOYED, now, evidence, to=Stage.DUAL_WRITING)
        except Exception:
            # Nothing stays deployed without its audit event: unless the event is known to be in the log
            # (committed, then the connection dropped), the snapshot goes back before the error is raised.
            self._undeploy_unrecorded(deployer, snap, entry["name"])
            raise
        return redact(evidence)

    def _undeploy_unrecorded(self, deployer: FileConfigDeployer, snap: ConfigSnapshot, name: str) -> None:
        try:
            if self.recorded(EventKind.DUAL_WRITE_DEPLOYED, Stage.DUAL_WRITING) is not None:
                return
        except Exception as exc:  # noqa: BLE001 - the audit database is what failed: it cannot say
            log.warning("cannot tell whether dual_write_deployed was recorded (%s); assuming it was not", exc)
        log.error("the dual_write_deployed audit event was not recorded; restoring %s without remote_write %s",
                  deployer.config_path, name)
        deployer.restore(snap)

    def _verify_live(self, name: str) -> tuple[str, ...]:
        """The source's loaded remote_write names, which must include ``name``; reloads once if it is missing
        (an attempt that wrote the file may have died before the reload)."""
        client = self.backends.source
        live = remote_write_names(client.config_text())
        if name not in live:
            client.reload()
            live = remote_write_names(client.config_text())
        if name not in live:
            raise DeployError(f"remote_write {name} is in {self.backends.source_config_path} but not in the "
                              f"loaded config of {redact_text(client.base_url)}")
        return tuple(live)

    def set_tenant_limit(self) -> dict[str, Any]:
        """The group's tenant (``tenant:``) pre-flighted and set in the workspace's ``limitsPerLabelSet``
        (``steps.tenants``); ``{}`` without one. Raises DeployError when refused, or when the target has no
        workspace configuration to hold it (fail closed: the limit the catalog asks for is never skipped)."""
        from promshift.steps.tenants import TenantRefused, apply_tenant

        if not self.group.tenant.enabled:
            return {}
        if self.backends.workspace_configuration is None:
            raise DeployError(f"group {self.group.name} declares a tenant, but its target has no workspace "
                              "configuration to hold the label-set limit (an AMP target has)")

        def count(client: PrometheusClient) -> Callable[[str], float]:
            return lambda selector: float(client.scalar(f"count({selector})") or 0.0)

        try:
            return apply_tenant(self.group, self.backends.workspace_configuration,
                                source_count=count(self.backends.source), target_count=count(self.backends.target))
        except TenantRefused as exc:
            raise DeployError(str(exc)) from None

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
        """Coverage, label parity and raw samples of a deterministic host sample (see ParityCheck)."""
        from promshift.adapters.parity_check import ParityCheck

        if self.group.replicas.enabled and self.backends.replica_sources is not None:
            from promshift.adapters.parity_ha import HaParityCheck

            return HaParityCheck(self.group, self.backends.replica_sources(), self.backends.target,
                                 catalog_dir=self.catalog_dir).run(dual_write_since=dual_write_since,
                                                                   now=now.timestamp())
        return ParityCheck(self.group, self.backends.source, self.backends.target,
                           catalog_dir=self.catalog_dir).run(
            dual_write_since=dual_write_since, now=now.timestamp())

    def latency(self, now: datetime, *, dual_write_since: float | None = None) -> LatencyResult:
        """Each window's golden queries on both backends (see LatencyProbe), plus the cost projection."""
        from promshift.adapters.latency_probe import LatencyProbe

        probe = LatencyProbe(self.backends.source, self.backends.target, self.group.latency,
                             min_step_s=self.group.parity.step_s, target_retention=self.backends.target_retention)
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
        from promshift.adapters.settings import amp_prices

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
            dashboard_viewers=policy.dashboard_viewers, prices=amp_prices())
        return CostEvidence(projection, active_series=series, scrape_interval_s=scrape_s, window=longest.name,
                            dashboard_refresh_s=policy.dashboard_refresh_s, dashboard_viewers=policy.dashboard_viewers)

    def gate(self, parity: ParityResult | Mapping[str, Any], latency: LatencyResult | Mapping[str, Any],
             now: datetime) -> GateVerdict:
        """Decide and record the gate; ``parity``/``latency`` are the results or their XCom (``to_dict``) form."""
        if not isinstance(parity, ParityResult):
            parity = ParityResult.from_dict(parity)
        if not isinstance(latency, LatencyResult):
            latency = LatencyResult.from_dict(latency)
        decided = GateEvidence.decide(parity, latency)
        verdict, evidence = decided.gate, decided.to_dict()
        if self.dry_run:  # the verdict, recorded; the stage never moves in a dry run
            self.record(EventKind.DRY_RUN_GATE, now, {**evidence, "dry_run": True})
        elif verdict.verdict == Verdict.SUCCESSFUL:
            self.record(EventKind.GATE_PASSED, now, evidence, to=Stage.VERIFIED)
        elif verdict.action == GateAction.ASK_APPROVAL:
            self.record(EventKind.GATE_INCONCLUSIVE, now, evidence)
        else:
            self.record(EventKind.GATE_FAILED, now, evidence)
        return verdict

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
                        prefix: str = "") -> None:
        """``hitl`` names Airflow's HITL record the answer came from, so the two can be compared.

        ``prefix`` names another approval than the cut-over's (``decommission_``): its events are
        ``<prefix>approved`` / ``<prefix>approval_<decision>`` and never move the stage.

        ``evidence_sha256`` is the hash of the evidence the approver was shown; ``current_sha256``
        the evidence's hash when the answer arrived, recorded when it differs (a refused approval);
        ``recorded_sha256`` the hash of the gate evidence the audit log holds for this run, recorded when it
        differs from the one shown (a refused approval: the approver was not shown the audited evidence).
        """
        evidence: dict[str, Any] = {"decision": decision, "by": by, "comment": comment}
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
            if ev.kind in (EventKind.DEPLOY_FAILED, EventKind.QUOTA_REFUSED):
                return f"{ev.kind.replace('_', ' ')}: {data.get('reason')}"
            if ev.kind in (EventKind.WARMUP_TIMEOUT, EventKind.WARMUP_ERROR, EventKind.WARMUP_FAILED):
                return f"warm-up {data.get('status')}: {data.get('reason')}"
            if ev.kind == EventKind.VALIDATION_FAILED:
                return f"validation failed: {data.get('reason')}"
        return "a step failed before the gate; see that task's log"

    def rollback(self, snapshot_info: Mapping[str, Any] | None, *, reason: str, now: datetime) -> dict[str, Any]:
        """Restore the snapshot byte for byte, reload, verify, route reads back to the source.

        When the snapshot file is lost or no longer matches its hash, the group's own entry is
        removed by name instead (``method: removed_entry``): that edit is the exact inverse of
        the deploy, so the file is identical when its hash equals the one recorded at the
        snapshot. Either way the live config is checked and the audit says what was done; a
        failure is recorded as ``rollback_failed`` before it is raised, and an unreadable routing
        store is recorded with the rollback, then raised.
        """
        mine = steps_of(self.audit.events(group=self.group.name, run_id=self.run_id))
        last_kind = mine[-1].kind if mine else None
        if not snapshot_info:
            if last_kind == EventKind.ROLLBACK_NOT_NEEDED:  # a retry: already recorded
                return redact(mine[-1].evidence_data)
            evidence = {"performed": False, "restored_identical": None, "reason": reason,
                        "detail": "no snapshot was taken, so nothing was deployed"}
            self.record(EventKind.ROLLBACK_NOT_NEEDED, now, evidence)
            return evidence
        name = remote_write_name(self.group.name)
        if last_kind == EventKind.ROLLED_BACK and (found := self._still_rolled_back(snapshot_info)) is not None:
            # A retry after this run's rollback was recorded: report what is there now, record nothing.
            return redact({**mine[-1].evidence_data, "already_rolled_back": True, "found": found})
        evidence: dict[str, Any] = {"performed": True, "method": "snapshot", "reason": reason,
                                    "config_sha256": snapshot_info["sha256"]}
        try:
            try:
                snap: ConfigSnapshot | None = self._load_snapshot(snapshot_info)
            except SnapshotError as exc:
                log.warning("%s; removing remote_write %s by name instead", exc, name)
                snap = None
                evidence.update(method="removed_entry", snapshot_error=str(exc))
            if snap is not None and (kept := self._changes_since(snap, name)) is not None:
                # Another writer's change since the snapshot (another group's entry, deployed after ours):
                # writing the snapshot back would drop it. Remove only ours; the file is the snapshot plus theirs.
                log.warning("%s changed since the snapshot beyond remote_write %s; removing only that entry",
                            self.deployer.config_path, name)
                evidence.update(method="removed_entry", kept_changes_since_snapshot=kept)
                self._remove_own_entry(snapshot_info)
                identical = False
            else:
                identical = self.deployer.restore(snap) if snap else self._remove_own_entry(snapshot_info)
        except Exception as exc:
            self.record(EventKind.ROLLBACK_FAILED, now, {**evidence, "performed": False, "restored_identical": False,
                                                 "error": f"{type(exc).__name__}: {exc}"})
            raise
        try:
            still_live: bool | None = name in remote_write_names(self.backends.source.config_text())
        except (PrometheusError, RenderError, KeyError, TypeError, ValueError) as exc:
            still_live = None
            evidence["live_config_error"] = f"{type(exc).__name__}: {exc}"
        routing_error = None
        try:
            if self.routing.read_from(self.group.name) != "source":
                self.routing.route(self.group.name, read_from="source", url=self.backends.source.base_url,
                                   at=now, run_id=self.run_id, pair=self.group.pair)
        except RoutingError as exc:
            routing_error = exc
            evidence["routing_error"] = str(exc)
        evidence.update(restored_identical=identical and still_live is False, remote_write_still_live=still_live)
        if "kept_changes_since_snapshot" in evidence:
            # Not the snapshot's bytes, by design (another writer's change is kept); safe when our entry is gone
            # from both the file and the loaded config.
            evidence["own_entry_removed"] = (still_live is False
                                             and name not in remote_write_names(self.deployer.real_path.read_bytes()))
        stage = self.stage()
        to = Stage.ROLLED_BACK if Stage.ROLLED_BACK in TRANSITIONS[stage] else None
        self.record(EventKind.ROLLED_BACK, now, evidence, to=to)
        if routing_error is not None:
            raise routing_error
        return redact(evidence)

    def _changes_since(self, snap: ConfigSnapshot, name: str) -> list[str] | None:
        """None when the file is the snapshot, with or without our entry (restoring the snapshot undoes only
        us); else the remote_write names added since the snapshot other than ours (possibly none: a hand edit)."""
        current = self.deployer.real_path.read_bytes()
        if current == snap.data or remove_remote_write(current, name) == snap.data:
            return None
        before = set(remote_write_names(snap.data))
        return [n for n in remote_write_names(current) if n != name and n not in before]

    def _still_rolled_back(self, snapshot_info: Mapping[str, Any]) -> dict[str, Any] | None:
        """What a repeated rollback finds when the group's entry is gone from both the file and the loaded
        config and reads go to the source; None when any of that is no longer so (roll back again)."""
        name = remote_write_name(self.group.name)
        try:
            data = self.deployer.real_path.read_bytes()
            in_file = name in remote_write_names(data)
            live = name in remote_write_names(self.backends.source.config_text())
            read_from = self.routing.read_from(self.group.name)
        except (OSError, PrometheusError, RenderError, RoutingError, KeyError, TypeError, ValueError):
            return None
        if in_file or live or read_from != "source":
            return None
        return {"config_sha256": sha256_bytes(data), "identical_to_snapshot": sha256_bytes(data) == snapshot_info[
            "sha256"], "remote_write_live": False, "read_from": read_from}

    def _remove_own_entry(self, snapshot_info: Mapping[str, Any]) -> bool:
        """Remove the group's remote_write entry by name (deployed and verified); True when the
        file's bytes then hash to the snapshot's recorded sha256."""
        name = remote_write_name(self.group.name)
        deployer = self.deployer
        current = deployer.snapshot()
        new_data = remove_remote_write(current.data, name)
        if new_data != current.data:
            deployer.deploy(new_data, snapshot=current, expect_remote_writes=set(), expect_absent={name})
        else:
            deployer.client.reload()  # the file may be right and the server not: load it
        return sha256_bytes(deployer.real_path.read_bytes()) == snapshot_info["sha256"]


def one_line(exc: BaseException) -> str:
    """An exception as one line: its first line, else its class name (messages here never carry secrets)."""
    text = str(exc).strip()
    return " ".join(text.splitlines()[0].split()) if text else exc.__class__.__name__


def record_validation_failed(audit: AuditStore, *, group_name: str, run_id: str, exc: BaseException, now: datetime,
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


def record_event(audit: AuditStore, *, group_name: str, run_id: str, kind: EventKind, evidence: Mapping[str, Any],
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


