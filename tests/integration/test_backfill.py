"""History backfilled into a real stack: source and target hold the same series, which are the live ones too."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import requests

from promshift.adapters.prometheus import PrometheusClient
from promshift.core.render import add_remote_write, remote_write_entry
from promshift.local.stack.backfill import backfill_stack
from promshift.local.stack.fleet import node_values
from promshift.local.stack.local import EXTERNAL_LABELS, LocalStack, StackConfig, StackError

pytestmark = pytest.mark.integration

GAUGE, COUNTER = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
METRICS = (GAUGE, COUNTER)
HISTORY_S, INTERVAL_S = 2 * 3600.0, 60.0


def instant(base_url: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    http = requests.Session()
    http.trust_env = False
    params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
    response = http.get(f"{base_url}/api/v1/query", params=params, timeout=10)
    response.raise_for_status()
    body = response.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def scalar(base_url: str, promql: str, at: float | None = None) -> float:
    result = instant(base_url, promql, at)
    return float(result[0]["value"][1]) if result else 0.0


def eventually(check: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, message
        time.sleep(0.5)


def test_backfilled_history_matches_on_both_sides_and_continues_the_live_series(
    stack_config_factory: Callable[..., StackConfig],
) -> None:
    stack = LocalStack(stack_config_factory(nodes=3))
    fleet = stack.fleet
    gpus = fleet.nodes * fleet.gpus_per_node
    try:
        result = backfill_stack(stack, METRICS, history_s=HISTORY_S, interval_s=INTERVAL_S)
        assert result.metrics == METRICS
        assert result.series_per_side == gpus * len(METRICS)
        assert result.end <= time.time() - 30 and result.start <= time.time() - HISTORY_S
        assert not (stack.home / "backfill").exists()
        stack.up(timeout=90)
        with pytest.raises(StackError, match="before starting"):
            backfill_stack(stack, METRICS, history_s=HISTORY_S)
        source, target = stack.source_url, stack.target_url

        # An hour ago both sides hold one series per GPU, and the same values.
        hour_ago = time.time() - 3600
        on_grid = result.start + INTERVAL_S * ((hour_ago - result.start) // INTERVAL_S)
        for metric in METRICS:
            assert scalar(source, f"count({metric})", hour_ago) == gpus, metric
            assert scalar(target, f"count({metric})", hour_ago) == gpus, metric
            selector = f'{metric}{{instance="{fleet.hostname(1)}", gpu="5"}}'
            src, tgt = instant(source, selector, on_grid), instant(target, selector, on_grid)
            assert len(src) == len(tgt) == 1
            assert src[0]["value"] == tgt[0]["value"] == [on_grid, node_values(fleet, 1, on_grid)[metric][5]]
            # The target's copy carries the source's external labels, as remote-written series do.
            assert tgt[0]["metric"] == src[0]["metric"] | EXTERNAL_LABELS

        # Dual-write the two metrics, as a group's deploy would, and let live samples in on both sides.
        entry = remote_write_entry(group_name="backfill-test", name_regex="|".join(METRICS),
                                   url=stack.target_remote_write_url)
        stack.source_config_path.write_text(add_remote_write(stack.source_config_path.read_text(), entry))
        PrometheusClient(stack.source_url).reload()
        for url in (source, target):
            eventually(lambda url=url: all(scalar(url, f"count(timestamp({m}) > time() - 10)") == gpus
                                           for m in METRICS),
                       timeout=30, message=f"{url} holds no live samples of every GPU")

        # Backfilled and live samples are one series per GPU: no second label set anywhere.
        for url in (source, target):
            for metric in METRICS:
                assert scalar(url, f"count({metric})") == scalar(url, f"count({metric})", hour_ago) == gpus
                assert scalar(url, f"count(count_over_time({metric}[3h]))") == gpus, (url, metric)
                # ...each holding history and live samples.
                assert scalar(url, f"min(count_over_time({metric}[3h]))") > HISTORY_S / INTERVAL_S
    finally:
        stack.down()
