"""The Kubernetes contract server as a component of the local stack (``stack up --k8s``; the demo's DEPLOY=k8s-cr).

`up` starts it once the source answers; it serves the ``Prometheus`` resource ``monitoring/k8s`` whose
``spec.remoteWrite`` is the source's, with a kubeconfig that ``KubernetesHook`` can use; the CR deployer goes
live through it on the real source Prometheus (which keeps scraping the fleet), and a restore leaves the
source's file byte-identical; the source's rules are a ``PrometheusRule`` rendered back to its rule file; a second
`up` reuses it; `down` stops it. A contract test, not a cluster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from kubernetes.config import new_client_from_config

from promshift.adapters.k8s_deploy import PrometheusCRDeployment
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.rules_deploy import loaded_rules
from promshift.core.deploy import ConfigDeployer, DeployResult, DeployState
from promshift.core.deploy_kinds import K8S_CR, kubernetes_source_of
from promshift.core.render import add_remote_write, remote_write_entry, remote_write_names, sha256_bytes
from promshift.local.stack.k8s_api import split_source_config
from promshift.local.stack.local import K8S, LocalStack, StackConfig, StackError

pytestmark = pytest.mark.integration


def follow(deployer: ConfigDeployer, result: DeployResult, timeout_s: float = 60) -> DeployResult:
    deadline = time.time() + timeout_s
    while not result.state.final:
        assert time.time() < deadline, f"still {result.status} after {timeout_s}s"
        time.sleep(0.2)
        result = deployer.verify(result, datetime.now(UTC))
    return result


def test_stack_runs_the_contract_server_over_the_source_and_the_cr_deploy_goes_live(
        stack_config_factory: Callable[..., StackConfig]) -> None:
    stack = LocalStack(stack_config_factory(nodes=2, kubernetes=True))
    pid = port = 0
    try:
        status = stack.up(timeout=120)
        row = status[K8S]
        assert row["alive"] and row["healthy"], row
        pid, port = row["pid"], stack.k8s_port
        assert port > 0 and row["url"] == f"http://127.0.0.1:{port}"
        original = stack.source_config_path.read_bytes()

        # The resource reproduces the source's remote_write (none on a fresh stack): no spec.remoteWrite at all.
        cr = stack.prometheus_cr()
        assert (cr["kind"], cr["metadata"]["namespace"], cr["metadata"]["name"]) == ("Prometheus", "monitoring", "k8s")
        assert "remoteWrite" not in cr["spec"] and cr["metadata"]["resourceVersion"]

        # The source connection's extra.kubernetes, as the demo gives it to Airflow, parses as a k8s-cr source.
        extra = {"deploy": K8S_CR, "kubernetes": stack.kubernetes_source_extra(timeout_s=60)}
        source = kubernetes_source_of(extra)
        assert source is not None and source.config_file == str(stack.kubeconfig_path)
        assert json.loads(stack.kubeconfig_path.read_text())["clusters"][0]["cluster"]["server"] == row["url"]

        # The source's rules live in PrometheusRule monitoring/gpu-rules (kube-prometheus-stack's way), selected by
        # the resource's ruleSelector, rendered back to the source's rule file, which the source loads.
        rule = stack.prometheus_rule()
        selector = cr["spec"]["ruleSelector"]["matchLabels"]
        assert rule["metadata"]["labels"]["prometheus"] == "k8s" == selector["prometheus"]
        assert [g["name"] for g in rule["spec"]["groups"]] == ["gpu-memory", "fleet"]
        assert yaml.safe_load(stack.source_rules_path.read_text()) == rule["spec"]
        assert stack.source_rules_path.name == "monitoring-gpu-rules.yml"
        names = {(r.file.rsplit("/", 1)[-1], r.name) for r in loaded_rules(PrometheusClient(stack.source_url))}
        assert names == {("monitoring-gpu-rules.yml", n) for n in ("gpu:fb_used:ratio", "GpuMemoryNearlyFull",
                                                                 "DcgmExporterDown")}
        with_rules = kubernetes_source_of({**extra, "kubernetes": stack.kubernetes_source_extra(timeout_s=60,
                                                                                             rules=True)})
        assert with_rules is not None and with_rules.prometheus_rules == (("monitoring", "gpu-rules"),)

        # The CR deployer, through the kubeconfig, goes live on the real source through the operator stand-in.
        prometheus = PrometheusClient(stack.source_url, timeout_s=30)
        entry = remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_(FREE|USED)",
                                   url=stack.target_remote_write_url)
        deployer = PrometheusCRDeployment(new_client_from_config(config_file=source.config_file),
                                          namespace=source.namespace, name=source.name, entry=entry,
                                          prometheus=prometheus, timeout_s=60)
        snapshot = deployer.snapshot()
        done = follow(deployer, deployer.deploy(snapshot, datetime.now(UTC)))
        assert done.state is DeployState.DONE and done.status == "LIVE", done.reason
        assert [e["name"] for e in stack.prometheus_cr()["spec"]["remoteWrite"]] == ["promshift-gpu-memory"]
        loaded = prometheus.config_text()
        assert remote_write_names(loaded) == ["promshift-gpu-memory"]
        # Rendered onto the source's own config: it still scrapes the fleet through file_sd.
        assert "job_name: dcgm" in loaded and str(stack.file_sd_path) in loaded
        assert stack.source_config_path.read_text() == add_remote_write(original.decode(), entry)

        restored = follow(deployer, deployer.restore(snapshot, datetime.now(UTC)))
        assert restored.state is DeployState.DONE, restored.reason
        assert "remoteWrite" not in stack.prometheus_cr()["spec"]
        assert sha256_bytes(stack.source_config_path.read_bytes()) == sha256_bytes(original)
        assert remote_write_names(prometheus.config_text()) == []

        again = stack.up(timeout=60)
        assert (again[K8S]["pid"], stack.k8s_port) == (pid, port), "a second up must reuse the contract server"
    finally:
        stack.down()
    assert not Path(f"/proc/{pid}").exists(), "down must stop the contract server"
    assert not stack.pid_path(K8S).exists() and stack.kubernetes_address() is None
    assert stack.status()[K8S]["alive"] is False
    with pytest.raises(StackError, match="Kubernetes contract server is not running"):
        stack.kubernetes_source_extra()
    stack.reset()
    assert not stack.kubernetes_dir.exists()


def test_a_plain_stack_runs_no_contract_server(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path))
    assert K8S not in stack.status()
    assert StackConfig(home=tmp_path, kubernetes=True, k8s_port=0).k8s_port == 0
    with pytest.raises(ValueError, match="ports must differ"):
        StackConfig(home=tmp_path, kubernetes=True, k8s_port=9090)


def test_the_sources_remote_write_moves_into_the_resource_and_out_of_the_base() -> None:
    text = ("global:\n  scrape_interval: 5s\n# the team's own queue\nremote_write:\n  - name: team-thanos\n"
            "    url: http://127.0.0.1:1/api/v1/receive\n    write_relabel_configs:\n"
            "      - source_labels: [__name__]\n        regex: up\n        action: keep\n"
            "scrape_configs:\n  - job_name: dcgm\n    static_configs: [{targets: ['127.0.0.1:2']}]\n")
    base, specs = split_source_config(text)
    assert specs == [{"name": "team-thanos", "url": "http://127.0.0.1:1/api/v1/receive",
                      "writeRelabelConfigs": [{"sourceLabels": ["__name__"], "regex": "up", "action": "keep"}]}]
    assert remote_write_names(base) == [] and "job_name: dcgm" in base and "# the team's own queue" in base
    with pytest.raises(ValueError, match=r"remote_write\[0\] has no name"):
        split_source_config("remote_write:\n  - url: http://127.0.0.1:1/w\n")
