"""Which deploy a run uses, chosen in one place, and the managed-collector path's steps.

The target connection's ``extra.deploy`` names the deploy: ``remote_write`` (the default: the
group's own ``remote_write`` entry in the source's config file, ``GroupMigration.snapshot`` /
``deploy_dual_write`` / ``rollback``) or ``scraper`` (AMP's managed collector scrapes the group
itself, ``ScraperDeployStep`` below). The DAG's tasks are the same for both; on the scraper path
``deploy_dual_write`` and ``rollback`` defer to ``ScraperStatusTrigger`` while the scraper moves.

Where the source Prometheus runs on Kubernetes, the *source* connection's ``extra.deploy`` says how
its config is changed: ``file`` (the default, ``extra.config_path``), ``k8s-configmap`` (a ConfigMap
holding ``prometheus.yml``) or ``k8s-cr`` (prometheus-operator's ``Prometheus`` resource), with
``extra.kubernetes`` naming the object and how to reach the API (``kubernetes_source_of``). The
group's ``remote_write`` entry is the same; only the deployer differs (``adapters.k8s_deploy``),
and ``ScraperDeployStep`` drives it like any other ``ConfigDeployer``.

``ScraperDeployStep`` drives ``deploy_steps`` over any ``core.deploy.ConfigDeployer`` and records
the audit events the file path records (``snapshot_taken``, ``dual_write_deployed`` -> DUAL_WRITING,
``rolled_back``), plus ``quota_refused`` and ``deploy_failed`` with AWS's own reason. It is plain
Python: the operators call it, and so do the tests, with the triggerer's event built the same way.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from promshift.core.catalog import MetricGroup
from promshift.core.deploy import ConfigDeployer, DeployError, DeployKind, DeployResult, SnapshotStore
from promshift.core.quota import QuotaExceeded
from promshift.core.redact import redact
from promshift.core.scraper_config import ACTIVE
from promshift.core.stages import TRANSITIONS, Stage
from promshift.deploy_steps import deploy_evidence, restore, start_deploy, take_snapshot
from promshift.migration import GroupMigration, steps_of

REMOTE_WRITE = "remote_write"
SCRAPER = "scraper"
DEPLOY_KINDS = (REMOTE_WRITE, SCRAPER)
# The source connection's extra.deploy: how the source's own config is changed.
FILE = DeployKind.FILE.value
K8S_CONFIGMAP = DeployKind.K8S_CONFIGMAP.value
K8S_CR = DeployKind.K8S_CR.value
SOURCE_DEPLOY_KINDS = (FILE, K8S_CONFIGMAP, K8S_CR)
K8S_KINDS = (K8S_CONFIGMAP, K8S_CR)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The scraper blob's interval; the managed collector's documented minimum (core.scraper_config).
SCRAPER_INTERVAL_S = 30.0

# (group_series, now) -> the audit's deploy.quota, or QuotaExceeded with nothing deployed.
QuotaCheck = Callable[[int, datetime], dict[str, Any]]


class DeployStepFailed(RuntimeError):
    """A deploy step ended without the group deployed (recorded in the audit first); one line."""


def deploy_kind_of(extra: Mapping[str, Any], *, conn_id: str, is_amp: bool,
                   source_extra: Mapping[str, Any] | None = None, source_conn_id: str = "promshift_source") -> str:
    """The deploy a run uses; one-line errors.

    The target connection's ``extra.deploy`` (default ``remote_write``) first; with ``remote_write``,
    a source connection whose ``extra.deploy`` is ``k8s-configmap`` or ``k8s-cr`` makes it that
    (the same entry, written through the Kubernetes API). A managed collector scrapes by itself, so
    ``scraper`` with a Kubernetes source deploy is refused rather than silently ignoring one of them.
    """
    kind = str(extra.get("deploy") or REMOTE_WRITE).strip().lower()
    if kind not in DEPLOY_KINDS:
        raise ValueError(f"connection {conn_id!r}: extra.deploy must be one of {', '.join(DEPLOY_KINDS)}, "
                         f"got {kind!r}")
    if kind == SCRAPER and not is_amp:
        raise ValueError(f"connection {conn_id!r}: extra.deploy 'scraper' needs an amp connection "
                         "(the managed collector writes to an AMP workspace)")
    source = kubernetes_source_of(source_extra or {}, conn_id=source_conn_id)
    if source is None:
        return kind
    if kind == SCRAPER:
        raise ValueError(f"connection {conn_id!r} deploys through the managed collector, but connection "
                         f"{source_conn_id!r} asks for {source.kind}: choose one")
    return source.kind


@dataclass(frozen=True)
class KubernetesSource:
    """Where a Kubernetes-run source's config lives and how to reach its API (the source connection's extra).

    ``extra.kubernetes``: ``namespace`` and ``name`` of the ConfigMap or ``Prometheus`` resource;
    ``key`` (ConfigMap only, default ``prometheus.yml``); how to reach the API, as the cncf-kubernetes
    provider's ``KubernetesHook`` takes it: ``conn_id`` (a ``kubernetes`` connection) or ``config_file``
    (+ ``cluster_context``) or ``in_cluster: true``; ``timeout_s``, how long verify waits for the reload.
    """

    kind: str
    namespace: str
    name: str
    key: str = "prometheus.yml"
    conn_id: str | None = None
    config_file: str | None = None
    cluster_context: str | None = None
    in_cluster: bool | None = None
    timeout_s: float = 300.0


def kubernetes_source_of(extra: Mapping[str, Any], *, conn_id: str = "promshift_source") -> KubernetesSource | None:
    """The source connection's ``extra.deploy`` / ``extra.kubernetes``; None for ``file``; one-line errors."""
    kind = str(extra.get("deploy") or FILE).strip().lower()
    if kind not in SOURCE_DEPLOY_KINDS:
        raise ValueError(f"connection {conn_id!r}: extra.deploy must be one of {', '.join(SOURCE_DEPLOY_KINDS)}, "
                         f"got {kind!r}")
    if kind == FILE:
        return None
    raw = extra.get("kubernetes")
    if not isinstance(raw, Mapping):
        raise ValueError(f"connection {conn_id!r}: extra.deploy {kind!r} needs extra.kubernetes: "
                         "{namespace, name, conn_id | config_file | in_cluster}")
    namespace, name = str(raw.get("namespace") or ""), str(raw.get("name") or "")
    if not _DNS_LABEL.match(namespace):
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.namespace must be a DNS label, got {namespace!r}")
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.name must be a DNS subdomain, got {name!r}")
    unknown = sorted(set(raw) - ({f.name for f in dataclasses.fields(KubernetesSource)} - {"kind"}))
    if unknown:
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes has unknown keys {unknown}")
    if "key" in raw and kind != K8S_CONFIGMAP:
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.key applies to a ConfigMap only")
    try:
        timeout_s = float(raw.get("timeout_s", 300.0))
    except (TypeError, ValueError):
        timeout_s = -1.0
    if not timeout_s > 0:
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.timeout_s must be a positive number of seconds")
    in_cluster = raw.get("in_cluster")
    if in_cluster is not None and not isinstance(in_cluster, bool):
        raise ValueError(f"connection {conn_id!r}: extra.kubernetes.in_cluster must be true or false")
    return KubernetesSource(kind=kind, namespace=namespace, name=name, key=str(raw.get("key") or "prometheus.yml"),
                            conn_id=raw.get("conn_id") or None, config_file=raw.get("config_file") or None,
                            cluster_context=raw.get("cluster_context") or None, in_cluster=in_cluster,
                            timeout_s=timeout_s)


