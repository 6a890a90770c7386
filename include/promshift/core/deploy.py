"""The deploy seam: what any deployer (file + reload, managed collector, ...) offers a migration.

A migration takes a snapshot, deploys the group's change, verifies it until it is live (at
once for a file and a reload; by polling for a managed collector that moves through
``CREATING -> ACTIVE``), and restores the snapshot on rollback. The steps, the rollback and
the audit are the same whatever deploys: they see a ``DeploySnapshot`` and a ``DeployResult``
whose ``status_history`` is the audit's ``deploy.status_history``.

``InMemoryConfigDeployer`` and ``InMemorySnapshotStore`` are the protocols' fakes for tests
and dry runs: they hold state in memory and refuse what a real deployer refuses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from promshift.core.render import remote_write_entry, sha256_text


def snapshot_key(group: str, run_id: str, suffix: str) -> str:
    """``<group>/<run>.<suffix>`` with anything but ``[A-Za-z0-9_.-]`` replaced: one name per group and run."""
    safe_run = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)
    safe_group = re.sub(r"[^A-Za-z0-9_.-]", "_", group)
    return f"{safe_group}/{safe_run}.{suffix}"


class DeployKind(StrEnum):
    """How a group's change reaches the collector that writes it to the target."""

    FILE = "file"
    SCRAPER = "scraper"
    K8S_CONFIGMAP = "k8s-configmap"
    K8S_CR = "k8s-cr"
    GIT = "git"  # a commit in the team's config repository, synced by Argo CD / Flux / helm (adapters.git_deploy)


class DeployState(StrEnum):
    """Where a deploy stands: still moving, live, refused by the backend, or out of time."""

    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    TIMEOUT = "timeout"

    @property
    def final(self) -> bool:
        return self is not DeployState.WAITING


