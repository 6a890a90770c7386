"""Operators for each step of a group's migration; each is a few lines around GroupMigration."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import BaseOperator, Param
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from promshift.core.approvers import team_of
from promshift.core.text import shown as escaped_text
from promshift.orchestration.hooks import backend_hook
from promshift.orchestration.links import MigrationReportLink

if TYPE_CHECKING:
    from promshift.orchestration.amp_hook import AmpHook
    from promshift.orchestration.hooks import PrometheusHook

# An upstream task's output as an operator's argument (a template field): the factory passes an XComArg
# (``task.output``), which Airflow resolves to the value when it renders the task, also when a deferred task
# resumes; a test passes the value itself. Never a pull by task id: the DAG file says where a value comes from.
Output = Any  # XComArg | the value

SOURCE_CONN = "promshift_source"
# The trigger form of a group's DAG (``core.run_params``; the schema is in ``dag_factory.run_params_schema``).
RUN_PARAMS = ("dry_run", "change_ticket", "warmup_override", "reason")
TARGET_CONN = "promshift_target"
# The trigger form field naming the group in a by-hand DAG of every group (decommission, recommission, rollback).
GROUP_PARAM = "group"
# The audit HMAC key lives in this connection's password (or the secrets backend behind it),
# never in the audit database.
AUDIT_CONN = "promshift_audit"
# Grafana (``extra.read_path``): absent, the group's dashboards are not switched ("not configured").
GRAFANA_CONN = "grafana_default"

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def audit_key() -> bytes | None:
    """The audit key: connection ``promshift_audit``'s password, else the environment (CLI, local stack)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from promshift.adapters.settings import audit_key as key_from_env
    from promshift.core.audit import check_key

    try:
        conn = BaseHook.get_connection(AUDIT_CONN)
    except AirflowNotFoundException:
        return key_from_env()
    if not conn.password:
        raise AirflowFailException(f"connection {AUDIT_CONN!r} has no password; it must hold the audit key")
    return check_key(conn.password.encode())


def audit_url() -> str:
    """The SQLAlchemy URL of the audit database, which also holds the routing state.

    ``PROMSHIFT_AUDIT_URL`` if set (an override), else connection ``promshift_audit``'s
    ``extra.url`` (e.g. ``postgresql+psycopg://promshift:...@db:5432/promshift``), else SQLite
    under ``PROMSHIFT_HOME`` (one worker only: the demo). Not the connection's own URI: its
    password is the audit HMAC key, which must never be a database password. The URL's password
    is registered with Airflow's secrets masker and every log line shows the URL redacted.
    """
    import os

    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException
    from airflow.sdk.log import mask_secret
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    from promshift.adapters.audit_store import default_audit_url, redacted

    def masked(url: str, where: str) -> str:
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise AirflowFailException(f"{where} is not a SQLAlchemy database URL") from None
        if parsed.password:
            mask_secret(str(parsed.password))
        log.info("audit database (from %s): %s", where, redacted(url))
        return url

    env = os.environ.get("PROMSHIFT_AUDIT_URL")
    if env:
        return masked(env, "PROMSHIFT_AUDIT_URL")
    try:
        conn = BaseHook.get_connection(AUDIT_CONN)
    except AirflowNotFoundException:
        conn = None
    url = conn.extra_dejson.get("url") if conn is not None else None
    if url is not None:
        if not isinstance(url, str) or not url:
            raise AirflowFailException(f"connection {AUDIT_CONN!r}: extra.url must be a SQLAlchemy URL string")
        return masked(url, f"connection {AUDIT_CONN!r} extra.url")
    url = default_audit_url()
    log.info("audit database (default, SQLite under PROMSHIFT_HOME): %s", redacted(url))
    return url


def audit_store(on_head: Any = None) -> Any:
    """The audit store of the Airflow shell: ``audit_url()`` with ``audit_key()``."""
    from promshift.adapters.audit_store import AuditStore

    return AuditStore(audit_url(), key=audit_key(), on_head=on_head)


def routing_store(audit: Any) -> Any:
    """The routing state in the audit store's own database (and engine); an old ``routing.json``
    under ``PROMSHIFT_HOME`` is taken in once, for groups the store does not hold yet (an unreadable
    old file is logged and ignored: it must not stop a step, least of all a rollback)."""
    from promshift.adapters.routing import RoutingError, RoutingStore

    routing = RoutingStore(audit.url, engine=audit.engine)
    try:
        routing.import_manifest()
    except RoutingError as exc:
        log.warning("old routing manifest not imported: %s", exc)
    return routing


def given(op: BaseOperator, name: str) -> Any:
    """The value of input ``name`` (a template field) as the task runs: an XComArg still there means the task
    was not rendered (a test calling ``execute`` on the DAG's own task, or the field missing from
    ``template_fields``), which must fail loudly rather than be read as a dict."""
    from airflow.sdk.definitions.xcom_arg import XComArg

    value = getattr(op, name)
    if isinstance(value, XComArg):
        raise AirflowFailException(f"{op.task_id}: input {name!r} is unresolved ({value!r}); Airflow resolves it "
                                   "when it renders the task's template fields")
    return value


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)


