"""The local stack: the simulated fleet, the source Prometheus and the AMP stand-in, all on 127.0.0.1.

``LocalStack.up()`` starts (or reuses) long-lived processes, each in its own session so they outlive the command
that started them. ``LocalStack`` is a thin composition of the stack's component families, one per module under
``promshift.local.stack.parts`` over a small spec (``promshift.local.stack.spec``: names, ports, ``StackConfig``)
and one process runner (``promshift.local.stack.processes``):

- ``fleet`` (``parts.fleet``): ``python -m promshift.local.stack.fleet`` (one scrape target per node);
- ``source`` and ``target`` (``parts.prometheus``): the self-hosted Prometheus scraping the fleet through file_sd,
  and a second Prometheus with the remote-write receiver under a workspace-like route prefix, standing in for the
  AMP workspace;
- ``mail`` and ``alertmanager`` (``parts.alerting``): an SMTP sink that keeps every message under ``mail/`` and
  delivers nothing (``LocalStack.smtp_connection_env()``), and the target's Alertmanager when it is installed;
- with ``target_kind="amp"`` (``stack up --target amp``) ``moto``, ``aws``, ``frontdoor`` and ``relay``
  (``parts.amp``): a local AWS that checks the SigV4 signature of everything it receives;
- with ``kubernetes=True`` or ``git=True`` (``stack up --k8s``/``--git``) ``k8s`` or ``git`` (``parts.stand_ins``),
  started once the source is up: the Kubernetes API contract server with the prometheus-operator stand-in, or the
  config repository with its sync and the GitHub API contract server;
- with ``clusters=2`` ``fleet-b``, ``source-b``, ``target-b`` (and ``relay-b`` with AMP) (``parts.cluster_b``);
- ``parts.airflow``: the source's scrape of promshift's ``/metrics`` and stopping the demo's Airflow with the rest.

Everything lives under ``StackConfig.home``: ``<name>.pid``, ``<name>.log``, ``stack.json`` (what is running),
``source/`` and ``target/`` (configs and TSDBs). The source's ``prometheus.yml`` is written only when missing,
because deployers edit it later (one ``remote_write`` entry per metric group).

The names other modules, tests and demos import from here (``LocalStack``, ``StackConfig``, ``find_free_ports``,
``PROMETHEUS_BIN``, the component names, ...) stay importable from this module.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from datetime import UTC, datetime
from typing import Any

from promshift.local.stack.fleet import write_file_sd
from promshift.local.stack.parts.airflow import AirflowPart
from promshift.local.stack.parts.amp import AmpPart
from promshift.local.stack.parts.fleet import FleetPart
from promshift.local.stack.parts.prometheus import SOURCE_RULES
from promshift.local.stack.parts.replicas import ReplicasPart
from promshift.local.stack.parts.stand_ins import StandInsPart
from promshift.local.stack.prometheus import PROMETHEUS_BIN, PROMTOOL_BIN
from promshift.local.stack.spec import (
    AIRFLOW,
    AIRFLOW_MARKER,
    ALERTMANAGER,
    ALERTMANAGER_BIN,
    ALL_COMPONENTS,
    AMP_COMPONENTS,
    AMP_RULE_FILES,
    AMP_RULES_DIR,
    AMP_STATE_KEYS,
    AMP_WORKSPACE_ALIAS,
    AMP_WORKSPACE_ALIAS_B,
    AWS,
    CLUSTER_B_COMPONENTS,
    CLUSTER_B_PREFIX,
    COMPONENTS,
    DEFAULT_REGION,
    EXTERNAL_LABELS,
    EXTERNAL_LABELS_B,
    FLEET,
    FLEET_B,
    FRONTDOOR,
    GIT,
    GRAFANA,
    K8S,
    K8S_NAME,
    K8S_NAMESPACE,
    LOCAL_ONCALL_RECEIVER,
    LOCAL_SCRAPER_SOURCE,
    LOG_TAIL_LINES,
    MAIL,
    MOTO,
    PROMSHIFT_JOB,
    PROMSHIFT_METRICS_PATH,
    RELAY,
    RELAY_B,
    SCRAPE_JOB,
    SOURCE,
    SOURCE_1,
    SOURCE_B,
    SOURCE_RETENTION,
    TARGET,
    TARGET_B,
    TARGET_KINDS,
    VMAGENT_BIN,
    Component,
    StackConfig,
    StackError,
    find_free_ports,
)

__all__ = [
    "AIRFLOW", "AIRFLOW_MARKER", "ALERTMANAGER", "ALERTMANAGER_BIN", "ALL_COMPONENTS", "AMP_COMPONENTS",
    "AMP_RULES_DIR", "AMP_RULE_FILES", "AMP_STATE_KEYS", "AMP_WORKSPACE_ALIAS", "AMP_WORKSPACE_ALIAS_B", "AWS",
    "CLUSTER_B_COMPONENTS", "CLUSTER_B_PREFIX", "COMPONENTS", "DEFAULT_REGION", "EXTERNAL_LABELS",
    "EXTERNAL_LABELS_B", "FLEET", "FLEET_B", "FRONTDOOR", "GIT", "GRAFANA", "K8S", "K8S_NAME", "K8S_NAMESPACE",
    "LOCAL_ONCALL_RECEIVER", "LOCAL_SCRAPER_SOURCE", "LOG_TAIL_LINES", "MAIL", "MOTO", "PROMETHEUS_BIN",
    "PROMSHIFT_JOB", "PROMSHIFT_METRICS_PATH", "PROMTOOL_BIN", "RELAY", "RELAY_B", "SCRAPE_JOB", "SOURCE",
    "SOURCE_1", "SOURCE_B", "SOURCE_RETENTION", "SOURCE_RULES", "TARGET", "TARGET_B", "TARGET_KINDS", "VMAGENT_BIN",
    "LocalStack", "StackConfig", "StackError", "find_free_ports",
]

logger = logging.getLogger(__name__)


class LocalStack(FleetPart, AmpPart, StandInsPart, ReplicasPart, AirflowPart):
    """Start, reuse, inspect and stop the local stack: the composition of its component families (``parts``)."""

    def _components(self, *, workspace_id: str | None = None, fingerprint: str = "",
                    workspace_b_id: str | None = None) -> dict[str, Component]:
        """Every component; the local AWS's argv carry the workspace id and the pair's fingerprint (not the pair)."""
        components = {**self._alerting_components(), **self._fleet_components(), **self._prometheus_components()}
        components.update(self._amp_components(workspace_id or self.workspace_id or "ws-none", fingerprint,
                                               workspace_b_id or self.workspace_b_id))
        components.update(self._stand_in_components())
        components.update(self._cluster_b_components())
        components.update(self._replica_components())
        return components

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
        replicas = (SOURCE_1,) if self.config.replicas == 2 or self.pid_path(SOURCE_1).exists() else ()
        return COMPONENTS + am + amp + k8s + git + cluster_b + replicas

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
            if self.config.replicas == 2:
                self._choose_replica_port()
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
                + ((K8S,) if self.config.kubernetes else ()) + ((GIT,) if self.config.git else ()) \
                + ((SOURCE_1,) if self.config.replicas == 2 else ())
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
                sources = (SOURCE, SOURCE_1) if self.config.replicas == 2 else (SOURCE,)
                for name in (TARGET, *sources):
                    self._apply(components[name], plans[name])
                self._wait_healthy([components[name] for name in (TARGET, *sources)], deadline)
                self._start_stand_ins(components, plans, deadline)
                if self.config.clusters == 2:
                    components = self._start_cluster_b(deadline)
                self._write_state(components)
            else:
                components, workspace_id, workspace_b_id, pair_changed = self._start_amp(
                    components, plans, fingerprint, deadline)
                sources = (SOURCE, SOURCE_1) if self.config.replicas == 2 else (SOURCE,)
                for name in sources:
                    action, pid = plans[name]
                    if action == "reuse" and pair_changed:
                        action = "restart"  # started without this pair in its environment (see _child_env)
                    self._apply(components[name], (action, pid))
                self._wait_healthy([components[name] for name in sources], deadline)
                self._start_stand_ins(components, plans, deadline)
                self._write_state(components, workspace_id=workspace_id, fingerprint=fingerprint,
                                  workspace_b_id=workspace_b_id)
            self._wait_scraped(deadline)
            if self.config.replicas == 2:
                self._wait_scraped(deadline, url=self.source_1_url)
            if self.config.clusters == 2:
                self._wait_scraped(deadline, url=self.source_b_url, expected=self.fleet_b.nodes)
        return self.status()

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
                              *CLUSTER_B_COMPONENTS, RELAY_B, SOURCE_1):
                shutil.rmtree(self.home / directory, ignore_errors=True)
            for name in ALL_COMPONENTS:
                self.log_path(name).unlink(missing_ok=True)
                self.pid_path(name).unlink(missing_ok=True)
            self.state_path.unlink(missing_ok=True)
        # stack.lock stays: deleting it could let a waiting process and a new one both "hold" the lock.
        logger.info("local stack state under %s removed", self.home)

    def _down(self, timeout: float) -> None:
        # Airflow first (a demo leaves it running, see ``promshift.local.airflow_lab``): its tasks talk to the rest.
        self._stop_airflow(timeout)
        components = self._components()
        running = {
            name: pid
            for name in ALL_COMPONENTS
            if (pid := self._read_pid(name)) is not None and self._owns(pid, components[name])
        }
        # The operator stand-in first (it rewrites and reloads the source); then the source: it may be flushing
        # remote-write queues into the relay or the target; then the relay, which may be flushing into the front door.
        for first in (K8S, SOURCE, SOURCE_1, SOURCE_B, RELAY, RELAY_B):
            if first in running:
                self._stop({first: running.pop(first)}, timeout)
        self._stop(running, timeout)
        for name in ALL_COMPONENTS:
            self.pid_path(name).unlink(missing_ok=True)

    # -- files ---------------------------------------------------------------------------

    def _write_configs(self) -> bool:
        """Write what is missing; True when the target's config was edited (a running target must reload)."""
        self._write_promshift_scrape_files()
        edited_target = self._write_prometheus_configs()
        if self.alertmanager_installed:
            edited_target = self._add_alerting() or edited_target
        self._copy_dashboards()
        if self.config.clusters == 2:
            self._write_cluster_b_configs()
        if self.config.replicas == 2:
            self._write_replica_config()
        return edited_target

    def _write_state(self, components: dict[str, Component], *, workspace_id: str | None = None,
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
        if cfg.replicas == 2:
            state["replicas"] = self._replica_state()
        self._record_amp_state(state, workspace_id=workspace_id, fingerprint=fingerprint,
                               workspace_b_id=workspace_b_id)
        tmp = self.state_path.with_name(".stack.json.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_path)
