"""The Kubernetes deployers against the local Kubernetes API contract server and a real Prometheus.

The contract server (``stack.k8s_api``) checks every body against the ``kubernetes`` package's models
and prometheus-operator's field names, and honours ``resourceVersion``; its config-reloader and operator
stand-ins write what the objects say into the real Prometheus's config file and reload it, so
``verify`` reads the proof from ``/api/v1/status/config``. A contract test, not a cluster.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from promshift.adapters.k8s_deploy import (
    CR_GROUP,
    CR_PLURAL,
    CR_VERSION,
    ConfigMapDeployment,
    PrometheusCRDeployment,
)
from promshift.adapters.prometheus import PrometheusClient
from promshift.core.deploy import ConfigDeployer, DeployError, DeployResult, DeployState, InMemorySnapshotStore
from promshift.core.render import add_remote_write, remote_write_entry, remote_write_names
from promshift.local.stack.k8s_api import CONFIGMAPS, PROMETHEUSES, ConfigReloader, K8sApiServer, OperatorStandIn
from promshift.local.stack.local import PROMETHEUS_BIN, find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess
from promshift.orchestration.compose import compose_migration

pytestmark = pytest.mark.integration

NS, NAME = "monitoring", "k8s"
# Written by hand: comments, a YAML 1.1 word and a flow mapping must all survive deploy + restore.
BASE = ("# fleet team's config; order and comments matter\r\n"
        "global:\r\n  scrape_interval: 5s   # keep\r\n  external_labels: {cluster: gpu-east, canary: 'on'}\r\n"
        "scrape_configs:\r\n  - job_name: self\r\n    static_configs: [{targets: ['127.0.0.1:1']}]\r\n")
OPERATOR_BASE = "global:\n  scrape_interval: 5s\nscrape_configs: []\n"


@dataclass
class Env:
    server: K8sApiServer
    api: ApiClient
    prometheus: PrometheusClient
    config: Path


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    if not Path(PROMETHEUS_BIN).exists():
        pytest.skip("Prometheus is not installed (apt-get install -y prometheus)")
    # A sigv4 remote_write loads only when the server finds AWS credentials (see test_deploy.py).
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDPROMSHIFTTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_bytes(BASE.encode())
    (port,) = find_free_ports(1)
    with PrometheusProcess("prometheus", tmp_path, port=port, config=cfg, data_dir=tmp_path / "data",
                           flags=("--web.enable-lifecycle",)) as prometheus:
        client = PrometheusClient(prometheus.url, timeout_s=30)
        server = K8sApiServer().start()
        try:
            yield Env(server, ApiClient(Configuration(host=server.base_url)), client, cfg)
        finally:
            server.stop()


def gpu_entry(**kw: Any) -> dict[str, Any]:
    return remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_(FREE|USED)",
                              url="http://127.0.0.1:9/workspaces/ws-1/api/v1/remote_write", **kw)


def follow(deployer: ConfigDeployer, result: DeployResult, timeout_s: float = 30) -> DeployResult:
    deadline = time.time() + timeout_s
    while not result.state.final:
        assert time.time() < deadline, f"still {result.status} after {timeout_s}s"
        time.sleep(0.2)
        result = deployer.verify(result, datetime.now(UTC))
    return result


def wait_loaded(client: PrometheusClient, names: list[str], timeout_s: float = 20) -> None:
    deadline = time.time() + timeout_s
    while remote_write_names(client.config_text()) != names:
        assert time.time() < deadline, f"loaded {remote_write_names(client.config_text())}, want {names}"
        time.sleep(0.2)


def seed_configmap(env: Env) -> dict[str, Any]:
    return env.server.create(CONFIGMAPS, NS, NAME, {
        "metadata": {"labels": {"app.kubernetes.io/name": "prometheus"}, "annotations": {"owner": "fleet"}},
        "data": {"prometheus.yml": BASE, "rules.yml": "groups: []\n"}})


def test_configmap_deploy_goes_live_through_the_reloader_and_restore_is_byte_identical(env: Env) -> None:
    seed_configmap(env)
    reloader = ConfigReloader(env.server, namespace=NS, name=NAME, config_path=env.config,
                              prometheus_url=env.prometheus.base_url, delay_s=2.0)
    try:
        deployer = ConfigMapDeployment(env.api, namespace=NS, name=NAME, entry=gpu_entry(), prometheus=env.prometheus,
                                       timeout_s=30)
        assert isinstance(deployer, ConfigDeployer)
        store = InMemorySnapshotStore()
        ref = store.put("gpu-memory", "run-1", deployer.snapshot())
        snap = store.get(ref)
        assert snap.content == BASE and snap.meta["resourceVersion"]

        started = deployer.deploy(snap, datetime.now(UTC))
        assert started.state is DeployState.WAITING and started.status == "CONFIGMAP_UPDATED"
        # The sidecar has not acted yet: the loaded config does not show the entry, so verify waits.
        first = deployer.verify(started, datetime.now(UTC))
        assert first.state is DeployState.WAITING and first.status == "WAITING_FOR_RELOAD"
        done = follow(deployer, first)
        assert done.state is DeployState.DONE and done.status == "LIVE", done.reason
        assert [c.status for c in done.status_history] == ["CONFIGMAP_UPDATED", "WAITING_FOR_RELOAD", "LIVE"]
        assert remote_write_names(env.prometheus.config_text()) == ["promshift-gpu-memory"]

        stored = env.server.get(CONFIGMAPS, NS, NAME)
        expected = add_remote_write(BASE, gpu_entry())
        assert stored["data"]["prometheus.yml"] == expected and "\r\n" in expected
        assert env.config.read_bytes() == expected.encode()
        # Only our key changed; labels, annotations and the other key are as they were.
        assert stored["data"]["rules.yml"] == "groups: []\n"
        assert stored["metadata"]["labels"] == {"app.kubernetes.io/name": "prometheus"}
        assert stored["metadata"]["annotations"] == {"owner": "fleet"}
        assert ("PATCH", f"/api/v1/namespaces/{NS}/configmaps/{NAME}", 200) in env.server.requests

        restoring = deployer.restore(snap, datetime.now(UTC))
        assert restoring.state is DeployState.WAITING and restoring.details["restored_identical"] is True
        restored = follow(deployer, restoring)
        assert restored.state is DeployState.DONE and restored.status == "RESTORED", restored.reason
        assert env.server.get(CONFIGMAPS, NS, NAME)["data"]["prometheus.yml"] == BASE
        assert env.config.read_bytes() == BASE.encode()
        assert remote_write_names(env.prometheus.config_text()) == []
        assert deployer.snapshot().sha256 == snap.sha256
        assert not reloader.errors
    finally:
        reloader.stop()


def test_configmap_deploy_that_never_reloads_times_out(env: Env) -> None:
    seed_configmap(env)  # no config-reloader: nothing carries the ConfigMap to the file
    deployer = ConfigMapDeployment(env.api, namespace=NS, name=NAME, entry=gpu_entry(), prometheus=env.prometheus,
                                   timeout_s=1)
    started = deployer.deploy(deployer.snapshot(), datetime.now(UTC))
    time.sleep(1.2)
    late = deployer.verify(started, datetime.now(UTC))
    assert late.state is DeployState.TIMEOUT and "missing" in late.reason


def test_configmap_409_leaves_the_other_writers_change_and_nothing_of_ours(env: Env) -> None:
    seed_configmap(env)
    reloader = ConfigReloader(env.server, namespace=NS, name=NAME, config_path=env.config,
                              prometheus_url=env.prometheus.base_url, delay_s=0.2)
    try:
        deployer = ConfigMapDeployment(env.api, namespace=NS, name=NAME, entry=gpu_entry(), prometheus=env.prometheus,
                                       timeout_s=30)
        snap = deployer.snapshot()
        theirs = BASE + "  - job_name: dcgm\r\n    static_configs: [{targets: ['127.0.0.1:2']}]\r\n"

        def their_edit(obj: dict[str, Any]) -> None:
            obj["data"]["prometheus.yml"] = theirs

        after_them = env.server.edit(CONFIGMAPS, NS, NAME, their_edit)
        with pytest.raises(DeployError, match=r"409 Conflict: configmap monitoring/k8s was changed by another "
                                              r"writer since the snapshot \(resourceVersion \d+ -> \d+, its data "
                                              r"changed\); refusing to deploy, nothing written") as err:
            deployer.deploy(snap, datetime.now(UTC))
        assert "\n" not in str(err.value)
        assert ("PATCH", f"/api/v1/namespaces/{NS}/configmaps/{NAME}", 409) in env.server.requests
        now = env.server.get(CONFIGMAPS, NS, NAME)
        assert now == after_them  # same resourceVersion: nothing was written after their edit
        assert now["data"]["prometheus.yml"] == theirs
        # The reloader applies their change, and only theirs.
        deadline = time.time() + 20
        while [j["job_name"] for j in yaml.safe_load(env.prometheus.config_text())["scrape_configs"]] != [
                "self", "dcgm"]:
            assert time.time() < deadline, "their change was never loaded"
            time.sleep(0.2)
        assert env.config.read_bytes() == theirs.encode()
        assert remote_write_names(env.prometheus.config_text()) == []
        assert reloader.applied == [theirs]
    finally:
        reloader.stop()


def test_configmap_restore_racing_another_writer_removes_only_our_entry(env: Env) -> None:
    seed_configmap(env)
    reloader = ConfigReloader(env.server, namespace=NS, name=NAME, config_path=env.config,
                              prometheus_url=env.prometheus.base_url, delay_s=0.2)
    try:
        deployer = ConfigMapDeployment(env.api, namespace=NS, name=NAME, entry=gpu_entry(), prometheus=env.prometheus,
                                       timeout_s=30)
        snap = deployer.snapshot()
        assert follow(deployer, deployer.deploy(snap, datetime.now(UTC))).state is DeployState.DONE
        theirs = remote_write_entry(group_name="team", name_regex="up", url="http://127.0.0.1:9/team")
        theirs["name"] = "team-thanos"
        raced = []

        def race(method: str, kind: str, ns: str, name: str) -> None:
            # Another writer adds its own remote_write just before our restore's first write lands.
            if not raced:
                raced.append(method)
                env.server.edit(CONFIGMAPS, NS, NAME, lambda obj: obj["data"].update(
                    {"prometheus.yml": add_remote_write(obj["data"]["prometheus.yml"], theirs)}))

        env.server.before_write = race
        restoring = deployer.restore(snap, datetime.now(UTC))
        env.server.before_write = None
        assert raced == ["PATCH"]
        assert ("PATCH", f"/api/v1/namespaces/{NS}/configmaps/{NAME}", 409) in env.server.requests
        assert restoring.details["restored_identical"] is False
        assert follow(deployer, restoring).state is DeployState.DONE
        text = env.server.get(CONFIGMAPS, NS, NAME)["data"]["prometheus.yml"]
        assert text == add_remote_write(BASE, theirs)  # their entry kept; ours, and only ours, removed
        wait_loaded(env.prometheus, ["team-thanos"])
    finally:
        reloader.stop()


CR_SPEC: dict[str, Any] = {
    "replicas": 2,
    "retention": "15d",
    "serviceMonitorSelector": {"matchLabels": {"team": "gpu"}},
    "remoteWrite": [{"url": "http://127.0.0.1:9/thanos/api/v1/receive", "name": "team-thanos",
                     "writeRelabelConfigs": [{"sourceLabels": ["__name__"], "regex": "up", "action": "keep"}]}],
}


@pytest.fixture
def operator(env: Env) -> Iterator[OperatorStandIn]:
    standin = OperatorStandIn(env.server, namespace=NS, name=NAME, base_config=OPERATOR_BASE,
                              config_path=env.config, prometheus_url=env.prometheus.base_url, delay_s=0.5)
    try:
        env.server.create(PROMETHEUSES, NS, NAME, {"metadata": {"labels": {"prometheus": "k8s"}},
                                                   "spec": copy.deepcopy(CR_SPEC)})
        wait_loaded(env.prometheus, ["team-thanos"])
        yield standin
    finally:
        standin.stop()


def cr(env: Env) -> dict[str, Any]:
    return CustomObjectsApi(env.api).get_namespaced_custom_object(CR_GROUP, CR_VERSION, NS, CR_PLURAL, NAME)


def test_cr_deploy_adds_a_sigv4_keep_filtered_entry_and_restore_leaves_the_spec_as_it_was(
        env: Env, operator: OperatorStandIn) -> None:
    entry = gpu_entry(sigv4={"region": "us-east-1"})
    deployer = PrometheusCRDeployment(env.api, namespace=NS, name=NAME, entry=entry, prometheus=env.prometheus,
                                      timeout_s=30)
    assert isinstance(deployer, ConfigDeployer)
    before = cr(env)
    snap = deployer.snapshot()
    assert snap.meta["resourceVersion"] == before["metadata"]["resourceVersion"]

    done = follow(deployer, deployer.deploy(snap, datetime.now(UTC)))
    assert done.state is DeployState.DONE and done.status == "LIVE", done.reason
    assert done.status_history[0].status == "CR_UPDATED"
    ours = cr(env)["spec"]["remoteWrite"][-1]
    assert ours == {
        "name": "promshift-gpu-memory", "url": entry["url"],
        "writeRelabelConfigs": [{"sourceLabels": ["__name__"], "regex": "DCGM_FI_DEV_FB_(FREE|USED)",
                                 "action": "keep"}],
        "sigv4": {"region": "us-east-1"},
        "queueConfig": {"maxSamplesPerSend": 1000, "maxShards": 200, "capacity": 2500},
    }
    loaded = yaml.safe_load(env.prometheus.config_text())["remote_write"]
    assert [rw["name"] for rw in loaded] == ["team-thanos", "promshift-gpu-memory"]
    assert loaded[1]["sigv4"]["region"] == "us-east-1"
    assert loaded[1]["write_relabel_configs"][0]["regex"] == "DCGM_FI_DEV_FB_(FREE|USED)"

    restored = follow(deployer, deployer.restore(snap, datetime.now(UTC)))
    assert restored.state is DeployState.DONE and restored.details["restored_identical"] is True
    after = cr(env)
    assert after["spec"] == before["spec"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert remote_write_names(env.prometheus.config_text()) == ["team-thanos"]
    assert not operator.errors


def test_cr_409_leaves_the_other_writers_change_and_nothing_of_ours(env: Env, operator: OperatorStandIn) -> None:
    deployer = PrometheusCRDeployment(env.api, namespace=NS, name=NAME, entry=gpu_entry(), prometheus=env.prometheus)
    snap = deployer.snapshot()
    theirs = {"url": "http://127.0.0.1:9/other", "name": "team-vm"}
    env.server.edit(PROMETHEUSES, NS, NAME, lambda obj: (obj["spec"]["remoteWrite"].append(theirs),
                                                         obj["spec"].update({"replicas": 3})))
    after_them = cr(env)
    with pytest.raises(DeployError, match=r"^409 Conflict: prometheus monitoring/k8s was changed by another writer"):
        deployer.deploy(snap, datetime.now(UTC))
    assert cr(env) == after_them
    assert [rw["name"] for rw in after_them["spec"]["remoteWrite"]] == ["team-thanos", "team-vm"]
    wait_loaded(env.prometheus, ["team-thanos", "team-vm"])


def test_cr_restore_after_another_writer_removes_only_our_entry(env: Env, operator: OperatorStandIn) -> None:
    deployer = PrometheusCRDeployment(env.api, namespace=NS, name=NAME, entry=gpu_entry(), prometheus=env.prometheus,
                                      timeout_s=30)
    snap = deployer.snapshot()
    assert follow(deployer, deployer.deploy(snap, datetime.now(UTC))).state is DeployState.DONE
    env.server.edit(PROMETHEUSES, NS, NAME, lambda obj: obj["spec"].update({"retention": "30d"}))
    restored = follow(deployer, deployer.restore(snap, datetime.now(UTC)))
    assert restored.state is DeployState.DONE
    spec = cr(env)["spec"]
    assert spec == {**CR_SPEC, "retention": "30d"}  # their change stays; our entry is gone
    assert remote_write_names(env.prometheus.config_text()) == ["team-thanos"]


def test_the_contract_server_rejects_invalid_bodies_and_keeps_the_object(env: Env, operator: OperatorStandIn) -> None:
    seed_configmap(env)
    core, custom = CoreV1Api(env.api), CustomObjectsApi(env.api)
    cm_before, cr_before = env.server.get(CONFIGMAPS, NS, NAME), cr(env)

    with pytest.raises(ApiException) as unknown:
        core.patch_namespaced_config_map(NAME, NS, {"dta": {"prometheus.yml": "x"}},
                                         _content_type="application/merge-patch+json")
    assert unknown.value.status == 400 and 'unknown field \\"dta\\"' in unknown.value.body
    with pytest.raises(ApiException) as bad_key:
        core.replace_namespaced_config_map(NAME, NS, {"metadata": {"name": NAME}, "data": {"prometheus yml": "x"}})
    assert bad_key.value.status == 422 and '"reason": "Invalid"' in bad_key.value.body
    with pytest.raises(ApiException) as not_a_string:
        core.patch_namespaced_config_map(NAME, NS, {"data": {"prometheus.yml": 5}},
                                         _content_type="application/merge-patch+json")
    assert not_a_string.value.status == 400
    with pytest.raises(ApiException) as strategic:  # custom resources take no strategic merge patch
        custom.patch_namespaced_custom_object(CR_GROUP, CR_VERSION, NS, CR_PLURAL, NAME, {"spec": {"replicas": 1}},
                                              _content_type="application/strategic-merge-patch+json")
    assert strategic.value.status == 415
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("nope", NS)
    assert missing.value.status == 404 and '"reason": "NotFound"' in missing.value.body

    with pytest.raises(ApiException) as typo:
        custom.patch_namespaced_custom_object(CR_GROUP, CR_VERSION, NS, CR_PLURAL, NAME, {"spec": {"remoteWrite": [
            {"url": "http://x", "writeRelabelConfig": []}]}})
    assert typo.value.status == 400 and "writeRelabelConfig" in typo.value.body
    with pytest.raises(ApiException) as no_url:
        custom.patch_namespaced_custom_object(CR_GROUP, CR_VERSION, NS, CR_PLURAL, NAME, {"spec": {"remoteWrite": [
            {"name": "x"}]}})
    assert no_url.value.status == 422 and "spec.remoteWrite[0].url: Required value" in no_url.value.body

    # Through our own deployer: an entry with a field RemoteWriteSpec lacks is refused, nothing written.
    bad = {**gpu_entry(), "send_exemplar": True}
    deployer = PrometheusCRDeployment(env.api, namespace=NS, name=NAME, entry=bad, prometheus=env.prometheus)
    with pytest.raises(DeployError, match=r"HTTP 400 .*unknown field \"spec.remoteWrite\[1\].sendExemplar\"; "
                                          r"nothing deployed"):
        deployer.deploy(deployer.snapshot(), datetime.now(UTC))

    assert env.server.get(CONFIGMAPS, NS, NAME) == cm_before
    assert cr(env) == cr_before


def test_the_deployer_works_through_the_providers_kubernetes_hook(env: Env, tmp_path: Path) -> None:
    """What production passes: the pinned cncf-kubernetes provider's KubernetesHook (here from a kubeconfig)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    seed_configmap(env)
    kubeconfig = tmp_path / "kubeconfig.json"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": env.server.base_url}}],
        "users": [{"name": "promshift", "user": {"token": "local-only"}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "promshift"}}]}))
    hook = KubernetesHook(conn_id=None, config_file=str(kubeconfig), in_cluster=False)
    reloader = ConfigReloader(env.server, namespace=NS, name=NAME, config_path=env.config,
                              prometheus_url=env.prometheus.base_url, delay_s=0.2)
    try:
        deployer = ConfigMapDeployment(hook, namespace=NS, name=NAME, entry=gpu_entry(), prometheus=env.prometheus,
                                       timeout_s=30)
        snap = deployer.snapshot()
        assert follow(deployer, deployer.deploy(snap, datetime.now(UTC))).state is DeployState.DONE
        assert remote_write_names(env.prometheus.config_text()) == ["promshift-gpu-memory"]
        assert follow(deployer, deployer.restore(snap, datetime.now(UTC))).state is DeployState.DONE
        assert env.config.read_bytes() == BASE.encode()
    finally:
        reloader.stop()


