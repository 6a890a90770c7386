"""The local AWS (``target_kind="amp"``; ``stack up --target amp``): four processes that check the SigV4 signature
of everything they receive (see ``promshift.local.stack.sigv4``):

- ``moto``: moto's server (in memory) holding the AMP workspaces;
- ``aws``: the control plane boto3's ``amp`` client talks to (``promshift.local.stack.controlplane``); the
  workspace's rule-groups namespaces become the target's rule files (``target/amp-rules/``, named by the
  target config's ``rule_files``) and the target evaluates them;
- ``frontdoor``: the workspace's query, remote-write and rules API over the target (``local.stack.frontdoor``);
- ``relay``: Debian's ``vmagent``, which SigV4-signs what the source remote-writes to it and
  forwards it to the front door (Debian's Prometheus 2.42 accepts a ``sigv4:`` block but
  sends unsigned: measured, see ``promshift.local.stack.frontdoor.DEBIAN_PROMETHEUS_SIGV4``).

``up`` creates (or finds) one workspace by alias and sets its retention (two with ``clusters=2``: the second is
target-b's, written through ``relay-b``). The credential pair comes from ``AWS_ACCESS_KEY_ID``/
``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``); when they are unset the stack makes one up and keeps it only
in ``amp/credentials.json`` (0600).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import requests
from botocore.config import Config as BotocoreConfig
from botocore.exceptions import BotoCoreError, ClientError

from promshift.local.stack.parts.alerting import AlertingPart
from promshift.local.stack.parts.cluster_b import ClusterBPart
from promshift.local.stack.prometheus import PROMTOOL_BIN
from promshift.local.stack.sigv4 import AwsCredentials, make_up_credentials, sign_request
from promshift.local.stack.spec import (
    AMP_COMPONENTS,
    AMP_RULES_DIR,
    AMP_STATE_KEYS,
    AMP_WORKSPACE_ALIAS_B,
    AWS,
    FRONTDOOR,
    LOCAL_ONCALL_RECEIVER,
    LOCAL_SCRAPER_SOURCE,
    MOTO,
    RELAY,
    RELAY_B,
    SOURCE,
    SOURCE_1,
    SOURCE_B,
    TARGET,
    TARGET_B,
    Component,
    StackConfig,
    StackError,
)

logger = logging.getLogger(__name__)


class AmpPart(ClusterBPart, AlertingPart):
    """The local AWS: addresses, credentials, clients, faults, workspaces, processes and what stack.json keeps."""

    def __init__(self, config: StackConfig | None = None) -> None:
        super().__init__(config)
        # AWS_* variables given to the local AWS's processes (set by up() for target_kind="amp").
        self._aws_child_env: dict[str, str] = {}

    @property
    def amp_dir(self) -> Path:
        """State of the local AWS: the made-up credentials (if any) and ``faults.json``."""
        return self.home / "amp"

    @property
    def credentials_path(self) -> Path:
        """Where a made-up credential pair is kept (0600) when no AWS_* variables are set."""
        return self.amp_dir / "credentials.json"

    @property
    def aws_url(self) -> str:
        """The local control plane: boto3's ``amp`` client takes it as ``endpoint_url``."""
        return f"http://127.0.0.1:{self.config.aws_port}"

    @property
    def moto_url(self) -> str:
        """moto's server, behind the control plane (never called directly by promshift)."""
        return f"http://127.0.0.1:{self.config.moto_port}"

    @property
    def frontdoor_url(self) -> str:
        """The front door: ``<frontdoor_url>/workspaces/<id>/api/v1/...``, every request SigV4-checked."""
        return f"http://127.0.0.1:{self.config.frontdoor_port}"

    @property
    def relay_remote_write_url(self) -> str:
        """The signing relay (vmagent): the source remote-writes here, it signs and forwards to the front door."""
        return f"http://127.0.0.1:{self.config.relay_port}/api/v1/write"

    @property
    def workspace_id(self) -> str | None:
        """The local workspace's id, as ``up`` last recorded it (None before an ``up --target amp``)."""
        value = self._read_state().get("workspace_id")
        return str(value) if value else None

    @property
    def workspace_b_id(self) -> str | None:
        """The second workspace's id (``up --target amp --clusters 2``; target-b backs it), else None."""
        value = self._read_state().get("workspace_b_id")
        return str(value) if value else None

    @property
    def relay_b_remote_write_url(self) -> str:
        """The second workspace's signing relay: a source remote-writes here to reach that workspace."""
        return f"http://127.0.0.1:{self.cluster_b_ports()[RELAY_B]}/api/v1/write"

    def prometheus_endpoint(self, workspace_id: str | None = None) -> str:
        """The workspace's ``prometheusEndpoint`` as DescribeWorkspace answers it (ends with ``/``)."""
        workspace = workspace_id or self.workspace_id
        if not workspace:
            raise StackError("no local AMP workspace yet: run `python -m promshift.local stack up --target amp`")
        return f"{self.frontdoor_url}/workspaces/{workspace}/"

    def aws_credentials(self) -> AwsCredentials:
        """The pair the local AWS checks signatures against.

        From ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``) when set;
        otherwise a pair made up once and kept only in ``credentials_path`` (mode 0600).
        """
        access_key, secret_key = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if access_key and secret_key:
            return AwsCredentials(access_key, secret_key, os.environ.get("AWS_SESSION_TOKEN") or None)
        path = self.credentials_path
        for _ in range(2):
            try:
                document = json.loads(path.read_text())
                return AwsCredentials(document["aws_access_key_id"], document["aws_secret_access_key"])
            except FileNotFoundError:
                pass
            except (ValueError, KeyError, TypeError):
                raise StackError(f"{path} is not a credentials file the stack wrote; delete it") from None
            made = make_up_credentials()
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue  # another process made one first: use theirs
            with os.fdopen(fd, "w") as handle:
                json.dump({"aws_access_key_id": made.access_key, "aws_secret_access_key": made.secret_key}, handle)
            logger.info("no AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY set: made up a local pair, kept in %s (0600)",
                        path)
            return made
        raise StackError(f"could not read or create {path}")

    def aws_env(self) -> dict[str, str]:
        """``AWS_*`` variables naming the local AWS's pair and region, for a process that must sign (the demo)."""
        credentials = self.aws_credentials()
        env = {
            "AWS_ACCESS_KEY_ID": credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
            "AWS_DEFAULT_REGION": self.config.region,
        }
        if credentials.session_token:
            env["AWS_SESSION_TOKEN"] = credentials.session_token
        return env

    def amp_client(self, credentials: AwsCredentials | None = None) -> Any:
        """A boto3 ``amp`` client on the local control plane, signing with ``credentials`` (default: the stack's)."""
        pair = credentials or self.aws_credentials()
        return boto3.client(
            "amp",
            region_name=self.config.region,
            endpoint_url=self.aws_url,
            aws_access_key_id=pair.access_key,
            aws_secret_access_key=pair.secret_key,
            aws_session_token=pair.session_token,
            config=BotocoreConfig(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30),
        )

    def amp_connection_extra(self, *, second: bool = False) -> dict[str, str]:
        """The ``extra`` of the Airflow ``amp`` connection for this stack (see AMP_CONTRACT): no credentials.
        ``second``: the second workspace's (``up --target amp --clusters 2``), written through its own relay."""
        workspace = self.workspace_b_id if second else self.workspace_id
        if not workspace:
            flags = "--target amp --clusters 2" if second else "--target amp"
            raise StackError(f"no local AMP workspace yet: run `python -m promshift.local stack up {flags}`")
        return {
            "region_name": self.config.region,
            "workspace_id": workspace,
            "endpoint_url": self.aws_url,
            "remote_write_url": self.relay_b_remote_write_url if second else self.relay_remote_write_url,
        }

    def scraper_extra(self) -> dict[str, Any]:
        """The target connection's ``extra.scraper`` for this stack: the EKS cluster a managed collector would
        scrape (per-environment infrastructure, not catalog data). Locally the names are placeholders the
        control plane only checks the shape of; its collector scrapes the local fleet instead."""
        return dict(LOCAL_SCRAPER_SOURCE)

    def publish_usage(self, workspace_id: str | None = None) -> dict[str, float]:
        """Seed CloudWatch as AMP vends usage: the workspace's active series now, as ``AWS/Usage`` ``ResourceCount``
        (``Service=Prometheus, Type=Resource, Resource=ActiveSeries, Class=None, ResourceId=<ws>``), through the
        local AWS into moto's CloudWatch. AWS publishes this on its own; locally it is a step (the demo's, a test's)
        so what the quota pre-flight reads is known. ``workspace_id``: another workspace than the first (its own
        series, its own datapoint). Returns ``{"active_series": N}``."""
        workspace = workspace_id or self.workspace_id
        if not workspace:
            raise StackError("no local AMP workspace yet: run `python -m promshift.local stack up --target amp`")
        pair = self.aws_credentials()
        url = requests.Request("GET", self.prometheus_endpoint(workspace) + "api/v1/query",
                               params={"query": 'count({__name__=~".+"})'}).prepare().url
        assert url is not None
        headers = sign_request("GET", url, credentials=pair, region=self.config.region)
        response = self._http.get(url, headers=headers, timeout=30)
        response.raise_for_status()
        result = response.json()["data"]["result"]
        series = float(result[0]["value"][1]) if result else 0.0
        cloudwatch = boto3.client("cloudwatch", region_name=self.config.region, endpoint_url=self.aws_url,
                                  aws_access_key_id=pair.access_key, aws_secret_access_key=pair.secret_key,
                                  aws_session_token=pair.session_token)
        dimensions = {"Service": "Prometheus", "Type": "Resource", "Resource": "ActiveSeries", "Class": "None",
                      "ResourceId": workspace}
        cloudwatch.put_metric_data(Namespace="AWS/Usage", MetricData=[{
            "MetricName": "ResourceCount", "Value": series, "Timestamp": datetime.now(UTC),
            "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()]}])
        return {"active_series": series}

    def sigv4_stats(self, component: str = FRONTDOOR) -> dict[str, Any]:
        """The counters of the ``frontdoor`` (default) or the ``aws`` control plane (``/-/sigv4-stats``)."""
        url = {FRONTDOOR: self.frontdoor_url, AWS: self.aws_url}[component]
        response = self._http.get(f"{url}/-/sigv4-stats", timeout=5)
        response.raise_for_status()
        return dict(response.json())

    def set_aws_faults(self, *, errors: dict[str, str] | None = None, workspace_status: dict[str, str] | None = None,
                       clock_skew_s: float = 0.0, scraper: dict[str, Any] | None = None,
                       aps_quotas: dict[str, float] | None = None,
                       aps_quotas_by_workspace: dict[str, dict[str, float]] | None = None,
                       aps_limits: dict[str, float] | None = None) -> None:
        """From now on, make the control plane fail operations (``{"DescribeWorkspace": "ThrottlingException"}``)
        or report a workspace status (``{"ws-...": "CREATING"}``), and shift the control plane's and the front
        door's clocks by ``clock_skew_s`` (over 300 s: every signature is refused). ``scraper`` sets how local
        scrapers move (``{"fail_update": "reason", "stuck": True, "delay_s": 1, ...}``, see
        ``promshift.local.stack.scrapers``), ``aps_quotas`` the Service Quotas values
        (``{"active_series": N, "ingestion_rate": N}``), ``aps_quotas_by_workspace`` one workspace's own
        (``{"ws-...": {"active_series": N}}``), ``aps_limits`` the strict workspace's other limits
        (``promshift.local.stack.amp_limits``). No arguments: clear them all."""
        path = self.amp_dir / "faults.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".faults.json.tmp")
        tmp.write_text(json.dumps({"errors": errors or {}, "workspace_status": workspace_status or {},
                                   "clock_skew_s": clock_skew_s, "scraper": scraper or {},
                                   "aps_quotas": aps_quotas or {},
                                   "aps_quotas_by_workspace": aps_quotas_by_workspace or {},
                                   "aps_limits": aps_limits or {}}))
        os.replace(tmp, path)

    def _ensure_workspace(self, alias: str | None = None, *, alert_definition: bool = True) -> str:
        """Find the ACTIVE workspace with the stack's alias (or ``alias``), or create it; set its retention either
        way. ``alert_definition``: give it the stack's alert manager definition when it has none (the second
        workspace gets none: the one Alertmanager is the first workspace's)."""
        amp = self.amp_client()
        alias = alias or self.config.workspace_alias
        found = [
            item["workspaceId"] for item in amp.list_workspaces(alias=alias)["workspaces"]
            if item.get("alias") == alias and item["status"]["statusCode"] == "ACTIVE"
        ]
        if found:
            workspace = str(found[0])
            logger.info("reusing local AMP workspace %s (%s)", workspace, alias)
        else:
            workspace = str(amp.create_workspace(alias=alias, tags={"managed-by": "promshift-local-stack"})
                            ["workspaceId"])
            logger.info("created local AMP workspace %s (%s)", workspace, alias)
        amp.get_waiter("workspace_active").wait(workspaceId=workspace, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
        amp.update_workspace_configuration(workspaceId=workspace, retentionPeriodInDays=self.config.retention_days)
        if alert_definition:
            self._ensure_alert_definition(amp, workspace)
        return workspace

    def _ensure_alert_definition(self, amp: Any, workspace: str) -> None:
        """The workspace routes its alerts, as a team's workspace that pages someone does: when it has no
        alert manager definition, one whose every alert goes to an SNS receiver (not reachable from here:
        the local Alertmanager holds the alerts for it, see ``promshift.local.stack.alert_definitions``)."""
        try:
            amp.describe_alert_manager_definition(workspaceId=workspace)
            return
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
        amp.create_alert_manager_definition(workspaceId=workspace, data=self.local_alert_definition())
        logger.info("created the alert manager definition of local AMP workspace %s", workspace)

    def local_alert_definition(self) -> bytes:
        """The stack's alert manager definition: every alert to one SNS receiver, as AMP's documentation writes it."""
        region = self.config.region
        return (
            "alertmanager_config: |\n"
            "  route:\n"
            f"    receiver: {LOCAL_ONCALL_RECEIVER}\n"
            "    group_by: [alertname]\n"
            "  receivers:\n"
            f"    - name: {LOCAL_ONCALL_RECEIVER}\n"
            "      sns_configs:\n"
            f"        - topic_arn: arn:aws:sns:{region}:123456789012:promshift-local-oncall\n"
            "          sigv4:\n"
            f"            region: {region}\n"
        ).encode()

    def _write_workspace_targets(self, targets: dict[str, dict[str, str]]) -> None:
        """``amp/workspace-targets.json``: the Prometheus and rules directory of each workspace but the first."""
        from promshift.local.stack.rule_namespaces import WORKSPACE_TARGETS_FILE

        path = self.amp_dir / WORKSPACE_TARGETS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(targets, indent=2) + "\n")
        os.replace(tmp, path)

    def _amp_components(self, workspace_id: str, fingerprint: str,
                        workspace_b_id: str | None = None) -> dict[str, Component]:
        cfg = self.config
        # The second workspace (clusters=2): the front door serves it too, over target-b; relay-b writes into it.
        second = cfg.clusters == 2 and workspace_b_id is not None
        state_dir = f"--state-dir={self.amp_dir}"
        moto_argv = (sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(cfg.moto_port))
        aws_argv = (
            sys.executable, "-m", "promshift.local.stack.controlplane", state_dir,
            "--port", str(cfg.aws_port), "--moto-url", self.moto_url, "--frontdoor-url", self.frontdoor_url,
            "--region", cfg.region, f"--credentials-fingerprint={fingerprint}",
            f"--targets-file={self.file_sd_path}", f"--vmagent-bin={cfg.vmagent_bin}",
            f"--target-url={self.target_url}", f"--target-rules-dir={self.amp_rules_dir}",
            f"--promtool={PROMTOOL_BIN}",
        ) + ((f"--alertmanager-url={self.alertmanager_url}", f"--alertmanager-config={self.alertmanager_config_path}")
             if self.alertmanager_installed else ())
        frontdoor_argv = (
            sys.executable, "-m", "promshift.local.stack.frontdoor", state_dir,
            "--port", str(cfg.frontdoor_port), "--target-url", self.target_url, "--region", cfg.region,
            "--workspace-id", workspace_id, f"--credentials-fingerprint={fingerprint}",
            "--strict", f"--cloudwatch-url={self.aws_url}",  # AMP's limits and DiscardedSamples (amp_strict)
        ) + ((f"--alertmanager-url={self.alertmanager_url}",) if self.alertmanager_installed else ()) \
            + ((f"--workspace-target={workspace_b_id}={self.target_b_url}",) if second else ())
        relay_data, relay_b_data = self.home / RELAY, self.home / RELAY_B

        # Credentials reach vmagent through AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN) in its
        # environment, never its argv (`ps` shows argv; vmagent 1.79 reads those variables when the
        # -remoteWrite.aws.accessKey/secretKey flags are unset).
        def relay_argv(data: Path, port: int, workspace: str) -> tuple[str, ...]:
            return (
                cfg.vmagent_bin,
                f"-remoteWrite.tmpDataPath={data}",
                f"-httpListenAddr=127.0.0.1:{port}",
                f"-remoteWrite.url={self.prometheus_endpoint(workspace)}api/v1/remote_write",
                "-remoteWrite.aws.useSigv4=true",
                f"-remoteWrite.aws.region={cfg.region}",
                "-remoteWrite.aws.service=aps",
                "-remoteWrite.flushInterval=1s",
            )

        relay_b_port = self.cluster_b_ports()[RELAY_B]
        return {
            RELAY_B: Component(RELAY_B, relay_b_port,
                                relay_argv(relay_b_data, relay_b_port, workspace_b_id or "ws-none"),
                                self.relay_b_remote_write_url, f"http://127.0.0.1:{relay_b_port}/health",
                                f"-remoteWrite.tmpDataPath={relay_b_data}", "PROMSHIFT_RELAY_B_PORT"),
            MOTO: Component(MOTO, cfg.moto_port, moto_argv, self.moto_url, f"{self.moto_url}/moto-api/data.json",
                             f"moto.server -H 127.0.0.1 -p {cfg.moto_port}", "PROMSHIFT_MOTO_PORT"),
            AWS: Component(AWS, cfg.aws_port, aws_argv, self.aws_url, f"{self.aws_url}/-/healthy",
                            f"promshift.local.stack.controlplane {state_dir}", "PROMSHIFT_AWS_PORT"),
            FRONTDOOR: Component(FRONTDOOR, cfg.frontdoor_port, frontdoor_argv, self.frontdoor_url,
                                  f"{self.frontdoor_url}/-/healthy", f"promshift.local.stack.frontdoor {state_dir}",
                                  "PROMSHIFT_FRONTDOOR_PORT"),
            RELAY: Component(RELAY, cfg.relay_port, relay_argv(relay_data, cfg.relay_port, workspace_id),
                              self.relay_remote_write_url,
                              f"http://127.0.0.1:{cfg.relay_port}/health", f"-remoteWrite.tmpDataPath={relay_data}",
                              "PROMSHIFT_RELAY_PORT"),
        }

    def _require_vmagent(self) -> None:
        binary = self.config.vmagent_bin
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise StackError(
                f"vmagent is not installed ({binary} not found); the AMP stack's signing relay needs it: "
                "`apt-get install -y victoria-metrics`"
            )

    def _child_env(self, component: Component) -> dict[str, str]:
        if component.name in (AWS, FRONTDOOR, RELAY, SOURCE, RELAY_B, SOURCE_B, SOURCE_1):
            # The source gets the pair too, as a Prometheus on EKS gets one from its role: Debian's 2.42
            # refuses to load a `sigv4:` remote_write entry without credentials (it never signs with them).
            return dict(self._aws_child_env)
        return super()._child_env(component)

    def _start_amp(self, components: dict[str, Component], plans: dict[str, tuple[str, int | None]],
                   fingerprint: str, deadline: float) -> tuple[dict[str, Component], str, str | None, bool]:
        """The target, moto, the control plane, (the second cluster,) the workspaces, the front door and the relays,
        in that order. Returns the components planned again with the workspaces known, the workspaces' ids and
        whether the credential pair changed since the last ``up`` (a running source must be restarted then)."""
        for name in (TARGET, MOTO):
            self._apply(components[name], plans[name])
        self._wait_healthy([components[TARGET], components[MOTO]], deadline)
        self._apply(components[AWS], plans[AWS])
        self._wait_healthy([components[AWS]], deadline)
        previous = self._read_state().get("credentials_fingerprint")
        two = self.config.clusters == 2
        if two:  # the second cluster first: the front door routes the second workspace to target-b
            self._start_cluster_b(deadline, restart_source=previous != fingerprint)
        workspace_b_id: str | None = None
        try:
            workspace_id = self._ensure_workspace()
            if two:
                workspace_b_id = self._ensure_workspace(AMP_WORKSPACE_ALIAS_B, alert_definition=False)
        except (BotoCoreError, ClientError) as exc:
            raise StackError(f"the local control plane did not provide the workspace: {exc}") from None
        if workspace_b_id:  # its rule-groups namespaces: target-b's rule files (rule_namespaces)
            self._write_workspace_targets({workspace_b_id: {
                "target_url": self.target_b_url, "rules_dir": str(self.home / TARGET_B / AMP_RULES_DIR)}})
        # The front door and the relays name the workspaces: plan them again now that they are known.
        components = self._components(workspace_id=workspace_id, fingerprint=fingerprint,
                                      workspace_b_id=workspace_b_id)
        relays = (RELAY, RELAY_B) if two else (RELAY,)
        for name in (FRONTDOOR, *relays):
            action, pid = self._plan(components[name])
            if name in relays and action == "reuse" and previous != fingerprint:
                action = "restart"  # vmagent's argv cannot carry the fingerprint: the state does
            self._apply(components[name], (action, pid))
        self._wait_healthy([components[name] for name in (FRONTDOOR, *relays)], deadline)
        return components, workspace_id, workspace_b_id, previous != fingerprint

    def _record_amp_state(self, state: dict[str, Any], *, workspace_id: str | None, fingerprint: str,
                          workspace_b_id: str | None) -> None:
        """What stack.json records about the local AWS (``AMP_STATE_KEYS``), into ``state``; a plain ``up`` keeps
        the record of a running local AWS."""
        cfg = self.config
        previous = self._read_state()
        if workspace_id is None and previous.get("workspace_id"):
            # A plain `up` leaves a running local AWS alone: keep its record and its components'.
            amp = self._components()
            if any((pid := self._read_pid(name)) is not None and self._owns(pid, amp[name]) for name in AMP_COMPONENTS):
                state["target_kind"] = previous.get("target_kind", "amp")
                state["components"].update({k: v for k, v in previous.get("components", {}).items()
                                            if k in (*AMP_COMPONENTS, RELAY_B)})
                state.update({key: previous[key] for key in AMP_STATE_KEYS if key in previous})
        if workspace_id:
            # What the demo builds the Airflow `amp` connection from (AMP_CONTRACT); never a secret.
            state.update({  # keys: AMP_STATE_KEYS
                "aws_port": cfg.aws_port,
                "frontdoor_port": cfg.frontdoor_port,
                "relay_port": cfg.relay_port,
                "region": cfg.region,
                "workspace_id": workspace_id,
                "workspace_alias": cfg.workspace_alias,
                "retention_days": cfg.retention_days,
                "aws_url": self.aws_url,
                "prometheus_endpoint": self.prometheus_endpoint(workspace_id),
                "relay_remote_write_url": self.relay_remote_write_url,
                "credentials": (
                    "environment" if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")
                    else f"file {self.credentials_path}"
                ),
                "credentials_fingerprint": fingerprint,
            })
        if workspace_id and workspace_b_id:  # the second workspace, over target-b (keys: AMP_STATE_KEYS)
            state.update({"workspace_b_id": workspace_b_id, "workspace_b_alias": AMP_WORKSPACE_ALIAS_B,
                          "prometheus_endpoint_b": self.prometheus_endpoint(workspace_b_id),
                          "relay_b_remote_write_url": self.relay_b_remote_write_url})