class _GroupStep:
    """What every step operator shares: which group, which catalog, which backends."""

    group_name: str
    catalog_path: str
    profile: str | None
    source_conn_id: str
    target_conn_id: str

    def _init_group(self, *, group_name: str | None, catalog_path: str, profile: str | None,
                    source_conn_id: str, target_conn_id: str, dag_target: str | None = None) -> None:
        # None: a DAG of every group (a migration DAG, a by-hand one); the group is the trigger form's ``group``
        # (``choose_group``). ``dag_target``: a migration DAG's workspace connection, which the group must have.
        self.group_name = group_name or ""
        self.dag_target = dag_target
        self.catalog_path = catalog_path
        self.profile = profile
        self.source_conn_id = source_conn_id
        self.target_conn_id = target_conn_id

    @cached_property
    def group(self) -> Any:
        from promshift.adapters.settings import load_catalog

        if not self.group_name:
            raise AirflowFailException("no metric group chosen: this task runs only after choose_group(context)")
        return load_catalog(self.catalog_path, profile=self.profile).get(self.group_name)

    def choose_group(self, context: Any) -> None:
        """In a DAG of every group (a target's migration DAG; decommission, recommission, full rollback), take
        the group from the trigger form's ``group`` and check it against the catalog now: the form's list was
        the catalog's when the DAG file was parsed. An unknown group, or one the catalog now sends to another
        workspace than this migration DAG's, fails the task with one line; nothing is touched. A task given its
        group (a bake check, mapped over groups) keeps it."""
        if self.group_name:
            return
        from promshift.adapters.settings import load_catalog

        chosen = (context.get("params") or {}).get(GROUP_PARAM)
        name = chosen if isinstance(chosen, str) else ""
        groups = {g.name: g for g in load_catalog(self.catalog_path, profile=self.profile).groups}
        names = list(groups)
        if name not in groups:
            shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
            what = (f"unknown metric group {escaped_text(str(chosen))[:100]!r}" if chosen is not None
                    else f"no metric group chosen (the form's {GROUP_PARAM!r})")
            raise AirflowFailException(f"{what}: the catalog {self.catalog_path} has {shown or 'no groups'}")
        group = groups[name]
        if self.dag_target is not None and group.target != self.dag_target:
            raise AirflowFailException(f"group {name!r} migrates to connection {group.target!r}, not this DAG's "
                                       f"{self.dag_target!r}: trigger {group.dag_id}")
        self.group_name = name
        # The chosen group's own cluster and workspace connections (its route's key).
        self.source_conn_id, self.target_conn_id = group.source, group.target

    def _do_render_template_fields(self, parent: Any, template_fields: Any, context: Any, jinja_env: Any,
                                   seen_oids: set[int]) -> None:
        # The group is chosen before anything reads it, on every try and every resume (each renders). Here, not in
        # ``render_template_fields``: a task renders through this (BaseOperator.render_template_fields calls it),
        # and so does one map index of a mapped task (parity_samples), which never calls render_template_fields
        # (airflow.sdk MappedOperator.render_template_fields unmaps the task and calls this on it).
        if parent is self:
            self.choose_group(context)
        super()._do_render_template_fields(parent, template_fields, context, jinja_env,  # type: ignore[misc]
                                           seen_oids)

    @cached_property
    def source_hook(self) -> PrometheusHook | AmpHook:
        return backend_hook(self.source_conn_id)

    @cached_property
    def target_hook(self) -> PrometheusHook | AmpHook:
        return backend_hook(self.target_conn_id)

    def check_pair(self) -> None:
        """The connections this task was built with are the group's in the catalog (its route's key):
        a DAG parsed before the catalog moved the group would otherwise write to the old pair."""
        if (self.source_conn_id, self.target_conn_id) != self.group.pair:
            raise ValueError(f"group {self.group_name!r}: this DAG uses connections {self.source_conn_id!r} -> "
                             f"{self.target_conn_id!r}, the catalog says {self.group.source!r} -> "
                             f"{self.group.target!r}; wait for the DAG to be parsed again")

    def gated(self, client: Any, context: Any) -> Any:
        """``client`` (to the target) with the workspace's query budget in front of it, when the target connection's
        ``extra.query_budget`` sets one: every worker of this DAG run takes from the same ledger rows
        (``adapters.query_budget``), keyed by the connection (the workspace) and the run."""
        from promshift.adapters.query_budget import query_gate
        from promshift.orchestration.hooks import PrometheusHook

        hook = self.target_hook
        extra = hook.extra if isinstance(hook, PrometheusHook) else hook.conn_config.extra_config
        run_key = f"{self.group.dag_id}/{context['run_id'] if context else 'no-run'}"
        client.before_query = query_gate(dict(extra or {}), workspace=self.target_conn_id, run_key=run_key)
        return client

    # Whether the step needs the target at all: a rollback restores the source alone, so a target
    # whose control plane refuses us (bad credentials, a deleted workspace) must not block it.
    needs_target = True

    def _replica_sources(self) -> list[tuple[str, Any]]:
        """(replica, its Prometheus client) for a source declared as replicas (``replicas.sources``)."""
        from promshift.orchestration.hooks import PrometheusHook

        clients = []
        for replica, conn_id in self.group.replicas.sources:
            hook = backend_hook(conn_id)
            if not isinstance(hook, PrometheusHook):
                raise AirflowFailException(f"replica {replica!r}: connection {conn_id!r} must be a prometheus one")
            clients.append((replica, hook.prometheus_client()))
        return clients

    def backends(self) -> Any:
        """Both backends from their connections; an AMP problem fails the task with its one-line reason."""
        from promshift.adapters.amp import AmpError
        from promshift.adapters.prometheus import PrometheusClient
        from promshift.orchestration.hooks import PrometheusHook
        from promshift.steps.migration import Backends

        source, target = self.source_hook, self.target_hook
        on_kubernetes = isinstance(source, PrometheusHook) and self.deploy.config_by_api
        if not isinstance(source, PrometheusHook) or ("config_path" not in source.extra and not on_kubernetes):
            raise AirflowFailException(f"connection {self.source_conn_id!r} must be a prometheus connection "
                                       "with extra.config_path (or extra.deploy k8s-configmap/k8s-cr)")
        # A Kubernetes-run source has no config file this worker can see: its deployer reads the object.
        config_path = str(source.extra.get("config_path") or "")
        if not self.needs_target:
            try:
                target.base_url  # noqa: B018 - resolves the workspace, which may fail
            except AmpError as exc:
                why = f"unavailable: {exc}"
                self.log.warning("target %s; this step uses the source only", why)
                # Port 0 never answers: any use fails at once as 'unreachable', never silently.
                return Backends(source=source.prometheus_client(), target=PrometheusClient("http://127.0.0.1:0"),
                                source_config_path=config_path, target_remote_write_url="",
                                promtool=source.extra.get("promtool", "promtool"),
                                target_ready=lambda: why)
        try:
            remote_write_url = target.remote_write_url
            if not remote_write_url:
                raise AirflowFailException(f"connection {self.target_conn_id!r} needs extra.remote_write_url")
            return Backends(
                source=source.prometheus_client(),
                target=target.prometheus_client(),
                source_config_path=config_path,
                target_remote_write_url=remote_write_url,
                promtool=source.extra.get("promtool", "promtool"),
                target_sigv4=target.sigv4,
                target_ready=target.readiness_problem,
                target_retention=target.retention_lookup,
                target_identity=target.identity(),
                target_alerts=target.alert_reader,
                target_discards=getattr(target, "discards_reader", None),
                replica_sources=self._replica_sources if self.group.replicas.sources else None,
                workspace_configuration=(target.workspace_configuration() if self.group.tenant.enabled
                                         and hasattr(target, "workspace_configuration") else None),
            )
        except AmpError as exc:
            if exc.retryable:
                raise
            raise AirflowFailException(str(exc)) from None

    @cached_property
    def deploy_kind(self) -> str:
        """``remote_write`` or ``scraper`` (the target connection's ``extra.deploy``), or ``k8s-configmap`` /
        ``k8s-cr`` (the source connection's ``extra.deploy``: the same entry through the Kubernetes API)."""
        from promshift.core.deploy_kinds import deploy_kind_of
        from promshift.orchestration.hooks import PrometheusHook

        hook, source = self.target_hook, self.source_hook
        extra = hook.extra if isinstance(hook, PrometheusHook) else hook.conn_config.extra_config
        source_extra = source.extra if isinstance(source, PrometheusHook) else {}
        try:
            kind = deploy_kind_of(extra, conn_id=self.target_conn_id, is_amp=not isinstance(hook, PrometheusHook),
                                  source_extra=source_extra, source_conn_id=self.source_conn_id)
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
        return kind

    @cached_property
    def deploy(self) -> Any:
        """What the chosen deploy does (``core.deploy_kinds.Deploy``): the one place its kind becomes behaviour."""
        from promshift.core.deploy_kinds import deploy_of

        return deploy_of(self.deploy_kind)

    def deploy_step(self, context: Any) -> Any:
        """The steps of a deploy through a ``ConfigDeployer``: the managed collector (the group's scraper) or
        the source's Kubernetes object (ConfigMap or ``Prometheus`` CR); snapshots in the object store; the
        quota pre-flight when the target is an AMP workspace."""
        from promshift.adapters.settings import snapshots_url
        from promshift.adapters.snapshot_store import BlobSnapshotStore
        from promshift.core.deploy import DeployError
        from promshift.orchestration.amp_hook import AmpHook
        from promshift.orchestration.object_blobs import ObjectStorageBlobs
        from promshift.steps.deploy import DeployStep

        hook = self.target_hook
        interval_s = self.deploy.writer_interval_s or self.group.scrape_interval_s
        try:
            if self.deploy.own_writer:  # the managed collector: the target's own writer is the deployed thing
                deployer = hook.scraper_deployer(self.group.name, self.group.name_regex(),
                                                 scrape_interval_s=interval_s, drop_labels=self.group.drop_labels)
            elif self.deploy.change_request:  # a commit in the team's config repository
                deployer = self._git_deployer(context)
            else:
                deployer = self._kubernetes_deployer()
        except (DeployError, ValueError) as exc:
            raise AirflowFailException(str(exc)) from None

        migration = self.migration(context)
        return DeployStep(migration, deployer, BlobSnapshotStore(ObjectStorageBlobs(snapshots_url())),
                          quota=self.quota_check(context, interval_s) if isinstance(hook, AmpHook) else None)

    def quota_check(self, context: Any, interval_s: float) -> Any:
        """``(group_series, now) -> deploy.quota``: the AMP workspace's quotas, current capacity and labels per
        series against its use, what other groups reserved on it, and this group (``adapters.amp_quota``)."""
        hook = self.target_hook
        migration = self.migration(context)

        def quota(group_series: int, now: datetime) -> dict[str, Any]:
            from promshift.adapters.amp_quota import external_labels, group_label_count
            from promshift.core.quota import RESERVATION_WINDOW_S, pending_on_workspace

            preflight = hook.quota_preflight()
            window_s = float((hook.conn_config.extra_config.get("quota") or {}).get("reservation_window_s")
                             or RESERVATION_WINDOW_S)
            pending = pending_on_workspace(migration.audit.events(), workspace=preflight.workspace_id,
                                           group=self.group.name, now=now, window_s=window_s)
            source = migration.backends.source
            at = now.timestamp()
            labels = group_label_count(source.label_names(self.group.selector(), start=at - 300, end=at),
                                       external_labels(source.config_text()), tuple(self.group.drop_labels))
            return preflight.require(group_series=group_series, scrape_interval_s=interval_s, now=now,
                                     pending=pending, group_labels=labels)

        return quota

    def _kubernetes_deployer(self) -> Any:
        """The source's ConfigMap or ``Prometheus`` CR deployer, through the cncf-kubernetes ``KubernetesHook``."""
        from promshift.adapters.k8s_deploy import kubernetes_deployer
        from promshift.core.deploy_kinds import kubernetes_source_of
        from promshift.core.render import remote_write_entry
        from promshift.orchestration.hooks import kubernetes_hook

        source = kubernetes_source_of(self.source_hook.extra, conn_id=self.source_conn_id)
        if source is None:
            raise ValueError(f"connection {self.source_conn_id!r} names no Kubernetes source")
        backends = self.backends()
        entry = remote_write_entry(group_name=self.group.name, name_regex=self.group.name_regex(),
                                   drop_labels=self.group.drop_labels, replicas=self.group.replicas,
                                   url=backends.target_remote_write_url, sigv4=backends.target_sigv4)
        return kubernetes_deployer(source.kind, kubernetes_hook(source), namespace=source.namespace,
                                   name=source.name, entry=entry, prometheus=self.source_hook.prometheus_client(),
                                   key=source.key, timeout_s=source.timeout_s)

    def _git_deployer(self, context: Any) -> Any:
        """The source's git deployer: the team's config repository, through a pull request or a direct push; the
        token from the connection ``extra.git.conn_id`` names (its password), never from the extra itself."""
        from promshift.adapters.git_deploy import GitDeployment, change_backend
        from promshift.core.git_source import git_source_of
        from promshift.core.render import remote_write_entry
        from promshift.orchestration.hooks import connection_secret

        source = git_source_of(self.source_hook.extra, conn_id=self.source_conn_id)
        token = connection_secret(source.conn_id) if source.conn_id else None
        backends = self.backends()
        entry = remote_write_entry(group_name=self.group.name, name_regex=self.group.name_regex(),
                                   drop_labels=self.group.drop_labels, replicas=self.group.replicas,
                                   url=backends.target_remote_write_url, sigv4=backends.target_sigv4)
        return GitDeployment(source, entry=entry, prometheus=self.source_hook.prometheus_client(),
                             backend=change_backend(source, token), group=self.group.name,
                             run_id=str(context["run_id"]), token=token)

    def deploy_trigger(self, result: dict[str, Any]) -> Any:
        """What waits for a deploy or restore to be live: the scraper's status, or the source's loaded config."""
        from promshift.orchestration.triggers import GitChangeTrigger, LoadedConfigTrigger, ScraperStatusTrigger

        if self.deploy.waits_for_scraper:
            return ScraperStatusTrigger(target_conn_id=self.target_conn_id, result=result)
        if self.deploy.change_request:  # the pull request's merge state, then the loaded config
            return GitChangeTrigger(source_conn_id=self.source_conn_id, result=result)
        return LoadedConfigTrigger(source_conn_id=self.source_conn_id, result=result)

    def run_params(self, context: Any, *, strict: bool = False) -> Any:
        """The trigger form's values (``core.run_params``). ``strict`` raises RunParamsError (validate records
        it); otherwise a value validate would have refused falls back to the defaults, keeping ``dry_run`` only
        when it is exactly true: a step after a failed validate (the rollback) must still run."""
        from promshift.core.run_params import RunParams, RunParamsError, parse_run_params

        params = context.get("params") or {}
        try:
            return parse_run_params(params, scrape_interval_s=self.group.scrape_interval_s)
        except RunParamsError:
            if strict:
                raise
            return RunParams(dry_run=params.get("dry_run") is True)

    def migration(self, context: Any) -> Any:
        from promshift.adapters.settings import snapshots_dir, snapshots_url
        from promshift.orchestration.object_blobs import ObjectStorageBlobs
        from promshift.steps.migration import GroupMigration

        backends = self.backends()
        audit = audit_store(on_head=lambda head: self._publish_audit_head(context, head))
        return GroupMigration(self.group, backends, audit=audit, routing=routing_store(audit),
                              snapshots_dir=snapshots_dir(), run_id=context["run_id"],
                              catalog_dir=Path(self.catalog_path).parent,
                              snapshot_blobs=ObjectStorageBlobs(snapshots_url()),
                              run_params=self.run_params(context))

    def rules_step(self, migration: Any) -> Any:
        """The group's rules move (``moves.RulesStep``) when the source connection's ``extra.rules`` is true,
        else None (not configured). The target: the AMP workspace's rule-groups namespace, or a self-hosted
        target's rule file (its connection's ``extra.config_path``, ``extra.rules_dir``)."""
        from promshift.adapters.rules_deploy import PrometheusRulesTarget, RulesMove, SourceRules
        from promshift.adapters.settings import snapshots_url
        from promshift.orchestration.amp_hook import AmpHook
        from promshift.orchestration.hooks import PrometheusHook
        from promshift.orchestration.object_blobs import ObjectStorageBlobs
        from promshift.steps.moves import RulesStep

        source = self.source_hook
        if not isinstance(source, PrometheusHook) or not source.extra.get("rules"):
            return None
        promtool = str(source.extra.get("promtool", "promtool"))
        config_path = source.extra.get("config_path")
        if not config_path:
            raise AirflowFailException(f"connection {self.source_conn_id!r}: extra.rules needs extra.config_path")
        target = self.target_hook
        if isinstance(target, AmpHook):
            rules_target: Any = target.rules_namespace(self.group.name)
        else:
            target_config = target.extra.get("config_path")
            if not target_config:
                raise AirflowFailException(f"connection {self.source_conn_id!r} moves rules: the self-hosted target "
                                           f"{self.target_conn_id!r} needs extra.config_path")
            rules_target = PrometheusRulesTarget(target_config, target.prometheus_client(), group_name=self.group.name,
                                                 rules_dir=target.extra.get("rules_dir"), promtool=promtool)
        move = RulesMove.for_group(SourceRules(config_path, source.prometheus_client(), promtool=promtool),
                                   rules_target, self.group)
        return RulesStep(migration, move, ObjectStorageBlobs(snapshots_url()))

    def read_path_step(self, migration: Any) -> Any:
        """The group's dashboards switch (``moves.ReadPathStep``) when connection ``grafana_default`` exists
        with ``extra.read_path``, else None (not configured). File mode keeps its snapshots in the store."""
        from promshift.adapters.settings import snapshots_url
        from promshift.orchestration.grafana_hook import GrafanaHook
        from promshift.orchestration.object_blobs import ObjectStorageBlobs
        from promshift.steps.moves import ReadPathStep

        if self._grafana_read_path() is None:
            return None
        switch = GrafanaHook(GRAFANA_CONN).read_path_switch(self.group, blobs=ObjectStorageBlobs(snapshots_url()))
        return ReadPathStep(migration, switch)

    def moved_restorers(self, migration: Any) -> list[Any]:
        """``lifecycle`` read restorers for what moves with the group (dashboards, then rules), for what is
        configured; each builds its move only when it is called (a bake check that passes builds none)."""
        from promshift.orchestration.hooks import PrometheusHook

        out: list[Any] = []

        def restorer(build: Any) -> Any:
            def restore(m: Any, *, reason: str, now: datetime) -> Any:
                return build(m).restore(m, reason=reason, now=now)
            return restore

        if self._grafana_read_path() is not None:
            out.append(("read_path", restorer(self.read_path_step)))
        source = self.source_hook
        if isinstance(source, PrometheusHook) and source.extra.get("rules"):
            out.append(("rules", restorer(self.rules_step)))
        return out

    @staticmethod
    def _grafana_read_path() -> Any:
        """``grafana_default``'s ``extra.read_path``, or None (no connection, or no read path in it)."""
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            config = BaseHook.get_connection(GRAFANA_CONN).extra_dejson.get("read_path")
        except AirflowNotFoundException:
            return None
        return config if isinstance(config, dict) else None

    def tell_owners(self, context: Any, kind: str, **details: Any) -> dict[str, Any] | None:
        """Notify the group's owners on the catalog's channel and record it; never raises (``orchestration.notify``)."""
        from promshift.orchestration.notify import tell_owners

        return tell_owners(self, context, kind, **details)

    def owners_notifier(self, kind: str, **details: Any) -> Any:
        """The same as an Airflow notifier, for ``HITLOperator(notifiers=...)`` and callbacks."""
        from promshift.orchestration.notify import OwnersNotifier

        return OwnersNotifier(step=self, kind=kind, details=details)

    def _publish_audit_head(self, context: Any, head: Any) -> None:
        """A second witness of the chain's head, in Airflow's own metadata: the task log and XCom ``audit_head``."""
        self.log.info("audit head: seq %s hash %s", head.seq, head.head)
        context["ti"].xcom_push(key="audit_head", value=head.to_dict())


