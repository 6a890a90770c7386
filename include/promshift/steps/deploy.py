"""The deploy part of a migration, over the ``core.deploy`` seam: the same calls whatever deploys.

``migration.GroupMigration`` (or its successor) calls these and records the audit events; they take
the deployer, the snapshot store and the quota pre-flight as arguments, so tests drive them with
``InMemoryConfigDeployer`` / ``InMemorySnapshotStore`` and production with ``FileDeployment`` or
``ScraperDeployer`` and ``FileSnapshotStore``.

1. ``take_snapshot`` -> XCom ``{"kind", "snapshot_ref", "ref", "sha256", "existed"}``;
2. ``start_deploy`` runs the quota pre-flight first (``QuotaExceeded`` before anything is deployed),
   then ``deployer.deploy`` -> XCom ``{"deploy": <DeployResult dict>, "quota": {...}}``; a WAITING
   result is followed by ``ScraperStatusTrigger`` (deferral), a DONE one goes straight on;
3. ``deploy_evidence`` -> the audit's / report's ``deploy: {kind, status_history, quota}``;
4. ``restore`` on rollback, followed the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from promshift.core.deploy import ConfigDeployer, DeployError, DeployResult, SnapshotStore
from promshift.core.deploy_kinds import Deploy, deploy_of
from promshift.core.events import EventKind
from promshift.core.quota import QuotaExceeded
from promshift.core.redact import redact
from promshift.core.stages import TRANSITIONS, Stage
from promshift.steps.migration import GroupMigration, steps_of

# (group_series, now) -> the audit's deploy.quota, or QuotaExceeded with nothing deployed.
QuotaCheck = Callable[[int, datetime], dict[str, Any]]


def take_snapshot(deployer: ConfigDeployer, store: SnapshotStore, *, group: str, run_id: str) -> dict[str, Any]:
    """Keep what is live now; the answer is JSON-safe (an XCom) and names the stored snapshot."""
    snapshot = deployer.snapshot()
    return {"kind": snapshot.kind, "snapshot_ref": store.put(group, run_id, snapshot), "ref": snapshot.ref,
            "sha256": snapshot.sha256, "existed": snapshot.existed}


def start_deploy(deployer: ConfigDeployer, store: SnapshotStore, snapshot_info: Mapping[str, Any], *,
                 now: datetime, quota: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Quota pre-flight (raises ``QuotaExceeded`` with nothing deployed), then the deploy; JSON-safe answer."""
    quota_evidence = quota() if quota is not None else None
    snapshot = store.get(str(snapshot_info["snapshot_ref"]))
    result = deployer.deploy(snapshot, now)
    return {"deploy": result.to_dict(), "quota": quota_evidence}


