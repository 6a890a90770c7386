"""AmpHook: an AMP workspace through the amazon provider's AwsBaseHook (credentials, region, role)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import cached_property
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper
from botocore.exceptions import BotoCoreError

from promshift.adapters.amp import (
    AmpError,
    AmpTarget,
    Workspace,
    active_workspace,
    amp_target_from_extra,
    check_amp_extra,
    describe_workspace,
    workspace_out_of_order_window,
    workspace_problem,
    workspace_retention,
)
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.adapters.sigv4 import AwsSigV4Auth
from promshift.orchestration.provider_info import AMP_UI, field_behaviour


class AmpHook(AwsBaseHook):
    """One AMP workspace: its control plane (boto3 ``amp``) and its signed Prometheus API.

    The connection (conn_type ``amp``) is an AWS connection as the amazon provider reads it
    (login/password or the default credential chain, ``region_name``, ``role_arn``,
    ``endpoint_url``) whose extra also names the workspace: ``workspace_id`` or
    ``workspace_alias``, and (local stand-in only) ``remote_write_url``. The query and
    remote-write URLs come from ``DescribeWorkspace``; nobody pastes them.
    """

    conn_name_attr = "aws_conn_id"
    default_conn_name = "promshift_target"
    conn_type = "amp"
    hook_name = "Amazon Managed Service for Prometheus (promshift)"

    def __init__(self, aws_conn_id: str | None = default_conn_name, *, timeout_s: float | None = None,
                 **kwargs: Any) -> None:
        kwargs["client_type"] = "amp"
        super().__init__(aws_conn_id=aws_conn_id, **kwargs)
        self._timeout_s = timeout_s
        self._query_limits: Any = None

    @cached_property
    def conn_config(self) -> AwsConnectionWrapper:
        """The provider's wrapper, read from our ``amp`` connection as an ``aws`` one (same fields)."""
        conn = self.get_connection(self.aws_conn_id) if self.aws_conn_id else None
        if conn is None:
            return super().conn_config
        # Before the provider reads it: a list, or access keys in it, is a one-line AmpError naming the field.
        extra = check_amp_extra(conn.extra_dejson, conn_id=str(conn.conn_id))
        aws = AwsConnectionWrapper.from_connection_metadata(conn_id=conn.conn_id, login=conn.login,
                                                            password=conn.password, extra=extra)
        return AwsConnectionWrapper(conn=aws, region_name=self._region_name, botocore_config=self._config,
                                    verify=self._verify)

    @cached_property
    def target(self) -> AmpTarget:
        return amp_target_from_extra(self.conn_config.extra_config, conn_id=str(self.aws_conn_id))

    @cached_property
    def workspace(self) -> Workspace:
        """The workspace, checked ACTIVE once per hook (``readiness_problem`` asks again)."""
        return active_workspace(self.conn, self.target)

    @cached_property
    def credentials(self) -> Any:
        """The session's botocore credentials (refreshable when a role is assumed); read per request."""
        creds = self.get_session(region_name=self.target.region).get_credentials()
        if creds is None:
            raise AmpError(f"no AWS credentials for connection {self.aws_conn_id!r} (set its login/password "
                           "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")
        frozen = creds.get_frozen_credentials()
        _mask(frozen.secret_key, frozen.token)
        return creds

    def sigv4_auth(self) -> AwsSigV4Auth:
        return AwsSigV4Auth(self.credentials, self.target.region, "aps")

    # -- what a migration asks of a backend (PrometheusHook answers the same) ----------------
    @property
    def base_url(self) -> str:
        return self.workspace.query_url

    def prometheus_client(self, *, stats: bool = False) -> PrometheusClient:
        timeout = self._timeout_s or self.target.timeout_s
        return PrometheusClient(self.base_url, timeout_s=timeout, auth=self.sigv4_auth(), always_stats=stats)

    @property
    def alert_reader(self) -> Callable[[str], list[Any]]:
        """The workspace's own Alertmanager API (``<endpoint>alertmanager/api/v2/alerts``, signed): alertname ->
        the alerts it holds active (``adapters.alertmanager.active_alerts``). Needs ``aps:ListAlerts``."""
        from promshift.adapters.alertmanager import active_alerts

        base, auth = self.base_url.rstrip("/") + "/alertmanager", self.sigv4_auth()
        return lambda name: active_alerts(base, name, auth=auth)

    @property
    def remote_write_url(self) -> str:
        """The connection's ``remote_write_url`` (a local signing relay), else the workspace's own."""
        return self.target.remote_write_url or self.workspace.remote_write_url

    @property
    def sigv4(self) -> dict[str, str]:
        """The remote_write ``sigv4:`` block: the workspace's region, and ``writer_role_arn`` when the writer assumes
        one. Never the connection's ``role_arn``: that is promshift's control-plane role (CreateScraper, rule
        namespaces, Secrets Manager reads), which the source Prometheus must not hold (docs/aws-setup.md)."""
        block = {"region": self.target.region}
        if self.target.writer_role_arn:
            block["role_arn"] = self.target.writer_role_arn
        return block

    @property
    def retention_lookup(self) -> Callable[[], tuple[float | None, str]]:
        return self.retention

    def retention(self) -> tuple[float | None, str]:
        """``(seconds, origin)`` from DescribeWorkspaceConfiguration, ``(None, why)`` when unavailable."""
        return workspace_retention(self.conn, self.target, self.workspace.workspace_id)

    def out_of_order_window(self) -> tuple[float | None, str]:
        """``(seconds, origin)``: the workspace's out-of-order window (DescribeWorkspaceConfiguration), ``(None, why)``
        when unavailable (a queue swap is then refused)."""
        return workspace_out_of_order_window(self.conn, self.target, self.workspace.workspace_id)

    def identity(self) -> dict[str, Any]:
        """What the audit records about the target: kind, workspace and region, never credentials."""
        return {"kind": "amp", "workspace_id": self.workspace.workspace_id, "region": self.target.region}

    def readiness_problem(self) -> str | None:
        """AMP has no ``/-/ready``: the workspace is ACTIVE now, and one cheap signed query answers."""
        target = self.target  # a bad extra is the caller's one-line AmpError, before any AWS call
        try:
            ws = describe_workspace(self.conn, target)
        except AmpError as exc:
            return str(exc)
        problem = workspace_problem(ws, target.region)
        if problem:
            return problem
        try:
            PrometheusClient(ws.query_url, timeout_s=15, auth=self.sigv4_auth()).query("vector(1)")
        except (PrometheusError, AmpError) as exc:
            return f"AMP workspace {ws.workspace_id}: signed query failed: {exc}"
        return None

    # -- the managed-collector path (DEPLOY=scraper) --------------------------------------------
    def scraper_deployer(self, group_name: str, name_regex: str, *, scrape_interval_s: float = 30.0,
                         timeout_s: float | None = None, drop_labels: tuple[str, ...] = ()) -> Any:
        """A ``ScraperDeployer`` for the group: its blob, this workspace as destination, ``extra.scraper`` as source.

        The blob is checked against the managed collector's limits when ``deploy`` is called, before any API call.
        """
        from promshift.adapters.amp_scraper import DEFAULT_TIMEOUT_S, ScraperDeployer, scraper_source_from_extra
        from promshift.core.scraper_config import render_scraper_config

        source = scraper_source_from_extra(self.conn_config.extra_config, conn_id=str(self.aws_conn_id),
                                           region=self.target.region)
        blob = render_scraper_config(name_regex=name_regex, scrape_interval_s=scrape_interval_s,
                                     drop_labels=drop_labels)
        return ScraperDeployer(self.conn, group_name=group_name, blob=blob, workspace_arn=self.workspace.arn,
                               source=source, timeout_s=timeout_s or DEFAULT_TIMEOUT_S)

    def rules_namespace(self, group_name: str, *, timeout_s: float | None = None) -> Any:
        """The group's rule-groups namespace (``promshift-<group>``) on this workspace: an ``AmpRulesNamespace``.

        Needs ``aps:CreateRuleGroupsNamespace``, ``aps:PutRuleGroupsNamespace``,
        ``aps:DescribeRuleGroupsNamespace`` and ``aps:DeleteRuleGroupsNamespace`` (rollback).
        """
        from promshift.adapters.rules_deploy import DEFAULT_TIMEOUT_S, AmpRulesNamespace

        return AmpRulesNamespace(self.conn, self.workspace.workspace_id, group_name,
                                 timeout_s=timeout_s or DEFAULT_TIMEOUT_S)

    def service_client(self, service_name: str) -> Any:
        """Another AWS service's client with this connection's credentials, region, role and endpoint.

        ``get_client_type`` builds only the hook's own ``amp`` client; this is its body for another service
        (``endpoint_url`` or ``service_config.<service>.endpoint_url`` from the extra, as the provider reads them).
        """
        session = self.get_session(region_name=self.target.region)
        return session.client(service_name, endpoint_url=self.conn_config.get_service_endpoint_url(service_name),
                              config=self._get_config(None), verify=self.verify)

    def quota_preflight(self, *, max_share: float | None = None) -> Any:
        """A ``QuotaPreflight`` on this workspace: Service Quotas and CloudWatch through this connection.

        ``extra.quota: {max_share, codes: {active_series, ingestion_rate}}`` may set the share (default 0.8)
        and pin AWS's quota codes (otherwise the quotas are found by their documented names).
        """
        from promshift.adapters.amp_quota import QuotaPreflight
        from promshift.core.quota import DEFAULT_MAX_SHARE

        settings = self.conn_config.extra_config.get("quota") or {}
        workspace = self.workspace
        return QuotaPreflight(
            quotas=self.service_client("service-quotas"), cloudwatch=self.service_client("cloudwatch"),
            workspace_id=workspace.workspace_id, workspace_arn=workspace.arn,
            workspace_series_query=lambda: self.prometheus_client().scalar('count({__name__=~".+"})'),
            max_share=float(max_share or settings.get("max_share") or DEFAULT_MAX_SHARE),
            quota_codes=dict(settings.get("codes") or {}), check_capacity=True)

    def workspace_configuration(self) -> Any:
        """The workspace's ``limitsPerLabelSet`` (``core.tenants.WorkspaceConfigurationPort``) over this hook."""
        from promshift.adapters.amp_tenants import AmpWorkspaceConfiguration

        return AmpWorkspaceConfiguration(self.conn, self.target, self.workspace.workspace_id)

    @property
    def discards_reader(self) -> Callable[[datetime, datetime], dict[str, float]]:
        """``(since, now) -> {reason: samples}``: what the workspace discarded (CloudWatch ``DiscardedSamples``)."""
        return self.read_discards

    def read_discards(self, since: datetime, now: datetime) -> dict[str, float]:
        """The workspace's discarded samples by reason between ``since`` and ``now`` (``adapters.ingest_health``),
        through this connection's CloudWatch."""
        from promshift.adapters.ingest_health import workspace_discards

        return workspace_discards(self._cloudwatch, self.workspace.workspace_id, since=since, now=now)

    @cached_property
    def _cloudwatch(self) -> Any:
        return self.service_client("cloudwatch")

    def query_limits(self) -> Any:
        """The workspace's per-query limits (``adapters.amp_quota.read_query_limits``): ``extra.query_limits``,
        else Service Quotas, else AMP's documented defaults. Read once per hook (one task); the parity plan
        carries them to its shards."""
        if self._query_limits is None:
            from promshift.adapters.amp_quota import read_query_limits

            self._query_limits = read_query_limits(self.service_client("service-quotas"),
                                                   configured=self.conn_config.extra_config.get("query_limits"))
        return self._query_limits

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return field_behaviour(AMP_UI)

    def test_connection(self) -> tuple[bool, str]:
        """The UI's Test button: the workspace is ACTIVE and a signed ``vector(1)`` answers."""
        try:
            problem = self.readiness_problem()
        except (AmpError, BotoCoreError) as exc:  # e.g. no region: the provider's client cannot be built
            # The whole reason on one line: botocore's ParamValidationError puts it after "Parameter validation
            # failed:" on the next lines.
            return False, " ".join(str(exc).split()) or exc.__class__.__name__
        if problem:
            return False, problem
        return True, (f"AMP workspace {self.target.workspace_ref} in {self.target.region} is ACTIVE "
                      "and answers signed queries")


def _mask(*secrets: str | None) -> None:
    """Ask Airflow's log masker to redact these values wherever they would be printed."""
    from airflow.sdk.log import mask_secret

    for secret in secrets:
        if secret:
            mask_secret(secret)