def publish_report(step: _GroupStep, context: Any, migration: Any) -> dict[str, Any] | None:
    """Write the run's report through ``ObjectStoragePath`` and audit where (``report_published``, with hashes).

    The report is a view of the audit log, which stays the evidence: a store that cannot be written is
    logged, and the step's outcome stands.
    """
    from promshift.adapters.settings import reports_url
    from promshift.orchestration.report_store import ReportStore
    from promshift.orchestration.report_store import publish_report as publish

    try:
        record = publish(migration.audit, ReportStore(reports_url()), group=step.group_name,
                         run_id=context["run_id"])
        from promshift.core.events import EventKind

        migration.record(EventKind.REPORT_PUBLISHED, _now(), record)
    except Exception as exc:  # noqa: BLE001 (any store failure: the report is secondary evidence)
        step.log.warning("report not published: %s", exc)
        return None
    step.log.info("report published to %s (%s)", record["url"], ", ".join(record["files"]))
    context["ti"].xcom_push(key="report", value=record)
    return record


class GroupStepOperator(_GroupStep, BaseOperator):
    """Base for the plain (non-deferring) steps."""

    template_fields: Sequence[str] = ("group_name",)
    ui_color = "#e8f0fe"

    def __init__(self, *, group_name: str | None, catalog_path: str, profile: str | None = None,
                 source_conn_id: str = SOURCE_CONN, target_conn_id: str = TARGET_CONN, dag_target: str | None = None,
                 **kwargs: Any) -> None:
        # A step's template fields besides ``group_name`` are its inputs: upstream outputs (XComArgs) given as
        # keyword arguments, None when not given. Taken here, not in an ``__init__`` of each step: Airflow wraps
        # every ``__init__`` of an operator's classes, and each wrapper deep-copies the DAG's Params again.
        inputs = {name: kwargs.pop(name, None) for name in self.template_fields if name != "group_name"}
        super().__init__(**kwargs)
        self._init_group(group_name=group_name, catalog_path=catalog_path, profile=profile,
                         source_conn_id=source_conn_id, target_conn_id=target_conn_id, dag_target=dag_target)
        for name, value in inputs.items():
            setattr(self, name, value)


