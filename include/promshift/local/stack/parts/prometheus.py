"""The source Prometheus (scraping the fleet through file_sd) and the target (the AMP stand-in's TSDB).

The source's ``prometheus.yml`` and its rules are written only when missing, because deployers edit them later
(one ``remote_write`` entry per metric group, the moved rules); so is the target's, whose edits (the local AMP's
rule files, the ``alerting:`` section) keep every other byte.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import requests

from promshift.local.stack.processes import StackProcesses
from promshift.local.stack.prometheus import prometheus_argv, prometheus_installed
from promshift.local.stack.spec import (
    AMP_RULE_FILES,
    AMP_RULES_DIR,
    EXTERNAL_LABELS,
    FLEET,
    K8S_NAMESPACE,
    K8S_RULES_NAME,
    PROMSHIFT_JOB,
    PROMSHIFT_METRICS_PATH,
    SCRAPE_JOB,
    SOURCE,
    SOURCE_B,
    SOURCE_RETENTION,
    TARGET,
    TARGET_B,
    Component,
    StackError,
)

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
# With the k8s component the source's rules also hold another team's alert: it stays in the PrometheusRule (and
# its rendered rule file) when gpu-memory's rules move, every byte of it as it was.
K8S_OTHER_RULES = """\
  # not gpu-memory's: stays on the source when gpu-memory's rules move
  - name: fleet
    rules:
      - alert: DcgmExporterDown
        expr: up{job="dcgm"} == 0
        for: 5m
        labels:
          severity: ticket