@contextlib.contextmanager
def cr_steps(env: Env, tmp_path: Path) -> Iterator[tuple[Any, Any, Any, Any]]:
    """Source extra {deploy: k8s-cr, kubernetes: {...}} -> KubernetesHook -> CR deployer, in the migration's steps.

    Yields (step, deployer, migration, audit)."""
    from promshift.adapters.audit_store import AuditStore
    from promshift.adapters.k8s_deploy import kubernetes_deployer
    from promshift.adapters.routing import RoutingStore
    from promshift.adapters.settings import load_catalog
    from promshift.core.deploy_kinds import deploy_kind_of, kubernetes_source_of
    from promshift.orchestration.hooks import kubernetes_hook
    from promshift.steps.deploy import DeployStep
    from promshift.steps.migration import Backends

    kubeconfig = tmp_path / "kubeconfig.json"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": env.server.base_url}}],
        "users": [{"name": "promshift", "user": {"token": "local-only"}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "promshift"}}]}))
    source_extra = {"deploy": "k8s-cr", "kubernetes": {"namespace": NS, "name": NAME, "config_file": str(kubeconfig),
                                                       "timeout_s": 30}}
    assert deploy_kind_of({}, conn_id="promshift_target", is_amp=True, source_extra=source_extra) == "k8s-cr"
    source = kubernetes_source_of(source_extra)
    assert source is not None
    group = load_catalog(profile="demo").get("gpu-memory")
    entry = remote_write_entry(group_name=group.name, name_regex=group.name_regex(),
                               url="http://127.0.0.1:9/workspaces/ws-1/api/v1/remote_write",
                               sigv4={"region": "us-east-1"})
    deployer = kubernetes_deployer(source.kind, kubernetes_hook(source), namespace=source.namespace, name=source.name,
                                   entry=entry, prometheus=env.prometheus, timeout_s=source.timeout_s)
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    try:
        backends = Backends(source=env.prometheus, target=PrometheusClient("http://127.0.0.1:1"),
                            source_config_path=str(env.config), target_remote_write_url="")
        migration = compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url),
                                   snapshots_dir=tmp_path, run_id="manual__k8s")
        yield DeployStep(migration, deployer, InMemorySnapshotStore(), quota=None), deployer, migration, audit
    finally:
        audit.engine.dispose()


