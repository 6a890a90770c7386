"""Parity sized to the workspace: a target that refuses large queries, as AMP does, still gets every layer.

A backfilled hour (20 nodes x 8 GPUs x 4 metrics at 30 s, identical on both sides) on a source Prometheus
and two targets limited to 8,000 samples per query (``--query.max-samples`` for what a query holds at once,
and ``local.stack.samples_limit`` for what it reads in all, as AMP counts): a clean one and one whose values
drift x1.01 on one host. The aggregates layer's whole-window query (160 series x 121 samples per metric) is
refused by the target (HTTP 422, "would load too many samples", which AMP passes on); with the limit known,
parity plans its queries in parts and answers SUCCESSFUL on the clean pair with no refusal, and FAILED
naming the drift host on the faulty one. Without the limit known, the refusals are split and asked again:
still SUCCESSFUL, the refusals counted, none an error.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.adapters.settings import default_catalog_path, load_catalog
from promshift.core.query_limits import QueryLimits, size_refusal
from promshift.core.verdicts import Verdict
from promshift.local.stack.backfill import SeriesChange, Side, create_blocks, write_openmetrics
from promshift.local.stack.fleet import FleetSpec
from promshift.local.stack.local import EXTERNAL_LABELS, SCRAPE_JOB, find_free_ports
from promshift.local.stack.prometheus import PROMTOOL_BIN, PrometheusProcess
from promshift.local.stack.samples_limit import SamplesLimitProxy

# slow: run by make e2e (.ci/run), which keeps make test inside its 15-minute budget
pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_SAMPLES = 8000
STEP = 30
WINDOW = 3600
DRIFT_HOST = "gpu-node-0007"


@dataclasses.dataclass
class Pairs:
    source: PrometheusClient
    clean: PrometheusClient
    faulty: PrometheusClient
    start: int
    end: int


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pairs]:
    tmp = tmp_path_factory.mktemp("limits")
    fleet = FleetSpec(nodes=20)
    group = load_catalog().get("gpu-power-thermal")
    # A whole hour inside one 2 h block, ended at least 30 min ago (promtool writes no block for the head).
    end = int(time.time()) - 1800
    end -= end % STEP
    if end - WINDOW < end - end % 7200:
        end = end - end % 7200 - STEP
    start = end - WINDOW
    steps = list(range(start, end + 1, STEP))
    drift = SeriesChange(factor=1.01)
    sides = [Side("source"), Side("clean", EXTERNAL_LABELS),
             Side("faulty", EXTERNAL_LABELS, lambda _m, host, _g: drift if host == DRIFT_HOST else None)]
    text = write_openmetrics(fleet, tmp, steps, list(group.metrics), sides, job=SCRAPE_JOB)
    dirs = {name: tmp / f"{name}-data" for name in text.files}
    create_blocks(text.files, dirs, promtool=PROMTOOL_BIN, max_block_duration="2h")
    servers, proxies = [], []
    try:
        for name, port in zip(dirs, find_free_ports(3), strict=True):
            limit = "100000000" if name == "source" else str(MAX_SAMPLES)
            # The backfilled data's interval: parity reads the step and its sample estimates from the config.
            servers.append(PrometheusProcess(name, tmp, port=port, config="global:\n  scrape_interval: 30s\n",
                                             data_dir=dirs[name], flags=("--storage.tsdb.retention.time=3650d",
                                                                         f"--query.max-samples={limit}")))
        for server in servers:
            server.wait_ready(60)
        proxies = [SamplesLimitProxy(s.url, MAX_SAMPLES) for s in servers if s.name != "source"]
        urls = {"source": servers[0].url, "clean": proxies[0].url, "faulty": proxies[1].url}
        clients = {name: PrometheusClient(url, timeout_s=30) for name, url in urls.items()}
        yield Pairs(clients["source"], clients["clean"], clients["faulty"], start, end)
    finally:
        for proxy in proxies:
            proxy.stop()
        for server in servers:
            server.stop(20)


def _check(p: Pairs, target: PrometheusClient, limits: QueryLimits | None) -> dict[str, Any]:
    group = load_catalog().get("gpu-power-thermal")
    group = dataclasses.replace(group, parity=dataclasses.replace(group.parity, step_s=float(STEP), sample_hosts=6,
                                                                  hosts_per_shard=3))
    check = ParityCheck(group, p.source, target, catalog_dir=default_catalog_path().parent, limits=limits)
    result = check.run(dual_write_since=p.start - 2 * STEP, now=p.end + group.parity.skip_recent_s).to_dict()
    result["by_name"] = {m["name"]: m for m in result["measurements"]}
    return result


def _sizing(result: dict[str, Any], key: str) -> int:
    return sum(int(m["numbers"].get("query_sizing", {}).get(key, 0)) for m in result["measurements"])


def test_the_target_refuses_the_unsplit_aggregate_query(pairs: Pairs) -> None:
    expr = 'sum by (Hostname) (sum_over_time({__name__="DCGM_FI_DEV_POWER_USAGE"}[3600s]))'
    assert len(pairs.source.query(expr, at=pairs.end).series) == 20
    with pytest.raises(PrometheusError) as refused:
        pairs.clean.query(expr, at=pairs.end)
    assert refused.value.http_status == 422 and size_refusal(422, str(refused.value)) == "samples"


def test_parity_planned_to_the_limit_is_successful_with_no_refusal(pairs: Pairs) -> None:
    result = _check(pairs, pairs.clean, QueryLimits(max_samples=MAX_SAMPLES))
    assert result["verdict"] == Verdict.SUCCESSFUL.value, {n: m["reason"] for n, m in result["by_name"].items()}
    aggregates = result["by_name"]["aggregates"]
    assert aggregates["numbers"]["aggregates_compared"] == 4 * 20
    assert aggregates["numbers"]["query_sizing"]["split_queries"] == 4 * 2  # each metric's query, on each side
    assert _sizing(result, "refused_for_size") == 0
    assert result["by_name"]["samples"]["numbers"]["query_sizing"]["split_queries"] > 0
    assert result["points_compared"] == 6 * 32 * 121


def test_a_planted_drift_still_fails_under_the_limit(pairs: Pairs) -> None:
    result = _check(pairs, pairs.faulty, QueryLimits(max_samples=MAX_SAMPLES))
    aggregates = result["by_name"]["aggregates"]
    assert result["verdict"] == Verdict.FAILED.value
    assert aggregates["verdict"] == Verdict.FAILED.value and aggregates["numbers"]["differing_keys"] == [DRIFT_HOST]
    assert _sizing(result, "refused_for_size") == 0
    assert not any(m["verdict"] == Verdict.ERROR.value for m in result["measurements"])


def test_refusals_without_known_limits_are_split_and_asked_again(pairs: Pairs) -> None:
    result = _check(pairs, pairs.clean, None)
    assert result["verdict"] == Verdict.SUCCESSFUL.value, {n: m["reason"] for n, m in result["by_name"].items()}
    assert result["by_name"]["aggregates"]["numbers"]["query_sizing"]["refused_for_size"] >= 4
    assert not any(m["verdict"] == Verdict.ERROR.value for m in result["measurements"])


def test_limits_too_small_for_any_split_are_inconclusive_not_error(pairs: Pairs, tmp_path: Path) -> None:
    result = _check(pairs, pairs.clean, QueryLimits(max_samples=1))
    assert result["verdict"] != Verdict.SUCCESSFUL.value
    layers = result["by_name"]
    assert layers["aggregates"]["verdict"] == Verdict.INCONCLUSIVE.value
    assert "no split fits" in layers["aggregates"]["reason"]
    assert not any(m["verdict"] in (Verdict.ERROR.value, Verdict.FAILED.value) for m in result["measurements"])


@pytest.mark.parametrize(("max_samples", "by_host", "slices", "shards"),
                         [(5000, False, 5, 1), (3750, False, 7, 1), (6250, True, 1, 4), (3750, True, 1, 7)])
def test_split_window_sums_equal_the_unsplit_answer_exactly(pairs: Pairs, max_samples: int, by_host: bool,
                                                            slices: int, shards: int) -> None:
    """On the unlimited source: parts of the window (720 s slices of 30 s samples: their edges fall on sample
    timestamps) or shards of the hosts add up to the whole-window count, exactly, for every host."""
    from promshift.adapters.parity.sized import SizedQueries, host_partition

    hosts = [f"gpu-node-{i:04d}" for i in range(20)]
    whole = {s.labels["Hostname"]: s.points[0][1] for s in pairs.source.query(
        'sum by (Hostname) (count_over_time({__name__="DCGM_FI_DEV_POWER_USAGE"}[3600s]))', at=pairs.end).series}
    assert set(whole.values()) == {8 * 121}
    sized = SizedQueries(QueryLimits(max_samples=max_samples))
    rows = sized.window(pairs.source, lambda d, x: f'sum by (Hostname) (count_over_time({{__name__='
                        f'"DCGM_FI_DEV_POWER_USAGE"{x}}}[{d}]))', end=pairs.end, span_s=3600, op="sum", series=160,
                        samples_per_series=121, partition=host_partition("Hostname", hosts) if by_host else None)
    assert {labels["Hostname"]: v for labels, v in rows} == whole
    assert sized.parts == slices * (shards + 1 if shards > 1 else 1) and sized.refused == 0