class DeployError(RuntimeError):
    """A deploy, verify or restore could not be done; the message is one line and names why.

    ``details``: what the audit records besides the reason (a file deploy's config and snapshot hashes), never
    a credential."""

    def __init__(self, message: str = "", *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = dict(details or {})


@dataclass(frozen=True)
class StatusChange:
    """One status the backend reported, and when it was first seen (ISO 8601, UTC)."""

    status: str
    at: str

    def to_dict(self) -> dict[str, str]:
        return {"status": self.status, "at": self.at}


@dataclass(frozen=True)
class DeploySnapshot:
    """What was live before the change: enough to restore it exactly.

    ``ref`` names the thing (a config path, a scraper id or ``None`` when there was none),
    ``content`` is its text (a file's bytes, a scraper's YAML blob; empty when absent),
    ``meta`` carries what a deployer needs besides (``resourceVersion``, ``existed``, ...).
    """

    kind: str
    ref: str | None
    content: str
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return sha256_text(self.content)

    @property
    def existed(self) -> bool:
        return bool(self.meta.get("existed", self.ref is not None))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "ref": self.ref, "content": self.content, "sha256": self.sha256,
                "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeploySnapshot:
        snap = cls(kind=str(data["kind"]), ref=data.get("ref"), content=str(data.get("content") or ""),
                   meta=dict(data.get("meta") or {}))
        if data.get("sha256") and data["sha256"] != snap.sha256:
            raise DeployError(f"{snap.kind} snapshot {snap.ref!r} does not match its recorded sha256")
        return snap


@dataclass(frozen=True)
class DeployResult:
    """A deploy (or restore) as last observed: its state, every status seen, and why it ended.

    ``details`` holds what the audit records besides (scraper id and ARN, config hashes, the
    live remote_write names); never a credential.
    """

    kind: str
    action: str  # "deploy" or "restore"
    state: DeployState
    status_history: tuple[StatusChange, ...] = ()
    reason: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str | None:
        return self.status_history[-1].status if self.status_history else None

    def observed(self, status: str, now: datetime, *, state: DeployState, reason: str = "",
                 **details: Any) -> DeployResult:
        """This result after one more observation; a status is added to the history only when it changes."""
        history = self.status_history
        if not history or history[-1].status != status:
            history = (*history, StatusChange(status, now.isoformat()))
        return replace(self, state=state, status_history=history, reason=reason,
                       details={**self.details, **details})

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "action": self.action, "state": self.state.value,
                "status_history": [change.to_dict() for change in self.status_history], "reason": self.reason,
                "details": dict(self.details)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeployResult:
        return cls(kind=str(data["kind"]), action=str(data.get("action") or "deploy"),
                   state=DeployState(data["state"]),
                   status_history=tuple(StatusChange(str(c["status"]), str(c["at"]))
                                        for c in data.get("status_history") or ()),
                   reason=str(data.get("reason") or ""), details=dict(data.get("details") or {}))


@runtime_checkable
class ConfigDeployer(Protocol):
    """One way of putting a group's change live, and of taking it back.

    - ``snapshot()`` reads what is live now (nothing is changed);
    - ``deploy(snapshot, now)`` starts the change, refusing if what is live is no longer the
      snapshot; a deployer that knows at once returns DONE, one that must wait returns WAITING;
    - ``verify(result, now)`` observes once more and returns the updated result (it never writes,
      so a trigger may call it again and again);
    - ``restore(snapshot, now)`` puts the snapshot back (or removes what the deploy created).

    What a deployer adds to the audit rides in its results' ``details["record"]`` (``steps.deploy.DeployStep``
    records it). A deployer may also offer ``confirm_live()`` (a retried deploy re-checks what it recorded),
    ``withdraw(now, expect_sha256=)`` (remove only the group's own entry: a lost snapshot, a full rollback by
    hand) and ``rolled_back_found(sha256)`` (what a repeated rollback finds live); the file path does.
    """

    kind: str

    def snapshot(self) -> DeploySnapshot: ...

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult: ...

    def verify(self, result: DeployResult, now: datetime) -> DeployResult: ...

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult: ...


@runtime_checkable
class SnapshotStore(Protocol):
    """Keeps snapshots between tasks: ``put`` returns a reference that ``get`` reads back, hash-checked."""

    def put(self, group: str, run_id: str, snapshot: DeploySnapshot) -> str: ...

    def get(self, ref: str) -> DeploySnapshot: ...


class InMemorySnapshotStore:
    """A SnapshotStore in a dict (tests, dry runs)."""

    def __init__(self) -> None:
        self._items: dict[str, dict[str, Any]] = {}

    def put(self, group: str, run_id: str, snapshot: DeploySnapshot) -> str:
        ref = f"memory://{group}/{run_id}"
        self._items[ref] = snapshot.to_dict()
        return ref

    def get(self, ref: str) -> DeploySnapshot:
        if ref not in self._items:
            raise DeployError(f"no snapshot {ref!r}")
        return DeploySnapshot.from_dict(self._items[ref])


class InMemoryConfigDeployer:
    """A ConfigDeployer over a string held in memory, with the real ones' refusals.

    ``deploy`` writes ``new_content``; it refuses when the live content changed since the
    snapshot. ``statuses`` scripts what ``verify`` observes, one per call (the last repeats),
    each ``(status, DeployState)``; without it a deploy is DONE at once.
    """

    def __init__(self, content: str | None, new_content: str, *, kind: str = "memory",
                 statuses: tuple[tuple[str, DeployState], ...] = ()) -> None:
        self.kind = kind
        self.live = content
        self.new_content = new_content
        self.statuses = list(statuses)
        self.calls: list[str] = []

    def snapshot(self) -> DeploySnapshot:
        self.calls.append("snapshot")
        return DeploySnapshot(self.kind, "memory" if self.live is not None else None, self.live or "",
                              {"existed": self.live is not None})

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        self.calls.append("deploy")
        if (self.live or "") != snapshot.content or (self.live is not None) != snapshot.existed:
            raise DeployError(f"{self.kind}: live content changed since the snapshot; refusing to deploy")
        self.live = self.new_content
        result = DeployResult(self.kind, "deploy", DeployState.WAITING)
        if not self.statuses:
            return result.observed("LIVE", now, state=DeployState.DONE)
        status, state = self.statuses[0]
        return result.observed(status, now, state=state)

    def verify(self, result: DeployResult, now: datetime) -> DeployResult:
        self.calls.append("verify")
        if len(self.statuses) > 1:
            self.statuses.pop(0)
        if not self.statuses:
            return result.observed("LIVE", now, state=DeployState.DONE)
        status, state = self.statuses[0]
        return result.observed(status, now, state=state, reason=f"{self.kind} is {status}")

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        self.calls.append("restore")
        self.live = snapshot.content if snapshot.existed else None
        return DeployResult(self.kind, "restore", DeployState.WAITING).observed("RESTORED", now,
                                                                                 state=DeployState.DONE)


def group_entry(group: Any, url: str, sigv4: Mapping[str, str] | None) -> dict[str, Any]:
    """A group's own remote_write entry (keep-filter, dropped labels, the target's URL and sigv4): what every
    entry deployer (file, Kubernetes, git) adds."""
    return remote_write_entry(group_name=group.name, name_regex=group.name_regex(), drop_labels=group.drop_labels,
                              url=url, sigv4=sigv4, replicas=getattr(group, "replicas", None))


def group_entry_record(group: Any, url: str, sigv4: Mapping[str, str] | None) -> dict[str, Any]:
    """What ``dual_write_deployed`` says of the entry besides its name and the config's hashes."""
    entry = group_entry(group, url, sigv4)
    record: dict[str, Any] = {"keep_regex": group.name_regex(), "url": url}
    if "sigv4" in entry:
        record["sigv4"] = entry["sigv4"]
    if group.drop_labels:
        record["drop_labels"] = list(group.drop_labels)
    replicas = getattr(group, "replicas", None)
    if replicas is not None and replicas.enabled:  # AMP's dedup labels on the entry (core.ha)
        record["replicas"] = {"replica_label": replicas.replica_label, "cluster_label": replicas.cluster_label}
    return record