# Tolerances of independent_scraper parity when the deploy (not the catalog) chose that mode: two scrapers
# read a noisy gauge at different instants, so per-step averages differ by the gauge's own noise. dcgm-exporter
# values move by several percent between scrapes (the simulator's utilisation: +-6 points per second), so
# 10 % relative, plus 0.05 absolute for values near zero (a 0..1 ratio stays checked). Looser catalog values win.
INDEPENDENT_ABS_TOLERANCE = 0.05
INDEPENDENT_REL_TOLERANCE = 0.10


def group_for_deploy(group: MetricGroup, kind: str) -> MetricGroup:
    """The group as its deploy sees it: a managed collector scrapes on its own clock, so its parity is
    ``independent_scraper`` (``dual_write`` parity needs both sides written by the same Prometheus), with
    at least the independent tolerances (a catalog written for dual-write holds ~1e-9, meant for identical
    samples)."""
    if kind == SCRAPER and group.parity.mode == "dual_write":
        parity = dataclasses.replace(group.parity, mode="independent_scraper",
                                     abs_tolerance=max(group.parity.abs_tolerance, INDEPENDENT_ABS_TOLERANCE),
                                     rel_tolerance=max(group.parity.rel_tolerance, INDEPENDENT_REL_TOLERANCE))
        return dataclasses.replace(group, parity=parity)
    return group


def active_since(result: Mapping[str, Any], live_status: str = ACTIVE) -> float:
    """When the deploy was first seen live (ACTIVE for a scraper: the start of dual-write on this path), epoch s."""
    for change in reversed(result.get("status_history") or []):
        if change["status"] == live_status:
            return datetime.fromisoformat(change["at"]).timestamp()
    what = "scraper" if live_status == ACTIVE else str(result.get("kind") or "deploy")
    raise DeployStepFailed(f"the {what}'s status history has no {live_status} entry; it never went live")


class ScraperDeployStep:
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
        self.what = SCRAPER if deployer.kind == SCRAPER else str(deployer.kind)
        self.live_status = ACTIVE if deployer.kind == SCRAPER else "LIVE"

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
            raise DeployStepFailed(f"{self.what} deploy {event.get('status')}: {reason}")
        result = event["result"]
        details = result.get("details") or {}
        out = {"deploy": evidence, "dual_write_since": active_since(result, self.live_status)}
        out.update({"scraper_id": details.get("scraper_id")} if self.what == SCRAPER else
                   {"remote_write": details.get("remote_write")})
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
        evidence: dict[str, Any] = {"performed": True, "method": f"{self.what}_restore", "reason": reason,
                                    "deploy": deploy_evidence(event["result"], None)}
        if event.get("status") != "done":
            m.record("rollback_failed", now, {**evidence, "performed": False,
                                              "error": str(event.get("reason") or event.get("status"))})
            raise DeployStepFailed(f"{self.what} restore {event.get('status')}: {event.get('reason')}")
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
