"""The composition root of the Airflow shell: what a task's run is built from, in one place.

Every operator gets its group, its hooks, its backends, its deployer (one switch on the deploy kind,
``deploy_step``), the moves that go with the group (rules, dashboards), its notifier, and the audit and
routing stores from here; ``migration(context)`` builds the run once per task execution. ``notify`` and
``deadlines`` take the audit store from here too (``audit_store``), never from the operators.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from promshift.core.text import shown as escaped_text
from promshift.orchestration.hooks import backend_hook

if TYPE_CHECKING:
    from promshift.orchestration.amp_hook import AmpHook
    from promshift.orchestration.hooks import PrometheusHook

SOURCE_CONN = "promshift_source"
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
    from promshift.adapters.settings import ProductionSettingsMissing

    try:
        url = default_audit_url()  # refuses under PROMSHIFT_ENV=production
    except ProductionSettingsMissing as exc:
        raise AirflowFailException(f"{exc}; or connection {AUDIT_CONN!r}'s extra.url") from None
    log.info("audit database (default, SQLite under PROMSHIFT_HOME): %s", redacted(url))
    return url


def require_production_settings(where: str) -> None:
    """Under ``PROMSHIFT_ENV=production``, fail the task in one line unless every store is named (the audit
    database, key and anchor, snapshots, reports), before anything is opened or created; in the lab, nothing."""
    import os

    from promshift.adapters import settings

    try:
        if not settings.is_production():
            return
        url = os.environ.get("PROMSHIFT_AUDIT_URL") or _connection_audit_url()
        settings.require_production_settings(where, audit_url=url, audit_key_given=audit_key() is not None)
    except settings.ProductionSettingsMissing as exc:
        raise AirflowFailException(str(exc)) from None


def lab_bake_watch_clock_ahead_s() -> float:
    """LAB ONLY: how far ahead of the wall clock the bake watch counts a group's history (0 unless the lab's
    ``PROMSHIFT_LAB_BAKE_WATCH_CLOCK_AHEAD`` is set); under ``PROMSHIFT_ENV=production`` a set one fails the task
    in one line (``settings.lab_bake_watch_clock_ahead_s``). The cut-over never reads it."""
    from promshift.adapters import settings

    try:
        ahead = settings.lab_bake_watch_clock_ahead_s()
    except settings.LabOnlySetting as exc:
        raise AirflowFailException(str(exc)) from None
    if ahead:
        log.warning("LAB ONLY: the bake watch counts the target's history %.0fs ahead of the wall clock (%s); "
                    "every horizon record says so", ahead, settings.LAB_CLOCK_AHEAD_VAR)
    return ahead


def _connection_audit_url() -> str | None:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        url = BaseHook.get_connection(AUDIT_CONN).extra_dejson.get("url")
    except AirflowNotFoundException:
        return None
    return url if isinstance(url, str) and url else None


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


class GroupWiring:
    """What every step operator shares: which group, which catalog, which backends; and the task's run, built
    once per execution (``migration(context)``: one audit store, routing store and set of backends)."""

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

    def _replica_sources(self, *, stats: bool = False) -> list[tuple[str, Any]]:
        """(replica, its Prometheus client) for a source declared as replicas (``replicas.sources``)."""
        from promshift.orchestration.hooks import PrometheusHook

        clients = []
        for replica, conn_id in self.group.replicas.sources:
            hook = backend_hook(conn_id)
            if not isinstance(hook, PrometheusHook):
                raise AirflowFailException(f"replica {replica!r}: connection {conn_id!r} must be a prometheus one")
            clients.append((replica, hook.prometheus_client(stats=stats)))
        return clients

    def parity_check(self, context: Any = None) -> Any:
        """The DAG's parity check (``plan`` / ``compare_shard`` / ``reduce``), the same choice as the migration's
        ``parity()``: a group whose source runs as replicas (``replicas.sources``) against the replica the target
        kept (``adapters.parity_ha``), any other against the group's source. Every query asks the backends for
        their query time (stats=all); the target behind the workspace's query budget (``gated``); the deploy
        path's mode (independent_scraper on the scraper path)."""
        from promshift.adapters.probes import AdapterProbes
        from promshift.core.deploy_kinds import group_for_deploy

        group = group_for_deploy(self.group, self.deploy)
        target = self.gated(self.target_hook.prometheus_client(stats=True), context)
        catalog_dir, limits = Path(self.catalog_path).parent, getattr(self.target_hook, "query_limits", None)
        if group.replicas.enabled and group.replicas.sources:
            return AdapterProbes().ha_parity(group, self._replica_sources(stats=True), target,
                                             catalog_dir=catalog_dir, limits=limits)
        return AdapterProbes().parity(group, self.source_hook.prometheus_client(stats=True), target,
                                      catalog_dir=catalog_dir, limits=limits)

    def parity_source(self, check: Any, plan: Any) -> Any:
        """The source a parity plan compared with, for the layers measured beside it (the rules layer): the replica
        it elected, for a source declared as replicas; else the group's source."""
        source_for = getattr(check, "source_for", None)
        return source_for(plan) if source_for is not None else self.source_hook.prometheus_client()

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
                target_limits=getattr(target, "query_limits", None),
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
        """The run's deploy driver (``steps.deploy.DeployStep``) over the deployer ``deployer`` chose."""
        return self.migration(context).deploy_step

    def deployer(self, context: Any, backends: Any) -> Any:
        """The group's ``ConfigDeployer``: the one switch on the deploy kind. The source's config file
        (``remote_write``), the managed collector (the group's scraper), the team's config repository (``git``) or
        the source's Kubernetes object (ConfigMap or ``Prometheus`` CR). One line for a deployer that cannot be
        built (nothing is deployed)."""
        from promshift.core.deploy import DeployError

        try:
            if self.group.aggregations and (self.deploy.own_writer or self.deploy.change_request
                                            or self.deploy.config_by_api):
                raise ValueError(f"group {self.group.name!r} ships aggregations, whose recording rules only the "
                                 f"source's config file path deploys (remote_write), not {self.deploy.kind}")
            if self.deploy.own_writer:  # the managed collector: the target's own writer is the deployed thing
                interval_s = self.deploy.writer_interval_s or self.group.scrape_interval_s
                return self.target_hook.scraper_deployer(self.group.name, self.group.name_regex(),
                                                         scrape_interval_s=interval_s,
                                                         drop_labels=self.group.drop_labels)
            if self.deploy.change_request:  # a commit in the team's config repository
                return self._git_deployer(context)
            if self.deploy.config_by_api:
                return self._kubernetes_deployer()
            return self._file_deployer(backends)
        except (DeployError, ValueError) as exc:
            raise AirflowFailException(str(exc)) from None

    def _file_deployer(self, backends: Any) -> Any:
        """The source's config file on this worker (``extra.config_path``) and the server that loads it."""
        from promshift.orchestration.compose import file_deployer

        return file_deployer(self.group, backends)

    def snapshot_store(self) -> Any:
        """Where snapshots go: the object store every worker reads (``PROMSHIFT_SNAPSHOTS_URL``); the file path's
        as the config's own bytes."""
        from promshift.adapters.file_deployment import FileBytesSnapshotStore
        from promshift.adapters.settings import snapshots_url
        from promshift.adapters.snapshot_store import BlobSnapshotStore
        from promshift.orchestration.object_blobs import ObjectStorageBlobs

        blobs = ObjectStorageBlobs(snapshots_url())
        return BlobSnapshotStore(blobs) if self.deploy.config_by_api or self.deploy.own_writer else \
            FileBytesSnapshotStore(blobs)

    def quota_check(self, audit: Any) -> Any:
        """The AMP workspace's quota pre-flight, on every deploy path (the source file's too): its quotas, current
        adaptive capacity and labels per series against its use (None: a self-hosted target)."""
        from promshift.orchestration.amp_hook import AmpHook

        hook = self.target_hook
        if not isinstance(hook, AmpHook):
            return None
        interval_s = self.deploy.writer_interval_s or self.group.scrape_interval_s

        def quota(group_series: int, now: datetime) -> dict[str, Any]:
            """The workspace's quotas against its use, what other groups reserved on it, and this group."""
            from promshift.adapters.amp_quota import external_labels, group_label_count
            from promshift.core.quota import RESERVATION_WINDOW_S, pending_on_workspace

            preflight = hook.quota_preflight()
            window_s = float((hook.conn_config.extra_config.get("quota") or {}).get("reservation_window_s")
                             or RESERVATION_WINDOW_S)
            pending = pending_on_workspace(audit.events(), workspace=preflight.workspace_id,
                                           group=self.group.name, now=now, window_s=window_s)
            source, at = self.source_hook.prometheus_client(), now.timestamp()
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
                             run_id=self.deploying_run_id(context), token=token)

    def deploying_run_id(self, context: Any) -> str:
        """The run whose change the deployer makes and undoes: this run (a by-hand full rollback: the run that
        deployed the group's dual-write, ``FullRollbackOperator``)."""
        return str(context["run_id"])

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
        """The task's run (``GroupMigration`` over this task's audit store, routing store and backends): built once
        for ``context`` (one execution, or one resume of a deferred task) and handed to every call in it."""
        built = getattr(self, "_task_run", None)
        if built is not None and built[0] is context:
            return built[1]
        migration = self._build_migration(context)
        self._task_run = (context, migration)
        return migration

    def effects(self, context: Any) -> Any:
        """What the run's steps do to the world (``steps.effects``): a dry run's record what they would have done.
        The one place the shell chooses by ``dry_run``."""
        from promshift.steps.effects import DryRunEffects, LiveEffects

        migration = self.migration(context)
        return (DryRunEffects if migration.dry_run else LiveEffects)(migration, self.deploy_kind)

    def _build_migration(self, context: Any) -> Any:
        from promshift.adapters.settings import snapshots_url
        from promshift.orchestration.compose import compose_migration
        from promshift.orchestration.object_blobs import ObjectStorageBlobs

        backends = self.backends()
        audit = audit_store(on_head=lambda head: self._publish_audit_head(context, head))
        return compose_migration(self.group, backends, audit=audit, routing=routing_store(audit),
                                 run_id=context["run_id"], catalog_dir=Path(self.catalog_path).parent,
                                 snapshot_blobs=ObjectStorageBlobs(snapshots_url()),
                                 run_params=self.run_params(context),
                                 # Built when a step first deploys or restores (a validate builds none).
                                 deployer=lambda: self.deployer(context, backends),
                                 snapshots=self.snapshot_store(), quota=self.quota_check(audit),
                                 queues=self.queue_cap(backends, audit))

    def queue_cap(self, backends: Any, audit: Any) -> Any:
        """The source's queue cap and swap (``compose.queue_cap``) on a path that adds a source queue, else None.

        The cap: the source connection's ``extra.max_queues``, else the catalog's ``defaults.max_queues``; read when
        the deploy's pre-flight needs it, and a bad value refuses that deploy in one line (fails closed) without
        blocking a rollback. The merge swap runs on the file path and on the ``Prometheus`` resource (k8s-cr: each
        edit through the Kubernetes API, ``adapters.k8s_edits``); the ConfigMap and git paths refuse past the cap. A
        swap starts only when the target's out-of-order window (its hook's ``out_of_order_window``: an AMP
        workspace's configuration, a Prometheus's loaded config) covers the overlap; else the deploy is refused."""
        from promshift.core.deploy_kinds import K8S_CR
        from promshift.core.queues import queue_cap_of
        from promshift.orchestration.compose import queue_cap
        from promshift.orchestration.hooks import PrometheusHook

        if not self.deploy.source_queue:
            return None
        source = self.source_hook
        extra = source.extra if isinstance(source, PrometheusHook) else {}

        def cap() -> int:
            return queue_cap_of((extra or {}).get("max_queues"), self.group.max_queues, conn_id=self.source_conn_id)

        return queue_cap(self.group, backends, audit=audit, cap=cap, file_path=not self.deploy.config_by_api,
                         edits=self._resource_edits() if self.deploy.kind == K8S_CR else None,
                         out_of_order_window=lambda: self.target_hook.out_of_order_window(),
                         member_interval_s=self._catalog_intervals())

    def _catalog_intervals(self) -> Callable[[str], float | None]:
        """Each catalog group's scrape interval (a swap's members), None for a name the catalog does not hold; the
        catalog is read once, when a swap's guard first asks, not once per member."""
        from functools import cache

        from promshift.adapters.settings import load_catalog

        @cache
        def intervals() -> dict[str, float]:
            groups = load_catalog(self.catalog_path, profile=self.profile).groups
            return {g.name: float(g.scrape_interval_s) for g in groups}

        return lambda group_name: intervals().get(group_name)

    def _resource_edits(self) -> Any:
        """A queue swap's edits of the source's ``Prometheus`` resource: a ``ConfigDeployer`` per change
        (``adapters.k8s_edits``), through the cncf-kubernetes ``KubernetesHook``, built when a swap first runs."""
        from promshift.adapters.k8s_edits import PrometheusCREditDeployment
        from promshift.core.deploy_kinds import kubernetes_source_of
        from promshift.orchestration.hooks import kubernetes_hook

        def edit(change: Any) -> Any:
            source = kubernetes_source_of(self.source_hook.extra, conn_id=self.source_conn_id)
            if source is None:
                raise ValueError(f"connection {self.source_conn_id!r} names no Kubernetes source")
            return PrometheusCREditDeployment(kubernetes_hook(source), namespace=source.namespace, name=source.name,
                                              change=change, prometheus=self.source_hook.prometheus_client(),
                                              timeout_s=source.timeout_s)

        return edit

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
        source_rules = self._prometheus_rule_source(source, promtool)  # rules in PrometheusRule objects
        config_path = source.extra.get("config_path")
        if not config_path and source_rules is None:
            raise AirflowFailException(f"connection {self.source_conn_id!r}: extra.rules needs extra.config_path "
                                       "(or extra.kubernetes.prometheus_rules)")
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
        source_rules = source_rules or SourceRules(config_path, source.prometheus_client(), promtool=promtool)
        move = RulesMove.for_group(source_rules, rules_target, self.group)
        return RulesStep(migration, move, ObjectStorageBlobs(snapshots_url()))

    def _prometheus_rule_source(self, source: Any, promtool: str) -> Any:
        """``adapters.k8s_rules.PrometheusRuleSource`` over ``extra.kubernetes.prometheus_rules``, else None."""
        from promshift.adapters.k8s_rules import PrometheusRuleSource
        from promshift.core.deploy_kinds import kubernetes_source_of
        from promshift.orchestration.hooks import kubernetes_hook

        k8s = kubernetes_source_of(source.extra, conn_id=self.source_conn_id)
        if k8s is None or not k8s.prometheus_rules:
            return None
        return PrometheusRuleSource(kubernetes_hook(k8s), k8s.prometheus_rules, source.prometheus_client(),
                                    promtool=promtool, timeout_s=k8s.timeout_s)

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

    def horizon(self, migration: Any, context: Any, now: datetime) -> Any:
        """The group's history horizon at ``now`` (``core.horizon.Horizon``): when its dual-write began and whether
        this run accepts short history; None when it is not dual-writing (nothing to hold back)."""
        from promshift.core.horizon import Horizon, dual_write_since

        since = dual_write_since(migration.audit.events(group=self.group_name))
        if since is None:
            return None
        return Horizon(since, now, accept_short_history=self.run_params(context).accept_short_history,
                       scrape_interval_s=self.group.scrape_interval_s)

    def horizon_moves(self) -> list[Any]:
        """The bake watch's movers of what the horizon held back (dashboards, then rules), for what is configured;
        each builds its move only when something waits (``GroupLifecycle.move_when_ready``)."""
        from promshift.orchestration.hooks import PrometheusHook

        out: list[Any] = []
        if self._grafana_read_path() is not None:
            out.append(lambda m, horizon, now: self.read_path_step(m).switch_when_ready(m, horizon, now))
        source = self.source_hook
        if isinstance(source, PrometheusHook) and source.extra.get("rules"):
            out.append(lambda m, horizon, now: self.rules_step(m).handoff_when_ready(m, horizon, now))
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


