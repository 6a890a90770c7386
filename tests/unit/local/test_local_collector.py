"""The local collector's translation of a scraper blob: kubernetes_sd becomes the fleet's file_sd, the
__meta_kubernetes_* relabels go (they could only drop every target), the group's keep-filter stays."""

from __future__ import annotations

from promshift.core.scraper_config import render_scraper_config
from promshift.local.stack.scrapers import local_collector_config

REGEX = "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_DEC_UTIL"


def test_kubernetes_discovery_becomes_the_fleets_file_sd_and_the_keep_filter_stays() -> None:
    blob = render_scraper_config(name_regex=REGEX, scrape_interval_s=30, external_labels={"source": "scraper"})
    config, external = local_collector_config(blob, "/state/source/targets/dcgm.json")
    job = config["scrape_configs"][0]
    assert "kubernetes_sd_configs" not in job
    assert job["file_sd_configs"] == [{"files": ["/state/source/targets/dcgm.json"]}]
    assert job["relabel_configs"] == []  # every rule read __meta_kubernetes_* labels
    assert job["metric_relabel_configs"] == [{"source_labels": ["__name__"], "regex": REGEX, "action": "keep"}]
    assert job["scrape_interval"] == "30s" and config["global"] == {"scrape_interval": "30s"}
    assert external == {"source": "scraper"}


def test_a_local_interval_override_replaces_every_interval_and_other_relabels_survive() -> None:
    blob = ("global: {scrape_interval: 30s}\nscrape_configs:\n- job_name: a\n  scrape_interval: 60s\n"
            "  static_configs: [{targets: ['10.0.0.1:9400']}]\n"
            "  relabel_configs: [{source_labels: [__address__], target_label: node}]\n")
    config, external = local_collector_config(blob, "/x.json", interval_s=2)
    job = config["scrape_configs"][0]
    assert config["global"]["scrape_interval"] == "2s" and "scrape_interval" not in job
    assert job["static_configs"] == [{"targets": ["10.0.0.1:9400"]}] and "file_sd_configs" not in job
    assert job["relabel_configs"] == [{"source_labels": ["__address__"], "target_label": "node"}]
    assert external == {}
