"""The source as an HA pair (``replicas=2``, ``stack up --replicas 2``): a second Debian Prometheus, ``source-1``,
scraping the same fleet (the same file_sd list) with the source's external labels but its own replica
(``prometheus_replica: source-1`` beside the source's ``source-0``), as prometheus-operator's ``replicas: 2`` runs.

Its scrapes run on their own phase (Prometheus offsets each scrape loop by a hash of the target and its external
labels), so the two replicas hold different samples of the same series: the target holds one of them when the
writes carry AMP's dedup labels (``core.ha``), both when they do not. Deployers add the group's ``remote_write``
to each replica's config (``source_config_paths``). Port: ``PROMSHIFT_SOURCE_1_PORT``, else a free one chosen at
``up`` and recorded in ``stack.json``.
"""

from __future__ import annotations

from pathlib import Path

from promshift.local.stack.parts.prometheus import PrometheusPart
from promshift.local.stack.prometheus import prometheus_argv
from promshift.local.stack.spec import (
    EXTERNAL_LABELS,
    REPLICA_LABEL,
    SCRAPE_JOB,
    SOURCE,
    SOURCE_1,
    SOURCE_RETENTION,
    Component,
    StackConfig,
    find_free_ports,
)


class ReplicasPart(PrometheusPart):
    """The source's second replica: its port, config and process."""

    def __init__(self, config: StackConfig | None = None) -> None:
        super().__init__(config)
        self._source_1_chosen = 0

    @property
    def source_1_port(self) -> int:
        """PROMSHIFT_SOURCE_1_PORT, else the free port `up` chose (stack.json); 0 unknown."""
        recorded = self._read_state().get("replicas", {}).get("port")
        return self.config.source_1_port or self._source_1_chosen or int(recorded or 0)

    @property
    def source_1_url(self) -> str:
        return f"http://127.0.0.1:{self.source_1_port}"

    @property
    def source_1_config_path(self) -> Path:
        return self.home / SOURCE_1 / "prometheus.yml"

    @property
    def replica_names(self) -> tuple[str, ...]:
        """The replicas' ``prometheus_replica`` values, the source's first."""
        first = EXTERNAL_LABELS[REPLICA_LABEL]
        return (first, SOURCE_1) if self.config.replicas == 2 else (first,)

    def source_urls(self) -> dict[str, str]:
        """Each replica's Prometheus by its ``prometheus_replica`` value (one entry without replicas)."""
        urls = {EXTERNAL_LABELS[REPLICA_LABEL]: self.source_url}
        if self.config.replicas == 2:
            urls[SOURCE_1] = self.source_1_url
        return urls

    def source_config_paths(self) -> dict[str, Path]:
        """Each replica's config file by its ``prometheus_replica`` value (deployers edit every one)."""
        paths = {EXTERNAL_LABELS[REPLICA_LABEL]: self.source_config_path}
        if self.config.replicas == 2:
            paths[SOURCE_1] = self.source_1_config_path
        return paths

    def _replica_components(self) -> dict[str, Component]:
        data = self.home / SOURCE_1 / "data"
        argv = prometheus_argv(self.source_1_config_path, data, self.source_1_port, "--web.enable-lifecycle",
                               "--web.enable-admin-api", f"--storage.tsdb.retention.time={SOURCE_RETENTION}",
                               binary=self.config.prometheus_bin)
        return {SOURCE_1: Component(SOURCE_1, self.source_1_port, argv, self.source_1_url,
                                    f"{self.source_1_url}/-/ready", f"--storage.tsdb.path={data}",
                                    "PROMSHIFT_SOURCE_1_PORT")}

    def _choose_replica_port(self) -> None:
        if not self.source_1_port:
            self._source_1_chosen = find_free_ports(1)[0]

    def _write_replica_config(self) -> None:
        """source-1's config and TSDB folder, where missing: the source's fleet job, its own replica label."""
        cfg = self.config
        self._write_once(self.source_1_config_path,
                         "# The source's second replica (replicas=2). Written once; deployers add remote_write.\n",
                         {"global": {"scrape_interval": cfg.scrape_interval,
                                     "evaluation_interval": cfg.scrape_interval,
                                     "external_labels": {**EXTERNAL_LABELS, REPLICA_LABEL: SOURCE_1}},
                          "scrape_configs": [{"job_name": SCRAPE_JOB,
                                              "file_sd_configs": [{"files": [str(self.file_sd_path)]}]}]})
        (self.home / SOURCE_1 / "data").mkdir(parents=True, exist_ok=True)

    def _replica_state(self) -> dict[str, object]:
        return {"port": self.source_1_port, "url": self.source_1_url, "config": str(self.source_1_config_path),
                "replicas": {name: url for name, url in self.source_urls().items()}, "of": SOURCE}
