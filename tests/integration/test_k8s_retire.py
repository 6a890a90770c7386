"""Retire the source on the k8s-cr path: its ``Prometheus`` resource becomes a ``PrometheusAgent`` on the local
Kubernetes API contract server, and back (``adapters.k8s_source_mode``), with a real Prometheus 2.42 behind the
operator stand-in (no Airflow).

The stand-in renders the ``Prometheus`` resource onto the real source (a server) and the ``PrometheusAgent`` as the
operator renders an agent (the config without rules and alerting, the source restarted with
``--enable-feature=agent``). Proven here: the agent carries every field an agent has and none of the server's (the
contract server refuses those, as the API server does), the source then refuses queries with 422 while the target
keeps receiving, a second switch is a no-op, a crash between creating the agent and deleting the server resumes,
and the undo creates the ``Prometheus`` resource again as its owner wrote it (byte for byte, less what the API server
sets), the source a server again with its own command line and config bytes.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes.client import ApiClient, Configuration, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from promshift.adapters.k8s_source_mode import K8sSourceModeSwitch
from promshift.adapters.source_mode import PopenControl, probe_mode
from promshift.core.retire import canonical, user_content
from promshift.local.stack.k8s_api import PROMETHEUSAGENTS, PROMETHEUSES, K8sApiServer, OperatorStandIn
from promshift.local.stack.prometheus import PROMETHEUS_BIN, PrometheusProcess, prometheus_argv

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(PROMETHEUS_BIN).exists(), reason="Prometheus is not installed")]

NS, NAME = "monitoring", "k8s"
# What the operator renders from the rest of the Prometheus spec (its base); remoteWrite entries are added to it.
BASE = """\
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - rules.yml
alerting:
  alertmanagers:
    - static_configs:
        - targets: ['127.0.0.1:1']
scrape_configs:
  - job_name: self
    static_configs:
      - targets: ['127.0.0.1:{port}']