# The trigger form field naming the source a retire DAG acts on (a connection id every group of it shares).
SOURCE_PARAM = "source"


def retire_source(conn_id: str, *, catalog_path: str, profile: str | None, run_id: str) -> Any:
    """``steps.retire.RetireSource`` for the source connection ``conn_id``: its catalog groups, the audit store,
    its mode switch, what it still does (its query log: ``extra.query_log``) and each group's target.

    The switch by the connection's deploy kind: ``git`` commits the Helm values' ``prometheus.agentMode``
    (``adapters.git_source_mode``), ``k8s-cr`` replaces the ``Prometheus`` resource with a ``PrometheusAgent``
    (``adapters.k8s_source_mode``); a file-path source needs ``extra.mode_switch`` (LAB ONLY: a pid file on the
    worker's host).
    Without one it fails closed with one line naming the by-hand flags edit: the next run finds the source an
    agent and proves it."""
    from promshift.adapters.prometheus import PrometheusClient
    from promshift.adapters.settings import load_catalog
    from promshift.adapters.source_mode import mode_switch_from_extra
    from promshift.adapters.source_retire import HttpSampleTimes, HttpSourceObserver
    from promshift.core.durations import parse_duration
    from promshift.steps.retire import RetireSource

    catalog = load_catalog(catalog_path, profile=profile)
    groups = [g for g in catalog.groups if g.source == conn_id]
    hook = backend_hook(conn_id)
    extra = hook.extra if isinstance(hook.extra, dict) else {}
    source_client = PrometheusClient(hook.base_url, timeout_s=30)
    switch: Any
    if extra.get("deploy") == "git":  # the Helm values' prometheus.agentMode, through the deploy's change backend
        from promshift.adapters.git_deploy import change_backend
        from promshift.adapters.git_source_mode import GitSourceModeSwitch
        from promshift.adapters.source_mode import SourceModeError
        from promshift.core.deploy import DeployError
        from promshift.core.git_source import git_source_of
        from promshift.orchestration.hooks import connection_secret

        try:
            git = git_source_of(extra, conn_id=conn_id)
            token = connection_secret(git.conn_id) if git.conn_id else None
            switch = GitSourceModeSwitch(git, backend=change_backend(git, token), url=hook.base_url, conn_id=conn_id,
                                         run_id=run_id, token=token)
        except (ValueError, SourceModeError, DeployError) as exc:
            raise AirflowFailException(f"connection {conn_id!r}: {exc}") from None
    elif extra.get("deploy") == "k8s-cr":  # the Prometheus resource becomes a PrometheusAgent (and back)
        from promshift.adapters.k8s_source_mode import K8sSourceModeSwitch
        from promshift.core.deploy_kinds import kubernetes_source_of
        from promshift.orchestration.hooks import kubernetes_hook

        try:
            k8s = kubernetes_source_of(extra, conn_id=conn_id)
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
        if k8s is None:  # deploy k8s-cr always names one; kept for the type
            raise AirflowFailException(f"connection {conn_id!r}: extra.kubernetes names no Prometheus resource")
        switch = K8sSourceModeSwitch(kubernetes_hook(k8s), namespace=k8s.namespace, name=k8s.name,
                                     url=hook.base_url, timeout_s=k8s.timeout_s)
    elif "mode_switch" in extra:
        try:
            switch = mode_switch_from_extra(hook.base_url, extra["mode_switch"])
        except ValueError as exc:
            raise AirflowFailException(f"connection {conn_id!r}: {exc}") from None
    else:
        switch = _NoProcessControl(conn_id, hook.base_url)
    # a PrometheusClient for either kind of target (an AmpHook's get_conn is its boto3 service, not a client)
    targets = {g.name: HttpSampleTimes(backend_hook(g.target).prometheus_client()) for g in groups}
    interval = max([g.scrape_interval_s for g in groups] or [30.0])
    if isinstance(extra.get("scrape_interval"), str):
        interval = parse_duration(extra["scrape_interval"])
    audit = audit_store()
    return RetireSource(conn_id=conn_id, groups=groups, audit=audit, switch=switch,
                        source=HttpSourceObserver(source_client, query_log=extra.get("query_log")),
                        target=targets, run_id=run_id, scrape_interval_s=interval,
                        queues=retire_queues(groups, catalog_path=catalog_path, profile=profile, audit=audit))