class ValidateGroupOperator(GroupStepOperator):
    """Check the catalog entry, the group's stage and both backends; change nothing.

    Every failure is recorded as a ``validation_failed`` audit event with its one-line reason
    (the rollback then names it), including backends that cannot even be built: an AMP
    workspace that is not ACTIVE, credentials the control plane refuses, an unknown workspace.
    """

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.core.run_params import RunParamsError
        from promshift.steps.migration import GroupNotStartable

        try:
            self.run_params(context, strict=True)
            self.check_pair()
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
        if self.run_params(context).dry_run:
            return self.migration(context).record_dry_run(
                "snapshot", _now(), would=f"keep the group's {self.deploy_kind} config for rollback")
        if self.deploy.via_deployer:
            out = self.deploy_step(context).snapshot(_now())
        else:
            out = self.migration(context).snapshot(_now())
        self._snapshot_moved(context)
        return out

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
        if self.run_params(context).dry_run:
            return self._dry_run(context)
        snap = given(self, "snapshot")
        if self.deploy.via_deployer:
            return self._deploy_through_deployer(context, snap)
        from promshift.orchestration.amp_hook import AmpHook

        if isinstance(self.target_hook, AmpHook):  # the file path's quota pre-flight, as every deployer's
            from promshift.steps.deploy import DeployStepFailed, quota_preflight

            try:
                quota_preflight(self.migration(context), self.quota_check(context, self.group.scrape_interval_s),
                                deploy_kind=self.deploy_kind, now=_now())
            except DeployStepFailed as exc:
                raise AirflowFailException(str(exc)) from None
        return self.migration(context).deploy_dual_write(snap, _now())

    def _dry_run(self, context: Any) -> dict[str, Any]:
        """Deploy nothing; hand parity and latency the live dual-write's start, if the group has one."""
        from promshift.core.render import remote_write_name

        migration = self.migration(context)
        since = migration.existing_dual_write_since()
        evidence = migration.record_dry_run(
            "deploy_dual_write", _now(), would=f"deploy the group's dual-write ({self.deploy_kind}, "
            f"remote_write {remote_write_name(self.group_name)})", stage=migration.stage().value,
            existing_dual_write_since=since)
        return {**evidence, "dual_write_since": since}

    def _deploy_through_deployer(self, context: Any, snap: dict[str, Any]) -> dict[str, Any]:
        """Quota pre-flight and the deploy (scraper or Kubernetes object), then defer until it is live (or failed)."""
        from promshift.core.deploy import DeployResult
        from promshift.steps.deploy import DeployStepFailed, final_event

        try:
            out = self.deploy_step(context).start(snap, _now())
        except DeployStepFailed as exc:
            raise AirflowFailException(str(exc)) from None
        result = DeployResult.from_dict(out["deploy"])
        if result.state.final:
            return self.execute_complete(context, final_event(result), quota=out["quota"])
        self.defer(trigger=self.deploy_trigger(out["deploy"]),
                   method_name="execute_complete", kwargs={"quota": out["quota"]},
                   timeout=timedelta(seconds=float(result.details.get("timeout_s") or 900) + 300))

    def execute_complete(self, context: Any, event: dict[str, Any], quota: dict[str, Any] | None = None
                         ) -> dict[str, Any]:
        from promshift.steps.deploy import DeployStepFailed

        try:
            out = self.deploy_step(context).finish(event, quota, _now())
        except DeployStepFailed as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info("%s live (%s); status history %s", self.deploy_kind, out.get("scraper_id") or "-",
                      [c["status"] for c in out["deploy"]["status_history"]])
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
        if params.dry_run:
            self.migration(context).record_dry_run(
                "warm_up", _now(), would=f"dual-write {duration_s:g}s and wait (at most {timeout_s:g}s) for the "
                "target to catch up", existing_dual_write_since=(deployed or {}).get("dual_write_since"))
            return
        self.migration(context).start_warmup(_now())
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
    def parity_check(self, context: Any = None) -> Any:
        from promshift.adapters.parity_check import ParityCheck
        from promshift.core.deploy_kinds import group_for_deploy

        # stats=all on every parity query: the result reports the backends' own query time.
        group = group_for_deploy(self.group, self.deploy)  # independent_scraper on the scraper path
        return ParityCheck(group, self.source_hook.prometheus_client(stats=True),
                           self.gated(self.target_hook.prometheus_client(stats=True), context),
                           catalog_dir=Path(self.catalog_path).parent)


