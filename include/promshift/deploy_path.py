"""Which deploy a run uses, chosen in one place, and the managed-collector path's steps.

The target connection's ``extra.deploy`` names the deploy: ``remote_write`` (the default: the
group's own ``remote_write`` entry in the source's config file, ``GroupMigration.snapshot`` /
``deploy_dual_write`` / ``rollback``) or ``scraper`` (AMP's managed collector scrapes the group
itself, ``ScraperDeployStep`` below). The DAG's tasks are the same for both; on the scraper path
``deploy_dual_write`` and ``rollback`` defer to ``ScraperStatusTrigger`` while the scraper moves.

``ScraperDeployStep`` drives ``deploy_steps`` over any ``core.deploy.ConfigDeployer`` and records
the audit events the file path records (``snapshot_taken``, ``dual_write_deployed`` -> DUAL_WRITING,
``rolled_back``), plus ``quota_refused`` and ``deploy_failed`` with AWS's own reason. It is plain
Python: the operators call it, and so do the tests, with the triggerer's event built the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from promshift.core.catalog import MetricGroup
from promshift.core.deploy import ConfigDeployer, DeployError, DeployResult, SnapshotStore
from promshift.core.quota import QuotaExceeded
from promshift.core.redact import redact
from promshift.core.scraper_config import ACTIVE
from promshift.core.stages import TRANSITIONS, Stage
from promshift.deploy_steps import deploy_evidence, restore, start_deploy, take_snapshot
from promshift.migration import GroupMigration, steps_of

REMOTE_WRITE = "remote_write"
SCRAPER = "scraper"
DEPLOY_KINDS = (REMOTE_WRITE, SCRAPER)
# The scraper blob's interval; the managed collector's documented minimum (core.scraper_config).
SCRAPER_INTERVAL_S = 30.0

# (group_series, now) -> the audit's deploy.quota, or QuotaExceeded with nothing deployed.
QuotaCheck = Callable[[int, datetime], dict[str, Any]]


class DeployStepFailed(RuntimeError):
    """A deploy step ended without the group deployed (recorded in the audit first); one line."""


def deploy_kind_of(extra: Mapping[str, Any], *, conn_id: str, is_amp: bool) -> str:
    """The deploy the target connection asks for (``extra.deploy``, default ``remote_write``); one-line errors."""
    kind = str(extra.get("deploy") or REMOTE_WRITE).strip().lower()
    if kind not in DEPLOY_KINDS:
        raise ValueError(f"connection {conn_id!r}: extra.deploy must be one of {', '.join(DEPLOY_KINDS)}, "
                         f"got {kind!r}")
    if kind == SCRAPER and not is_amp:
        raise ValueError(f"connection {conn_id!r}: extra.deploy 'scraper' needs an amp connection "
                         "(the managed collector writes to an AMP workspace)")
    return kind


def group_for_deploy(group: MetricGroup, kind: str) -> MetricGroup:
    """The group as its deploy sees it: a managed collector scrapes on its own clock, so its parity is
    ``independent_scraper`` (``dual_write`` parity needs both sides written by the same Prometheus)."""
    if kind == SCRAPER and group.parity.mode == "dual_write":
        return dataclasses.replace(group, parity=dataclasses.replace(group.parity, mode="independent_scraper"))
    return group


def active_since(result: Mapping[str, Any]) -> float:
    """When the scraper was first seen ACTIVE (the start of dual-write on this path), epoch seconds."""
    for change in reversed(result.get("status_history") or []):
        if change["status"] == ACTIVE:
            return datetime.fromisoformat(change["at"]).timestamp()
    raise DeployStepFailed("the scraper's status history has no ACTIVE entry; it never went live")


class ScraperDeployStep:
    """snapshot -> quota pre-flight -> deploy -> (trigger) -> finish; restore -> (trigger) -> finish_rollback."""

    def __init__(self, migration: GroupMigration, deployer: ConfigDeployer, store: SnapshotStore, *,
                 quota: QuotaCheck | None) -> None:
        self.migration = migration
        self.deployer = deployer
        self.store = store
        self.quota = quota

    def snapshot(self, now: datetime) -> dict[str, Any]:
        m = self.migration
        info = take_snapshot(self.deployer, self.store, group=m.group.name, run_id=m.run_id)
        m.record("snapshot_taken", now, info)
        return info

    def start(self, snapshot_info: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """Quota pre-flight, then the deploy; ``{"deploy": <WAITING or final result>, "quota"}`` for the trigger."""
        m = self.migration
        quota = None
        if self.quota is not None:
            check = self.quota
            series = int(m.backends.source.scalar(f"count({m.group.selector()})") or 0)

            def quota() -> dict[str, Any]:
                return check(series, now)
        try:
            return start_deploy(self.deployer, self.store, snapshot_info, now=now, quota=quota)
        except QuotaExceeded as exc:
            m.record("quota_refused", now, {"reason": str(exc), "deploy": {
                "kind": self.deployer.kind, "status_history": [], "quota": exc.evidence}})
            raise DeployStepFailed(str(exc)) from None
        except DeployError as exc:
            m.record("deploy_failed", now, {"reason": str(exc), "deploy": {
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
            self.migration.record("deploy_failed", now, {"reason": reason, "deploy": evidence})
            raise DeployStepFailed(f"scraper deploy {event.get('status')}: {reason}")
        result = event["result"]
        out = {"deploy": evidence, "dual_write_since": active_since(result),
               "scraper_id": (result.get("details") or {}).get("scraper_id")}
        self.migration.record("dual_write_deployed", now, out, to=Stage.DUAL_WRITING)
        return redact(out)

    def restore(self, snapshot_info: Mapping[str, Any], *, reason: str, now: datetime) -> DeployResult:
        """Start putting the snapshot back; a failure is recorded as ``rollback_failed`` and raised."""
        try:
            return restore(self.deployer, self.store, snapshot_info, now=now)
        except DeployError as exc:
            self.migration.record("rollback_failed", now, {"performed": False, "reason": reason,
                                                           "error": str(exc)})
            raise DeployStepFailed(f"rollback: {exc}") from None

    def finish_rollback(self, event: Mapping[str, Any], snapshot_info: Mapping[str, Any], *, reason: str,
                        now: datetime) -> dict[str, Any]:
        """Record ``rolled_back`` (or ``rollback_failed``) from the restore's final result; reads go back to source.

        ``restored_identical``: what is live now (read again) is the snapshot (the same blob, or no scraper).
        A retry after this run recorded ``rolled_back`` reports what is live now and records nothing."""
        m = self.migration
        mine = steps_of(m.audit.events(group=m.group.name, run_id=m.run_id))
        if mine and mine[-1].kind == "rolled_back" and event.get("status") == "done":
            found = {"restored_identical": self._live_is(snapshot_info), "read_from": m.routing.read_from(m.group.name)}
            return redact({**mine[-1].evidence_data, "already_rolled_back": True, "found": found})
        evidence: dict[str, Any] = {"performed": True, "method": "scraper_restore", "reason": reason,
                                    "deploy": deploy_evidence(event["result"], None)}
        if event.get("status") != "done":
            m.record("rollback_failed", now, {**evidence, "performed": False,
                                              "error": str(event.get("reason") or event.get("status"))})
            raise DeployStepFailed(f"scraper restore {event.get('status')}: {event.get('reason')}")
        if m.routing.read_from(m.group.name) != "source":
            m.routing.route(m.group.name, read_from="source", url=m.backends.source.base_url, at=now,
                            run_id=m.run_id)
        evidence["restored_identical"] = self._live_is(snapshot_info)
        to = Stage.ROLLED_BACK if Stage.ROLLED_BACK in TRANSITIONS[m.stage()] else None
        m.record("rolled_back", now, evidence, to=to)
        return redact(evidence)

    def _live_is(self, snapshot_info: Mapping[str, Any]) -> bool:
        """What is live now (read again) is the snapshot: the same blob, or no scraper when there was none."""
        live = self.deployer.snapshot()
        return live.existed == bool(snapshot_info["existed"]) and live.sha256 == snapshot_info["sha256"]


def final_event(result: DeployResult) -> dict[str, Any]:
    """The event ``ScraperStatusTrigger`` yields, for a result that was already final (no deferral needed)."""
    return {"status": result.state.value, "reason": result.reason, "result": result.to_dict()}
