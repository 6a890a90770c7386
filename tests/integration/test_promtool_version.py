"""validate refuses a promtool older than the source Prometheus (issue 37 item 5; docs/deployment.md#promtool).

The source's version is its ``/api/v1/status/buildinfo``; promtool's is ``promtool --version``, the real Debian 2.42
on this machine. A real 2.42 server passes; a source that answers as Prometheus 3.5 does fails ``validate`` in one
line, recorded as ``validation_failed``, before anything is touched.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.deploy import promtool_version
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.local.group_dag import build_group_dag
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
GROUP, PROFILE = "gpu-memory", "demo"
# What Prometheus 3.5.0 answers on /api/v1/status/buildinfo (the fields of its BuildInfo).
BUILDINFO_3_5 = {"status": "success", "data": {
    "version": "3.5.0", "revision": "8be3a9560fbdd18a94dedec4b747c35178177202", "branch": "HEAD",
    "buildUser": "root@4f3c2a1e9b1d", "buildDate": "20250714-16:15:23", "goVersion": "go1.24.5"}}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 2s}\n")
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1",
        "extra": {"config_path": str(config), "remote_write_url": "http://127.0.0.1:1/api/v1/write"}}))
    return config


def source_at(monkeypatch: pytest.MonkeyPatch, url: str, config: Path) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": url, "extra": {"config_path": str(config)}}))


def validate() -> object:
    group = load_catalog(CATALOG, profile=PROFILE).get(GROUP)
    return build_group_dag(group, catalog_path=CATALOG, profile=PROFILE).get_task("validate")


@pytest.fixture
def newer_source() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(BUILDINFO_3_5).encode() if self.path == "/api/v1/status/buildinfo" else b"{}"
            self.send_response(200 if self.path == "/api/v1/status/buildinfo" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_this_machines_promtool_and_prometheus_are_debians_2_42(tmp_path: Path, env: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert promtool_version().startswith("promtool, version 2.42.0")
    with PrometheusProcess("prometheus", tmp_path, port=find_free_ports(1)[0], config=env,
                           data_dir=tmp_path / "data") as prometheus:
        assert PrometheusClient(prometheus.url).build_info()["version"].startswith("2.42.0")
        source_at(monkeypatch, prometheus.url, env)
        validate().check_promtool()  # the same version: nothing to refuse


def test_validate_refuses_a_promtool_older_than_the_source(env: Path, newer_source: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.orchestration.test_operators import make_context

    source_at(monkeypatch, newer_source, env)
    with pytest.raises(AirflowFailException) as excinfo:
        validate().execute(make_context())
    line = str(excinfo.value)
    assert line.startswith("promtool 2.42.0 (promtool) is older than the source Prometheus 3.5.0: ")
    assert "--build-arg PROMETHEUS_VERSION=3.5.0" in line and "\n" not in line
    [event] = AuditStore().events(group=GROUP)
    assert event.kind == "validation_failed" and event.evidence_data["reason"] == line
    assert env.read_text() == "global: {scrape_interval: 2s}\n"  # nothing touched