class ParityPlanOperator(_ParityStep):
    """Coverage and label layers, and the host shards the mapped sample tasks will compare.

    ``deployed``: the deploy task's output (the parity window starts at the dual-write's start).
    """

    template_fields: Sequence[str] = ("group_name", "deployed")

    deployed: Output

    def execute(self, context: Any) -> list[dict[str, Any]]:
        deployed = given(self, "deployed")
        if deployed.get("dual_write_since") is None and self.run_params(context).dry_run:
            from promshift.core.parity import Measurement, ParityPlan
            from promshift.core.verdicts import Verdict

            # A check without data never passes: nothing of the group is on the target to compare.
            why = (f"dry run: the group is not dual-writing ({self.migration(context).stage().value}), so the "
                   "target holds nothing of it to compare")
            self.log.info("parity window: INCONCLUSIVE %s", why)
            context["ti"].xcom_push(key="plan", value=ParityPlan(None, (Measurement("window", Verdict.INCONCLUSIVE,
                                                                                      why),)).to_dict())
            return []
        plan = self.parity_check(context).plan(dual_write_since=float(deployed["dual_write_since"]),
                                        now=_now().timestamp())
        for m in plan.measurements:
            self.log.info("parity %s: %s %s", m.name, m.verdict.value, m.reason)
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
        result = self.parity_check().reduce(plan, shards, extra=self._rules_layer(context, plan))
        self.log.info("parity %s\n%s", result.verdict.value, parity_log_table(result))
        return result.to_dict()


    def _rules_layer(self, context: Any, plan: dict[str, Any] | None) -> list[Any]:
        """The rules layer when the group's rules move with it: each moved rule's expression on both sides over
        the parity window (``rules_parity``); no window (a dry run without dual-write): none, as for samples."""
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
            if migration.dry_run:  # read only: what the move would take now, kept nowhere
                rules_plan = step.move.plan(step.move.snapshot())
            else:
                _snap, rules_plan = step.this_run()
            # The samples layer's policy and noise allowance: the deploy path's mode (independent on the scraper).
            policy = group_for_deploy(self.group, self.deploy).parity
            return rules_parity(self.source_hook.prometheus_client(), self.target_hook.prometheus_client(),
                                rules_plan.selection, start=float(window["start"]), end=float(window["end"]),
                                step=float(window["step"]), abs_tol=policy.abs_tolerance,
                                rel_tol=policy.rel_tolerance, ignore_labels=policy.ignore_labels,
                                rename_labels=policy.rename_labels, noise_k=noise_allowance(policy.mode))
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
        verdict = migration.gate(parity, latency, _now())
        self.log.info("gate: %s", verdict.reason)
        if verdict.action == GateAction.ROLL_BACK:
            dry = "dry run (nothing to roll back): " if self.run_params(context).dry_run else ""
            raise AirflowFailException(f"{dry}gate {verdict.verdict.value}: {verdict.reason}")
        recorded = migration.gate_event()
        return dict(recorded.evidence_data)


