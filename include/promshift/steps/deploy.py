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

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from promshift.core.deploy import ConfigDeployer, DeployError, DeployKind, DeployResult, DeploySnapshot, SnapshotStore
from promshift.core.deploy_kinds import REMOTE_WRITE, Deploy, deploy_of
from promshift.core.errors import RoutingError
from promshift.core.events import EventKind
from promshift.core.queues import QueueCapError
from promshift.core.quota import QuotaExceeded
from promshift.core.redact import redact
from promshift.core.stages import TRANSITIONS, Stage
from promshift.steps.migration import GroupMigration, steps_of
from promshift.steps.queues import QueueCap, SwapFailed
from promshift.steps.tenants import set_tenant_limit

log = logging.getLogger(__name__)

# (group_series, now) -> the audit's deploy.quota, or QuotaExceeded with nothing deployed.
QuotaCheck = Callable[[int, datetime], dict[str, Any]]


def take_snapshot(deployer: ConfigDeployer, store: SnapshotStore, *, group: str, run_id: str) -> dict[str, Any]:
    """Keep what is live now; the answer is JSON-safe (an XCom) and names the stored snapshot. A deployer's own
    ``meta["record"]`` (the file path's config path, size, mode and owner) is recorded with it, and the stored
    snapshot's reference also as ``snapshot_path`` there."""
    snapshot = deployer.snapshot()
    ref = store.put(group, run_id, snapshot)
    info = {"kind": snapshot.kind, "snapshot_ref": ref, "ref": snapshot.ref, "sha256": snapshot.sha256,
            "existed": snapshot.existed}
    if "record" in snapshot.meta:
        info.update(snapshot_path=ref, **snapshot.meta["record"])
    return info


def start_deploy(deployer: ConfigDeployer, store: SnapshotStore, snapshot_info: Mapping[str, Any], *,
                 now: datetime, quota: Callable[[], dict[str, Any]] | None = None,
                 snapshot: DeploySnapshot | None = None) -> dict[str, Any]:
    """Quota pre-flight (raises ``QuotaExceeded`` with nothing deployed), then the deploy; JSON-safe answer."""
    quota_evidence = quota() if quota is not None else None
    if snapshot is None:
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


class DeployStepFailed(DeployError):
    """A deploy step ended without the group deployed (recorded in the audit first); one line."""


def quota_preflight(m: Any, check: QuotaCheck, *, now: datetime) -> dict[str, Any]:
    """The quota pre-flight of every deploy path: the group's series on the source against ``check``;
    ``quota_reserved`` when it fits (its series now count on the workspace for the other groups' pre-flights).
    ``QuotaExceeded`` (nothing deployed) when it does not: the caller records ``quota_refused``."""
    series = int(m.backends.source.scalar(m.group.shipped_series_query()) or 0)
    evidence = check(series, now)
    m.record(EventKind.QUOTA_RESERVED, now, {
        **{key: evidence[key] for key in ("workspace_id", "group_series", "workspace_series",
                                          "pending_series", "pending_groups", "share") if key in evidence},
        "connections": {"source": m.group.source, "target": m.group.target}})
    return evidence


class SnapshotLost(DeployError):
    """A recorded snapshot is missing, unreadable or no longer matches its hash."""


def active_since(result: Mapping[str, Any], deploy: Deploy) -> float:
    """When the deploy was first seen live (its ``live_status``: ACTIVE for a scraper, the start of dual-write on
    that path), epoch s."""
    for change in reversed(result.get("status_history") or []):
        if change["status"] == deploy.live_status:
            return datetime.fromisoformat(change["at"]).timestamp()
    raise DeployStepFailed(f"the {deploy.kind}'s status history has no {deploy.live_status} entry; it never went live")


