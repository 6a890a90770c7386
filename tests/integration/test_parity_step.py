"""Issue 39, item 2, on real Prometheus: a 2 s parity step on a source that scrapes every 5 s.

The catalog said ``parity.step: 2s``; the window started two steps (4 s) after dual-write began, where the
source still answered from a sample scraped before the reload, which the target never received: host coverage
FAILED ("target misses series of 10 hosts") on a healthy dual-write. Now parity reads the source's loaded config,
finds the group's job scraped every 5 s, raises the step to it (said so in the window's evidence) and starts the
window at least one scrape interval and a step after dual-write began.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.core.verdicts import Layer
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.local.stack.remote_write import LocalRemoteWrite

pytestmark = pytest.mark.integration


def test_a_step_below_the_scrape_interval_is_raised_and_parity_passes(
        stack_config_factory: Callable[..., StackConfig]) -> None:
    stack = LocalStack(stack_config_factory(nodes=10, scrape_interval="5s"))
    try:
        stack.up(timeout=90)
        group = load_catalog(profile="demo").get("gpu-utilization")
        group = dataclasses.replace(group, parity=dataclasses.replace(
            group.parity, step_s=2.0, skip_recent_s=7.0, golden_dashboards=(), sample_hosts=10, hosts_per_shard=5))
        since = time.time()  # dual-write begins with the reload below
        LocalRemoteWrite(stack, group, timeout_s=30).dual_write()
        time.sleep(max(0.0, since + 40 - time.time()))
        source = PrometheusClient(stack.source_url, timeout_s=10)
        target = PrometheusClient(stack.target_url, timeout_s=10)
        check = ParityCheck(group, source, target)
        plan = check.plan(dual_write_since=since, now=time.time())
        result = check.reduce(plan, [ParityCheck(group, source, target).compare_shard(dict(s))
                                     for s in plan.to_dict()["shards"]])
    finally:
        stack.down()
    window = result.window
    assert window is not None
    assert (window.step, window.scrape_interval_s) == (5.0, 5.0)
    assert window.interval_from is not None and "5s" in window.interval_from
    assert window.step_note is not None and window.step_note.startswith("step raised from 2s to 5s")
    assert window.start - since >= 5.0 + 5.0  # one scrape interval and a step after dual-write began
    assert result.to_dict()["window"]["step_note"] == window.step_note  # in the evidence
    assert result.verdict.value == "SUCCESSFUL", [(m.name, m.verdict.value, m.reason) for m in result.measurements]
    host = result.measurement(Layer.HOST_COVERAGE)
    assert host is not None and host.numbers["keys"] == 10
    assert result.points_compared > 0