def test_the_migration_steps_drive_the_cr_deployer_chosen_by_the_source_connection(
        env: Env, operator: OperatorStandIn, tmp_path: Path) -> None:
    """The same steps and audit as the managed collector: dual-writing once loaded, rolled back with the spec
    as it was."""
    from promshift.core.stages import Stage
    from promshift.steps.deploy import final_event

    with cr_steps(env, tmp_path) as (step, deployer, migration, audit):
        spec_before = cr(env)["spec"]
        info = step.snapshot(datetime.now(UTC))
        started = DeployResult.from_dict(step.start(info, datetime.now(UTC))["deploy"])
        out = step.finish(final_event(follow(deployer, started)), None, datetime.now(UTC))
        assert migration.stage() == Stage.DUAL_WRITING and out["remote_write"] == "promshift-gpu-memory"
        assert out["deploy"]["kind"] == "k8s-cr" and out["deploy"]["status_history"][-1]["status"] == "LIVE"
        assert remote_write_names(env.prometheus.config_text()) == ["team-thanos", "promshift-gpu-memory"]

        reason = "test: the gate failed"
        restoring = step.restore(info, reason=reason, now=datetime.now(UTC))
        evidence = step.finish_rollback(final_event(follow(deployer, restoring)), info, reason=reason,
                                        now=datetime.now(UTC))
        assert evidence["restored_identical"] is True and migration.stage() == Stage.ROLLED_BACK
        assert cr(env)["spec"] == spec_before
        assert remote_write_names(env.prometheus.config_text()) == ["team-thanos"]
        assert [e.kind for e in audit.events(group="gpu-memory")] == ["snapshot_taken", "dual_write_deployed",
                                                                      "rolled_back"]
        assert audit.verify().ok