class DeployStep:
    """snapshot -> quota pre-flight -> deploy -> (trigger) -> finish; restore -> (trigger) -> finish_rollback.

    The one driver of every deploy kind, over any ConfigDeployer: the source's config file (``file``, live at
    once), the managed collector's scraper (live once ACTIVE), the Kubernetes objects (``k8s-configmap``,
    ``k8s-cr``) and the team's repository (``git``), live once the source's loaded config shows the entry. What
    a deployer adds to the audit rides in its results' ``details["record"]``; every rollback records the same
    shape (``performed``, ``method``, ``reason``, ``deploy``, ``restored_identical``, and the deployer's own).
    """

    def __init__(self, migration: GroupMigration, deployer: ConfigDeployer, store: SnapshotStore, *,
                 quota: QuotaCheck | None = None, queues: QueueCap | None = None) -> None:
        self.migration = migration
        self.deployer = deployer
        self.store = store
        self.quota = quota
        self.queues = queues
        kind = str(deployer.kind)
        self.deploy = deploy_of(REMOTE_WRITE if kind == DeployKind.FILE.value else kind)
        # The snapshot this step's deploy was made from, loaded before it wrote: undoing an unrecorded deploy
        # (``finish``) must not depend on the store that may be what just failed (the audit database's blobs).
        self._deployed_from: DeploySnapshot | None = None

    def snapshot(self, now: datetime) -> dict[str, Any]:
        """The queue cap's pre-flight first (a merge swap where it makes room; refused in one line, nothing
        deployed and no snapshot, when it cannot), then the snapshot of what the deploy will change."""
        m = self.migration
        queues = self.queue_preflight(now, merge=True)
        info = take_snapshot(self.deployer, self.store, group=m.group.name, run_id=m.run_id)
        if queues is not None:
            info["queues"] = queues
        m.record(EventKind.SNAPSHOT_TAKEN, now, info)
        return info

    def queue_preflight(self, now: datetime, *, merge: bool) -> dict[str, Any] | None:
        """Room under the source's queue cap for this group's own entry (``steps.queues.QueueCap``), on every path
        that adds a source queue; ``DeployStepFailed`` in one line with the count when there is none (recorded as
        ``queue_cap_refused``). None: this path adds no queue (the managed collector), or no cap is wired."""
        if self.queues is None or not self.deploy.source_queue:
            return None
        m = self.migration
        try:
            return self.queues.preflight(group=m.group.name, record=m.record, now=now, merge=merge)
        except QueueCapError as exc:
            raise DeployStepFailed(str(exc)) from None
        except SwapFailed as exc:  # the merge that would make room was not proven: undone (queue_swap_undone)
            raise DeployStepFailed(f"no room under the source's queue cap: {exc}") from None

    def load(self, snapshot_info: Mapping[str, Any]) -> DeploySnapshot:
        """The stored snapshot, checked against the hash recorded when it was taken (``SnapshotLost``)."""
        ref = str(snapshot_info.get("snapshot_ref") or snapshot_info.get("snapshot_path"))
        try:
            snapshot = self.store.get(ref)
        except DeployError as exc:
            raise SnapshotLost(str(exc)) from None
        with_record = getattr(self.store, "with_record", None)  # the file path: its path, mode and owner
        if with_record is not None:
            snapshot = with_record(snapshot, snapshot_info)
        if snapshot.sha256 != snapshot_info["sha256"]:
            raise SnapshotLost(f"snapshot {ref} does not match its recorded hash "
                               f"({snapshot.sha256[:12]} != {str(snapshot_info['sha256'])[:12]})")
        return snapshot

    def recorded_deploy(self) -> dict[str, Any] | None:
        """This run's ``dual_write_deployed`` when it is the group's latest move (a retry after it was recorded),
        re-confirmed live when the deployer can (the file path reloads once if need be)."""
        done = self.migration.recorded(EventKind.DUAL_WRITE_DEPLOYED, Stage.DUAL_WRITING)
        if done is None:
            return None
        confirm = getattr(self.deployer, "confirm_live", None)
        if confirm is not None:
            confirm()
        return redact(done.evidence_data)

    def start(self, snapshot_info: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """Quota pre-flight, then the deploy; ``{"deploy": <WAITING or final result>, "quota"}`` for the trigger."""
        m = self.migration
        quota = None
        if self.quota is not None:
            check = self.quota

            def quota() -> dict[str, Any]:
                return quota_preflight(m, check, now=now)
        # Before anything else is set: another group may have taken the room since the snapshot step.
        self.queue_preflight(now, merge=False)
        try:
            tenant = set_tenant_limit(m)  # before the deploy: a refused tenant leaves nothing deployed
            self._deployed_from = self.load(snapshot_info)
            started = start_deploy(self.deployer, self.store, snapshot_info, now=now, quota=quota,
                                   snapshot=self._deployed_from)
            return {**started, "tenant": tenant} if tenant else started
        except QuotaExceeded as exc:
            m.record(EventKind.QUOTA_REFUSED, now, {"reason": str(exc), "deploy": {
                "kind": self.deployer.kind, "status_history": [], "quota": exc.evidence}})
            raise DeployStepFailed(str(exc)) from None
        except DeployError as exc:
            m.record(EventKind.DEPLOY_FAILED, now, {"reason": str(exc), **exc.details, "deploy": {
                "kind": self.deployer.kind, "status_history": [], "reason": str(exc)}})
            raise DeployStepFailed(str(exc)) from None

    def finish(self, event: Mapping[str, Any], quota: Mapping[str, Any] | None, now: datetime,
               snapshot_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The trigger's event: DUAL_WRITING with the evidence when done; else ``deploy_failed`` and raise.

        A retry after this run recorded ``dual_write_deployed`` returns that record (no second event). Nothing
        stays deployed without its event: when recording fails and the event is not known to be in the log, the
        snapshot (``snapshot_info``) goes back before the error is raised (reading the log fails the same way)."""
        try:
            done = self.recorded_deploy()
        except Exception:
            if snapshot_info is not None and event.get("status") == "done":
                self._undeploy_unrecorded(snapshot_info, now)
            raise
        if done is not None:
            return done
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
        out.update(details.get("record") or {})
        try:
            self.migration.record(EventKind.DUAL_WRITE_DEPLOYED, now, out, to=Stage.DUAL_WRITING)
        except Exception:
            if snapshot_info is not None:
                self._undeploy_unrecorded(snapshot_info, now)
            raise
        return redact(out)

    def _undeploy_unrecorded(self, snapshot_info: Mapping[str, Any], now: datetime) -> None:
        m = self.migration
        try:
            if m.recorded(EventKind.DUAL_WRITE_DEPLOYED, Stage.DUAL_WRITING) is not None:
                return
        except Exception as exc:  # noqa: BLE001 - the audit database is what failed: it cannot say
            log.warning("cannot tell whether dual_write_deployed was recorded (%s); assuming it was not", exc)
        log.error("the dual_write_deployed audit event was not recorded; restoring the %s snapshot", self.deploy.kind)
        held = self._deployed_from
        snapshot = held if held is not None and held.sha256 == snapshot_info.get("sha256") else self.load(snapshot_info)
        self.deployer.restore(snapshot, now)

    def restore(self, snapshot_info: Mapping[str, Any], *, reason: str, now: datetime) -> DeployResult:
        """Start putting the snapshot back; a failure is recorded as ``rollback_failed`` and raised.

        A snapshot that is lost (missing, or no longer its recorded hash) is not restored: the group's own entry
        is withdrawn by name instead, where the deployer can (``method: removed_entry``, ``snapshot_error``)."""
        evidence: dict[str, Any] = {"performed": True, "method": f"{self.deploy.kind}_restore", "reason": reason,
                                    "config_sha256": snapshot_info.get("sha256")}
        try:
            left = self.leave_merged()
            try:
                snapshot: DeploySnapshot | None = self.load(snapshot_info)
            except SnapshotLost as exc:
                withdraw = getattr(self.deployer, "withdraw", None)
                if withdraw is None:
                    raise
                log.warning("%s; removing the group's own entry by name instead", exc)
                evidence.update(method="removed_entry", snapshot_error=str(exc))
                snapshot = None
            if snapshot is None:
                result = withdraw(now, expect_sha256=snapshot_info.get("sha256"))
                record = {**(result.details.get("record") or {}), "snapshot_error": evidence["snapshot_error"]}
                return replace(result, details={**result.details, "record": {**record, **left}})
            result = self.deployer.restore(snapshot, now)
            if left:
                record = {**(result.details.get("record") or {}), **left}
                result = replace(result, details={**result.details, "record": record})
            return result
        except Exception as exc:
            self.migration.record(EventKind.ROLLBACK_FAILED, now, {
                **evidence, "performed": False, "restored_identical": False,
                "error": f"{type(exc).__name__}: {exc}"})
            if isinstance(exc, DeployError):
                raise DeployStepFailed(f"rollback: {exc}") from exc
            raise

    def leave_merged(self) -> dict[str, Any]:
        """A group merged into a shared entry leaves it first, by one more swap (``QueueCap.leave``: add the merged
        entry without it, prove it carries the others, remove the old one; audited as ``queue_swap_added`` and
        ``queue_swap_done``); what the rollback records of it, {} when the group was not merged. A retry after a
        crash resumes the swap from what the config holds."""
        if self.queues is None or not self.deploy.source_queue:
            return {}
        outcome = self.queues.leave(group=self.migration.group.name, record=self.migration.record)
        return {} if outcome is None else {"left_merged_entry": outcome.to_dict()["swap"]}

    def finish_rollback(self, event: Mapping[str, Any], snapshot_info: Mapping[str, Any], *, reason: str,
                        now: datetime, extra: Mapping[str, Any] | None = None,
                        method: str | None = None) -> dict[str, Any]:
        """Record ``rolled_back`` (or ``rollback_failed``) from the restore's final result; reads go back to source.

        ``restored_identical``: what is live now (read again) is the snapshot (the same blob, or no scraper; the
        file's bytes with our entry gone from the loaded config). A retry after this run recorded ``rolled_back``
        reports what is live now and records nothing. An unreadable routing store is recorded with the rollback,
        then raised."""
        m = self.migration
        mine = steps_of(m.audit.events(group=m.group.name, run_id=m.run_id))
        if mine and mine[-1].kind == EventKind.ROLLED_BACK and event.get("status") == "done":
            found = self._found(snapshot_info)
            if found is not None:
                return redact({**mine[-1].evidence_data, "already_rolled_back": True, "found": found})
        result = event["result"]
        record = dict((result.get("details") or {}).get("record") or {})
        evidence: dict[str, Any] = {"performed": True, "method": method or f"{self.deploy.kind}_restore",
                                    "reason": reason, "deploy": deploy_evidence(result, None), **record,
                                    **(extra or {})}
        if event.get("status") != "done":
            m.record(EventKind.ROLLBACK_FAILED, now, {**evidence, "performed": False,
                                                      "error": str(event.get("reason") or event.get("status"))})
            raise DeployStepFailed(f"{self.deploy.kind} restore {event.get('status')}: {event.get('reason')}")
        routing_error = None
        try:
            if m.routing.read_from(m.group.name) != "source":
                m.routing.route(m.group.name, read_from="source", url=m.backends.source.base_url, at=now,
                                run_id=m.run_id, pair=m.group.pair)
        except RoutingError as exc:
            routing_error = exc
            evidence["routing_error"] = str(exc)
        if "restored_identical" not in record:
            evidence["restored_identical"] = self._live_is(snapshot_info)
        to = Stage.ROLLED_BACK if Stage.ROLLED_BACK in TRANSITIONS[m.stage()] else None
        m.record(EventKind.ROLLED_BACK, now, evidence, to=to)
        if routing_error is not None:
            raise routing_error
        return redact(evidence)

    def _found(self, snapshot_info: Mapping[str, Any]) -> dict[str, Any] | None:
        """What a repeated rollback finds live, with where reads go; None when it is no longer rolled back."""
        m = self.migration
        try:
            read_from = m.routing.read_from(m.group.name)
        except RoutingError:
            return None
        found_by = getattr(self.deployer, "rolled_back_found", None)
        if found_by is not None:
            found = found_by(str(snapshot_info["sha256"]))
            return None if found is None or read_from != "source" else {**found, "read_from": read_from}
        return {"restored_identical": self._live_is(snapshot_info), "read_from": read_from}

    def _live_is(self, snapshot_info: Mapping[str, Any]) -> bool:
        """What is live now (read again) is the snapshot: the same blob, or no scraper when there was none."""
        live = self.deployer.snapshot()
        return live.existed == bool(snapshot_info["existed"]) and live.sha256 == snapshot_info["sha256"]


def final_event(result: DeployResult) -> dict[str, Any]:
    """The event ``ScraperStatusTrigger`` yields, for a result that was already final (no deferral needed)."""
    return {"status": result.state.value, "reason": result.reason, "result": result.to_dict()}
