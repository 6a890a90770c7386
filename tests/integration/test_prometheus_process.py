"""The one way to run a Prometheus and fill its TSDB (``stack.prometheus``, ``stack.backfill``), end to end.

Three sides written by ``write_openmetrics`` (the parity benchmark's: source, faulty target, clean
target), turned into blocks by ``create_blocks`` (measured, 2 h blocks), served by ``PrometheusProcess``:
each server holds exactly what its text said, and a server that cannot start says why.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from promshift.adapters.prometheus import PrometheusClient
from promshift.local.stack.backfill import SeriesChange, Side, create_blocks, write_openmetrics
from promshift.local.stack.fleet import FleetSpec, node_values
from promshift.local.stack.local import EXTERNAL_LABELS, find_free_ports
from promshift.local.stack.prometheus import (
    PROMETHEUS_BIN,
    PROMTOOL_BIN,
    PrometheusProcess,
    PrometheusStartError,
    prometheus_installed,
)

pytestmark = pytest.mark.integration

GAUGE, COUNTER = "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
START = 1_790_006_400  # a 2 h block boundary (promtool aligns blocks to multiples of --max-block-duration)
STEPS = [START + 60 * i for i in range(30)]
MISSING = (GAUGE, "gpu-node-0001", 2)
DRIFT_HOST, RENAME_HOST = "gpu-node-0002", "gpu-node-0000"


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    if not (prometheus_installed(PROMETHEUS_BIN) and prometheus_installed(PROMTOOL_BIN)):
        pytest.skip("Prometheus is not installed (apt-get install -y prometheus)")


def changes(metric: str, host: str, gpu: int) -> SeriesChange | None:
    if (metric, host, gpu) == MISSING:
        return SeriesChange(missing=True)
    if host == RENAME_HOST:
        return SeriesChange(rename=("Hostname", "hostname"))
    if host == DRIFT_HOST:
        return SeriesChange(factor=2.0)
    return None


def test_backfilled_sides_are_served_as_written(tmp_path: Path) -> None:
    fleet = FleetSpec(nodes=3, gpus_per_node=4)
    sides = [Side("source"), Side("target", EXTERNAL_LABELS, changes), Side("clean", EXTERNAL_LABELS)]
    text = write_openmetrics(fleet, tmp_path / "om", STEPS, [GAUGE, COUNTER], sides)
    series = fleet.nodes * fleet.gpus_per_node * 2
    assert text.samples == {"source": series * 30, "target": (series - 1) * 30, "clean": series * 30}

    runs = create_blocks(text.files, {s.name: tmp_path / s.name for s in sides}, promtool=PROMTOOL_BIN,
                         max_block_duration="2h")
    assert not any(path.exists() for path in text.files.values())  # the text is deleted once it is in blocks
    for side in sides:
        run = runs[side.name]
        assert run.input_bytes == text.bytes[side.name] and run.tsdb_bytes > 0 and run.cpu_s >= 0
        assert run.peak_rss_mb > 0 and run.wall_s > 0
        [block] = run.blocks  # 30 min inside one 2 h block
        assert block["series"] == text.samples[side.name] // 30 and block["samples"] == text.samples[side.name]
        assert block["min_time"] == START and block["max_time"] == STEPS[-1] + 0.001

    ports = find_free_ports(3)
    servers = [PrometheusProcess(s.name, tmp_path, port=p, data_dir=tmp_path / s.name,
                                 flags=("--storage.tsdb.retention.time=3650d",)) for s, p in zip(sides, ports,
                                                                                                  strict=True)]
    try:
        for server in servers:
            server.wait_ready(60)
            assert (server.rss_mb() or 0) > 0
        src, tgt, clean = (PrometheusClient(s.url, timeout_s=30) for s in servers)
        at = STEPS[-1]
        assert src.scalar(f"count({GAUGE})", at=at) == clean.scalar(f"count({GAUGE})", at=at) == 12
        assert tgt.scalar(f"count({GAUGE})", at=at) == 11
        assert tgt.scalar(f'count({GAUGE}{{hostname="{RENAME_HOST}"}})', at=at) == 4
        assert tgt.scalar(f'count({GAUGE}{{Hostname="{RENAME_HOST}"}})', at=at) is None
        assert clean.scalar(f'count({GAUGE}{{cluster="{EXTERNAL_LABELS["cluster"]}"}})', at=at) == 12
        value = float(node_values(fleet, 2, at)[GAUGE][0])
        assert src.scalar(f'{GAUGE}{{Hostname="{DRIFT_HOST}",gpu="0"}}', at=at) == value
        assert tgt.scalar(f'{GAUGE}{{Hostname="{DRIFT_HOST}",gpu="0"}}', at=at) == 2 * value
    finally:
        for server in servers:
            server.stop()
    assert all(not s.alive() for s in servers)


def test_a_server_that_cannot_start_says_why_and_leaves_nothing_running(tmp_path: Path) -> None:
    (port,) = find_free_ports(1)
    bad = PrometheusProcess("bad", tmp_path, port=port, config="global: {scrape_interval: nonsense}\n", start=False)
    with pytest.raises(PrometheusStartError, match=r"bad exited: .*nonsense"), bad:
        pass
    assert not bad.alive()


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    (port,) = find_free_ports(1)
    with PrometheusProcess("stubborn", tmp_path, port=port) as server:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)  # a stopped process does not act on SIGTERM
        server.stop(timeout_s=1)
        assert not server.alive() and server.proc is not None and server.proc.returncode == -signal.SIGKILL
