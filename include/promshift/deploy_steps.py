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

from promshift.core.deploy import ConfigDeployer, DeployResult, SnapshotStore


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
    if quota is not None:
        evidence["quota"] = {key: quota[key] for key in ("group_series", "workspace_series", "limit", "share")
                             if key in quota}
    return evidence


def restore(deployer: ConfigDeployer, store: SnapshotStore, snapshot_info: Mapping[str, Any], *,
            now: datetime) -> DeployResult:
    """Put the snapshot back (or remove what the deploy created); WAITING results are followed like a deploy."""
    return deployer.restore(store.get(str(snapshot_info["snapshot_ref"])), now)
