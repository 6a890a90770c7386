"""Label parity against real Prometheus servers: dcgm-exporter's 2026 `Hostname` -> `hostname` rename."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.core.verdicts import Verdict
from promshift.local.stack.fleet import FleetServer, FleetSpec, file_sd_groups
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess

pytestmark = pytest.mark.integration


def scraping_prometheus(tmp: Path, name: str, fleet: FleetSpec) -> Iterator[PrometheusClient]:
    server = FleetServer(fleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sd = tmp / f"{name}.json"
    sd.write_text(json.dumps(file_sd_groups(fleet, server.port)))
    cfg = tmp / f"{name}.yml"
    cfg.write_text(f"global: {{scrape_interval: 1s}}\nscrape_configs:\n- job_name: dcgm\n"
                   f"  file_sd_configs: [{{files: ['{sd}']}}]\n")
    (port,) = find_free_ports(1)
    prometheus = PrometheusProcess(name, tmp, port=port, config=cfg, data_dir=tmp / name)
    client = PrometheusClient(prometheus.url, timeout_s=10)
    try:
        prometheus.wait_ready(40)
        deadline = time.time() + 40
        while (client.scalar('count(up{job="dcgm"} == 1)') or 0) < fleet.nodes:
            assert time.time() < deadline, f"{name} prometheus did not scrape the fleet"
            time.sleep(0.5)
        yield client
    finally:
        prometheus.stop(20)
        server.shutdown()


@pytest.fixture(scope="module")
def renamed_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusClient, PrometheusClient]]:
    tmp = tmp_path_factory.mktemp("rename")
    src_gen = scraping_prometheus(tmp, "source", FleetSpec(nodes=3))
    tgt_gen = scraping_prometheus(tmp, "target", FleetSpec(nodes=3, hostname_label="hostname"))
    src, tgt = next(src_gen), next(tgt_gen)
    time.sleep(4)  # a few scrapes on both sides, so the test windows hold data
    yield src, tgt
    for gen in (src_gen, tgt_gen):
        next(gen, None)


def test_label_rename_is_named_as_drift_and_a_rename_rule_clears_it(
        renamed_pair: tuple[PrometheusClient, PrometheusClient]) -> None:
    src, tgt = renamed_pair
    group = load_catalog(profile="demo").get("gpu-memory")
    end = time.time() - 1
    start = end - 30
    drift = ParityCheck(group, src, tgt).labels(start, end)
    assert drift.verdict == Verdict.FAILED
    assert "`Hostname` only on source" in drift.reason and "`hostname` only on target" in drift.reason
    assert "`parity.rename_labels: {hostname: Hostname}`" in drift.reason
    assert "`hostname` on 3 hosts (gpu-node-0000, gpu-node-0001, gpu-node-0002) of the target" in drift.reason
    assert set(drift.numbers["drift"]) == {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"}

    renamed = dataclasses.replace(group, parity=dataclasses.replace(group.parity,
                                                                    rename_labels=(("hostname", "Hostname"),)))
    clean = ParityCheck(renamed, src, tgt).labels(start, end)
    assert clean.verdict == Verdict.SUCCESSFUL, clean.reason


def test_host_coverage_names_hosts_present_under_another_label_on_the_target(
        renamed_pair: tuple[PrometheusClient, PrometheusClient]) -> None:
    src, tgt = renamed_pair
    group = load_catalog(profile="demo").get("gpu-memory")
    end = time.time() - 0.5
    by_host = {m.name: m for m in ParityCheck(group, src, tgt).coverage(end - 1, end)}
    assert by_host["coverage"].verdict == Verdict.SUCCESSFUL  # same series counts per metric
    assert by_host["host_coverage"].verdict == Verdict.FAILED
    assert by_host["host_coverage"].reason.startswith(
        "3 hosts (gpu-node-0000, gpu-node-0001, gpu-node-0002) present under `hostname` on the target, not `Hostname`")
    assert "misses" not in by_host["host_coverage"].reason


def test_golden_reads_the_target_under_its_own_label_name_once_a_rename_is_declared(
        renamed_pair: tuple[PrometheusClient, PrometheusClient], tmp_path: Path) -> None:
    src, tgt = renamed_pair
    history = "count({__name__=\"DCGM_FI_DEV_FB_USED\"} offset 15s)"
    while not (src.query(history).series and tgt.query(history).series):  # 12 s of history on both sides
        time.sleep(0.5)
    expr = 'count by (Hostname) (DCGM_FI_DEV_FB_USED{Hostname=~"gpu-node-.*"})'
    (tmp_path / "d.json").write_text(json.dumps({"panels": [{"title": "per host", "targets": [{"expr": expr}]}]}))
    group = load_catalog(profile="demo").get("gpu-memory")
    policy = dataclasses.replace(group.parity, golden_dashboards=(str(tmp_path / "d.json"),), step_s=2.0)
    end = time.time() - 1
    undeclared, _ = ParityCheck(dataclasses.replace(group, parity=policy), src, tgt).golden(end - 12, end)
    assert undeclared[0].verdict != Verdict.SUCCESSFUL, undeclared[0].reason  # the target has no `Hostname`
    renamed = dataclasses.replace(group, parity=dataclasses.replace(policy, rename_labels=(("hostname", "Hostname"),)))
    (m,), _ = ParityCheck(renamed, src, tgt).golden(end - 12, end)
    assert m.verdict == Verdict.SUCCESSFUL, m.reason
    # Both sides read the series under either name (the target's under `hostname`, relabelled back).
    assert 'DCGM_FI_DEV_FB_USED{hostname=~"gpu-node-.*", hostname!=""}' in m.queries[0]


@pytest.fixture(scope="module")
def independent_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusClient, PrometheusClient]]:
    """Two Prometheus servers scraping the same fleet on their own schedules (a managed collector's case)."""
    tmp = tmp_path_factory.mktemp("independent")
    fleet = FleetSpec(nodes=2)
    src_gen = scraping_prometheus(tmp, "source", fleet)
    tgt_gen = scraping_prometheus(tmp, "target", fleet)
    src, tgt = next(src_gen), next(tgt_gen)
    time.sleep(22)  # a few 5 s buckets of data on both sides, and rate windows fully inside them
    yield src, tgt
    for gen in (src_gen, tgt_gen):
        next(gen, None)


def test_independent_scraper_mode_compares_buckets_and_rates(
        independent_pair: tuple[PrometheusClient, PrometheusClient]) -> None:
    src, tgt = independent_pair
    base = load_catalog(profile="demo").get("gpu-power-thermal")  # gauges and an energy counter
    end = time.time() - 2
    start = end - 10
    independent = dataclasses.replace(base, parity=dataclasses.replace(
        base.parity, mode="independent_scraper", step_s=5.0, rel_tolerance=0.2, abs_tolerance=0.5))
    check = ParityCheck(independent, src, tgt)
    queries = check.host_queries("gpu-node-0000", start, end)
    assert any(q.startswith('label_replace(rate({__name__="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"') for q in queries)
    assert any(q.startswith('label_replace(avg_over_time({__name__="DCGM_FI_DEV_GPU_TEMP"') for q in queries)
    # The kinds come from the source's own metadata (the fleet's # TYPE lines), not the DCGM list.
    kinds = check.metric_kinds(start, end)
    assert kinds["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == {"kind": "counter", "from": "source_metadata"}
    assert kinds["DCGM_FI_DEV_GPU_TEMP"] == {"kind": "gauge", "from": "source_metadata"}
    result = check.compare_hosts(["gpu-node-0000", "gpu-node-0001"], start, end)
    assert result["metric_kinds"] == kinds
    assert result["series_compared"] == 2 * 8 * 4 and result["points_compared"] > 0
    assert result["mismatches"] == 0 and result["missing_series"] == 0, result["offenders"]



@pytest.mark.parametrize("expr,verdict,needle", [
    ("avg(DCGM_FI_DEV_GPU_TEMP{", "INCONCLUSIVE", "unsupported: does not parse"),  # Prometheus: HTTP 400
    ('DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname"}', "INCONCLUSIVE", "needs variable $Hostname"),
    ('DCGM_FI_DEV_GPU_TEMP{instance="no-such-host"}', "INCONCLUSIVE", "no data behind this query"),
    ('avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance"})', "SUCCESSFUL", "identical"),
])
def test_golden_query_bad_input_is_named_never_a_crash_or_a_pass(
        independent_pair: tuple[PrometheusClient, PrometheusClient], tmp_path: Path, expr: str, verdict: str,
        needle: str) -> None:
    src, _ = independent_pair
    group = load_catalog(profile="demo").get("gpu-power-thermal")
    (tmp_path / "d.json").write_text(json.dumps({"panels": [{"title": "panel", "targets": [{"expr": expr}]}]}))
    group = dataclasses.replace(group, parity=dataclasses.replace(
        group.parity, golden_dashboards=("d.json",), golden_variables=(("instance", ".+"),)))
    end = time.time() - 2
    # Same server on both sides: a clean golden query must match exactly.
    measurements, inventory = ParityCheck(group, src, src, catalog_dir=tmp_path).golden(end - 15, end)
    (m,) = measurements
    assert m.name == "golden[panel]" and inventory.queries[0].measurement == "golden[panel]"
    assert m.verdict.value == verdict and needle in m.reason, m.reason


def test_independent_scraper_aggregates_average_gauges_and_rate_counters(
        independent_pair: tuple[PrometheusClient, PrometheusClient]) -> None:
    """Two scrapers keep different sample counts: sum_over_time would differ by whole samples; the per-host
    aggregates compare gauges as avg_over_time and counters as rate instead, and still pass."""
    src, tgt = independent_pair
    base = load_catalog(profile="demo").get("gpu-power-thermal")
    end = time.time() - 2
    start = end - 15
    independent = dataclasses.replace(base, parity=dataclasses.replace(
        base.parity, mode="independent_scraper", step_s=5.0, rel_tolerance=0.2, abs_tolerance=0.5))
    m = ParityCheck(independent, src, tgt).aggregates(start, end)
    assert m.verdict == Verdict.SUCCESSFUL, m.reason
    assert any("rate({__name__=\"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\"}" in q for q in m.queries)
    assert any("avg_over_time({__name__=\"DCGM_FI_DEV_GPU_TEMP\"}" in q for q in m.queries)
    assert not any("sum_over_time" in q for q in m.queries)
    assert m.numbers["aggregates_compared"] > 0
