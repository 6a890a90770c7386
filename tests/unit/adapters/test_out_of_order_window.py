"""The target's out-of-order window, as a queue swap's guard reads it: a self-hosted Prometheus's loaded config over
HTTP (a fake server on 127.0.0.1 answering ``/api/v1/status/config`` as Prometheus does), and the merge it refuses
through ``compose.queue_cap`` on the file path when the window is missing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.queue_probe import target_out_of_order_window
from promshift.core.catalog import MetricGroup
from promshift.core.queues import QueueCapError
from promshift.core.render import add_remote_write, remote_write_entry
from promshift.core.stages import Stage
from promshift.orchestration.compose import queue_cap
from promshift.steps.migration import Backends

URL = "http://127.0.0.1:9/api/v1/write"


class FakePrometheus:
    """``/api/v1/status/config`` answers ``yaml`` (None: a 503, as a server that is not ready); nothing else."""

    def __init__(self) -> None:
        owner = self
        self.yaml: str | None = "global:\n  scrape_interval: 1m\n"
        self.asked = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                owner.asked += 1
                if self.path != "/api/v1/status/config" or owner.yaml is None:
                    body, status = b"Service Unavailable", 503
                else:
                    body, status = json.dumps({"status": "success", "data": {"yaml": owner.yaml}}).encode(), 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()
    yield fake
    fake.close()


def test_a_prometheus_targets_window_comes_from_its_loaded_config(prometheus: FakePrometheus) -> None:
    client = PrometheusClient(prometheus.url, timeout_s=5)
    origin = f"storage.tsdb.out_of_order_time_window of {prometheus.url}"
    assert target_out_of_order_window(client) == (0.0, origin)  # absent: no out-of-order ingestion
    prometheus.yaml = "global:\n  scrape_interval: 1m\nstorage:\n  tsdb:\n    out_of_order_time_window: 10m\n"
    assert target_out_of_order_window(client) == (600.0, origin)
    prometheus.yaml = "storage:\n  tsdb:\n    out_of_order_time_window: later\n"
    seconds, why = target_out_of_order_window(client)
    assert seconds is None and why.startswith("unavailable: invalid duration") and "\n" not in why
    prometheus.yaml = None
    seconds, why = target_out_of_order_window(client)
    assert seconds is None and why.startswith("unavailable: ") and "503" in why


class CutOver:
    def stage_of(self, name: str) -> Stage:
        return Stage.CUT_OVER


def test_the_file_paths_merge_is_refused_before_any_edit_on_a_target_without_the_window(
        prometheus: FakePrometheus, tmp_path: Path) -> None:
    config = b"global:\n  scrape_interval: 30s\nremote_write:\n- name: other\n  url: http://x.invalid/w\n"
    for g in "abc":
        config = add_remote_write(config, remote_write_entry(group_name=g, name_regex=f"M_{g}", url=URL))
    path = tmp_path / "prometheus.yml"
    path.write_bytes(config)
    client = PrometheusClient(prometheus.url, timeout_s=5)
    backends = Backends(source=client, target=client, source_config_path=str(path), target_remote_write_url=URL)
    group = MetricGroup(name="d", metrics=("M_d",), owners=("o",), approvers=("p",), max_queues=3)
    queues = queue_cap(group, backends, audit=CutOver())
    assert queues.out_of_order_window() == (0.0, f"storage.tsdb.out_of_order_time_window of {prometheus.url}")
    events: list[tuple[Any, ...]] = []
    with pytest.raises(QueueCapError) as refused:
        queues.preflight(group="d", record=lambda kind, at, evidence: events.append((kind.value, dict(evidence))),
                         now=queues.clock(), merge=True)
    line = str(refused.value)
    assert "\n" not in line and "carries 3 promshift remote_write queues (cap 3)" in line and "'d'" in line
    assert "the target accepts no out-of-order samples" in line and "at least 60s" in line  # 30 s scrapes
    assert path.read_bytes() == config  # no edit, no reload asked
    assert [kind for kind, _ in events] == ["queue_cap_refused"] and events[0][1]["reason"] == line
