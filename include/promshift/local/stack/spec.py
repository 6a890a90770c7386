"""The local stack's spec: its components' names, its settings (``StackConfig``) and how one process is described.

Every component family of the stack (``promshift.local.stack.parts``) reads its ports and paths from here;
``promshift.local.stack.local.LocalStack`` composes the families. Nothing here starts a process.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promshift.local.stack.prometheus import PROMETHEUS_BIN

VMAGENT_BIN = "/usr/bin/vmagent"
ALERTMANAGER_BIN = "/usr/bin/prometheus-alertmanager"
ALERTMANAGER = "alertmanager"
# The receiver of the stack's alert manager definition: where the demo's moved alerts are routed.
LOCAL_ONCALL_RECEIVER = "promshift-local-oncall"
FLEET, TARGET, SOURCE, MAIL = "fleet", "target", "source", "mail"
# The provisioned dashboards a read-path switch edits: reset with the rest, or a switched copy outlives its stack.
GRAFANA = "grafana"
MOTO, AWS, FRONTDOOR, RELAY = "moto", "aws", "frontdoor", "relay"
# Start order: the fleet before the source that scrapes it, the target before the source that
# may remote-write to it. Stop order is the reverse, so the source can flush its queues.
COMPONENTS = (FLEET, MAIL, TARGET, SOURCE)
# The demo's Airflow (``promshift.local.airflow_lab``: ``airflow standalone``, or the celery executor's api-server,
# scheduler, dag-processor, triggerer and workers, all in one process group) records its process group here, so
# ``stack down`` stops it with the rest; a recycled pid is signalled only if a member of that group runs Airflow.
AIRFLOW, AIRFLOW_MARKER = "airflow", "airflow"
# The local AWS (``target_kind="amp"``), started after the target and before the source.
AMP_COMPONENTS = (MOTO, AWS, FRONTDOOR, RELAY)
# The Kubernetes API contract server + operator stand-in (``kubernetes=True``), started after the source.
K8S = "k8s"
K8S_NAMESPACE, K8S_NAME = "monitoring", "k8s"
# The k8s component's PrometheusRule: the source's rule file taken over (kube-prometheus-stack keeps rules so).
K8S_RULES_NAME = "gpu-rules"
# The config repository, its sync stand-in and the GitHub API contract server (``git=True``), after the source.
GIT = "git"
# A second cluster (``clusters=2``, ``make demo SCENARIO=fleet``): its own fleet, its own source Prometheus
# scraping it, and a second target standing in for a second workspace. Ports: PROMSHIFT_FLEET_B_PORT,
# PROMSHIFT_SOURCE_B_PORT, PROMSHIFT_TARGET_B_PORT, else free ones chosen at `up` (recorded in stack.json).
FLEET_B, SOURCE_B, TARGET_B = "fleet-b", "source-b", "target-b"
CLUSTER_B_COMPONENTS = (FLEET_B, TARGET_B, SOURCE_B)
CLUSTER_B_PREFIX = "/workspaces/ws-local-b"
EXTERNAL_LABELS_B = {"cluster": "local-gpu-fleet-b", "prometheus_replica": "source-b-0"}
# With target_kind="amp" too (``stack up --target amp --clusters 2``): target-b backs a second AMP workspace (alias
# AMP_WORKSPACE_ALIAS_B) behind the one front door, and a second signing relay (vmagent) writes into it. Its port:
# PROMSHIFT_RELAY_B_PORT, else a free one chosen at `up` (recorded in stack.json with the second cluster's).
RELAY_B = "relay-b"
AMP_WORKSPACE_ALIAS_B = "promshift-local-b"
# Every component ``down`` and ``reset`` look after, whichever started them.
# The source's second replica (``replicas=2``, ``stack up --replicas 2``): another Prometheus scraping the same fleet,
# its external labels the source's but ``prometheus_replica: source-1`` (an HA pair, ``parts.replicas``). Its port:
# PROMSHIFT_SOURCE_1_PORT, else a free one chosen at `up` (recorded in stack.json).
SOURCE_1 = "source-1"
REPLICA_LABEL = "prometheus_replica"
ALL_COMPONENTS = COMPONENTS + AMP_COMPONENTS + (K8S, ALERTMANAGER, GIT) + CLUSTER_B_COMPONENTS + (RELAY_B, SOURCE_1)
TARGET_KINDS = ("prometheus", "amp")
AMP_WORKSPACE_ALIAS = "promshift-local"
# What stack.json records about the local AWS (never a secret; the fingerprint is a digest).
AMP_STATE_KEYS = (
    "aws_port", "frontdoor_port", "relay_port", "region", "workspace_id", "workspace_alias", "retention_days",
    "aws_url", "prometheus_endpoint", "relay_remote_write_url", "credentials", "credentials_fingerprint",
    "workspace_b_id", "workspace_b_alias", "prometheus_endpoint_b", "relay_b_remote_write_url",
)
DEFAULT_REGION = "us-east-1"
# The target's rule_files glob (relative to its config's folder) for the local AMP's rule-groups namespaces.
AMP_RULES_DIR = "amp-rules"
AMP_RULE_FILES = f"{AMP_RULES_DIR}/*.yml"
LOCAL_SCRAPER_SOURCE = {"cluster_arn": "arn:aws:eks:us-east-1:123456789012:cluster/promshift-local",
                        "subnet_ids": ["subnet-0local0000000000a"], "security_group_ids": ["sg-0local0000000000a"]}
EXTERNAL_LABELS = {"cluster": "local-gpu-fleet", "prometheus_replica": "source-0"}
SCRAPE_JOB = "dcgm"
# The source also scrapes promshift itself: the board's /metrics on the local Airflow's API server, with a bearer
# token from a file (LocalStack.scrape_promshift). Its target list stays empty until an Airflow is there.
PROMSHIFT_JOB = "promshift"
PROMSHIFT_METRICS_PATH = "/promshift/metrics"
SOURCE_RETENTION = "2d"  # the source's --storage.tsdb.retention.time
LOG_TAIL_LINES = 30


class StackError(RuntimeError):
    """The local stack could not be brought to the requested state."""


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


@dataclass(frozen=True)
class StackConfig:
    """Where the local stack keeps its state and which ports it listens on."""

    home: Path = field(default_factory=lambda: Path.cwd() / ".state")
    nodes: int = 200
    fleet_port: int = 9400
    source_port: int = 9090
    target_port: int = 9091
    scrape_interval: str = "5s"
    target_prefix: str = "/workspaces/ws-local"
    seed: int = 0
    prometheus_bin: str = PROMETHEUS_BIN
    # The local AWS (target_kind="amp"): control plane, moto behind it, front door, signing relay.
    target_kind: str = "prometheus"
    aws_port: int = 4566
    moto_port: int = 4567
    frontdoor_port: int = 9095
    relay_port: int = 8429
    # The SMTP sink; 0: any free port, chosen when it starts (see LocalStack.smtp_port).
    smtp_port: int = 0
    # The Kubernetes API contract server over the source (the k8s component); 0: any free port.
    kubernetes: bool = False
    k8s_port: int = 0
    # The target's Alertmanager (Debian's prometheus-alertmanager, when installed); 0: a free port, kept once chosen.
    alertmanager_port: int = 0
    alertmanager_bin: str = ALERTMANAGER_BIN
    # The bare config repository + reconciler stand-in + GitHub API contract server (the git component).
    git: bool = False
    github_port: int = 0
    reconciler_interval_s: float = 5.0
    region: str = DEFAULT_REGION
    workspace_alias: str = AMP_WORKSPACE_ALIAS
    # The target Prometheus keeps its default 15 days; the workspace says so.
    retention_days: int = 15
    vmagent_bin: str = VMAGENT_BIN
    # 2: a second cluster (fleet, source) and a second target (see CLUSTER_B_COMPONENTS); 0 ports: free ones.
    clusters: int = 1
    fleet_b_port: int = 0
    source_b_port: int = 0
    target_b_port: int = 0
    # clusters=2 with target_kind="amp": the second workspace's signing relay.
    relay_b_port: int = 0
    # 2: the source runs as an HA pair (SOURCE_1 beside it); 0 port: a free one.
    replicas: int = 1
    source_1_port: int = 0

    def __post_init__(self) -> None:
        # Prometheus runs with cwd=home but reads absolute paths from its config: resolve once here.
        object.__setattr__(self, "home", Path(self.home).expanduser().resolve())
        prefix = "/" + self.target_prefix.strip("/")
        object.__setattr__(self, "target_prefix", prefix)
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")
        if self.clusters not in (1, 2):
            raise ValueError(f"clusters must be 1 or 2, got {self.clusters}")
        if self.replicas not in (1, 2):
            raise ValueError(f"replicas must be 1 or 2, got {self.replicas}")
        if self.target_kind not in TARGET_KINDS:
            raise ValueError(f"target kind must be one of {', '.join(TARGET_KINDS)}, got {self.target_kind!r}")
        ports = (self.fleet_port, self.source_port, self.target_port)
        if self.smtp_port:
            ports += (self.smtp_port,)
        if self.kubernetes and self.k8s_port:
            ports += (self.k8s_port,)
        if self.alertmanager_port:
            ports += (self.alertmanager_port,)
        if self.git and self.github_port:
            ports += (self.github_port,)
        if self.git and self.kubernetes:
            raise ValueError("the git and k8s components both render onto the source's config: choose one")
        if self.target_kind == "amp":
            ports += (self.aws_port, self.moto_port, self.frontdoor_port, self.relay_port)
        if len(set(ports)) != len(ports):
            raise ValueError(f"the stack's ports must differ, got {ports}")

    @classmethod
    def from_env(cls, **overrides: Any) -> StackConfig:
        """Defaults, then ``PROMSHIFT_*`` environment variables, then non-None ``overrides``."""
        values: dict[str, Any] = {
            "home": Path(os.environ.get("PROMSHIFT_HOME") or Path.cwd() / ".state"),
            "nodes": _env_int("PROMSHIFT_NODES", cls.nodes),
            "fleet_port": _env_int("PROMSHIFT_FLEET_PORT", cls.fleet_port),
            "source_port": _env_int("PROMSHIFT_SOURCE_PORT", cls.source_port),
            "target_port": _env_int("PROMSHIFT_TARGET_PORT", cls.target_port),
            "aws_port": _env_int("PROMSHIFT_AWS_PORT", cls.aws_port),
            "moto_port": _env_int("PROMSHIFT_MOTO_PORT", cls.moto_port),
            "frontdoor_port": _env_int("PROMSHIFT_FRONTDOOR_PORT", cls.frontdoor_port),
            "relay_port": _env_int("PROMSHIFT_RELAY_PORT", cls.relay_port),
            "smtp_port": _env_int("PROMSHIFT_SMTP_PORT", cls.smtp_port),
            "k8s_port": _env_int("PROMSHIFT_K8S_PORT", cls.k8s_port),
            "alertmanager_port": _env_int("PROMSHIFT_ALERTMANAGER_PORT", cls.alertmanager_port),
            "github_port": _env_int("PROMSHIFT_GITHUB_PORT", cls.github_port),
            "fleet_b_port": _env_int("PROMSHIFT_FLEET_B_PORT", cls.fleet_b_port),
            "source_b_port": _env_int("PROMSHIFT_SOURCE_B_PORT", cls.source_b_port),
            "target_b_port": _env_int("PROMSHIFT_TARGET_B_PORT", cls.target_b_port),
            "relay_b_port": _env_int("PROMSHIFT_RELAY_B_PORT", cls.relay_b_port),
            "source_1_port": _env_int("PROMSHIFT_SOURCE_1_PORT", cls.source_1_port),
            "region": os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


@dataclass(frozen=True)
class Component:
    """One process of the stack and how to recognise and probe it."""

    name: str
    port: int
    argv: tuple[str, ...]
    url: str
    health_url: str
    # A command-line fragment that marks the process as this stack's, so a recycled PID in a
    # stale pid file is never signalled.
    marker: str
    port_env: str



def find_free_ports(count: int = 1) -> list[int]:
    """Ports free on 127.0.0.1 right now; all sockets are held together so the ports differ."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