class MigrationApprovalOperator(_GroupStep, ApprovalOperator):
    """On-call approval showing the evidence; enforces four eyes; Reject fails (and so rolls back).

    ``gate_evidence``: the gate task's output. Rendered again when the answer resumes the task, so the
    answer is checked against the gate's XCom as it is then.
    """

    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "gate_evidence")

    # Which approval this is in the audit ("" the cut-over's; "decommission_" the second approval).
    approval_prefix = ""
    # Whether the evidence shown is the gate's, recorded in the audit log, so the answer is checked against it.
    shows_audited_gate = True

    def _answer(self, migration: Any, **answer: Any) -> None:
        migration.record_approval(prefix=self.approval_prefix, **answer)

    def __init__(self, *, group_name: str | None, catalog_path: str, approvers: Sequence[str] | None,
                 profile: str | None = None, source_conn_id: str = SOURCE_CONN,
                 target_conn_id: str = TARGET_CONN, dag_target: str | None = None, gate_evidence: Output = None,
                 **kwargs: Any) -> None:
        """``group_name`` and ``approvers`` None: a DAG of every group; the chosen group's approvers (and its
        ``approval_timeout``) are read from the catalog when the task runs."""
        kwargs.setdefault("subject", f"Cut over metric group {group_name or '(chosen in the form)'} to AMP?")
        kwargs.setdefault("body", "Evidence is filled in when the task runs.")
        # The approver's form: its own comment field only. Airflow hands a task the DAG's params (the trigger
        # form) merged with its own; HITL keeps only params whose source is "task", so the comment is marked so
        # (without it, a DAG with params would leave the approver no comment field).
        from airflow.sdk.definitions.param import ParamsDict

        params = ParamsDict(kwargs.pop("params", None) or {})
        if "comment" not in params:
            params["comment"] = Param("", type="string", description="Why (kept in the audit)", source="task")
        kwargs["params"] = params
        # The catalog's users and teams; a team is resolved when the question is asked (``ask_approvers``).
        self.approver_entries = list(approvers) if approvers is not None else None
        super().__init__(assigned_users=[{"id": a, "name": a} for a in approvers or () if team_of(a) is None],
                         **kwargs)
        self._init_group(group_name=group_name, catalog_path=catalog_path, profile=profile,
                         source_conn_id=source_conn_id, target_conn_id=target_conn_id, dag_target=dag_target)
        self.gate_evidence = gate_evidence

    def ask_within_group_timeout(self) -> None:
        """In a DAG of every group, wait for the chosen group's own ``approval_timeout`` (the DAG was built with
        the longest of its groups')."""
        if self.approver_entries is None:
            self.response_timeout = timedelta(seconds=self.group.approval_timeout_s)

    def ask_approvers(self, context: Any) -> list[str]:
        """Resolve the approvers now (a team's members as they are now), without the run's trigger user, and
        assign the request to them; their ids. Fails with one line when nobody is left to ask: Airflow would let
        any user answer a request assigned to nobody."""
        from promshift.core.approvers import ApproversError, resolve
        from promshift.orchestration.approver_teams import team_directory

        triggered_by = getattr(context.get("dag_run"), "triggering_user_name", None)
        entries = self.approver_entries if self.approver_entries is not None else list(self.group.approvers)
        try:
            directory = team_directory() if any(team_of(a) for a in entries) else None
            asked = resolve(entries, directory, group=self.group_name, exclude=[triggered_by])
        except ApproversError as exc:
            raise AirflowFailException(str(exc)) from None
        self.assigned_users = [{"id": a.id, "name": a.name} for a in asked]
        return [a.id for a in asked]

    def evidence(self) -> dict[str, Any]:
        """What the approver decides on: the gate's whole evidence (verdict, parity, latency with cost), its XCom."""
        return given(self, "gate_evidence") or {}

    def board_url(self) -> str | None:
        """The migration board's page for this group, under the Airflow UI's base URL (None when it is not set)."""
        from airflow.configuration import conf

        from promshift.board import URL_PREFIX

        base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
        return f"{base}{URL_PREFIX}/groups/{self.group_name}" if base else None

    def execute(self, context: Any) -> Any:
        from promshift.core.evidence import evidence_sha256
        from promshift.core.gate import GateEvidence
        from promshift.core.report import approval_body

        evidence = self.evidence()
        if self.run_params(context).dry_run:
            self._end_dry_run(context, evidence)
        self.ask_within_group_timeout()
        digest = evidence_sha256(evidence)
        shown = GateEvidence.from_dict(evidence)
        gate = shown.gate
        board = self.board_url()
        # Recorded before the question is asked: the answer is checked against this hash.
        asked = self.ask_approvers(context)
        self.migration(context).record_evidence_shown(
            evidence_sha256=digest, approvers=asked, now=_now(), board_url=board)
        self.subject = f"[{gate.verdict.value}] Cut over metric group {self.group_name} to AMP?"
        self.body = approval_body(self.group_name, gate, shown.parity, shown.latency, evidence_sha256=digest,
                                  board_url=board)
        # HITL runs its notifiers once the request exists, just before the task waits for an answer.
        self.notifiers = [*self.notifiers, self.owners_notifier("approval_needed", gate=gate.to_dict(),
                                                                board_url=board, approvers=asked)]
        return super().execute(context)

    def _end_dry_run(self, context: Any, evidence: dict[str, Any]) -> None:
        """A dry run asks nobody: record how far it got (``dry_run_complete``), publish the report, and skip
        the approval, and so the cut-over and its asset."""
        from promshift.core.events import EventKind

        migration = self.migration(context)
        gate = evidence.get("gate") or {}
        migration.record(EventKind.DRY_RUN_COMPLETE, _now(), {
            "dry_run": True, "gate": gate.get("verdict"), "gate_reason": gate.get("reason"),
            "parity": (evidence.get("parity") or {}).get("verdict"),
            "latency": (evidence.get("latency") or {}).get("verdict"), "stage": migration.stage().value,
            "run_params": migration.run_params.to_dict(),
            "would": "ask the approvers, then cut over"})
        publish_report(self, context, migration)
        raise AirflowSkipException(f"dry run: gate {gate.get('verdict')}; no approval asked, nothing cut over")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        self.choose_group(context)
        migration = self.migration(context)
        responder = event.get("responded_by_user") or {}

        def field(name: str) -> str | None:
            value = responder.get(name) if isinstance(responder, dict) else getattr(responder, name, None)
            return str(value) if value else None

        # Airflow's own record of this answer: the HITL detail of this task instance.
        hitl = {"dag_id": self.dag_id, "run_id": context["run_id"], "task_id": self.task_id,
                "map_index": getattr(context["ti"], "map_index", -1), "responder_id": field("id"),
                "responded_at": _iso(event.get("responded_at"))}
        if "error" in event:
            self._answer(migration, decision="timeout", by="nobody", comment=str(event.get("error")),
                                      now=_now(), hitl=hitl)
            raise AirflowFailException(f"approval not given: {event.get('error_type')}")

        by = field("id") or field("name") or "unknown"
        choice = (event.get("chosen_options") or ["?"])[0]
        # Airflow's form took it as typed: kept and shown with control and bidi-override characters escaped.
        comment = escaped_text(str((event.get("params_input") or {}).get("comment", "")))
        triggered_by = getattr(context.get("dag_run"), "triggering_user_name", None)
        # The evidence the approver was shown (its hash, recorded when the question was asked) and now.
        from promshift.core.evidence import evidence_sha256

        asked = migration.approval_request()
        shown = str(asked.evidence_data.get("evidence_sha256")) if asked is not None else None
        current = evidence_sha256(self.evidence())
        bound = {"evidence_sha256": shown, "current_sha256": current}
        # The gate evidence as the audit log holds it for this run (read back now): the hash shown must be its.
        gate_event = migration.gate_event() if self.shows_audited_gate else None
        recorded = evidence_sha256(gate_event.evidence_data) if gate_event is not None else None
        # triggering_user_name is the user's *name*; HITL records the *id* (equal only under the
        # Simple auth manager), so the responder matches on either.
        if choice == self.APPROVE and triggered_by and triggered_by in {field("id"), field("name")}:
            self._answer(migration, decision="refused_four_eyes", by=by, comment=comment, now=_now(), hitl=hitl,
                                      **bound)
            raise AirflowFailException(f"{by} triggered this run and cannot also approve it (four-eyes rule)")
        if choice == self.APPROVE and shown != current:
            self._answer(migration, decision="refused_evidence_changed", by=by, comment=comment, now=_now(),
                                      hitl=hitl, **bound)
            raise AirflowFailException(
                f"{by} approved evidence sha256 {shown or '(none recorded)'}, but the evidence is now {current}: "
                "it changed after it was shown, so the approval is refused")
        if choice == self.APPROVE and self.shows_audited_gate and shown != recorded:
            self._answer(migration, decision="refused_evidence_unverified", by=by, comment=comment, now=_now(),
                         hitl=hitl, **bound, recorded_sha256=recorded or "(none recorded)")
            where = f"audit seq {gate_event.seq}" if gate_event is not None else "no gate event recorded"
            raise AirflowFailException(
                f"{by} approved evidence sha256 {shown}, but this run's gate evidence in the audit log ({where}) "
                f"hashes to {recorded or '(nothing)'}: the approver was not shown it, so the approval is refused")
        self._answer(migration, decision=choice, by=by, comment=comment, now=_now(), hitl=hitl, **bound)
        if choice != self.APPROVE:
            raise AirflowFailException(f"rejected by {by}: {comment or 'no comment'}")
        self.log.info("approved by %s", by)
        return {"decision": choice, "by": by, "comment": comment}


