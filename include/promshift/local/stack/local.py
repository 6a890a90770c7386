"""The local stack: the simulated fleet, the source Prometheus and the AMP stand-in, all on 127.0.0.1.

``LocalStack.up()`` starts (or reuses) three long-lived processes, each in its own
session so they outlive the command that started them:

- ``fleet``: ``python -m promshift.local.stack.fleet`` (one scrape target per node);
- ``source``: the self-hosted Prometheus scraping the fleet through file_sd;
- ``target``: a second Prometheus with the remote-write receiver under a
  workspace-like route prefix, standing in for the AMP workspace;
- ``mail``: an SMTP sink (``promshift.local.stack.smtp_sink``) that keeps every message under
  ``mail/`` and delivers nothing: the mail relay the notifications' ``smtp_default`` names
  (``LocalStack.smtp_connection_env()``). Its port is ``PROMSHIFT_SMTP_PORT``, or by default
  any free one, recorded in ``mail/sink.json``.

With ``target_kind="amp"`` (``python -m promshift.local stack up --target amp``) four more make a local AWS
that checks the SigV4 signature of everything it receives (see ``promshift.local.stack.sigv4``):

- ``moto``: moto's server (in memory) holding the AMP workspaces;
- ``aws``: the control plane boto3's ``amp`` client talks to (``promshift.local.stack.controlplane``); the
  workspace's rule-groups namespaces become the target's rule files (``target/amp-rules/``, named by the
  target config's ``rule_files``) and the target evaluates them;
- ``frontdoor``: the workspace's query, remote-write and rules API over the target (``local.stack.frontdoor``);
- ``relay``: Debian's ``vmagent``, which SigV4-signs what the source remote-writes to it and
  forwards it to the front door (Debian's Prometheus 2.42 accepts a ``sigv4:`` block but
  sends unsigned: measured, see ``promshift.local.stack.frontdoor.DEBIAN_PROMETHEUS_SIGV4``).

With ``kubernetes=True`` (``python -m promshift.local stack up --k8s``; the demo's ``DEPLOY=k8s-cr``) one more, started
once the source is up:

- ``k8s``: ``python -m promshift.local.stack.k8s_api``, the Kubernetes API contract server with the
  prometheus-operator stand-in (not a cluster). It holds the ``Prometheus`` resource
  ``monitoring/k8s`` whose ``spec.remoteWrite`` is the source's ``remote_write`` when it starts, and
  renders it onto the source's own ``prometheus.yml`` (the base: its scrape configs stay) and reloads
  it. Its port is ``PROMSHIFT_K8S_PORT``, or by default any free one, recorded in ``k8s/api.json``;
  ``k8s/kubeconfig.json`` points at it (``LocalStack.kubernetes_source_extra()``).

``up`` then creates (or finds) one workspace by alias and sets its retention. The credential
pair comes from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``); when
they are unset the stack makes one up and keeps it only in ``amp/credentials.json`` (0600).

Everything lives under ``StackConfig.home``: ``<name>.pid``, ``<name>.log``,
``stack.json`` (what is running), ``source/`` and ``target/`` (configs and TSDBs).
The source's ``prometheus.yml`` is written only when missing, because deployers
edit it later (one ``remote_write`` entry per metric group).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import requests
import yaml
from botocore.config import Config as BotocoreConfig
from botocore.exceptions import BotoCoreError, ClientError

import promshift
from promshift.local.stack.fleet import FleetSpec, write_file_sd
from promshift.local.stack.prometheus import PROMETHEUS_BIN, PROMTOOL_BIN, prometheus_argv, prometheus_installed
from promshift.local.stack.sigv4 import AwsCredentials, make_up_credentials, sign_request
from promshift.local.stack.smtp_sink import answers as smtp_answers
from promshift.local.stack.smtp_sink import read_mail, sink_address

logger = logging.getLogger(__name__)

# The source's rules (written once, like its config): gpu-memory's recording rule and an alert reading it.
SOURCE_RULES = """\
# Rules of the local stack's source Prometheus. gpu-memory's rules move to the target with their group.
groups:
  - name: gpu-memory
    rules:
      # share of each GPU's framebuffer in use
      - record: gpu:fb_used:ratio
        expr: DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)
      # for: 1m, so the lifecycle demo's fleet fault (a few GPUs' framebuffer full) fires within its bake
      - alert: GpuMemoryNearlyFull
        expr: gpu:fb_used:ratio > 0.98
        for: 1m
        labels:
          severity: warning
        annotations:
          summary: "GPU {{ $labels.gpu }} on {{ $labels.instance }}: framebuffer above 98%"
"""

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
ALL_COMPONENTS = COMPONENTS + AMP_COMPONENTS + (K8S, ALERTMANAGER, GIT) + CLUSTER_B_COMPONENTS + (RELAY_B,)
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

    def __post_init__(self) -> None:
        # Prometheus runs with cwd=home but reads absolute paths from its config: resolve once here.
        object.__setattr__(self, "home", Path(self.home).expanduser().resolve())
        prefix = "/" + self.target_prefix.strip("/")
        object.__setattr__(self, "target_prefix", prefix)
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")
        if self.clusters not in (1, 2):
            raise ValueError(f"clusters must be 1 or 2, got {self.clusters}")
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
            "region": os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


@dataclass(frozen=True)
class _Component:
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


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in field 2 may contain spaces and parentheses; the state follows the last ")".
    return stat.rsplit(")", 1)[1].split()[0]


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


# Popen objects of processes this interpreter started: polling them reaps exited children
# (a zombie still "exists" for kill(pid, 0)) and avoids "still running" ResourceWarnings.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (read from /proc: the leader may have exited before them)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp.
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _airflow_group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member running Airflow (or one of its Celery workers)."""
    for pid in _group_members(pgid):
        cmdline = " ".join(_cmdline(pid))
        if AIRFLOW_MARKER in cmdline or "[celeryd:" in cmdline:
            return True
    return False


