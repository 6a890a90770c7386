"""End to end: ``make demo TARGET=amp DEPLOY=k8s-cr`` through Airflow (issue 10).

The source runs as if by prometheus-operator: the stack's k8s component (the Kubernetes API contract
server, not a cluster) holds the ``Prometheus`` resource ``monitoring/k8s`` and its operator stand-in
renders ``spec.remoteWrite`` onto the source. Airflow's source connection names the resource and a
kubeconfig, no config file; the run must cut over with the group's entry added through the resource
(a sigv4 entry to the signing relay, the keep-filter as ``writeRelabelConfigs``), ``deploy.kind``
``k8s-cr`` and the deploy's status history in ``report.json``. Then, in the same session, the by-hand
``promshift__rollback`` DAG takes the cut-over group all the way back through the one deploy driver: the
resource's ``spec.remoteWrite`` and the source's rendered config are byte-identical to what they were before the
run, reads go back to the source, and the audit records ``rolled_back`` in the shape every rollback has. Last, the
``drift`` scenario on another group: its gate fails and its own rollback restores the resource byte-identical.

Session: an Airflow of its own (``run_demo``, as ``make demo``); tests/e2e/conftest.py says why no AMP
scenario shares one yet.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.routing import RoutingStore
from promshift.core.render import remote_write_names
from promshift.local.demo import run_scenario, start_session
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.orchestration.dag_factory import FULL_ROLLBACK_DAG_ID
from tests.e2e.conftest import free_port, stop_stack

# Two runs (happy, drift) and a full rollback plus the stack's and Airflow's start: above the 600 s pytest-timeout
# of pyproject.toml.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

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
        # As run_demo(scenario="happy", deploy="k8s-cr") does, keeping the session for the rollback after it.
        session = start_session(nodes=12, airflow_port=free_port(), target_kind="amp", kubernetes=True)
        stack = LocalStack(StackConfig.from_env(target_kind="amp", kubernetes=True))
        cr_before = json.dumps(stack.prometheus_cr()["spec"].get("remoteWrite"), sort_keys=True)
        source_before = stack.source_config_path.read_bytes()
        out = run_scenario(session, group_name="gpu-memory", scenario="happy", report_root=amp_env / "reports",
                           deploy="k8s-cr", timeout_s=RUN_TIMEOUT_S)
        cr = stack.prometheus_cr()
        source_config = stack.source_config_path.read_text()
        kubeconfig = json.loads(stack.kubeconfig_path.read_text())
        api_url = stack.kubernetes_url  # read from the running server's api.json, gone after stop_stack

        # The full rollback by hand, through Airflow: the resource is restored through the same deploy driver.
        run_id = session.airflow.trigger(FULL_ROLLBACK_DAG_ID, conf={"group": "gpu-memory", "reason": "e2e: undo"})
        rollback_state = session.airflow.follow(FULL_ROLLBACK_DAG_ID, run_id, timeout_s=600)
        cr_after = json.dumps(stack.prometheus_cr()["spec"].get("remoteWrite"), sort_keys=True)
        source_after = stack.source_config_path.read_bytes()
        audit = AuditStore(session.audit_url)
        rolled = [e for e in audit.events(group="gpu-memory") if e.run_id == run_id and e.kind == "rolled_back"]
        stage_after, read_from = audit.stage_of("gpu-memory").value, RoutingStore(audit.url).read_from("gpu-memory")
        audit.engine.dispose()

        # ``make demo SCENARIO=drift DEPLOY=k8s-cr`` in the same session: the gate fails and the run's own rollback
        # restores the resource through the same driver, byte-identical.
        drift = run_scenario(session, group_name="gpu-utilization", scenario="drift",
                             report_root=amp_env / "reports", deploy="k8s-cr", timeout_s=RUN_TIMEOUT_S)
        cr_after_drift = json.dumps(stack.prometheus_cr()["spec"].get("remoteWrite"), sort_keys=True)
        source_after_drift = stack.source_config_path.read_bytes()
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

    # promshift__rollback after the cut-over: byte-identical resource and source config, reads on the source.
    assert rollback_state == "success", rollback_state
    assert cr_after == cr_before and source_after == source_before
    assert OURS not in remote_write_names(source_after)
    assert (stage_after, read_from) == ("rolled_back", "source")
    [event] = rolled
    evidence = event.evidence_data
    assert (evidence["performed"], evidence["restored_identical"], evidence["from_stage"]) == (True, True, "cut_over")
    assert evidence["method"] == "k8s-cr_restore" and evidence["deploy"]["kind"] == "k8s-cr"
    assert evidence["deploy"]["status_history"][-1]["status"] in ("LIVE", "RESTORED"), evidence["deploy"]

    drifted = json.loads((drift / "report.json").read_text())
    assert drifted["final_stage"] == "rolled_back" and drifted["parity"]["verdict"] == "FAILED", drifted["summary"]
    assert drifted["rollback"]["performed"] is True and drifted["rollback"]["restored_identical"] is True
    assert cr_after_drift == cr_before and source_after_drift == source_before