class _CatalogGroup(GroupWiring):
    """One group's wiring outside a group's task: the retire builds each target's queue swap from one of its groups
    (the same backends, deploy path and ``queue_cap`` as the group's own runs)."""

    log = log

    def __init__(self, group: Any, *, catalog_path: str, profile: str | None) -> None:
        self._init_group(group_name=group.name, catalog_path=catalog_path, profile=profile,
                         source_conn_id=group.source, target_conn_id=group.target)


def retire_queues(groups: Any, *, catalog_path: str, profile: str | None, audit: Any) -> list[Any]:
    """Each target of the retired source's groups, with what builds its queue swap (``steps.retire.SourceQueues``):
    ``GroupWiring.queue_cap`` of the first group writing to it, built when the consolidation runs. The swap runs on
    the file path and on the ``Prometheus`` resource; on the ConfigMap and git paths ``QueueCap.swap_ports`` is None
    and the per-group entries stay (the consolidation says why); the managed collector adds no source queue."""
    from promshift.steps.retire import SourceQueues

    firsts: dict[str, Any] = {}
    for group in groups:
        firsts.setdefault(group.target, group)

    def build(group: Any) -> Any:
        def queue_cap() -> tuple[Any, str]:
            wiring = _CatalogGroup(group, catalog_path=catalog_path, profile=profile)
            return wiring.queue_cap(wiring.backends(), audit), wiring.deploy_kind
        return queue_cap

    return [SourceQueues(target=target, build=build(group)) for target, group in firsts.items()]


class _NoProcessControl:
    """A file-path source promshift cannot restart: reads its mode, refuses to change it (one line)."""

    def __init__(self, conn_id: str, url: str) -> None:
        self.conn_id, self.url = conn_id, url

    def mode(self) -> str:
        from promshift.adapters.source_mode import probe_mode

        return probe_mode(self.url)

    def to_agent(self) -> Any:
        raise AirflowFailException(
            f"{self.conn_id}: promshift has no process control on a file-path source; switch it by hand (its "
            "service's flags: --enable-feature=agent on 2.x, --agent on 3.x, --storage.agent.path; the config's "
            "rule_files/alerting/remote_read removed; docs/lifecycle.md), then run this DAG again to prove it")

    def restore(self) -> Any:
        raise AirflowFailException(f"{self.conn_id}: restore its server flags and config by hand (docs/lifecycle.md)")