def _stop_group(pgid: int, timeout: float) -> None:
    """SIGTERM the whole group, wait until no member is left, SIGKILL what remains."""
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while _group_members(pgid) and time.monotonic() < deadline:
            child = _CHILDREN.get(pgid)
            if child is not None:
                child.poll()
            time.sleep(0.2)
        left = _group_members(pgid)
        if not left:
            return
        logger.warning("airflow process group %s ignored %s for %ss: %s", pgid, signal.Signals(sig).name, wait_s,
                       "; ".join(" ".join(_cmdline(pid))[:80] or str(pid) for pid in left))


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process group the component leads (start_new_session made pgid == pid)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


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


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Same option the servers use, so sockets lingering in TIME_WAIT do not count as taken.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _tail(path: Path, offset: int = 0, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class LocalStack:
    """Start, reuse, inspect and stop the local fleet + source + target processes."""

    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig.from_env()
        self._http = requests.Session()
        # Local endpoints only: an HTTP(S)_PROXY from the environment must not intercept them.
        self._http.trust_env = False
        self._log_offsets: dict[str, int] = {}
        # AWS_* variables given to the local AWS's processes (set by up() for target_kind="amp").
        self._aws_child_env: dict[str, str] = {}
        # The second cluster's free ports, chosen by up() when no PROMSHIFT_*_B_PORT names them.
        self._cluster_b_chosen: dict[str, int] = {}
        # Set by _write_configs when target-b's config gained the AMP rules glob (a running target-b must reload).
        self._target_b_edited = False

    # -- addresses and paths -------------------------------------------------------------

    @property
    def home(self) -> Path:
        """State directory of this stack."""
        return self.config.home

    @property
    def fleet(self) -> FleetSpec:
        """The fleet this stack simulates."""
        return FleetSpec(nodes=self.config.nodes, seed=self.config.seed)

    @property
    def fleet_url(self) -> str:
        """Base URL of the fleet simulator."""
        return f"http://127.0.0.1:{self.config.fleet_port}"

    @property
    def source_url(self) -> str:
        """Base URL of the source Prometheus."""
        return f"http://127.0.0.1:{self.config.source_port}"

    @property
    def target_url(self) -> str:
        """Base URL of the AMP stand-in; its HTTP API lives under it, as under an AMP workspace URL."""
        return f"http://127.0.0.1:{self.config.target_port}{self.config.target_prefix}"

    @property
    def target_remote_write_url(self) -> str:
        """Where the source remote-writes to reach the target."""
        return f"{self.target_url}/api/v1/write"

    @property
    def source_config_path(self) -> Path:
        """The source Prometheus config (deployers add ``remote_write`` entries here)."""
        return self.home / SOURCE / "prometheus.yml"

    @property
    def source_query_log_path(self) -> Path:
        """The source's query log (``query_log_file``: JSON lines, one per query it answered)."""
        return self.home / SOURCE / "query.log"

    @property
    def target_config_path(self) -> Path:
        """The target Prometheus config (no scrape jobs)."""
        return self.home / TARGET / "prometheus.yml"

    @property
    def source_rules_path(self) -> Path:
        """The source's rule file (its config's ``rule_files``): gpu-memory's rules, which move with the group."""
        return self.home / SOURCE / "rules" / "gpu-memory.yml"

    @property
    def amp_rules_dir(self) -> Path:
        """Where the local AMP's rule-groups namespaces become the target's rule files (``AMP_RULE_FILES``)."""
        return self.target_config_path.parent / AMP_RULES_DIR

    @property
    def dashboards_dir(self) -> Path:
        """A provisioned Grafana dashboard folder (file mode of the read path switch): the DCGM dashboard."""
        return self.home / GRAFANA / "dashboards"

    @property
    def file_sd_path(self) -> Path:
        """The file_sd JSON listing one target per fleet node."""
        return self.home / SOURCE / "targets" / f"{SCRAPE_JOB}.json"

    @property
    def promshift_sd_path(self) -> Path:
        """The file_sd JSON naming the Airflow API server whose board the source scrapes (job ``promshift``)."""
        return self.home / SOURCE / "targets" / f"{PROMSHIFT_JOB}.json"

    @property
    def promshift_token_path(self) -> Path:
        """The bearer token the source sends to promshift's ``/metrics`` (0600; ``scrape_promshift`` writes it)."""
        return self.home / SOURCE / "promshift.token"

    def scrape_promshift(self, address: str, token: str) -> None:
        """Have the source scrape promshift's own metrics at ``address`` (``host:port`` of an Airflow API server)
        with ``token``: the token file first (0600, replaced whole: a scrape never reads half of one), then the
        target. Prometheus reads both files as they change, so a refreshed token needs no reload."""
        if not token or any(c.isspace() for c in token):
            raise StackError("the token for promshift's /metrics is empty or not one word")
        path = self.promshift_token_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        os.chmod(tmp, 0o600)  # an existing tmp keeps its old mode through O_CREAT
        os.replace(tmp, path)
        targets = [{"targets": [address], "labels": {}}]
        sd = self.promshift_sd_path
        sd.parent.mkdir(parents=True, exist_ok=True)
        if not sd.exists() or json.loads(sd.read_text() or "[]") != targets:
            sd_tmp = sd.with_name(f".{sd.name}.tmp")
            sd_tmp.write_text(json.dumps(targets))
            os.replace(sd_tmp, sd)

    @property
    def state_path(self) -> Path:
        """JSON record of what the stack last started."""
        return self.home / "stack.json"

    # -- the second cluster (clusters=2) ----------------------------------------------------------

    def cluster_b_ports(self) -> dict[str, int]:
        """The second cluster's ports: PROMSHIFT_*_B_PORT, else the free ones `up` chose (stack.json); 0 unknown."""
        cfg = self.config
        recorded = self._read_state().get("cluster_b", {}).get("ports", {})
        given = {FLEET_B: cfg.fleet_b_port, SOURCE_B: cfg.source_b_port, TARGET_B: cfg.target_b_port,
                 RELAY_B: cfg.relay_b_port}
        return {name: port or self._cluster_b_chosen.get(name) or int(recorded.get(name) or 0)
                for name, port in given.items()}

    @property
    def fleet_b(self) -> FleetSpec:
        """The second cluster's fleet: half the nodes (at least one), another seed."""
        return FleetSpec(nodes=max(1, self.config.nodes // 2), seed=self.config.seed + 1)

    @property
    def source_b_url(self) -> str:
        return f"http://127.0.0.1:{self.cluster_b_ports()[SOURCE_B]}"

    @property
    def target_b_url(self) -> str:
        """The second workspace's stand-in, its API under a workspace-like prefix as the first one's."""
        return f"http://127.0.0.1:{self.cluster_b_ports()[TARGET_B]}{CLUSTER_B_PREFIX}"

    @property
    def target_b_remote_write_url(self) -> str:
        return f"{self.target_b_url}/api/v1/write"

    @property
    def source_b_config_path(self) -> Path:
        return self.home / SOURCE_B / "prometheus.yml"

    @property
    def file_sd_b_path(self) -> Path:
        return self.home / SOURCE_B / "targets" / f"{SCRAPE_JOB}.json"

    # -- the SMTP sink ----------------------------------------------------------------------

    @property
    def mail_dir(self) -> Path:
        """Where the SMTP sink keeps every message it accepted (``read_mail`` reads them)."""
        return self.home / MAIL

    @property
    def smtp_port(self) -> int:
        """The sink's port: ``smtp_port`` when set, else the one the running sink bound (0 before it has)."""
        if self.config.smtp_port:
            return self.config.smtp_port
        address = sink_address(self.mail_dir)
        return address[1] if address else 0

    def smtp_connection_env(self, conn_id: str = "smtp_default") -> dict[str, str]:
        """``AIRFLOW_CONN_<CONN_ID>`` naming the running sink, for the processes that send notifications.

        The SMTP provider's connection: host and port, no TLS (the sink is plain SMTP on the loopback),
        no login, the sender in ``extra.from_email``, and short timeouts so a stopped sink is noticed fast.
        """
        port = self.smtp_port
        if not port or not smtp_answers("127.0.0.1", port):
            raise StackError("the SMTP sink is not running: run `python -m promshift.local stack up`")
        conn = {"conn_type": "smtp", "host": "127.0.0.1", "port": port,
                "extra": {"from_email": "promshift@localhost", "disable_ssl": True, "disable_tls": True,
                          "timeout": 10, "retry_limit": 1}}
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn)}

    def mail(self) -> list[Any]:
        """Every message the sink has accepted, oldest first (``smtp_sink.ReceivedMail``)."""
        return list(read_mail(self.mail_dir))

    # -- the Kubernetes API contract server (kubernetes=True) --------------------------------

    @property
    def fleet_faults_path(self) -> Path:
        """The fleet's faults (``promshift.local.stack.fleet``), re-read every second."""
        return self.home / "fleet-faults.json"

    def set_fleet_faults(self, *, fb_full_gpus: int = 0) -> None:
        """Inject (or, with 0, clear) the fleet's faults: the first ``fb_full_gpus`` GPUs report a full framebuffer,
        so gpu-memory's ``GpuMemoryNearlyFull`` fires for them once its ``for:`` has passed."""
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.fleet_faults_path.with_name(".fleet-faults.json.tmp")
        tmp.write_text(json.dumps({"fb_full_gpus": int(fb_full_gpus)}) + "\n")
        os.replace(tmp, self.fleet_faults_path)

    @property
    def alertmanager_dir(self) -> Path:
        """The Alertmanager's configuration, storage, port record and the target's file_sd of it."""
        return self.home / ALERTMANAGER

    @property
    def alertmanager_config_path(self) -> Path:
        return self.alertmanager_dir / "alertmanager.yml"

    @property
    def alertmanager_installed(self) -> bool:
        binary = self.config.alertmanager_bin
        return os.path.isfile(binary) and os.access(binary, os.X_OK)

    @property
    def alertmanager_port(self) -> int:
        """``alertmanager_port`` when set, else the free port chosen at the first ``up`` (0 before)."""
        if self.config.alertmanager_port:
            return self.config.alertmanager_port
        try:
            return int((self.alertmanager_dir / "port").read_text().strip())
        except (OSError, ValueError):
            return 0

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    def _prepare_alertmanager(self) -> None:
        """Its port (chosen once), a configuration while none was written, and the target's file_sd of it."""
        from promshift.local.stack.alert_definitions import NO_DEFINITION_CONFIG

        self.alertmanager_dir.mkdir(parents=True, exist_ok=True)
        if not self.alertmanager_port:
            (self.alertmanager_dir / "port").write_text(f"{find_free_ports(1)[0]}\n")
        if not self.alertmanager_config_path.exists():
            self.alertmanager_config_path.write_text(
                "# The target's Alertmanager; the local AMP control plane rewrites it from the workspace's alert "
                "manager definition.\n" + yaml.safe_dump(NO_DEFINITION_CONFIG, sort_keys=False), encoding="utf-8")
        targets = json.dumps([{"targets": [f"127.0.0.1:{self.alertmanager_port}"]}]) + "\n"
        sd = self.alertmanager_dir / "targets.json"
        if not sd.exists() or sd.read_text() != targets:
            tmp = sd.with_name(".targets.json.tmp")
            tmp.write_text(targets)
            os.replace(tmp, sd)

    @property
    def kubernetes_dir(self) -> Path:
        """Where the k8s component writes ``api.json`` (where it listens) and ``kubeconfig.json``."""
        return self.home / K8S

    @property
    def kubeconfig_path(self) -> Path:
        """The kubeconfig naming the contract server (``KubernetesHook``'s ``config_file``)."""
        return self.kubernetes_dir / "kubeconfig.json"

    def kubernetes_address(self) -> dict[str, Any] | None:
        """What the running k8s component recorded (``url``, ``port``, ``pid``, ...), or None."""
        try:
            data = json.loads((self.kubernetes_dir / "api.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    @property
    def k8s_port(self) -> int:
        """The contract server's port: ``k8s_port`` when set, else the one the running server bound (0 before)."""
        if self.config.k8s_port:
            return self.config.k8s_port
        address = self.kubernetes_address()
        return int(address["port"]) if address and address.get("port") else 0

    @property
    def kubernetes_url(self) -> str:
        return f"http://127.0.0.1:{self.k8s_port}"

    @property
    def prometheus_cr_url(self) -> str:
        """The ``Prometheus`` resource the k8s component serves (``GET`` it to see ``spec.remoteWrite``)."""
        return (f"{self.kubernetes_url}/apis/monitoring.coreos.com/v1/namespaces/{K8S_NAMESPACE}/"
                f"prometheuses/{K8S_NAME}")

    def prometheus_cr(self) -> dict[str, Any]:
        """The ``Prometheus`` resource as the contract server holds it now."""
        if not self.kubernetes_address():
            raise StackError("the Kubernetes contract server is not running: "
                             "run `python -m promshift.local stack up --k8s`")
        response = self._http.get(self.prometheus_cr_url, timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def kubernetes_source_extra(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """The source connection's ``extra.kubernetes`` for the ``Prometheus`` resource (``extra.deploy: k8s-cr``)."""
        if not self.kubernetes_address():
            raise StackError("the Kubernetes contract server is not running: "
                             "run `python -m promshift.local stack up --k8s`")
        return {"namespace": K8S_NAMESPACE, "name": K8S_NAME, "config_file": str(self.kubeconfig_path),
                "timeout_s": timeout_s}

    # -- the config repository and its sync (git=True) -----------------------------------------

    @property
    def git_dir(self) -> Path:
        """Where the git component keeps ``config.git``, ``api.json``, ``token`` and ``sync.json``."""
        return self.home / GIT

    def git_address(self) -> dict[str, Any] | None:
        """What the running git component recorded (``url``, ``port``, ``pid``, ``repo``, ...), or None."""
        from promshift.local.stack.reconciler import read_address

        return read_address(self.git_dir)

    @property
    def github_url(self) -> str:
        address = self.git_address() or {}
        port = self.config.github_port or address.get("port") or 0
        return f"http://127.0.0.1:{port}"

    def git_token(self) -> str:
        """The GitHub API contract server's token (Airflow gets it as a connection's password)."""
        return (self.git_dir / "token").read_text().strip()

    def git_source_extra(self, *, backend: str = "github", timeout_s: float = 120.0) -> dict[str, Any]:
        """The source connection's ``extra.git`` for the stack's config repository (``extra.deploy: git``)."""
        address = self.git_address()
        if not address:
            raise StackError("the git component is not running: run `python -m promshift.local stack up --git`")
        extra: dict[str, Any] = {"url": address["repo"], "path": address["path"], "shape": address["shape"],
                                 "branch": address["branch"], "backend": backend, "timeout_s": timeout_s}
        if backend == "github":
            extra.update(github={"repository": address["repository"], "api_url": address["url"]},
                         conn_id="promshift_git")
        return extra

    # -- the local AWS (target_kind="amp") ------------------------------------------------

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

    def _reload_target(self) -> None:
        try:
            self._http.post(f"{self.target_url}/-/reload", timeout=30).raise_for_status()
        except requests.RequestException as exc:
            logger.warning("reloading the target after adding its alerting section failed: %s", exc)

    def data_dir(self, name: str) -> Path:
        """TSDB directory (``--storage.tsdb.path``) of the ``source`` or the ``target`` (or the second cluster's)."""
        if name not in (SOURCE, TARGET, SOURCE_B, TARGET_B):
            raise ValueError(f"only the source and the target have a TSDB, not {name!r}")
        return self.home / name / "data"

    def log_path(self, name: str) -> Path:
        """Log file of component ``name``."""
        return self.home / f"{name}.log"

    def pid_path(self, name: str) -> Path:
        """PID file of component ``name``."""
        return self.home / f"{name}.pid"

    def _components(self, *, workspace_id: str | None = None, fingerprint: str = "",
                    workspace_b_id: str | None = None) -> dict[str, _Component]:
        """Every component; the local AWS's argv carry the workspace id and the pair's fingerprint (not the pair)."""
        cfg = self.config
        fleet_argv = (
            sys.executable,
            "-m",
            "promshift.local.stack.fleet",
            "--nodes",
            str(cfg.nodes),
            "--port",
            str(cfg.fleet_port),
            "--seed",
            str(cfg.seed),
            f"--faults-file={self.fleet_faults_path}",
        )
        source_data, target_data = self.data_dir(SOURCE), self.data_dir(TARGET)
        source_argv = prometheus_argv(
            self.source_config_path,
            source_data,
            cfg.source_port,
            "--web.enable-lifecycle",
            "--web.enable-admin-api",
            f"--storage.tsdb.retention.time={SOURCE_RETENTION}",
            binary=cfg.prometheus_bin,
        )
        target_argv = prometheus_argv(
            self.target_config_path,
            target_data,
            cfg.target_port,
            "--web.enable-remote-write-receiver",
            "--web.enable-lifecycle",  # moved rules are loaded by a reload (POST /-/reload)
            "--web.enable-admin-api",
            # firing alerts are re-sent to the Alertmanager every 5 s (default 1 min): one dropped while a reload
            # re-discovers it (a moved rule's reload) is not missing for a minute
            "--rules.alert.resend-delay=5s",
            f"--web.route-prefix={cfg.target_prefix}",
            f"--web.external-url={self.target_url}",
            binary=cfg.prometheus_bin,
        )
        mail_argv = (sys.executable, "-m", "promshift.local.stack.smtp_sink", "--dir", str(self.mail_dir),
                     "--port", str(cfg.smtp_port))
        smtp_url = f"smtp://127.0.0.1:{self.smtp_port}"
        components = {
            MAIL: _Component(MAIL, cfg.smtp_port, mail_argv, smtp_url, smtp_url,
                             f"promshift.local.stack.smtp_sink --dir {self.mail_dir}", "PROMSHIFT_SMTP_PORT"),
            FLEET: _Component(
                FLEET,
                cfg.fleet_port,
                fleet_argv,
                self.fleet_url,
                f"{self.fleet_url}/healthz",
                "promshift.local.stack.fleet",
                "PROMSHIFT_FLEET_PORT",
            ),
            TARGET: _Component(
                TARGET,
                cfg.target_port,
                target_argv,
                self.target_url,
                f"{self.target_url}/-/ready",
                f"--storage.tsdb.path={target_data}",
                "PROMSHIFT_TARGET_PORT",
            ),
            SOURCE: _Component(
                SOURCE,
                cfg.source_port,
                source_argv,
                self.source_url,
                f"{self.source_url}/-/ready",
                f"--storage.tsdb.path={source_data}",
                "PROMSHIFT_SOURCE_PORT",
            ),
        }
        components.update(self._amp_components(workspace_id or self.workspace_id or "ws-none", fingerprint,
                                               workspace_b_id or self.workspace_b_id))
        k8s_argv = (sys.executable, "-m", "promshift.local.stack.k8s_api", "--state-dir", str(self.kubernetes_dir),
                    "--port", str(cfg.k8s_port), "--config", str(self.source_config_path),
                    "--prometheus", self.source_url, "--namespace", K8S_NAMESPACE, "--name", K8S_NAME)
        components[K8S] = _Component(K8S, cfg.k8s_port, k8s_argv, self.kubernetes_url, self.prometheus_cr_url,
                                     f"promshift.local.stack.k8s_api --state-dir {self.kubernetes_dir}",
                                     "PROMSHIFT_K8S_PORT")
        am_data = self.alertmanager_dir / "data"
        am_argv = (cfg.alertmanager_bin, f"--config.file={self.alertmanager_config_path}",
                   f"--storage.path={am_data}", f"--web.listen-address=127.0.0.1:{self.alertmanager_port}",
                   "--cluster.listen-address=", f"--web.external-url={self.alertmanager_url}")
        components[ALERTMANAGER] = _Component(ALERTMANAGER, self.alertmanager_port, am_argv, self.alertmanager_url,
                                              f"{self.alertmanager_url}/-/ready", f"--storage.path={am_data}",
                                              "PROMSHIFT_ALERTMANAGER_PORT")
        git_argv = (sys.executable, "-m", "promshift.local.stack.reconciler", "--state-dir", str(self.git_dir),
                    "--port", str(cfg.github_port), "--config", str(self.source_config_path),
                    "--prometheus", self.source_url, "--interval", str(cfg.reconciler_interval_s))
        components[GIT] = _Component(GIT, cfg.github_port, git_argv, self.github_url, self.github_url,
                                     f"promshift.local.stack.reconciler --state-dir {self.git_dir}",
                                     "PROMSHIFT_GITHUB_PORT")
        components.update(self._cluster_b_components())
        return components

    def _cluster_b_components(self) -> dict[str, _Component]:
        ports, cfg = self.cluster_b_ports(), self.config
        fleet_b_url = f"http://127.0.0.1:{ports[FLEET_B]}"
        fleet_argv = (sys.executable, "-m", "promshift.local.stack.fleet", "--nodes", str(self.fleet_b.nodes),
                      "--port", str(ports[FLEET_B]), "--seed", str(self.fleet_b.seed))
        source_data, target_data = self.data_dir(SOURCE_B), self.data_dir(TARGET_B)
        source_argv = prometheus_argv(self.source_b_config_path, source_data, ports[SOURCE_B], "--web.enable-lifecycle",
                                      f"--storage.tsdb.retention.time={SOURCE_RETENTION}", binary=cfg.prometheus_bin)
        target_argv = prometheus_argv(self.home / TARGET_B / "prometheus.yml", target_data, ports[TARGET_B],
                                      "--web.enable-remote-write-receiver", "--web.enable-lifecycle",
                                      f"--web.route-prefix={CLUSTER_B_PREFIX}",
                                      f"--web.external-url={self.target_b_url}", binary=cfg.prometheus_bin)
        # The fleet's marker is the module's, as the first fleet's: not its size (`stack down` knows no NODES) nor its
        # port (a free one an earlier `up` chose is not the environment's); its own pid file tells the two apart.
        return {
            FLEET_B: _Component(FLEET_B, ports[FLEET_B], fleet_argv, fleet_b_url, f"{fleet_b_url}/healthz",
                                "promshift.local.stack.fleet",
                                "PROMSHIFT_FLEET_B_PORT"),
            TARGET_B: _Component(TARGET_B, ports[TARGET_B], target_argv, self.target_b_url,
                                 f"{self.target_b_url}/-/ready", f"--storage.tsdb.path={target_data}",
                                 "PROMSHIFT_TARGET_B_PORT"),
            SOURCE_B: _Component(SOURCE_B, ports[SOURCE_B], source_argv, self.source_b_url,
                                 f"{self.source_b_url}/-/ready", f"--storage.tsdb.path={source_data}",
                                 "PROMSHIFT_SOURCE_B_PORT"),
        }

    def _amp_components(self, workspace_id: str, fingerprint: str,
                        workspace_b_id: str | None = None) -> dict[str, _Component]:
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
            RELAY_B: _Component(RELAY_B, relay_b_port,
                                relay_argv(relay_b_data, relay_b_port, workspace_b_id or "ws-none"),
                                self.relay_b_remote_write_url, f"http://127.0.0.1:{relay_b_port}/health",
                                f"-remoteWrite.tmpDataPath={relay_b_data}", "PROMSHIFT_RELAY_B_PORT"),
            MOTO: _Component(MOTO, cfg.moto_port, moto_argv, self.moto_url, f"{self.moto_url}/moto-api/data.json",
                             f"moto.server -H 127.0.0.1 -p {cfg.moto_port}", "PROMSHIFT_MOTO_PORT"),
            AWS: _Component(AWS, cfg.aws_port, aws_argv, self.aws_url, f"{self.aws_url}/-/healthy",
                            f"promshift.local.stack.controlplane {state_dir}", "PROMSHIFT_AWS_PORT"),
            FRONTDOOR: _Component(FRONTDOOR, cfg.frontdoor_port, frontdoor_argv, self.frontdoor_url,
                                  f"{self.frontdoor_url}/-/healthy", f"promshift.local.stack.frontdoor {state_dir}",
                                  "PROMSHIFT_FRONTDOOR_PORT"),
            RELAY: _Component(RELAY, cfg.relay_port, relay_argv(relay_data, cfg.relay_port, workspace_id),
                              self.relay_remote_write_url,
                              f"http://127.0.0.1:{cfg.relay_port}/health", f"-remoteWrite.tmpDataPath={relay_data}",
                              "PROMSHIFT_RELAY_PORT"),
        }

    def _names(self) -> tuple[str, ...]:
        """The components this stack runs: the local AWS's too when it is an AMP stack or they were started."""
        amp = tuple(
            name for name in AMP_COMPONENTS
            if self.config.target_kind == "amp" or self.pid_path(name).exists()
        )
        k8s = (K8S,) if self.config.kubernetes or self.pid_path(K8S).exists() else ()
        cluster_b = tuple(name for name in CLUSTER_B_COMPONENTS
                          if self.config.clusters == 2 or self.pid_path(name).exists())
        if (self.config.clusters == 2 and self.config.target_kind == "amp") or self.pid_path(RELAY_B).exists():
            cluster_b += (RELAY_B,)
        am = (ALERTMANAGER,) if self.alertmanager_installed or self.pid_path(ALERTMANAGER).exists() else ()
        git = (GIT,) if self.config.git or self.pid_path(GIT).exists() else ()
        return COMPONENTS + am + amp + k8s + git + cluster_b

    # -- public operations ---------------------------------------------------------------

    def up(self, timeout: float = 180.0) -> dict[str, dict[str, Any]]:
        """Start whatever is not already running and healthy; return when the source has scraped every node.

        Raises StackError when Prometheus is not installed, a port is taken by another
        process, a process dies during start-up, or the deadline passes.
        """
        self._require_prometheus()
        amp = self.config.target_kind == "amp"
        if amp:
            self._require_vmagent()
        deadline = time.monotonic() + timeout
        with self._locked():
            fingerprint = ""
            if amp:
                credentials = self.aws_credentials()
                fingerprint = credentials.fingerprint()
                self._aws_child_env = self.aws_env()
            alerting = self.alertmanager_installed
            if alerting:
                self._prepare_alertmanager()
            components = self._components(fingerprint=fingerprint)
            target_edited = self._write_configs()
            # A plain `up` neither starts nor checks the local AWS (a running one is left alone).
            names = COMPONENTS + ((ALERTMANAGER,) if alerting else ()) + (AMP_COMPONENTS if amp else ()) \
                + ((K8S,) if self.config.kubernetes else ()) + ((GIT,) if self.config.git else ())
            plans = {name: self._plan(components[name]) for name in names}
            # Check every port before starting anything, so a conflict leaves nothing half-started.
            for name, (action, _pid) in plans.items():
                if action == "start":
                    self._require_port(components[name])
            if plans[FLEET][0] == "restart":
                logger.info(
                    "fleet changes from %s to %s nodes",
                    self._read_state().get("fleet", {}).get("nodes", "?"),
                    self.config.nodes,
                )
            self._apply(components[FLEET], plans[FLEET])
            self._apply(components[MAIL], plans[MAIL])
            if alerting:
                self._apply(components[ALERTMANAGER], plans[ALERTMANAGER])
            self._wait_healthy([components[FLEET], components[MAIL]]
                               + ([components[ALERTMANAGER]] if alerting else []), deadline)
            # Written only once the fleet answers, so the source never scrapes nodes it does not serve.
            write_file_sd(self.fleet, self.config.fleet_port, self.file_sd_path)
            if target_edited and plans[TARGET][0] == "reuse":
                self._reload_target()
            if not amp:
                for name in (TARGET, SOURCE):
                    self._apply(components[name], plans[name])
                self._wait_healthy([components[TARGET], components[SOURCE]], deadline)
                self._start_kubernetes(components, plans, deadline)
                self._start_git(components, plans, deadline)
                if self.config.clusters == 2:
                    components = self._start_cluster_b(deadline)
                self._write_state(components)
            else:
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
                action, pid = plans[SOURCE]
                if action == "reuse" and previous != fingerprint:
                    action = "restart"  # started without this pair in its environment (see _start)
                self._apply(components[SOURCE], (action, pid))
                self._wait_healthy([components[SOURCE]], deadline)
                self._start_kubernetes(components, plans, deadline)
                self._start_git(components, plans, deadline)
                self._write_state(components, workspace_id=workspace_id, fingerprint=fingerprint,
                                  workspace_b_id=workspace_b_id)
            self._wait_scraped(deadline)
            if self.config.clusters == 2:
                self._wait_scraped(deadline, url=self.source_b_url, expected=self.fleet_b.nodes)
        return self.status()

    def _start_cluster_b(self, deadline: float, *, restart_source: bool = False) -> dict[str, _Component]:
        """The second cluster's fleet, target and source (in that order), on their ports or free ones.
        ``restart_source``: a running source-b is restarted (another AWS pair for its environment)."""
        missing = [name for name, port in self.cluster_b_ports().items() if port == 0]
        self._cluster_b_chosen.update(zip(missing, find_free_ports(len(missing)), strict=True))
        components = self._components()
        self._apply(components[FLEET_B], self._plan(components[FLEET_B]))
        self._wait_healthy([components[FLEET_B]], deadline)
        write_file_sd(self.fleet_b, components[FLEET_B].port, self.file_sd_b_path)
        reload_target = False
        for name in (TARGET_B, SOURCE_B):
            action, pid = self._plan(components[name])
            if name == SOURCE_B and action == "reuse" and restart_source:
                action = "restart"
            reload_target = reload_target or (name == TARGET_B and action == "reuse" and self._target_b_edited)
            self._apply(components[name], (action, pid))
        self._wait_healthy([components[TARGET_B], components[SOURCE_B]], deadline)
        if reload_target:
            try:
                self._http.post(f"{self.target_b_url}/-/reload", timeout=30).raise_for_status()
            except requests.RequestException as exc:
                logger.warning("reloading target-b after adding its rule files failed: %s", exc)
        return components

    def _start_kubernetes(self, components: dict[str, _Component], plans: dict[str, tuple[str, int | None]],
                          deadline: float) -> None:
        """The k8s component, once the source it renders onto answers (kubernetes=True only)."""
        if not self.config.kubernetes:
            return
        action, pid = plans[K8S]
        if action == "reuse" and plans[SOURCE][0] != "reuse":
            action = "restart"  # the operator renders onto the source's file: take it over again
        self._apply(components[K8S], (action, pid))
        self._wait_healthy([components[K8S]], deadline)

    def _start_git(self, components: dict[str, _Component], plans: dict[str, tuple[str, int | None]],
                   deadline: float) -> None:
        """The git component, once the source it syncs onto answers (git=True only)."""
        if not self.config.git:
            return
        action, pid = plans[GIT]
        if action == "reuse" and plans[SOURCE][0] != "reuse":
            action = "restart"  # the sync renders onto the source's file: take it over again
        self._apply(components[GIT], (action, pid))
        self._wait_healthy([components[GIT]], deadline)

    def down(self, timeout: float = 30.0) -> None:
        """Stop every component (SIGTERM, then SIGKILL after ``timeout`` s); idempotent."""
        if not self.home.exists():
            return
        with self._locked():
            self._down(timeout)

    def status(self) -> dict[str, dict[str, Any]]:
        """Per component: ``pid``, ``alive``, ``healthy`` and ``url``."""
        result: dict[str, dict[str, Any]] = {}
        components = self._components()
        for name in self._names():
            component = components[name]
            pid = self._read_pid(name)
            alive = pid is not None and self._owns(pid, component)
            result[name] = {
                "pid": pid,
                "alive": alive,
                "healthy": alive and self._healthy(component),
                "url": component.url,
            }
        return result

    def reset(self) -> None:
        """Stop the stack and delete its state (configs, TSDBs, logs) for a fresh start.

        Only what the stack itself creates is removed, so a mistyped PROMSHIFT_HOME cannot
        wipe unrelated files.
        """
        if not self.home.exists():
            return
        with self._locked():
            self._down(30.0)
            for directory in (SOURCE, TARGET, RELAY, "amp", MAIL, K8S, GRAFANA, ALERTMANAGER, GIT,
                              *CLUSTER_B_COMPONENTS, RELAY_B):
                shutil.rmtree(self.home / directory, ignore_errors=True)
            for name in ALL_COMPONENTS:
                self.log_path(name).unlink(missing_ok=True)
                self.pid_path(name).unlink(missing_ok=True)
            self.state_path.unlink(missing_ok=True)
        # stack.lock stays: deleting it could let a waiting process and a new one both "hold" the lock.
        logger.info("local stack state under %s removed", self.home)

    # -- process management --------------------------------------------------------------

    @property
    def _lock_path(self) -> Path:
        return self.home / "stack.lock"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise up/down/reset across processes (CLI, tests and DAG tasks may race)."""
        self.home.mkdir(parents=True, exist_ok=True)
        with self._lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _require_prometheus(self) -> None:
        binary = self.config.prometheus_bin
        if not prometheus_installed(binary):
            raise StackError(
                f"Prometheus is not installed ({binary} not found); install it with "
                "`apt-get install -y prometheus`"
            )

    def _require_vmagent(self) -> None:
        binary = self.config.vmagent_bin
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise StackError(
                f"vmagent is not installed ({binary} not found); the AMP stack's signing relay needs it: "
                "`apt-get install -y victoria-metrics`"
            )

    def _read_pid(self, name: str) -> int | None:
        try:
            return int(self.pid_path(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _owns(self, pid: int, component: _Component) -> bool:
        return _alive(pid) and component.marker in " ".join(_cmdline(pid))

    def _healthy(self, component: _Component) -> bool:
        if component.name == MAIL:
            # The port the sink bound (written once it listens), and the sink must be the one the pid file names.
            address = sink_address(self.mail_dir)
            if address is None or (self.config.smtp_port and address[1] != self.config.smtp_port):
                return False
            return address[2] == self._read_pid(MAIL) and smtp_answers(address[0], address[1])
        if component.name == GIT:
            # Written once the API listens and the first sync has been loaded by the source.
            address = self.git_address()
            if address is None or address.get("pid") != self._read_pid(GIT):
                return False
            return not self.config.github_port or address.get("port") == self.config.github_port
        if component.name == K8S:
            # Written once the server listens and the operator has rendered the resource onto the source.
            address = self.kubernetes_address()
            if address is None or address.get("pid") != self._read_pid(K8S):
                return False
            if self.config.k8s_port and address.get("port") != self.config.k8s_port:
                return False
            try:
                return self._http.get(self.prometheus_cr_url, timeout=2).status_code == 200
            except requests.RequestException:
                return False
        try:
            return self._http.get(component.health_url, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _plan(self, component: _Component) -> tuple[str, int | None]:
        """Decide between ``reuse``, ``restart`` (ours, other settings) and ``start`` for a component."""
        pid = self._read_pid(component.name)
        if pid is None or not _alive(pid):
            return "start", None
        cmdline = _cmdline(pid)
        # argv[0] is skipped: another interpreter path (venv vs. Airflow worker) is the same fleet.
        if cmdline[1:] == list(component.argv[1:]):
            return "reuse", pid
        if component.marker in " ".join(cmdline):
            return "restart", pid
        logger.warning(
            "%s names pid %s, which is not ours (%s); ignoring it",
            self.pid_path(component.name),
            pid,
            " ".join(cmdline)[:120],
        )
        return "start", None

    def _apply(self, component: _Component, plan: tuple[str, int | None]) -> None:
        action, pid = plan
        if action == "reuse":
            logger.info("%s already running (pid %s), reusing it", component.name, pid)
            return
        if action == "restart" and pid is not None:
            logger.info("%s (pid %s) runs with other settings; restarting it", component.name, pid)
            self._stop({component.name: pid}, 30.0)
        self.pid_path(component.name).unlink(missing_ok=True)
        self._require_port(component)
        self._start(component)

    @staticmethod
    def _require_port(component: _Component) -> None:
        if component.port == 0:  # the process binds any free port itself
            return
        if not _port_free(component.port):
            raise StackError(
                f"port {component.port} on 127.0.0.1 (for the {component.name}) is already in use by "
                f"another process; stop it or choose another port with {component.port_env}"
            )

    def _start(self, component: _Component) -> None:
        log_path = self.log_path(component.name)
        if component.name == MAIL:
            (self.mail_dir / "sink.json").unlink(missing_ok=True)  # a dead sink's port must not pass for the new one's
        if component.name == K8S:
            (self.kubernetes_dir / "api.json").unlink(missing_ok=True)  # likewise for the contract server's
        if component.name == GIT:
            (self.git_dir / "api.json").unlink(missing_ok=True)
        env = dict(os.environ)
        package_root = str(Path(promshift.__file__).resolve().parent.parent)
        # The fleet runs as `python -m promshift.local.stack.fleet`: make sure it imports this very package.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        if component.name in (AWS, FRONTDOOR, RELAY, SOURCE, RELAY_B, SOURCE_B):
            # The source gets the pair too, as a Prometheus on EKS gets one from its role: Debian's 2.42
            # refuses to load a `sigv4:` remote_write entry without credentials (it never signs with them).
            env.update(self._aws_child_env)
        with log_path.open("ab") as log:
            log.write(f"--- {datetime.now(UTC).isoformat()} starting: {' '.join(component.argv)}\n".encode())
            log.flush()
            self._log_offsets[component.name] = log.tell()
            proc = subprocess.Popen(
                component.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env=env,
                start_new_session=True,
            )
        _CHILDREN[proc.pid] = proc
        self.pid_path(component.name).write_text(f"{proc.pid}\n")
        logger.info("started %s (pid %s), log %s", component.name, proc.pid, log_path)

    def _wait_healthy(self, components: list[_Component], deadline: float) -> None:
        pending = {c.name: c for c in components}
        while pending:
            for name, component in list(pending.items()):
                pid = self._read_pid(name)
                if pid is None or not _alive(pid):
                    raise StackError(
                        f"{name} exited during start-up; last lines of {self.log_path(name)}:\n"
                        f"{_tail(self.log_path(name), self._log_offsets.get(name, 0))}"
                    )
                if self._healthy(component):
                    logger.info("%s is healthy at %s", name, component.url)
                    del pending[name]
            if not pending:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- {self.log_path(n)}:\n{_tail(self.log_path(n), self._log_offsets.get(n, 0))}"
                    for n in pending
                )
                raise StackError(f"not healthy before the deadline: {', '.join(pending)}\n{tails}")
            time.sleep(0.2)

    def _scraped_targets(self, url: str | None = None) -> int:
        query = f'count(up{{job="{SCRAPE_JOB}"}} == 1)'
        try:
            response = self._http.get(f"{url or self.source_url}/api/v1/query", params={"query": query}, timeout=5)
            response.raise_for_status()
            result = response.json()["data"]["result"]
        except (requests.RequestException, ValueError, KeyError) as exc:
            logger.debug("querying the source for scraped targets failed: %s", exc)
            return 0
        return int(float(result[0]["value"][1])) if result else 0

    def _wait_scraped(self, deadline: float, *, url: str | None = None, expected: int | None = None) -> None:
        expected = self.config.nodes if expected is None else expected
        last, logged_at = -1, 0.0
        while True:
            scraped = self._scraped_targets(url)
            # At most one progress line every 2 s: a 2,000-node fleet fills in over a whole interval.
            if scraped != last and (scraped == expected or time.monotonic() - logged_at >= 2.0):
                logger.info("source sees %s/%s fleet targets up", scraped, expected)
                last, logged_at = scraped, time.monotonic()
            if scraped == expected:
                return
            if time.monotonic() > deadline:
                raise StackError(
                    f"the source scraped {scraped} of {expected} fleet targets before the deadline; "
                    f"see {url or self.source_url}/targets and {self.log_path(FLEET)}"
                )
            time.sleep(0.5)

    def _down(self, timeout: float) -> None:
        # Airflow first (a demo leaves it running, see ``promshift.local.airflow_lab``): its tasks talk to the rest.
        airflow = self._read_pid(AIRFLOW)
        if airflow is not None and _airflow_group_alive(airflow):
            logger.info("stopping airflow (process group %s)", airflow)
            _stop_group(airflow, timeout)
        self.pid_path(AIRFLOW).unlink(missing_ok=True)
        components = self._components()
        running = {
            name: pid
            for name in ALL_COMPONENTS
            if (pid := self._read_pid(name)) is not None and self._owns(pid, components[name])
        }
        # The operator stand-in first (it rewrites and reloads the source); then the source: it may be flushing
        # remote-write queues into the relay or the target; then the relay, which may be flushing into the front door.
        for first in (K8S, SOURCE, SOURCE_B, RELAY, RELAY_B):
            if first in running:
                self._stop({first: running.pop(first)}, timeout)
        self._stop(running, timeout)
        for name in ALL_COMPONENTS:
            self.pid_path(name).unlink(missing_ok=True)

    def _stop(self, pids: dict[str, int], timeout: float) -> None:
        for name, pid in pids.items():
            logger.info("stopping %s (pid %s)", name, pid)
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for name, pid in pids.items():
            if _alive(pid):
                logger.warning("%s (pid %s) ignored SIGTERM for %ss; killing it", name, pid, timeout)
                _signal_group(pid, signal.SIGKILL)
        kill_deadline = time.monotonic() + 5.0
        while any(_alive(pid) for pid in pids.values()) and time.monotonic() < kill_deadline:
            time.sleep(0.05)

    # -- files ---------------------------------------------------------------------------

    def _write_configs(self) -> bool:
        """Write what is missing; True when the target's config was edited (a running target must reload)."""
        cfg = self.config
        edited_target = False
        source = {
            "global": {
                "scrape_interval": cfg.scrape_interval,
                "evaluation_interval": cfg.scrape_interval,
                "external_labels": dict(EXTERNAL_LABELS),
                # Every query it answers, for `promshift plan` (docs/plan.md): real usage to read.
                "query_log_file": str(self.source_query_log_path),
            },
            "rule_files": ["rules/*.yml"],
            "scrape_configs": [
                {"job_name": SCRAPE_JOB, "file_sd_configs": [{"files": [str(self.file_sd_path)]}]},
                {"job_name": PROMSHIFT_JOB, "metrics_path": PROMSHIFT_METRICS_PATH,
                 "authorization": {"credentials_file": str(self.promshift_token_path)},
                 "file_sd_configs": [{"files": [str(self.promshift_sd_path)]}]},
            ],
        }
        target: dict[str, Any] = {"global": {"evaluation_interval": "1m"}, "scrape_configs": []}
        amp = cfg.target_kind == "amp"
        if amp:  # the control plane writes each rule-groups namespace there (promshift.local.stack.rule_namespaces)
            target["rule_files"] = [AMP_RULE_FILES]
            # The strict front door judges sample order (amp_ingest); the TSDB behind takes what it accepted.
            target["storage"] = {"tsdb": {"out_of_order_time_window": "1h"}}
        self._write_once(
            self.source_config_path,
            "# Source Prometheus of promshift's local stack. Written once; deployers add remote_write.\n",
            source,
        )
        if not self.promshift_sd_path.exists():  # no Airflow yet: job promshift has no target (scrape_promshift)
            self.promshift_sd_path.parent.mkdir(parents=True, exist_ok=True)
            self.promshift_sd_path.write_text("[]")
        if not self.promshift_token_path.exists():  # promtool (every deployer's check) stats the credentials file
            os.close(os.open(self.promshift_token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._write_once(
            self.target_config_path,
            "# Stand-in for the AMP workspace: receives remote write, scrapes nothing.\n",
            target,
        )
        if amp:  # a target first written for a plain stack: the entry added, every other byte kept
            from promshift.adapters.deploy import write_keeping
            from promshift.core.rules import add_rule_file

            config = self.target_config_path.read_bytes()
            edited = add_rule_file(config, AMP_RULE_FILES)
            if edited != config:
                write_keeping(self.target_config_path, edited)
                edited_target = True
            self.amp_rules_dir.mkdir(parents=True, exist_ok=True)
        if self.alertmanager_installed:
            edited_target = self._add_alerting() or edited_target
        if not self.source_rules_path.exists():
            self.source_rules_path.parent.mkdir(parents=True, exist_ok=True)
            self.source_rules_path.write_text(SOURCE_RULES, encoding="utf-8")
        from promshift.adapters.settings import REPO_ROOT

        dashboard = REPO_ROOT / "catalog" / "dashboards" / "dcgm-exporter-dashboard.json"
        if dashboard.is_file() and not (self.dashboards_dir / dashboard.name).exists():
            self.dashboards_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dashboard, self.dashboards_dir / dashboard.name)
        for name in (SOURCE, TARGET):
            self.data_dir(name).mkdir(parents=True, exist_ok=True)
        if cfg.clusters == 2:
            self._write_once(self.source_b_config_path,
                             "# The second cluster's source Prometheus (clusters=2). Written once; deployers add "
                             "remote_write.\n",
                             {"global": {"scrape_interval": cfg.scrape_interval,
                                         "evaluation_interval": cfg.scrape_interval,
                                         "external_labels": dict(EXTERNAL_LABELS_B)},
                              "scrape_configs": [{"job_name": SCRAPE_JOB,
                                                  "file_sd_configs": [{"files": [str(self.file_sd_b_path)]}]}]})
            self._write_once(self.home / TARGET_B / "prometheus.yml",
                             "# Stand-in for the second workspace: receives remote write, scrapes nothing.\n",
                             {"global": {"evaluation_interval": "1m"}, "scrape_configs": []})
            for name in (SOURCE_B, TARGET_B):
                self.data_dir(name).mkdir(parents=True, exist_ok=True)
            if amp:  # the second workspace's rule-groups namespaces are evaluated by target-b (rule_namespaces)
                from promshift.adapters.deploy import write_keeping
                from promshift.core.rules import add_rule_file

                path = self.home / TARGET_B / "prometheus.yml"
                config = path.read_bytes()
                edited = add_rule_file(config, AMP_RULE_FILES)
                if edited != config:
                    write_keeping(path, edited)
                    self._target_b_edited = True
                (path.parent / AMP_RULES_DIR).mkdir(parents=True, exist_ok=True)
        return edited_target

    def _add_alerting(self) -> bool:
        """The target's ``alerting:`` names the Alertmanager (through a file_sd the stack keeps current); added
        at the end of its config when it has none, every other byte kept. True when added."""
        from promshift.adapters.deploy import write_keeping

        config = self.target_config_path.read_bytes()
        loaded = yaml.safe_load(config) or {}
        if isinstance(loaded, dict) and "alerting" in loaded:
            return False
        block = ("# The target's Alertmanager (the local stack's prometheus-alertmanager).\n"
                 "alerting:\n  alertmanagers:\n    - file_sd_configs:\n"
                 f"        - files: [{json.dumps(str(self.alertmanager_dir / 'targets.json'))}]\n").encode()
        write_keeping(self.target_config_path, config + (b"" if config.endswith(b"\n") else b"\n") + block)
        return True

    @staticmethod
    def _write_once(path: Path, header: str, document: dict[str, Any]) -> None:
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(header + yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        os.replace(tmp, path)
        logger.info("wrote %s", path)

    def _read_state(self) -> dict[str, Any]:
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _write_state(self, components: dict[str, _Component], *, workspace_id: str | None = None,
                     fingerprint: str = "", workspace_b_id: str | None = None) -> None:
        cfg = self.config
        state: dict[str, Any] = {
            "updated_at": datetime.now(UTC).isoformat(),
            "fleet": {"nodes": cfg.nodes, "seed": cfg.seed, "port": cfg.fleet_port, "url": self.fleet_url},
            "source": {"url": self.source_url, "config": str(self.source_config_path)},
            "target": {"url": self.target_url, "remote_write_url": self.target_remote_write_url},
            "scrape_interval": cfg.scrape_interval,
            "components": {
                name: {"pid": self._read_pid(name), "argv": list(component.argv)}
                for name, component in components.items()
                if name in self._names()
            },
            "target_kind": cfg.target_kind,
        }
        if cfg.clusters == 2:
            state["cluster_b"] = {
                "ports": self.cluster_b_ports(),
                "source": {"url": self.source_b_url, "config": str(self.source_b_config_path)},
                "target": {"url": self.target_b_url, "remote_write_url": self.target_b_remote_write_url},
                "fleet": {"nodes": self.fleet_b.nodes, "seed": self.fleet_b.seed}}
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
        tmp = self.state_path.with_name(".stack.json.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_path)