def deploy_evidence(result: DeployResult | Mapping[str, Any], quota: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{kind, status_history: [{status, at}], quota: {group_series, workspace_series, limit, share}}``."""
    deployed = result if isinstance(result, DeployResult) else DeployResult.from_dict(result)
    evidence: dict[str, Any] = {"kind": deployed.kind, "state": deployed.state.value,
                                "status_history": [c.to_dict() for c in deployed.status_history],
                                "reason": deployed.reason}
    if deployed.details.get("change"):  # a git deploy: repository, branch, commits, change request (no secret)
        evidence["change"] = dict(deployed.details["change"])
    if quota is not None:
        evidence["quota"] = {key: quota[key] for key in ("group_series", "workspace_series", "pending_series",
                                                         "pending_groups", "workspace_id", "limit", "share")
                             if key in quota}
    return evidence


def restore(deployer: ConfigDeployer, store: SnapshotStore, snapshot_info: Mapping[str, Any], *,
            now: datetime) -> DeployResult:
    """Put the snapshot back (or remove what the deploy created); WAITING results are followed like a deploy."""
    return deployer.restore(store.get(str(snapshot_info["snapshot_ref"])), now)


class DeployStepFailed(RuntimeError):
    """A deploy step ended without the group deployed (recorded in the audit first); one line."""


def quota_preflight(m: Any, check: QuotaCheck, *, deploy_kind: str, now: datetime) -> dict[str, Any]:
    """The quota pre-flight of every deploy path (a deployer's, the source file's): the group's series on the source
    against ``check``; ``quota_reserved`` when it fits (its series now count on the workspace for the other groups'
    pre-flights), else ``quota_refused`` and DeployStepFailed with nothing deployed."""
    series = int(m.backends.source.scalar(f"count({m.group.selector()})") or 0)
    try:
        evidence = check(series, now)
    except QuotaExceeded as exc:
        m.record(EventKind.QUOTA_REFUSED, now, {"reason": str(exc), "deploy": {
            "kind": deploy_kind, "status_history": [], "quota": exc.evidence}})
        raise DeployStepFailed(str(exc)) from None
    m.record(EventKind.QUOTA_RESERVED, now, {
        **{key: evidence[key] for key in ("workspace_id", "group_series", "workspace_series",
                                          "pending_series", "pending_groups", "share") if key in evidence},
        "connections": {"source": m.group.source, "target": m.group.target}})
    return evidence


def active_since(result: Mapping[str, Any], deploy: Deploy) -> float:
    """When the deploy was first seen live (its ``live_status``: ACTIVE for a scraper, the start of dual-write on
    that path), epoch s."""
    for change in reversed(result.get("status_history") or []):
        if change["status"] == deploy.live_status:
            return datetime.fromisoformat(change["at"]).timestamp()
    raise DeployStepFailed(f"the {deploy.kind}'s status history has no {deploy.live_status} entry; it never went live")


class DeployStep:
    """snapshot -> quota pre-flight -> deploy -> (trigger) -> finish; restore -> (trigger) -> finish_rollback.

    Over any ConfigDeployer: the managed collector's (live once ACTIVE) and the Kubernetes ones
    (``k8s-configmap``, ``k8s-cr``: live once the source's loaded config shows the entry, LIVE).
    """

    def __init__(self, migration: GroupMigration, deployer: ConfigDeployer, store: SnapshotStore, *,
                 quota: QuotaCheck | None) -> None:
        self.migration = migration
        self.deployer = deployer
        self.store = store
        self.quota = quota
        self.deploy = deploy_of(str(deployer.kind))

    def snapshot(self, now: datetime) -> dict[str, Any]:
        m = self.migration
        info = take_snapshot(self.deployer, self.store, group=m.group.name, run_id=m.run_id)
        m.record(EventKind.SNAPSHOT_TAKEN, now, info)
        return info

    def start(self, snapshot_info: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """Quota pre-flight, then the deploy; ``{"deploy": <WAITING or final result>, "quota"}`` for the trigger."""
        m = self.migration
        quota = None
        if self.quota is not None:
            check = self.quota

            def quota() -> dict[str, Any]:
                return quota_preflight(m, check, deploy_kind=self.deployer.kind, now=now)
        try:
            return start_deploy(self.deployer, self.store, snapshot_info, now=now, quota=quota)
        except DeployError as exc:
            m.record(EventKind.DEPLOY_FAILED, now, {"reason": str(exc), "deploy": {
                "kind": self.deployer.kind, "status_history": [], "reason": str(exc)}})
            raise DeployStepFailed(str(exc)) from None

    def finish(self, event: Mapping[str, Any], quota: Mapping[str, Any] | None, now: datetime) -> dict[str, Any]:
        """The trigger's event: DUAL_WRITING with the evidence when done; else ``deploy_failed`` and raise.

        A retry after this run recorded ``dual_write_deployed`` returns that record (no second event)."""
        done = self.migration.recorded("dual_write_deployed", Stage.DUAL_WRITING)
        if done is not None:
            return redact(done.evidence_data)
        evidence = deploy_evidence(event["result"], quota)
        if event.get("status") != "done":
            reason = str(event.get("reason") or evidence["reason"] or event.get("status"))
            self.migration.record(EventKind.DEPLOY_FAILED, now, {"reason": reason, "deploy": evidence})
            raise DeployStepFailed(f"{self.deploy.kind} deploy {event.get('status')}: {reason}")
        result = event["result"]
        details = result.get("details") or {}
        out = {"deploy": evidence, "dual_write_since": active_since(result, self.deploy)}
        out.update({"scraper_id": details.get("scraper_id")} if self.deploy.own_writer else
                   {"remote_write": details.get("remote_write")})
        self.migration.record(EventKind.DUAL_WRITE_DEPLOYED, now, out, to=Stage.DUAL_WRITING)
        return redact(out)

    def restore(self, snapshot_info: Mapping[str, Any], *, reason: str, now: datetime) -> DeployResult:
        """Start putting the snapshot back; a failure is recorded as ``rollback_failed`` and raised."""
        try:
            return restore(self.deployer, self.store, snapshot_info, now=now)
        except DeployError as exc:
            self.migration.record(EventKind.ROLLBACK_FAILED, now, {"performed": False, "reason": reason,
                                                           "error": str(exc)})
            raise DeployStepFailed(f"rollback: {exc}") from None

    def finish_rollback(self, event: Mapping[str, Any], snapshot_info: Mapping[str, Any], *, reason: str,
                        now: datetime) -> dict[str, Any]:
        """Record ``rolled_back`` (or ``rollback_failed``) from the restore's final result; reads go back to source.

        ``restored_identical``: what is live now (read again) is the snapshot (the same blob, or no scraper).
        A retry after this run recorded ``rolled_back`` reports what is live now and records nothing."""
        m = self.migration
        mine = steps_of(m.audit.events(group=m.group.name, run_id=m.run_id))
        if mine and mine[-1].kind == EventKind.ROLLED_BACK and event.get("status") == "done":
            found = {"restored_identical": self._live_is(snapshot_info), "read_from": m.routing.read_from(m.group.name)}
            return redact({**mine[-1].evidence_data, "already_rolled_back": True, "found": found})
        evidence: dict[str, Any] = {"performed": True, "method": f"{self.deploy.kind}_restore", "reason": reason,
                                    "deploy": deploy_evidence(event["result"], None)}
        if event.get("status") != "done":
            m.record(EventKind.ROLLBACK_FAILED, now, {**evidence, "performed": False,
                                              "error": str(event.get("reason") or event.get("status"))})
            raise DeployStepFailed(f"{self.deploy.kind} restore {event.get('status')}: {event.get('reason')}")
        if m.routing.read_from(m.group.name) != "source":
            m.routing.route(m.group.name, read_from="source", url=m.backends.source.base_url, at=now,
                            run_id=m.run_id, pair=m.group.pair)
        evidence["restored_identical"] = self._live_is(snapshot_info)
        to = Stage.ROLLED_BACK if Stage.ROLLED_BACK in TRANSITIONS[m.stage()] else None
        m.record(EventKind.ROLLED_BACK, now, evidence, to=to)
        return redact(evidence)

    def _live_is(self, snapshot_info: Mapping[str, Any]) -> bool:
        """What is live now (read again) is the snapshot: the same blob, or no scraper when there was none."""
        live = self.deployer.snapshot()
        return live.existed == bool(snapshot_info["existed"]) and live.sha256 == snapshot_info["sha256"]


def final_event(result: DeployResult) -> dict[str, Any]:
    """The event ``ScraperStatusTrigger`` yields, for a result that was already final (no deferral needed)."""
    return {"status": result.state.value, "reason": result.reason, "result": result.to_dict()}