"""
RULES = "groups:\n  - name: retire\n    rules:\n      - record: job:up:sum\n        expr: sum by (job) (up)\n"
SERVER_ONLY = {"retention": "15d", "evaluationInterval": "1s", "ruleSelector": {"matchLabels": {"prometheus": "k8s"}},
               "alerting": {"alertmanagers": [{"namespace": NS, "name": "alertmanager-main", "port": "web"}]}}


@dataclass
class Lab:
    server: K8sApiServer
    custom: CustomObjectsApi
    switch: K8sSourceModeSwitch
    control: PopenControl
    operator: OperatorStandIn
    target: PrometheusProcess
    config: Path


def _http() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    return s


def _samples_after(target: str, after: float) -> int:
    r = _http().get(f"{target}/api/v1/query", params={"query": 'prometheus_build_info{job="self"}[60s]'}, timeout=10)
    r.raise_for_status()
    return len({float(t) for s in r.json()["data"]["result"] for t, _ in s["values"] if float(t) > after})


def _wait(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.3)
    return result


@pytest.fixture()
def lab(tmp_path: Path, free_ports: Any) -> Iterator[Lab]:
    source_port, target_port = free_ports(2)
    target = PrometheusProcess("target", tmp_path, port=target_port, flags=["--web.enable-remote-write-receiver"])
    target.__enter__()
    config = tmp_path / "source" / "prometheus.yml"
    config.parent.mkdir()
    base = BASE.format(port=source_port)
    config.write_text(base)
    (config.parent / "rules.yml").write_text(RULES)
    url = f"http://127.0.0.1:{source_port}"
    argv = prometheus_argv(config, tmp_path / "source" / "data", source_port, "--web.enable-lifecycle",
                           "--storage.tsdb.retention.time=15d")
    control = PopenControl(argv, url=url, log_path=tmp_path / "source.log")
    control.start()
    server = K8sApiServer().start()
    operator = OperatorStandIn(server, namespace=NS, name=NAME, base_config=base, config_path=config,
                               prometheus_url=url, delay_s=0.2, control=control, agent_path=tmp_path / "agent")
    custom = CustomObjectsApi(ApiClient(Configuration(host=server.base_url)))
    try:
        server.create(PROMETHEUSES, NS, NAME, {
            "metadata": {"labels": {"prometheus": "k8s"}, "annotations": {"owner": "fleet team"}},
            "spec": {"replicas": 1, "serviceMonitorSelector": {"matchLabels": {"team": "gpu"}}, **SERVER_ONLY,
                     "remoteWrite": [{"url": f"{target.url}/api/v1/write", "name": "promshift-build",
                                      "queueConfig": {"batchSendDeadline": "1s"},
                                      "writeRelabelConfigs": [{"sourceLabels": ["__name__"],
                                                               "regex": "prometheus_build_info", "action": "keep"}]}]}})
        _wait(lambda: _samples_after(target.url, time.time() - 30) >= 3)
        switch = K8sSourceModeSwitch(ApiClient(Configuration(host=server.base_url)), namespace=NS, name=NAME,
                                     url=url, timeout_s=60, poll_s=0.2)
        yield Lab(server, custom, switch, control, operator, target, config)
    finally:
        operator.stop()
        server.stop()
        control.stop()
        target.stop()


def _get(lab: Lab, kind: str) -> dict[str, Any] | None:
    version = "v1" if kind == PROMETHEUSES else "v1alpha1"
    try:
        return lab.custom.get_namespaced_custom_object("monitoring.coreos.com", version, NS, kind, NAME)
    except ApiException as exc:
        assert exc.status == 404, exc.body
        return None


def test_the_prometheus_resource_becomes_an_agent_and_comes_back_as_its_owner_wrote_it(lab: Lab) -> None:
    original = _get(lab, PROMETHEUSES)
    assert original is not None
    config_before, argv_before = lab.config.read_bytes(), lab.control.argv()
    assert _http().get(f"{lab.switch.url}/api/v1/query", params={"query": "up"}, timeout=5).status_code == 200

    change = lab.switch.to_agent()
    switched = time.time()
    assert change.changed and change.mode == "agent" and probe_mode(lab.switch.url) == "agent"
    assert lab.switch.dropped == sorted(SERVER_ONLY)
    assert _get(lab, PROMETHEUSES) is None
    agent = _get(lab, PROMETHEUSAGENTS)
    assert agent is not None and not set(agent["spec"]) & set(SERVER_ONLY)
    assert agent["spec"]["remoteWrite"] == original["spec"]["remoteWrite"] and agent["spec"]["replicas"] == 1
    assert agent["metadata"]["labels"] == {"prometheus": "k8s"}
    # what the operator stand-in did, as the operator would: an agent's config and command line
    assert "--enable-feature=agent" in lab.control.argv()
    assert not any(a.startswith(("--storage.tsdb.", "--rules.")) for a in lab.control.argv())
    assert b"rule_files:\n" not in lab.config.read_bytes() and b"promshift-build" in lab.config.read_bytes()
    assert lab.operator.restarts == ["agent"] and not lab.operator.errors
    answer = _http().get(f"{lab.switch.url}/api/v1/query", params={"query": "up"}, timeout=5)
    assert answer.status_code == 422 and "unavailable with Prometheus Agent" in answer.text
    _wait(lambda: _samples_after(lab.target.url, switched) >= 3)  # the agent forwards: the target still receives

    again = lab.switch.to_agent()  # the resources are read first: nothing is created or restarted
    assert not again.changed and lab.operator.restarts == ["agent"]

    undo = lab.switch.restore()
    undone = time.time()
    assert undo.changed and undo.byte_identical is True and probe_mode(lab.switch.url) == "server"
    back = _get(lab, PROMETHEUSES)
    assert back is not None and _get(lab, PROMETHEUSAGENTS) is None
    assert canonical(user_content(back)) == canonical(user_content(original))
    # what the API server sets is its own on a re-created object (never compared)
    assert back["metadata"]["uid"] != original["metadata"].get("uid")
    assert back["metadata"]["resourceVersion"] != original["metadata"]["resourceVersion"]
    assert lab.control.argv() == argv_before and lab.config.read_bytes() == config_before
    assert lab.operator.restarts == ["agent", "server"]
    assert _http().get(f"{lab.switch.url}/api/v1/query", params={"query": "up"}, timeout=5).status_code == 200
    _wait(lambda: _samples_after(lab.target.url, undone) >= 3)
    assert not lab.switch.restore().changed  # nothing left to undo


def test_a_crash_between_the_agent_and_the_delete_resumes_and_a_foreign_agent_is_left_alone(lab: Lab) -> None:
    from promshift.core.retire import agent_resource

    original = _get(lab, PROMETHEUSES)
    assert original is not None
    body, _ = agent_resource(original)
    lab.server.post(PROMETHEUSAGENTS, NS, copy.deepcopy(body))  # the switch died after creating the agent
    _wait(lambda: probe_mode(lab.switch.url) == "agent")
    change = lab.switch.to_agent()  # resumes: the agent is ours (it saved this resource), the server goes
    assert change.changed and _get(lab, PROMETHEUSES) is None
    assert lab.switch.restore().byte_identical is True

    foreign = copy.deepcopy(body)
    foreign["metadata"]["annotations"] = {"owner": "someone else"}
    lab.server.post(PROMETHEUSAGENTS, NS, foreign)
    with pytest.raises(Exception, match="not made from this Prometheus resource"):
        lab.switch.to_agent()
    assert _get(lab, PROMETHEUSES) is not None  # nothing deleted


def test_the_stacks_k8s_component_retires_its_source_through_the_connection_the_demo_gives(
        stack_config_factory: Any) -> None:
    """The stack's ``k8s`` component (``python -m promshift.local.stack.k8s_api --mode-switch``) over its source:
    the switch built as the retire DAG's wiring builds it, from the source connection's ``extra.kubernetes``."""
    from promshift.core.deploy_kinds import K8S_CR, kubernetes_source_of
    from promshift.core.retire import PROMETHEUS_ONLY_SPEC
    from promshift.local.stack.local import LocalStack
    from promshift.orchestration.hooks import kubernetes_hook

    stack = LocalStack(stack_config_factory(nodes=2, kubernetes=True))
    try:
        stack.up(timeout=120)
        before_cr, before_argv = stack.prometheus_cr(), stack.source_mode_switch().control.argv()
        server_only = sorted(k for k in before_cr["spec"] if k in PROMETHEUS_ONLY_SPEC)
        assert {"ruleSelector", "evaluationInterval"} <= set(server_only)  # the source's rule_files, its globals
        source = kubernetes_source_of({"deploy": K8S_CR, "kubernetes": stack.kubernetes_source_extra(timeout_s=90)})
        assert source is not None
        switch = K8sSourceModeSwitch(kubernetes_hook(source), namespace=source.namespace, name=source.name,
                                     url=stack.source_url, timeout_s=source.timeout_s)
        assert switch.to_agent().changed and probe_mode(stack.source_url) == "agent"
        assert switch.dropped == server_only
        assert "--enable-feature=agent" in stack.source_mode_switch().control.argv()
        undo = switch.restore()
        assert undo.byte_identical is True and probe_mode(stack.source_url) == "server"
        assert canonical(user_content(stack.prometheus_cr())) == canonical(user_content(before_cr))
        assert stack.source_mode_switch().control.argv() == before_argv
    finally:
        stack.down()


def test_an_agent_that_never_comes_up_is_deleted_again_and_the_server_runs_on(lab: Lab, monkeypatch: Any) -> None:
    from promshift.adapters.source_mode import SourceModeError

    # the operator renders a config the agent refuses (rule_files kept): the real agent exits at start
    monkeypatch.setattr("promshift.local.stack.k8s_api.agent_config", lambda data: data)
    lab.switch.timeout_s = 15
    with pytest.raises(SourceModeError, match="the PrometheusAgent was deleted again, the Prometheus resource kept"):
        lab.switch.to_agent()
    assert _get(lab, PROMETHEUSAGENTS) is None and _get(lab, PROMETHEUSES) is not None
    _wait(lambda: probe_mode(lab.switch.url) == "server")  # the stand-in renders the server again
    assert lab.operator.restarts == ["agent", "server"]
