"""Latency evidence by samples read, against a real Prometheus: ``stats=all`` says what a query read.

One Debian Prometheus over a small backfilled TSDB (3 nodes x 8 GPUs of ``DCGM_FI_DEV_GPU_UTIL``, 30 min).
An empty answer that read every series (``count(x == -1)``) reports its samples and is judged; a query on a
metric nobody has reads none and stays INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from promshift.adapters.latency_probe import LatencyProbe
from promshift.adapters.prometheus import PrometheusClient
from promshift.core.catalog import LatencyPolicy, LatencyWindow
from promshift.core.verdicts import Verdict
from promshift.local.stack.backfill import Side, create_blocks, write_openmetrics
from promshift.local.stack.fleet import FleetSpec
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PROMTOOL_BIN, PrometheusProcess

pytestmark = pytest.mark.integration

METRIC = "DCGM_FI_DEV_GPU_UTIL"
START = 1_790_006_400  # a 2 h block boundary
STEPS = [START + 60 * i for i in range(31)]
EMPTY_BUT_READ = f"count({METRIC} == -1)"  # no GPU is ever at -1 %: no series, every series read
READS_NOTHING = "count(DCGM_FI_DEV_NO_SUCH_METRIC == 0)"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    tmp = tmp_path_factory.mktemp("latency-stats")
    text = write_openmetrics(FleetSpec(nodes=3), tmp / "om", STEPS, [METRIC], [Side("data")])
    create_blocks(text.files, {"data": tmp / "data"}, promtool=PROMTOOL_BIN, max_block_duration="2h")
    (port,) = find_free_ports(1)
    with PrometheusProcess("data", tmp, port=port, data_dir=tmp / "data",
                           flags=("--storage.tsdb.retention.time=3650d",)) as prom:
        yield prom


def test_stats_all_reports_the_samples_an_empty_answer_read(prometheus: PrometheusProcess) -> None:
    client = PrometheusClient(prometheus.url, timeout_s=30)
    read = client.query_range(EMPTY_BUT_READ, start=STEPS[10], end=STEPS[-1], step=60, stats=True)
    assert read.series == () and read.result_type == "matrix"
    # 24 series x 21 steps, one sample each (5 min look-back, 1 min spacing: the newest counts once).
    assert read.stats["samples"]["totalQueryableSamples"] == 24 * 21
    nothing = client.query_range(READS_NOTHING, start=STEPS[10], end=STEPS[-1], step=60, stats=True)
    assert nothing.series == () and nothing.stats["samples"]["totalQueryableSamples"] == 0


def test_the_probe_judges_an_empty_answer_that_read_samples_and_not_one_that_read_none(
        prometheus: PrometheusProcess) -> None:
    policy = LatencyPolicy(repeats=4, max_rounds=2, confidence=0.95, timeout_s=10.0, deadline_s=60.0,
                           slowdown_floor_s=0.25, windows=(LatencyWindow("20m", 1200.0, 5.0),),
                           retention_s=3650 * 86400.0)
    source, target = PrometheusClient(prometheus.url), PrometheusClient(prometheus.url)
    probe = LatencyProbe(source, target, policy, min_step_s=15)
    judged = probe.run(now=STEPS[-1], queries=[EMPTY_BUT_READ], dual_write_since=None)
    [w] = judged.windows
    assert judged.verdict == Verdict.SUCCESSFUL, w.outcome
    assert all(r.ok and r.series == 0 and (r.samples or 0) > 0 for r in judged.runs)
    assert w.interval is not None and w.interval.pairs == 8 and w.rounds == 2  # 4 pairs cannot reach 97.5 %
    assert w.behind == {EMPTY_BUT_READ: (24.0, 24.0)}
    none = probe.run(now=STEPS[-1], queries=[READS_NOTHING], dual_write_since=None)
    assert none.verdict == Verdict.INCONCLUSIVE
    assert none.windows[0].outcome == (f"no data behind this query: {READS_NOTHING!r} (source: read no samples; "
                                       "target: read no samples)")
    assert none.windows[0].rounds == 1  # more rounds would read nothing either
