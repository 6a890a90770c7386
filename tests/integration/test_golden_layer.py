"""The golden layer on a real dual-written pair whose target joined later (remote write added by a reload).

Before look-back-aware windows, every range query here FAILED on this healthy pair: its first
points looked back into time the target never received.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.core.verdicts import Verdict
from promshift.local.stack.fleet import FleetServer, FleetSpec, file_sd_groups
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess

pytestmark = pytest.mark.integration

PANELS = {
    "rate": "sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10s]))",
    "rate_interval": 'avg_over_time(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance"}[$__rate_interval])',
    "range": "max_over_time(DCGM_FI_DEV_POWER_USAGE[$__range])",
    "or_vector": 'sum(DCGM_FI_DEV_POWER_USAGE{Hostname="no-such-host"}) or vector(0)',
    "absent_nothing": 'absent(DCGM_FI_DEV_GPU_TEMP{Hostname="no-such-host"})',
    "absent_present": "absent(DCGM_FI_DEV_GPU_TEMP)",
    "empty": 'DCGM_FI_DEV_GPU_TEMP{Hostname="no-such-host"}',
    "negative_offset": "DCGM_FI_DEV_POWER_USAGE offset -4s",
    "capture_groups": 'label_replace(DCGM_FI_DEV_GPU_TEMP, "node", "$1", "Hostname", "gpu-node-(.*)")',
    "invalid_both": "DCGM_FI_DEV_GPU_TEMP + on() DCGM_FI_DEV_POWER_USAGE",  # many-to-many: HTTP 422 on both
    # Only the group's metrics are dual-written: these read other groups' too.
    "nameless": '{gpu="0", Hostname="gpu-node-0000"}',
    "name_regex": '{__name__=~"DCGM_FI_DEV_GPU_TEMP|DCGM_FI_DEV_FB_USED", gpu="0"}',
    "mixed": "DCGM_FI_DEV_POWER_USAGE / on(Hostname, gpu) DCGM_FI_DEV_FB_USED",
    "other_group": "up",
    "needs_variable": 'DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname"}',
    "unparseable": "avg(DCGM_FI_DEV_GPU_TEMP{",
}


def _prometheus(tmp: Path, name: str, config: str, *flags: str, started: list[PrometheusProcess]) -> PrometheusClient:
    (port,) = find_free_ports(1)
    prometheus = PrometheusProcess(name, tmp, port=port, config=config, flags=flags)
    started.append(prometheus)  # stopped by the caller, also when it never becomes ready
    prometheus.wait_ready(40)
    return PrometheusClient(prometheus.url, timeout_s=10)


@pytest.fixture(scope="module")
def late_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusClient, PrometheusClient, float]]:
    """Source scrapes a 2-node fleet every 1 s; 6 s later a reload starts remote write of one group to the target."""
    tmp = tmp_path_factory.mktemp("golden")
    fleet = FleetSpec(nodes=2)
    server = FleetServer(fleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp / "sd.json").write_text(json.dumps(file_sd_groups(fleet, server.port)))
    scrape = (f"global: {{scrape_interval: 1s}}\nscrape_configs:\n- job_name: dcgm\n"
              f"  file_sd_configs: [{{files: ['{tmp / 'sd.json'}']}}]\n")
    procs: list[PrometheusProcess] = []
    try:
        target = _prometheus(tmp, "target", "global: {scrape_interval: 1m}\n", "--web.enable-remote-write-receiver",
                             started=procs)
        source = _prometheus(tmp, "source", scrape, "--web.enable-lifecycle", started=procs)
        time.sleep(6)  # the source holds history the target will never receive
        keep = load_catalog(profile="demo").get("gpu-power-thermal").name_regex()
        (tmp / "source.yml").write_text(scrape + f"remote_write:\n- url: {target.base_url}/api/v1/write\n"
                                                 "  queue_config: {batch_send_deadline: 500ms}\n"
                                                 f"  write_relabel_configs: [{{source_labels: [__name__], "
                                                 f"regex: '{keep}', action: keep}}]\n")
        source.reload()
        dual_write_since = time.time()
        deadline = time.time() + 30
        while (target.scalar("count(DCGM_FI_DEV_GPU_TEMP)") or 0) < 16:
            assert time.time() < deadline, "the target never received the dual-write"
            time.sleep(0.5)
        time.sleep(max(0.0, dual_write_since + 32 - time.time()))
        yield source, target, dual_write_since
    finally:
        for proc in reversed(procs):  # the source first: with its remote end gone it may ignore SIGTERM
            proc.stop(20)
        server.shutdown()


def _check(source: PrometheusClient, target: PrometheusClient, tmp: Path, **parity: Any) -> ParityCheck:
    dashboard = {"panels": [{"title": title, "targets": [{"refId": "A", "expr": expr}]}
                            for title, expr in PANELS.items()]}
    (tmp / "dash.json").write_text(json.dumps(dashboard))
    group = load_catalog(profile="demo").get("gpu-power-thermal")
    policy = dataclasses.replace(group.parity, golden_dashboards=(str(tmp),), golden_variables=(("instance", ".+"),),
                                 **parity)
    return ParityCheck(dataclasses.replace(group, parity=policy), source, target)


def test_golden_on_a_late_target_at_a_fast_step(late_pair: tuple[PrometheusClient, PrometheusClient, float],
                                                tmp_path: Path) -> None:
    source, target, since = late_pair
    check = _check(source, target, tmp_path, step_s=2.0, skip_recent_s=3.0)
    window = check.window(dual_write_since=since, now=time.time())
    assert window is not None
    measurements, inventory = check.golden(*window)
    by = {m.name.removeprefix("golden[").removesuffix("]"): m for m in measurements}
    json.dumps([m.to_dict() for m in measurements] + [inventory.to_dict()], allow_nan=False)
    for panel in ("rate", "rate_interval", "range", "negative_offset", "capture_groups", "nameless", "name_regex"):
        assert by[panel].verdict == Verdict.SUCCESSFUL, (panel, by[panel].reason)
    # The range query's window starts after its look-back; the $__range one a whole window in.
    assert by["rate"].numbers["window"]["start"] >= window[0] + 10
    w = by["range"].numbers["window"]
    assert w["start"] - (w["end"] - w["start"]) >= window[0]
    assert by["negative_offset"].numbers["window"]["end"] <= window[1] - 4
    for panel in ("or_vector", "absent_nothing", "empty"):
        assert by[panel].verdict == Verdict.INCONCLUSIVE and "no data behind this query" in by[panel].reason
    assert by["absent_present"].verdict == Verdict.INCONCLUSIVE
    assert '{gpu="0", Hostname="gpu-node-0000", __name__=~"' in by["nameless"].queries[0]
    assert by["mixed"].verdict == Verdict.INCONCLUSIVE, by["mixed"].reason
    assert "DCGM_FI_DEV_FB_USED (not this group's metrics), which the target does not have" in by["mixed"].reason
    assert by["invalid_both"].verdict == Verdict.INCONCLUSIVE
    assert by["invalid_both"].reason.startswith("invalid on both sides: HTTP 422")
    assert "needs variable $Hostname" in by["needs_variable"].reason
    assert by["unparseable"].reason.startswith("unsupported: does not parse")
    rows = {row.panel: row for row in inventory.queries}
    assert len(rows) == len(PANELS) and "other_group" not in by
    assert rows["other_group"].disposition == "not this group's metrics"
    assert rows["needs_variable"].disposition == "needs variable $Hostname"
    assert rows["unparseable"].disposition == "unsupported"
    assert rows["rate"].disposition == "compared"


def test_golden_at_production_step_waits_instead_of_failing(
        late_pair: tuple[PrometheusClient, PrometheusClient, float], tmp_path: Path) -> None:
    source, target, since = late_pair
    check = _check(source, target, tmp_path, step_s=30.0, skip_recent_s=3.0)
    start = math.ceil(since / 30) * 30
    end = math.floor((time.time() - 3) / 30) * 30
    measurements, _ = check.golden(start, max(start, end))
    by = {m.name.removeprefix("golden[").removesuffix("]"): m for m in measurements}
    assert not [m for m in measurements if m.verdict == Verdict.FAILED], [m.to_dict() for m in measurements]
    for panel in ("rate", "rate_interval", "range"):
        assert by[panel].verdict == Verdict.INCONCLUSIVE and "wait" in by[panel].reason, by[panel].reason
    assert "needs 2m of dual-write before the window" in by["rate_interval"].reason
