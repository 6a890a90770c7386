"""``wiring.retire_source``: which switch a source connection gets (the file path's lab process control, the k8s-cr
path's PrometheusAgent conversion, the git path's agentMode commit, or a refusal), built from the connection alone
(nothing is called)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from promshift.local.stack.k8s_api import kubeconfig
from tests.unit.orchestration.test_operators import CATALOG, PROFILE, env  # noqa: F401  (audit DB, connections)


def _source(monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps(
        {"conn_type": "prometheus", "host": "http://127.0.0.1:1", "extra": extra}))


def test_a_k8s_cr_source_gets_the_prometheus_agent_switch(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from promshift.adapters.k8s_source_mode import K8sSourceModeSwitch
    from promshift.orchestration.wiring import retire_source

    config = env / "kubeconfig.json"
    config.write_text(json.dumps(kubeconfig("http://127.0.0.1:1", "monitoring")))
    _source(monkeypatch, {"deploy": "k8s-cr", "kubernetes": {"namespace": "monitoring", "name": "k8s",
                                                            "config_file": str(config), "timeout_s": 42}})
    step = retire_source("promshift_source", catalog_path=str(CATALOG), profile=PROFILE, run_id="r1")
    assert isinstance(step.switch, K8sSourceModeSwitch)
    assert (step.switch.namespace, step.switch.name, step.switch.url, step.switch.timeout_s) == (
        "monitoring", "k8s", "http://127.0.0.1:1", 42)
    assert {g.name for g in step.groups} == {"gpu-utilization", "gpu-memory", "gpu-power-thermal", "gpu-clocks"}


def test_a_git_source_gets_the_agent_mode_commit_switch(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from promshift.adapters.git_deploy import DirectPush, GitHubPullRequests
    from promshift.adapters.git_source_mode import GitSourceModeSwitch
    from promshift.orchestration.wiring import retire_source

    _source(monkeypatch, {"deploy": "git", "git": {"url": "/srv/config.git", "path": "values.yaml",
                                                   "shape": "helm-values", "timeout_s": 77}})
    step = retire_source("promshift_source", catalog_path=str(CATALOG), profile=PROFILE, run_id="r1")
    assert isinstance(step.switch, GitSourceModeSwitch) and isinstance(step.switch.backend, DirectPush)
    assert (step.switch.url, step.switch.timeout_s, step.switch.run_id) == ("http://127.0.0.1:1", 77, "r1")
    assert step.switch.heads["retire"] == "promshift/source-promshift_source/agent-mode"
    # the pull-request backend, its token from the connection extra.git.conn_id names (never from the extra)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_GIT", json.dumps({"conn_type": "generic", "password": "tok-123"}))
    _source(monkeypatch, {"deploy": "git", "git": {"url": "https://git.example/platform/values.git",
                                                   "path": "values.yaml", "shape": "helm-values", "backend": "github",
                                                   "github": {"repository": "platform/values"},
                                                   "conn_id": "promshift_git"}})
    step = retire_source("promshift_source", catalog_path=str(CATALOG), profile=PROFILE, run_id="r1")
    assert isinstance(step.switch.backend, GitHubPullRequests) and step.switch.git.token == "tok-123"


def test_a_git_source_without_the_switch_and_a_bad_k8s_extra_are_refused_in_one_line(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from promshift.orchestration.wiring import retire_source

    _source(monkeypatch, {"deploy": "git", "git": {"url": "/nowhere.git", "path": "values.yaml"}})
    with pytest.raises(AirflowFailException, match="extra.git.shape must be one of"):
        retire_source("promshift_source", catalog_path=str(CATALOG), profile=PROFILE, run_id="r1")
    # a plain prometheus.yml in git has no agent switch: only kube-prometheus-stack values have one
    _source(monkeypatch, {"deploy": "git", "git": {"url": "/srv/c.git", "path": "prometheus.yml",
                                                   "shape": "prometheus-yml"}})
    with pytest.raises(AirflowFailException, match="needs kube-prometheus-stack values"):
        retire_source("promshift_source", catalog_path=str(CATALOG), profile=PROFILE, run_id="r1")
    _source(monkeypatch, {"deploy": "k8s-cr", "kubernetes": {"namespace": "Not_A_Label", "name": "k8s"}})
    with pytest.raises(AirflowFailException, match="namespace must be a DNS label"):
        retire_source("promshift_source", catalog_path=str(CATALOG), profile=PROFILE, run_id="r1")


def test_each_target_is_read_through_its_hooks_prometheus_client(env: Path,  # noqa: F811
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An AmpHook's ``get_conn`` is its boto3 service, which has no ``query`` (measured: the retire proof failed on
    an AMP target with "'PrometheusService' object has no attribute 'query'"); both hooks give a client."""
    import promshift.orchestration.wiring as wiring
    from promshift.orchestration.wiring import retire_source

    real = wiring.backend_hook
    client = object()

    class AmpLike:
        def get_conn(self) -> Any:
            return object()

        def prometheus_client(self) -> Any:
            return client

    monkeypatch.setattr(wiring, "backend_hook", lambda conn_id: AmpLike() if conn_id == "promshift_target"
                        else real(conn_id))
    _source(monkeypatch, {"mode_switch": {"pid_file": "/nonexistent/pid", "flags_file": "/nonexistent/flags",
                                          "config_path": "/nonexistent/prometheus.yml", "agent_path": "/nonexistent/a",
                                          "log_path": "/nonexistent/log"}})
    step = retire_source("promshift_source", catalog_path=str(CATALOG), profile=PROFILE, run_id="r1")
    assert step.target and all(t.client is client for t in step.target.values())