def test_a_409_through_the_steps_is_audited_and_deploys_nothing(
        env: Env, operator: OperatorStandIn, tmp_path: Path) -> None:
    from promshift.steps.deploy import DeployStepFailed

    with cr_steps(env, tmp_path) as (step, _deployer, migration, audit):
        info = step.snapshot(datetime.now(UTC))
        env.server.edit(PROMETHEUSES, NS, NAME, lambda obj: obj["spec"].update({"replicas": 5}))
        theirs = cr(env)
        with pytest.raises(DeployStepFailed, match="^409 Conflict: prometheus monitoring/k8s was changed"):
            step.start(info, datetime.now(UTC))
        assert cr(env) == theirs
        events = audit.events(group="gpu-memory")
        assert [e.kind for e in events] == ["snapshot_taken", "deploy_failed"]
        assert "409 Conflict" in events[-1].evidence_data["reason"]
        assert migration.failure_reason().startswith("deploy failed: 409 Conflict")
        assert remote_write_names(env.prometheus.config_text()) == ["team-thanos"]


def test_the_dags_tasks_deploy_through_the_cr_and_roll_back_deferring_on_the_loaded_config(
        env: Env, operator: OperatorStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source connection says k8s-cr: the DAG's snapshot, deploy_dual_write and rollback tasks go through the
    CR deployer (KubernetesHook from a kubeconfig), defer on LoadedConfigTrigger, and leave the spec as it was."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred

    from promshift.adapters.audit_store import AuditStore
    from promshift.adapters.settings import default_catalog_path, load_catalog
    from promshift.core.stages import Stage
    from promshift.local.group_dag import build_group_dag
    from promshift.orchestration.triggers import LoadedConfigTrigger
    from tests.fakes import FakeTI, fed

    kubeconfig = tmp_path / "kubeconfig.json"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": env.server.base_url}}],
        "users": [{"name": "promshift", "user": {"token": "local-only"}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "promshift"}}]}))
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'dag-audit.db'}")
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": env.prometheus.base_url,
        "extra": {"deploy": "k8s-cr", "kubernetes": {"namespace": NS, "name": NAME, "config_file": str(kubeconfig),
                                                     "timeout_s": 30}}}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:9",
        "extra": {"remote_write_url": "http://127.0.0.1:9/api/v1/write"}}))
    group = load_catalog(profile="demo").get("gpu-memory")
    dag = build_group_dag(group, catalog_path=default_catalog_path(), profile="demo")
    context = {"run_id": "manual__k8s-dag", "ti": FakeTI()}
    spec_before = cr(env)["spec"]

    def first_event(trigger: LoadedConfigTrigger) -> dict[str, Any]:
        trigger.poll_interval_s = 0.2

        async def run() -> dict[str, Any]:
            async for event in trigger.run():
                return dict(event.payload)
            raise AssertionError("the trigger ended without an event")

        return asyncio.run(run())

    snap = dag.get_task("snapshot").execute(context)
    assert snap["kind"] == "k8s-cr"
    deploy = fed(dag, "deploy_dual_write", snapshot=snap)
    with pytest.raises(TaskDeferred) as deferred:
        deploy.execute(context)
    assert isinstance(deferred.value.trigger, LoadedConfigTrigger)
    assert deferred.value.kwargs["quota"] is None  # a plain Prometheus target: no AMP quota to check
    event = first_event(deferred.value.trigger)
    assert event["status"] == "done", event
    deployed = deploy.execute_complete(context, event, **deferred.value.kwargs)
    assert deployed["deploy"]["status_history"][-1]["status"] == "LIVE"
    assert remote_write_names(env.prometheus.config_text()) == ["team-thanos", "promshift-gpu-memory"]
    [ours] = [e for e in cr(env)["spec"]["remoteWrite"] if e.get("name") == "promshift-gpu-memory"]
    assert ours["url"] == "http://127.0.0.1:9/api/v1/write" and ours["writeRelabelConfigs"][0]["action"] == "keep"

    audit = AuditStore()
    try:
        assert audit.stage_of(group.name) == Stage.DUAL_WRITING
        rollback = fed(dag, "rollback", snapshot=snap)
        with pytest.raises(TaskDeferred) as deferred:
            rollback.execute(context)
        event = first_event(deferred.value.trigger)
        evidence = rollback.execute_complete(context, event, **deferred.value.kwargs)
        assert evidence["restored_identical"] is True
        assert audit.stage_of(group.name) == Stage.ROLLED_BACK
        assert cr(env)["spec"] == spec_before
        assert remote_write_names(env.prometheus.config_text()) == ["team-thanos"]
    finally:
        audit.engine.dispose()
