"""The second cluster (``clusters=2``, ``make demo SCENARIO=fleet``): its own fleet, its own source Prometheus
scraping it, and a second target standing in for a second workspace. Ports: ``PROMSHIFT_FLEET_B_PORT``,
``PROMSHIFT_SOURCE_B_PORT``, ``PROMSHIFT_TARGET_B_PORT`` (and ``PROMSHIFT_RELAY_B_PORT`` for the second
workspace's relay, see ``parts.amp``), else free ones chosen at ``up`` and recorded in ``stack.json``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import requests

from promshift.local.stack.fleet import FleetSpec, write_file_sd
from promshift.local.stack.parts.prometheus import PrometheusPart
from promshift.local.stack.prometheus import prometheus_argv
from promshift.local.stack.spec import (
    CLUSTER_B_PREFIX,
    EXTERNAL_LABELS_B,
    FLEET_B,
    RELAY_B,
    SCRAPE_JOB,
    SOURCE_B,
    SOURCE_RETENTION,
    TARGET_B,
    Component,
    StackConfig,
    find_free_ports,
)

logger = logging.getLogger(__name__)


class ClusterBPart(PrometheusPart):
    """The second cluster's ports, addresses, configs and processes."""

    def __init__(self, config: StackConfig | None = None) -> None:
        super().__init__(config)
        # The second cluster's free ports, chosen by up() when no PROMSHIFT_*_B_PORT names them.
        self._cluster_b_chosen: dict[str, int] = {}
        # Set by _write_configs when target-b's config gained the AMP rules glob (a running target-b must reload).
        self._target_b_edited = False

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

    def _cluster_b_components(self) -> dict[str, Component]:
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
            FLEET_B: Component(FLEET_B, ports[FLEET_B], fleet_argv, fleet_b_url, f"{fleet_b_url}/healthz",
                                "promshift.local.stack.fleet",
                                "PROMSHIFT_FLEET_B_PORT"),
            TARGET_B: Component(TARGET_B, ports[TARGET_B], target_argv, self.target_b_url,
                                 f"{self.target_b_url}/-/ready", f"--storage.tsdb.path={target_data}",
                                 "PROMSHIFT_TARGET_B_PORT"),
            SOURCE_B: Component(SOURCE_B, ports[SOURCE_B], source_argv, self.source_b_url,
                                 f"{self.source_b_url}/-/ready", f"--storage.tsdb.path={source_data}",
                                 "PROMSHIFT_SOURCE_B_PORT"),
        }

    def _start_cluster_b(self, deadline: float, *, restart_source: bool = False) -> dict[str, Component]:
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

    def _write_cluster_b_configs(self) -> None:
        """The second source's and target's configs and TSDB folders, where missing; with ``target_kind="amp"``
        target-b evaluates the second workspace's rule-groups namespaces (``rule_namespaces``)."""
        cfg = self.config
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
        if cfg.target_kind == "amp" and self._add_amp_rule_files(self.home / TARGET_B / "prometheus.yml"):
            self._target_b_edited = True
