"""End to end: ``make demo TARGET=amp DEPLOY=k8s-cr`` through Airflow (issue 10).

The source runs as if by prometheus-operator: the stack's k8s component (the Kubernetes API contract
server, not a cluster) holds the ``Prometheus`` resource ``monitoring/k8s`` and its operator stand-in
renders ``spec.remoteWrite`` onto the source. Airflow's source connection names the resource and a
kubeconfig, no config file; the run must cut over with the group's entry added through the resource
(a sigv4 entry to the signing relay, the keep-filter as ``writeRelabelConfigs``), ``deploy.kind``
``k8s-cr`` and the deploy's status history in ``report.json``.

Session: an Airflow of its own (``run_demo``, as ``make demo``); tests/e2e/conftest.py says why no AMP
scenario shares one yet.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from promshift.core.render import remote_write_names
from promshift.local.demo import run_demo
from promshift.local.stack.local import LocalStack, StackConfig
from tests.e2e.conftest import free_port, stop_stack

# RUN_TIMEOUT_S plus the stack's and Airflow's start: above the 600 s pytest-timeout of pyproject.toml.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# Stack, Airflow start and the run, on a loaded 2-core machine (as test_amp_demo_e2e).
RUN_TIMEOUT_S = 900.0
OURS = "promshift-gpu-memory"


@pytest.fixture
def amp_env(small_stack_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAE2EK8SCRDEMO0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "e2eK8sCrDemoSecretKey/0123456789abcdefgh")
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION", "PROMSHIFT_K8S_PORT"):
        monkeypatch.delenv(name, raising=False)
    return small_stack_env


def test_k8s_cr_demo_cuts_over_through_the_prometheus_resource(amp_env: Path, capsys: pytest.CaptureFixture[str],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    try:
        out = run_demo(group_name="gpu-memory", scenario="happy", nodes=12, airflow_port=free_port(),
                       report_root=amp_env / "reports", target_kind="amp", deploy="k8s-cr",
                       timeout_s=RUN_TIMEOUT_S)
        stack = LocalStack(StackConfig.from_env(target_kind="amp", kubernetes=True))
        cr = stack.prometheus_cr()
        source_config = stack.source_config_path.read_text()
        kubeconfig = json.loads(stack.kubeconfig_path.read_text())
        api_url = stack.kubernetes_url  # read from the running server's api.json, gone after stop_stack
    finally:
        stop_stack()
    report = json.loads((out / "report.json").read_text())
    assert report["final_stage"] == "cut_over", report["summary"]
    assert [s["stage"] for s in report["stages"]] == ["dual_writing", "warming", "verified", "approved", "cut_over"]
    deploy = report["deploy"]
    assert deploy["kind"] == "k8s-cr", deploy
    history = deploy["status_history"]
    assert history and history[0]["status"] == "CR_UPDATED" and history[-1]["status"] == "LIVE", history
    assert all(change["at"] for change in history)
    # The target is an AMP workspace: the quota pre-flight ran before the resource was written.
    assert deploy["quota"]["group_series"] > 0 and deploy["quota"]["limit"] > 0, deploy
    assert report["parity"]["verdict"] == "SUCCESSFUL" and report["latency"]["verdict"] == "SUCCESSFUL"
    assert report["target"]["kind"] == "amp" and report["target"]["sigv4_rejected"] == 0

    # The resource holds our entry in the operator's spelling; cut-over keeps dual-writing, so it stays.
    [ours] = [e for e in cr["spec"]["remoteWrite"] if e["name"] == OURS]
    assert ours["sigv4"] == {"region": "us-east-1"} and ours["url"].endswith("/api/v1/write")
    assert ours["writeRelabelConfigs"][0]["action"] == "keep"
    assert ours["writeRelabelConfigs"][0]["sourceLabels"] == ["__name__"]
    # ... and the operator stand-in rendered it onto the source's own config, which still scrapes the fleet.
    assert remote_write_names(source_config) == [OURS]
    # (and promshift's own /metrics, job promshift: the lab's source scrapes the demo's Airflow)
    assert [job["job_name"] for job in yaml.safe_load(source_config)["scrape_configs"]] == ["dcgm", "promshift"]
    assert kubeconfig["clusters"][0]["cluster"]["server"] == api_url != "http://127.0.0.1:0"
