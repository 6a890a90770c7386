"""Counter or gauge comes from the source's /api/v1/metadata, the DCGM list only where the source has none;
and production code (settings, the DAG files) never imports the local stack."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.adapters.settings import dcgm_counters, load_catalog
from promshift.core.errors import ErrorKind
from promshift.core.parity import metric_kinds

REPO = Path(__file__).resolve().parents[3]

NAMES = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "site_custom_metric"]


class MetadataPrometheus:
    """Answers label values and /api/v1/metadata as Prometheus does; refuses any other call or parameter."""

    def __init__(self, metadata: dict[str, Any], names: list[str]) -> None:
        self.metadata, self.names, self.asked = metadata, names, []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                url = urlsplit(self.path)
                params = parse_qs(url.query)
                if url.path == "/api/v1/label/__name__/values" and set(params) == {"match[]", "start", "end"}:
                    return self.reply(200, {"status": "success", "data": owner.names})
                if url.path == "/api/v1/metadata" and set(params) <= {"metric"}:
                    metric = params.get("metric", [None])[0]
                    owner.asked.append(metric)
                    if isinstance(owner.metadata, dict):
                        data = {k: v for k, v in owner.metadata.items() if metric in (None, k)}
                    else:
                        data = owner.metadata
                    return self.reply(200, {"status": "success", "data": data})
                self.reply(400, {"status": "error", "errorType": "bad_data", "error": f"unexpected {self.path}"})

            def reply(self, code: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()


@pytest.fixture
def served() -> Iterator[list[MetadataPrometheus]]:
    made: list[MetadataPrometheus] = []
    yield made
    for s in made:
        s.server.shutdown()
        s.server.server_close()


def serve(served: list[MetadataPrometheus], metadata: Any, names: list[str] = NAMES) -> MetadataPrometheus:
    served.append(MetadataPrometheus(metadata, names))
    return served[-1]


def test_metadata_decides_and_the_dcgm_list_is_only_the_fallback() -> None:
    metadata = {
        "DCGM_FI_DEV_GPU_TEMP": [{"type": "counter", "help": "h", "unit": ""}],  # the source says counter
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": [{"type": "unknown", "help": "", "unit": ""}],
        "a_conflict": [{"type": "counter"}, {"type": "gauge"}],
    }
    fallback = {"DCGM_FI_DEV_GPU_TEMP": "gauge", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
                "a_conflict": "gauge"}
    kinds = metric_kinds([*NAMES, "a_conflict"], metadata, fallback)
    assert kinds == {
        "DCGM_FI_DEV_GPU_TEMP": {"kind": "counter", "from": "source_metadata"},
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": {"kind": "counter", "from": "dcgm_list"},
        "site_custom_metric": {"kind": "gauge", "from": "default"},
        "a_conflict": {"kind": "gauge", "from": "dcgm_list", "conflict": "counter, gauge"},
    }


def test_the_client_reads_metadata_and_refuses_a_malformed_answer(served: list[MetadataPrometheus]) -> None:
    good = serve(served, {"up": [{"type": "gauge", "help": "up?", "unit": ""}], "x": [{"type": "counter"}]})
    client = PrometheusClient(good.url)
    assert client.metadata("up") == {"up": [{"type": "gauge", "help": "up?", "unit": ""}]}
    assert client.metadata() == {"up": [{"type": "gauge", "help": "up?", "unit": ""}], "x": [{"type": "counter"}]}
    assert client.metadata("absent") == {}
    assert good.asked == ["up", None, "absent"]
    for bad in (["not", "an", "object"], {"up": {"type": "gauge"}}):
        with pytest.raises(PrometheusError) as err:
            PrometheusClient(serve(served, bad).url).metadata("up")
        assert err.value.kind == ErrorKind.MALFORMED and "malformed answer for metadata" in str(err.value)


def test_parity_queries_follow_the_sources_metadata(served: list[MetadataPrometheus]) -> None:
    # The source declares GPU_TEMP a counter (the DCGM list says gauge) and has nothing for the energy counter.
    source = serve(served, {"DCGM_FI_DEV_GPU_TEMP": [{"type": "counter", "help": "", "unit": ""}]})
    base = load_catalog(profile="demo").get("gpu-power-thermal")
    group = dataclasses.replace(base, parity=dataclasses.replace(base.parity, mode="independent_scraper", step_s=5.0))
    check = ParityCheck(group, PrometheusClient(source.url), PrometheusClient("http://127.0.0.1:1"))
    queries = check.host_queries("gpu-node-0000", 0, 60)
    assert any(q.startswith('label_replace(rate({__name__="DCGM_FI_DEV_GPU_TEMP"') for q in queries)
    assert any(q.startswith('label_replace(rate({__name__="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"') for q in queries)
    assert any(q.startswith('label_replace(avg_over_time({__name__="site_custom_metric"') for q in queries)
    assert check.metric_kinds(0, 60)["DCGM_FI_DEV_GPU_TEMP"] == {"kind": "counter", "from": "source_metadata"}
    assert check.metric_kinds(0, 60)["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["from"] == "dcgm_list"
    assert sorted(source.asked) == sorted(NAMES)  # one metadata call per metric, once per check
    # A shard carries the plan's kinds: it asks the source no metadata of its own.
    fresh = ParityCheck(group, PrometheusClient(source.url), PrometheusClient("http://127.0.0.1:1"))
    fresh._kinds = check.metric_kinds(0, 60)
    fresh.host_queries("gpu-node-0000", 0, 60)
    assert sorted(source.asked) == sorted(NAMES)
    # The kinds and where each came from land in the samples evidence.
    shard = {"hosts": ["gpu-node-0000"], "errors": [], "metric_kinds": check.metric_kinds(0, 60)}
    assert check.samples_measurement([shard], hosts_total=1).numbers["metric_kinds"] == check.metric_kinds(0, 60)


def test_the_dcgm_list_is_package_data_outside_the_stack() -> None:
    counters = {c.name: c.kind for c in dcgm_counters()}
    assert counters["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert counters["DCGM_FI_DEV_GPU_TEMP"] == "gauge"
    assert not list((REPO / "include" / "promshift" / "stack").glob("*.csv"))


@pytest.mark.integration  # starts a process
def test_settings_and_the_dag_files_do_not_import_the_local_stack() -> None:
    code = (
        "import glob, runpy, sys\n"
        "import promshift.adapters.settings as s\n"
        "s.check_catalog_file()\n"  # what a DAG parse does: the catalog checked against the DCGM list
        "for f in sorted(glob.glob('dags/*.py')):\n"
        "    runpy.run_path(f)\n"
        "print(sorted(m for m in sys.modules if m.startswith('promshift.local.stack')))\n"
        "print(len(glob.glob('dags/*.py')))\n"
    )
    env = {**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW_CONN_PROMSHIFT_SOURCE": '{"conn_type": "prometheus", "host": "http://127.0.0.1:1"}',
           "AIRFLOW_CONN_PROMSHIFT_TARGET": '{"conn_type": "prometheus", "host": "http://127.0.0.1:2"}'}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    imported, dag_files = out.stdout.strip().splitlines()[-2:]
    assert imported == "[]"
    assert int(dag_files) >= 1