def emit_group_asset(op: BaseOperator, context: Any, asset: Any, extra: dict[str, Any]) -> None:
    """Emit ``asset`` (one group's) through the task's asset alias, its only outlet: a task shared by every group
    knows which group's asset only when it runs. A task built without the alias (a test's) emits nothing."""
    from airflow.sdk import AssetAlias

    for outlet in op.outlets or ():
        if isinstance(outlet, AssetAlias):
            context["outlet_events"][outlet].add(asset, extra=extra)


class CutoverOperator(GroupStepOperator):
    """Route the group's reads to the target; emits the group's ``cut_over`` asset (through its alias)."""

    def execute(self, context: Any) -> dict[str, Any]:
        if self.run_params(context).dry_run:  # never reached (the approval skips first); a skip emits no asset
            raise AirflowSkipException("dry run: no cut-over")
        from promshift.steps.moves import record_move_failure

        migration = self.migration(context)
        # The rules first (the source drops them, the target loads them), then the dashboards, then routing;
        # each is audited and done once per run, so a retry resumes where the first attempt stopped.
        rules = self.rules_step(migration)
        if rules is not None:
            try:
                moved = rules.handoff(_now())
            except Exception as exc:
                record_move_failure(migration, "rules", "handoff", exc, _now())
                raise
            self.log.info("rules moved: %s (%s recording, %s alerting)", moved["rules"], moved["records"],
                          moved["alerts"])
        read_path = self.read_path_step(migration)
        if read_path is not None:
            try:
                switched = read_path.switch(_now())
            except Exception as exc:
                record_move_failure(migration, "read_path", "switch", exc, _now())
                raise
            self.log.info("read path switched: %s dashboard(s), %s panel(s)", switched["dashboards"],
                          switched["panels"])
        result = migration.cutover(_now())
        from promshift.orchestration.dag_factory import cut_over_asset

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
        if migration.dry_run:  # nothing was deployed: restore nothing, route nothing, tell nobody
            result = migration.record_dry_run("rollback", _now(), would="restore the snapshot and route reads "
                                              "to the source", reason=reason, performed=False)
            publish_report(self, context, migration)
            return result
        snap = given(self, "snapshot")
        moved_errors = self._restore_moved(context, migration, reason)
        if snap and self.deploy.via_deployer:
            return self._restore_through_deployer(context, snap, reason, moved_errors)
        try:
            result = migration.rollback(snap, reason=reason, now=_now())
        except Exception as exc:
            self.tell_owners(context, "rollback_failed", reason=reason, error=exc)
            raise
        if moved_errors:
            self.tell_owners(context, "rollback_failed", reason=reason, error="; ".join(moved_errors))
            publish_report(self, context, migration)
            raise AirflowFailException("rollback did not restore what moved with the group: " + "; ".join(moved_errors))
        self.tell_owners(context, "rolled_back", reason=reason, result=result)
        self.log.info("rollback because %s: performed=%s restored_identical=%s", reason, result["performed"],
                      result["restored_identical"])
        publish_report(self, context, migration)
        if result["performed"] and not result["restored_identical"] and not result.get("own_entry_removed"):
            raise AirflowFailException("rollback did not restore the source config identically")
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

    def _restore_through_deployer(self, context: Any, snap: dict[str, Any], reason: str,
                         moved_errors: Sequence[str] = ()) -> dict[str, Any]:
        """The snapshot back (the previous blob or object; a created scraper deleted); defer until it is live."""
        from promshift.steps.deploy import DeployStepFailed, final_event

        try:
            result = self.deploy_step(context).restore(snap, reason=reason, now=_now())
        except DeployStepFailed as exc:
            self.tell_owners(context, "rollback_failed", reason=reason, error=exc)
            raise AirflowFailException(str(exc)) from None
        if result.state.final:
            return self.execute_complete(context, final_event(result), reason=reason, moved_errors=list(moved_errors))
        self.defer(trigger=self.deploy_trigger(result.to_dict()),
                   method_name="execute_complete", kwargs={"reason": reason, "moved_errors": list(moved_errors)},
                   timeout=timedelta(seconds=float(result.details.get("timeout_s") or 900) + 300))

    def execute_complete(self, context: Any, event: dict[str, Any], reason: str = "",
                         moved_errors: Sequence[str] = ()) -> dict[str, Any]:
        from promshift.steps.deploy import DeployStepFailed

        try:
            evidence = self.deploy_step(context).finish_rollback(
                event, given(self, "snapshot"), reason=reason, now=_now())
        except DeployStepFailed as exc:
            self.tell_owners(context, "rollback_failed", reason=reason, error=exc)
            raise AirflowFailException(str(exc)) from None
        self.tell_owners(context, "rolled_back", reason=reason, result=evidence)
        self.log.info("rollback because %s: scraper %s restored_identical=%s", reason,
                      event["result"]["status_history"][-1:], evidence["restored_identical"])
        publish_report(self, context, self.migration(context))
        if not evidence["restored_identical"]:
            raise AirflowFailException("rollback did not restore the group's scraper as snapshotted")
        if moved_errors:
            raise AirflowFailException("rollback did not restore what moved with the group: " + "; ".join(moved_errors))
        return evidence


# --------------------------------------------------------------------------- after cut-over: the bake watch


class BakeCheckOperator(GroupStepOperator):
    """One bake check of a cut-over group (``lifecycle.GroupLifecycle``); skips a group not cut over or baking.

    A failed check has already returned the group's reads to the source (``rolled_back_reads``) when this
    task fails; the owners are told (``bake_failed``).
    """

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.core.stages import BAKE_WATCHED
        from promshift.steps.lifecycle import GroupLifecycle, RestoreReadsFailed

        migration = self.migration(context)
        stage = migration.stage()
        if stage not in BAKE_WATCHED:
            raise AirflowSkipException(f"group {self.group_name!r} is {stage.value}: the bake watch checks only "
                                       f"{', '.join(sorted(s.value for s in BAKE_WATCHED))}")
        from promshift.steps.lifecycle import DEFAULT_READ_RESTORERS

        lifecycle = GroupLifecycle(migration, deploy=self.deploy,
                                   read_restorers=[*DEFAULT_READ_RESTORERS, *self.moved_restorers(migration)])
        try:
            out = lifecycle.bake_check(_now())
        except RestoreReadsFailed as exc:
            self.tell_owners(context, "bake_failed", check="restore_reads", reason=str(exc))
            raise AirflowFailException(str(exc)) from None
        self.log.info("bake check of %s: %s (%s)", self.group_name, out["outcome"],
                      (out.get("check") or {}).get("reason"))
        if out["outcome"] == "rolled_back_reads":
            check = out.get("check") or {}
            failed = [m["name"] for m in check.get("measurements", []) if m["verdict"] in ("FAILED", "ERROR")]
            self.tell_owners(context, "bake_failed", check=", ".join(failed) or "bake", reason=out["reason"])
            raise AirflowFailException(f"{out['reason']}; reads returned to the source, dual-write stays on")
        if out["outcome"] == "baked":
            from promshift.orchestration.dag_factory import baked_asset

            emit_group_asset(self, context, baked_asset(self.group_name), {"group": self.group_name,
                                                                            "clean_since": out.get("clean_since")})
        return out