"""


class PrometheusPart(StackProcesses):
    """The source and the target: their addresses, files, processes, and the wait for the source's scrapes."""

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
    def source_flags_path(self) -> Path:
        """The source's command line when it was switched (the lab's ``/etc/default/prometheus``: JSON, written by
        ``adapters.source_mode.PidFileControl`` when the retire DAG makes the source an agent, and back)."""
        return self.home / SOURCE / "flags.json"

    @property
    def source_agent_path(self) -> Path:
        """The source's WAL while it is an agent (``--storage.agent.path``)."""
        return self.home / SOURCE / "agent"

    def source_mode_extra(self) -> dict[str, str]:
        """The source connection's ``extra.mode_switch`` (LAB ONLY: the worker runs beside the source, so it may
        restart it by its pid file; ``adapters.source_mode.PidFileControl``)."""
        return {"pid_file": str(self.pid_path(SOURCE)), "flags_file": str(self.source_flags_path),
                "config_path": str(self.source_config_path), "agent_path": str(self.source_agent_path),
                "log_path": str(self.log_path(SOURCE)), "cwd": str(self.home)}

    def source_mode_switch(self) -> Any:
        """The retire DAG's switch on this stack's source (``adapters.source_mode``)."""
        from promshift.adapters.source_mode import mode_switch_from_extra

        return mode_switch_from_extra(self.source_url, self.source_mode_extra())

    def _source_argv(self, default: tuple[str, ...]) -> tuple[str, ...]:
        try:
            flags = json.loads(self.source_flags_path.read_text())
        except (OSError, ValueError):
            return default
        if not (isinstance(flags, list) and flags and all(isinstance(f, str) for f in flags)
                and f"--config.file={self.source_config_path}" in flags):
            logger.warning("%s is not the source's command line; starting it with the default", self.source_flags_path)
            return default
        return tuple(flags)

    @property
    def target_config_path(self) -> Path:
        """The target Prometheus config (no scrape jobs)."""
        return self.home / TARGET / "prometheus.yml"

    @property
    def source_rules_path(self) -> Path:
        """The source's rule file (its config's ``rule_files``): gpu-memory's rules, which move with the group. With
        the k8s component (``kubernetes=True``) it is the file the operator stand-in renders ``PrometheusRule``
        ``monitoring/gpu-rules`` to (``<namespace>-<name>.yml``): the rules live in that object, written first from
        this file."""
        if self.config.kubernetes:
            return self.home / SOURCE / "rules" / f"{K8S_NAMESPACE}-{K8S_RULES_NAME}.yml"
        return self.home / SOURCE / "rules" / "gpu-memory.yml"

    @property
    def amp_rules_dir(self) -> Path:
        """Where the local AMP's rule-groups namespaces become the target's rule files (``AMP_RULE_FILES``)."""
        return self.target_config_path.parent / AMP_RULES_DIR

    @property
    def file_sd_path(self) -> Path:
        """The file_sd JSON listing one target per fleet node."""
        return self.home / SOURCE / "targets" / f"{SCRAPE_JOB}.json"

    def data_dir(self, name: str) -> Path:
        """TSDB directory (``--storage.tsdb.path``) of the ``source`` or the ``target`` (or the second cluster's)."""
        if name not in (SOURCE, TARGET, SOURCE_B, TARGET_B):
            raise ValueError(f"only the source and the target have a TSDB, not {name!r}")
        return self.home / name / "data"

    def _prometheus_components(self) -> dict[str, Component]:
        cfg = self.config
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
        return {
            TARGET: Component(
                TARGET,
                cfg.target_port,
                target_argv,
                self.target_url,
                f"{self.target_url}/-/ready",
                f"--storage.tsdb.path={target_data}",
                "PROMSHIFT_TARGET_PORT",
            ),
            SOURCE: Component(
                SOURCE,
                cfg.source_port,
                self._source_argv(source_argv),  # the retire DAG's agent command line while it is one
                self.source_url,
                f"{self.source_url}/-/ready",
                # in both modes (an agent has no --storage.tsdb.path)
                f"--config.file={self.source_config_path}",
                "PROMSHIFT_SOURCE_PORT",
            ),
        }

    def _require_prometheus(self) -> None:
        binary = self.config.prometheus_bin
        if not prometheus_installed(binary):
            raise StackError(
                f"Prometheus is not installed ({binary} not found); install it with "
                "`apt-get install -y prometheus`"
            )

    def _reload_target(self) -> None:
        try:
            self._http.post(f"{self.target_url}/-/reload", timeout=30).raise_for_status()
        except requests.RequestException as exc:
            logger.warning("reloading the target after adding its alerting section failed: %s", exc)

    def _write_prometheus_configs(self) -> bool:
        """The source's and the target's configs, the source's rules and both TSDB folders, where missing; with
        ``target_kind="amp"`` the target reads the local AMP's rule files. True when the target's config was
        edited (a running target must reload)."""
        cfg = self.config
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
        self._write_once(
            self.target_config_path,
            "# Stand-in for the AMP workspace: receives remote write, scrapes nothing.\n",
            target,
        )
        # a target first written for a plain stack: the entry added, every other byte kept
        edited_target = amp and self._add_amp_rule_files(self.target_config_path)
        if not self.source_rules_path.exists():
            self.source_rules_path.parent.mkdir(parents=True, exist_ok=True)
            self.source_rules_path.write_text(SOURCE_RULES + (K8S_OTHER_RULES if self.config.kubernetes else ""),
                                              encoding="utf-8")
        for name in (SOURCE, TARGET):
            self.data_dir(name).mkdir(parents=True, exist_ok=True)
        return edited_target

    @staticmethod
    def _add_amp_rule_files(config_path: Path) -> bool:
        """A target config's ``rule_files`` gains the local AMP's glob (its rule-groups namespaces, see
        ``promshift.local.stack.rule_namespaces``), every other byte kept, and the folder is made. True when
        the config was edited."""
        from promshift.adapters.deploy import write_keeping
        from promshift.core.rules import add_rule_file

        config = config_path.read_bytes()
        edited = add_rule_file(config, AMP_RULE_FILES)
        if edited != config:
            write_keeping(config_path, edited)
        (config_path.parent / AMP_RULES_DIR).mkdir(parents=True, exist_ok=True)
        return edited != config

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