class _EveryGroupTask(BaseOperator):
    """A task about every group of the catalog (the mapped tasks' arguments): the catalog as it is when the
    task runs, and every group's stage moves from the audit log in one read."""

    ui_color = "#e6f4ea"

    def __init__(self, *, catalog_path: str, profile: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog_path = catalog_path
        self.profile = profile

    def catalog_and_moves(self) -> tuple[Any, dict[str, list[str]]]:
        from promshift.adapters.settings import load_catalog

        return load_catalog(self.catalog_path, profile=self.profile), audit_store().stage_moves()


class BakeWatchListOperator(_EveryGroupTask):
    """The groups the bake watch checks now (cut over or baking), each with its connections: the mapped
    ``bake_check``'s arguments. A group no longer in the catalog is left out (its DAG-file list is the
    catalog's)."""

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from promshift.core.stages import BAKE_WATCHED, stage_from_moves

        catalog, moves = self.catalog_and_moves()
        watched = []
        for group in catalog.groups:
            history = moves.get(group.name)  # none: planned, never watched
            if history and stage_from_moves(history) in BAKE_WATCHED:
                watched.append({"group_name": group.name, "source_conn_id": group.source,
                                "target_conn_id": group.target})
        self.log.info("bake watch: %s group(s) cut over or baking: %s", len(watched),
                      ", ".join(w["group_name"] for w in watched[:20]) or "none")
        return watched


class WavesReadyOperator(_EveryGroupTask):
    """The dependent groups to start now (``core.waves.ready_to_start``), as the mapped start's arguments: each
    group's target migration DAG, the run id every worker names for the same cut-overs, and its form."""

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from promshift.core.waves import ready_to_start

        catalog, moves = self.catalog_and_moves()
        groups = {g.name: g for g in catalog.groups}
        starts = ready_to_start(catalog.groups, moves)
        for start in starts:
            self.log.info("starting %s (%s cut over) as run %s", start.group, ", ".join(start.after), start.run_id)
        return [{"trigger_dag_id": groups[s.group].dag_id, "trigger_run_id": s.run_id,
                 "conf": {GROUP_PARAM: s.group, "reason": f"wave: {', '.join(s.after)} cut over"}}
                for s in starts]


# --------------------------------------------------------------------------- decommission (second approval)


def _decommission(step: GroupStepOperator, context: Any) -> Any:
    from promshift.steps.lifecycle import Decommission

    return Decommission(step.migration(context), deploy=step.deploy)


class DecommissionPrepareOperator(GroupStepOperator):
    """Refuse what may not be decommissioned (recorded); else measure what the drop frees and gather the bake
    evidence the second approver is shown."""

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.core.events import EventKind

        self.choose_group(context)
        d = _decommission(self, context)
        m = d.migration
        why = d.refusal()
        if why is not None:
            m.record(EventKind.DECOMMISSION_REFUSED, _now(), {"reason": why, "stage": m.stage().value})
            raise AirflowFailException(why)
        baked = [e for e in m.audit.events(group=self.group_name) if e.kind == EventKind.BAKED]
        bake = baked[-1].evidence_data if baked else {}
        summary = {"at": baked[-1].at.isoformat() if baked else None, "checks": bake.get("checks"),
                   "clean_since": bake.get("clean_since"), "period_s": bake.get("period_s"),
                   "last_check": (bake.get("last_check") or {}).get("reason")}
        return {"freed": d.measure(_now()), "bake": summary}


class DecommissionApprovalOperator(MigrationApprovalOperator):
    """The second approval: the bake evidence and what the drop frees; four eyes and the evidence hash as for the
    cut-over; recorded as ``decommission_approved`` (no stage move: the drop moves it)."""

    approval_prefix = "decommission_"
    shows_audited_gate = False  # the bake evidence and what the drop frees: XCom only (prepare records no event)
    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "prepared")

    def __init__(self, *, prepared: Output = None, **kwargs: Any) -> None:
        """``prepared``: the prepare task's output (what the drop frees, the bake evidence)."""
        super().__init__(**kwargs)
        self.prepared = prepared

    def evidence(self) -> dict[str, Any]:
        return {"prepare": given(self, "prepared") or {}}

    def execute(self, context: Any) -> Any:
        from promshift.core.evidence import evidence_sha256

        self.choose_group(context)
        self.ask_within_group_timeout()
        evidence = self.evidence()
        digest = evidence_sha256(evidence)
        self.migration(context).record_evidence_shown(
            evidence_sha256=digest, approvers=self.ask_approvers(context), now=_now())
        prepare = evidence["prepare"]
        freed, bake = prepare.get("freed") or {}, prepare.get("bake") or {}
        self.subject = f"Decommission metric group {self.group_name} on the source?"
        self.body = (f"**{self.group_name}** baked at {bake.get('at')} after {bake.get('checks')} clean checks "
                     f"(clean since {bake.get('clean_since')}, period {bake.get('period_s')}s; last: "
                     f"{bake.get('last_check')}).\n\nThe source stops storing the group: "
                     f"{freed.get('series')} series ({freed.get('series_by_job')}), "
                     f"{freed.get('samples_per_s')} samples/s freed. The target (written by the managed collector) "
                     f"becomes the only copy; undoing it leaves a gap in the source's history.\n\n"
                     f"evidence sha256 `{digest}`")
        return ApprovalOperator.execute(self, context)


class DecommissionOperator(GroupStepOperator):
    """Drop the group at scrape on the source, verified live; undone by itself if the target would not survive.

    ``approval``: the second approval's output (its decision, by whom, the comment).
    """

    template_fields: Sequence[str] = ("group_name", "approval")

    def __init__(self, *, approval: Output = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.approval = approval

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.lifecycle import DecommissionFailed, DecommissionRefused

        self.choose_group(context)
        approval = given(self, "approval") or {}
        try:
            return _decommission(self, context).decommission(_now(), approval=approval)
        except (DecommissionRefused, DecommissionFailed) as exc:
            raise AirflowFailException(str(exc)) from None


class RecommissionOperator(GroupStepOperator):
    """Undo a decommission: remove the drop; reads stay on the target; the source's history gap is recorded."""

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.lifecycle import DecommissionRefused

        self.choose_group(context)
        reason = str((context.get("params") or {}).get("reason") or "manual recommission")
        try:
            return _decommission(self, context).recommission(_now(), reason=reason)
        except DecommissionRefused as exc:
            raise AirflowFailException(str(exc)) from None


class FullRollbackOperator(GroupStepOperator):
    """By hand, from a cut-over group (e.g. after ``rolled_back_reads``): reads back to the source and the group's
    own remote_write entry removed by name (``lifecycle.full_rollback``); the owners are told."""

    ui_color = "#fde8e8"
    needs_target = False

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.lifecycle import DEFAULT_READ_RESTORERS, DecommissionRefused, full_rollback

        self.choose_group(context)
        if self.deploy.via_deployer:
            raise AirflowFailException(f"a full rollback by hand is wired for the remote_write path only, not "
                                       f"{self.deploy_kind!r}: roll the group's {self.deploy_kind} back by hand")
        reason = str((context.get("params") or {}).get("reason") or "") or "full rollback by hand"
        migration = self.migration(context)
        try:
            result = full_rollback(migration, _now(), reason=reason,
                                   read_restorers=[*DEFAULT_READ_RESTORERS, *self.moved_restorers(migration)])
        except DecommissionRefused as exc:
            raise AirflowFailException(str(exc)) from None
        except Exception as exc:
            self.tell_owners(context, "rollback_failed", reason=reason, error=exc)
            raise
        self.tell_owners(context, "rolled_back", reason=reason, result={**result, "restored_identical": None})
        return result
