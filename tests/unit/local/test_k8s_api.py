"""The local Kubernetes API contract server's checks: they must refuse what the real API refuses.

Validation functions are called directly; the server's resourceVersion, 404/409/415 and Status answers
are exercised over HTTP with the ``kubernetes`` client (no Prometheus involved).
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from promshift.adapters.k8s_deploy import (
    RESTORE_ATTEMPTS,
    ConfigMapDeployment,
    PrometheusCRDeployment,
    api_client_of,
    config_remote_write_entry,
    cr_remote_write_entry,
)
from promshift.core.deploy import DeployError, DeployState, InMemorySnapshotStore
from promshift.core.render import add_remote_write, remote_write_entry
from promshift.local.stack.k8s_api import (
    CONFIGMAP_MAX_BYTES,
    CONFIGMAPS,
    PROMETHEUSES,
    ApiRefusal,
    K8sApiServer,
    check_model,
    merge_patch,
    validate_configmap,
    validate_prometheus,
)

CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prom", "namespace": "monitoring",
                                                            "labels": {"app": "prometheus"}},
      "data": {"prometheus.yml": "global: {}\n"}}
RW = {"url": "http://127.0.0.1:9/write", "name": "promshift-gpu",
      "writeRelabelConfigs": [{"sourceLabels": ["__name__"], "regex": "DCGM_.*", "action": "keep"}],
      "sigv4": {"region": "us-east-1", "roleArn": "arn:aws:iam::123456789012:role/x"},
      "queueConfig": {"maxSamplesPerSend": 1000, "maxShards": 200, "capacity": 2500}}
CR = {"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus", "metadata": {"name": "k8s"},
      "spec": {"replicas": 2, "remoteWrite": [RW]}}


def refused(call: Any, *args: Any) -> ApiRefusal:
    with pytest.raises(ApiRefusal) as exc:
        call(*args)
    return exc.value


def cm_with(**changes: Any) -> dict[str, Any]:
    obj = copy.deepcopy(CM)
    obj.update(changes)
    return obj


def test_a_valid_configmap_passes() -> None:
    validate_configmap(copy.deepcopy(CM), "monitoring", "prom")


@pytest.mark.parametrize(("body", "code", "text"), [
    (cm_with(dta={"a": "b"}), 400, 'unknown field "dta"'),
    (cm_with(metadata={"name": "prom", "labelz": {}}), 400, 'unknown field "metadata.labelz"'),
    (cm_with(data={"prometheus.yml": 5}), 400, "into data[prometheus.yml] of type string"),
    (cm_with(data=["prometheus.yml"]), 400, "into data of type object"),
    (cm_with(metadata={"name": "other"}), 400, "does not match the name on the URL (prom)"),
    (cm_with(metadata={"name": "prom", "namespace": "default"}), 400, "namespace"),
    (cm_with(kind="Secret"), 400, "kind 'Secret' does not match"),
    (cm_with(data={"prometheus yml": "x"}), 422, "data[prometheus yml]: Invalid value"),
    (cm_with(data={"prometheus.yml": "x" * CONFIGMAP_MAX_BYTES}), 422, "Too long"),
    (cm_with(data={"k": "a"}, binaryData={"k": "YQ=="}), 422, "duplicate of key present in data"),
    # The model's own required-field check (V1OwnerReference needs apiVersion, kind, name and uid).
    (cm_with(metadata={"name": "prom", "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p"}]}),
     422, "uid"),
])
def test_configmap_refusals(body: dict[str, Any], code: int, text: str) -> None:
    err = refused(validate_configmap, body, "monitoring", "prom")
    assert err.code == code and text in err.message


def test_check_model_walks_nested_models_lists_and_maps() -> None:
    check_model({"metadata": {"name": "x", "ownerReferences": [{"uid": "1", "name": "n", "kind": "k",
                                                                "apiVersion": "v1"}]}}, "V1ConfigMap")
    err = refused(check_model, {"metadata": {"ownerReferences": [{"uidd": "1"}]}}, "V1ConfigMap")
    assert 'unknown field "metadata.ownerReferences[0].uidd"' in err.message
    assert refused(check_model, {"immutable": "yes"}, "V1ConfigMap").code == 400


def test_a_valid_prometheus_cr_passes() -> None:
    validate_prometheus(copy.deepcopy(CR), "monitoring", "k8s")
    validate_prometheus({"metadata": {"name": "k8s"}, "spec": {"replicas": 1}}, "monitoring", "k8s")


def cr_with_entry(**entry: Any) -> dict[str, Any]:
    obj = copy.deepcopy(CR)
    obj["spec"]["remoteWrite"] = [{**copy.deepcopy(RW), **entry}]
    return obj


@pytest.mark.parametrize(("body", "code", "text"), [
    (cr_with_entry(writeRelabelConfig=[]), 400, 'unknown field "spec.remoteWrite[0].writeRelabelConfig"'),
    (cr_with_entry(write_relabel_configs=[]), 400, "write_relabel_configs"),
    (cr_with_entry(sigv4={"regoin": "us-east-1"}), 400, 'unknown field "spec.remoteWrite[0].sigv4.regoin"'),
    (cr_with_entry(queueConfig={"max_shards": 1}), 400, "queueConfig.max_shards"),
    (cr_with_entry(writeRelabelConfigs=[{"source_labels": ["__name__"]}]), 400,
     "writeRelabelConfigs[0].source_labels"),
    (cr_with_entry(writeRelabelConfigs=[{"action": "keepit"}]), 422, "action: Unsupported value"),
    (cr_with_entry(url=""), 422, "spec.remoteWrite[0].url: Required value"),
    (cr_with_entry(writeRelabelConfigs={"action": "keep"}), 400, "of type array"),
    ({**CR, "spac": {}}, 400, 'unknown field "spac"'),
    ({**CR, "metadata": {"name": "k8s", "label": {}}}, 400, 'unknown field "metadata.label"'),
    ({**CR, "apiVersion": "monitoring.coreos.com/v1alpha1"}, 400, "apiVersion"),
    ({**CR, "spec": {"remoteWrite": {"url": "x"}}}, 400, "spec.remoteWrite of type array"),
])
def test_prometheus_cr_refusals(body: dict[str, Any], code: int, text: str) -> None:
    err = refused(validate_prometheus, body, "monitoring", "k8s")
    assert err.code == code and text in err.message


def test_duplicate_remote_write_names_are_invalid() -> None:
    obj = copy.deepcopy(CR)
    obj["spec"]["remoteWrite"].append(copy.deepcopy(RW))
    err = refused(validate_prometheus, obj, "monitoring", "k8s")
    assert err.code == 422 and "Duplicate value" in err.message


def test_merge_patch_is_rfc_7386() -> None:
    target = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert merge_patch(target, {"a": {"c": [3], "b": None}, "e": "x"}) == {"a": {"c": [3]}, "d": 1, "e": "x"}
    assert target == {"a": {"b": 1, "c": [1, 2]}, "d": 1}


def test_our_entry_in_both_spellings_round_trips() -> None:
    entry = remote_write_entry(group_name="gpu", name_regex="DCGM_.*", url="http://127.0.0.1:9/w",
                               sigv4={"region": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/x"})
    cr_entry = cr_remote_write_entry(entry)
    assert cr_entry == {**RW, "name": "promshift-gpu", "url": "http://127.0.0.1:9/w"}
    validate_prometheus({**CR, "spec": {"remoteWrite": [cr_entry]}}, "monitoring", "k8s")
    assert config_remote_write_entry(cr_entry) == entry


def test_api_client_of_takes_a_client_or_a_hook_and_nothing_else() -> None:
    client = ApiClient(Configuration(host="http://127.0.0.1:1"))

    class Hook:
        def get_conn(self) -> ApiClient:
            return client

    assert api_client_of(client) is client and api_client_of(Hook()) is client
    with pytest.raises(TypeError, match="KubernetesHook"):
        api_client_of(object())


@pytest.fixture
def server() -> Iterator[K8sApiServer]:
    with K8sApiServer() as srv:
        srv.create(CONFIGMAPS, "monitoring", "prom", copy.deepcopy(CM))
        srv.create(PROMETHEUSES, "monitoring", "k8s", copy.deepcopy(CR))
        yield srv


def api(server: K8sApiServer) -> ApiClient:
    return ApiClient(Configuration(host=server.base_url))


def test_every_write_bumps_the_resource_version_and_a_stale_one_is_a_409(server: K8sApiServer) -> None:
    core = CoreV1Api(api(server))
    first = core.read_namespaced_config_map("prom", "monitoring")
    body = {"metadata": {"name": "prom", "resourceVersion": first.metadata.resource_version},
            "data": {"prometheus.yml": "a: 1\n"}}
    second = core.replace_namespaced_config_map("prom", "monitoring", body)
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert second.metadata.labels is None  # a PUT replaces the whole object
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_config_map("prom", "monitoring", {**body, "data": {"prometheus.yml": "b: 2\n"}})
    status = json.loads(stale.value.body)
    assert stale.value.status == 409 and status["kind"] == "Status" and status["reason"] == "Conflict"
    with pytest.raises(ApiException) as stale_patch:
        core.patch_namespaced_config_map("prom", "monitoring", {"metadata": body["metadata"], "data": {"x": "y"}},
                                         _content_type="application/merge-patch+json")
    assert stale_patch.value.status == 409
    assert server.get(CONFIGMAPS, "monitoring", "prom")["data"] == {"prometheus.yml": "a: 1\n"}
    # Without a resourceVersion a ConfigMap update is unconditional, as on the real API.
    third = core.patch_namespaced_config_map("prom", "monitoring", {"data": {"x": "y"}})  # strategic merge
    assert third.data == {"prometheus.yml": "a: 1\n", "x": "y"}


def test_a_refused_patch_leaves_the_object_and_its_version_untouched(server: K8sApiServer) -> None:
    custom = CustomObjectsApi(api(server))
    before = server.get(PROMETHEUSES, "monitoring", "k8s")
    with pytest.raises(ApiException) as bad:
        custom.patch_namespaced_custom_object("monitoring.coreos.com", "v1", "monitoring", "prometheuses", "k8s",
                                              {"spec": {"remoteWrite": [{"name": "no-url"}]}})
    assert bad.value.status == 422
    assert server.get(PROMETHEUSES, "monitoring", "k8s") == before


def test_missing_objects_paths_and_patch_types(server: K8sApiServer) -> None:
    core, custom = CoreV1Api(api(server)), CustomObjectsApi(api(server))
    with pytest.raises(ApiException) as missing:
        custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", "monitoring", "prometheuses", "nope")
    assert missing.value.status == 404
    assert json.loads(missing.value.body)["message"] == 'prometheuses.monitoring.coreos.com "nope" not found'
    with pytest.raises(ApiException) as put_missing:
        core.replace_namespaced_config_map("nope", "monitoring", {"metadata": {"name": "nope"}})
    assert put_missing.value.status == 404
    with pytest.raises(ApiException) as json_patch:
        core.patch_namespaced_config_map("prom", "monitoring", [{"op": "remove", "path": "/data"}])
    assert json_patch.value.status == 415
    with pytest.raises(urllib.error.HTTPError) as unserved:
        urllib.request.urlopen(f"{server.base_url}/api/v1/namespaces/monitoring/secrets/x", timeout=5)
    assert unserved.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as not_json:
        urllib.request.urlopen(urllib.request.Request(f"{server.base_url}/api/v1/namespaces/monitoring/configmaps/prom",
                                                      data=b"{", method="PUT"), timeout=5)
    assert not_json.value.code == 400


def test_watchers_see_each_stored_write_and_not_a_refused_one(server: K8sApiServer) -> None:
    seen: list[tuple[str, str]] = []
    server.watchers.append(lambda kind, ns, name, obj: seen.append((kind, obj["metadata"]["resourceVersion"])))
    core = CoreV1Api(api(server))
    with pytest.raises(ApiException):
        core.patch_namespaced_config_map("prom", "monitoring", {"data": {"bad key": "x"}})
    stored = core.patch_namespaced_config_map("prom", "monitoring", {"data": {"good": "x"}})
    assert seen == [(CONFIGMAPS, stored.metadata.resource_version)]


# -- the deployers against the contract server (a fake Prometheus: verify's logic only) ---------------------------

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


class FakePrometheus:
    base_url = "http://127.0.0.1:1"

    def __init__(self) -> None:
        self.names: list[str] = []

    def config_text(self) -> str:
        return "remote_write:\n" + "".join(f"  - name: {n}\n    url: http://x\n" for n in self.names) \
            if self.names else "global: {}\n"


def gpu() -> dict[str, Any]:
    return remote_write_entry(group_name="gpu", name_regex="DCGM_.*", url="http://127.0.0.1:9/w")


def cm_deployer(server: K8sApiServer, prom: FakePrometheus | None = None, **kw: Any) -> ConfigMapDeployment:
    return ConfigMapDeployment(api(server), namespace="monitoring", name="prom", entry=gpu(),
                               prometheus=prom or FakePrometheus(), **kw)  # type: ignore[arg-type]


def cr_deployer(server: K8sApiServer, prom: FakePrometheus | None = None, **kw: Any) -> PrometheusCRDeployment:
    return PrometheusCRDeployment(api(server), namespace="monitoring", name="k8s", entry=gpu(),
                                  prometheus=prom or FakePrometheus(), **kw)  # type: ignore[arg-type]


def test_a_retried_configmap_deploy_recognises_its_own_write(server: K8sApiServer) -> None:
    deployer = cm_deployer(server)
    store = InMemorySnapshotStore()
    ref = store.put("gpu", "run-1", deployer.snapshot())
    first = deployer.deploy(store.get(ref), T0)
    after_first = server.get(CONFIGMAPS, "monitoring", "prom")
    again = deployer.deploy(store.get(ref), T0)  # stale resourceVersion, but the live text is ours
    assert again.state is DeployState.WAITING and again.details["resource_version"] == first.details["resource_version"]
    assert server.get(CONFIGMAPS, "monitoring", "prom") == after_first
    assert after_first["data"]["prometheus.yml"] == add_remote_write(CM["data"]["prometheus.yml"], gpu())


def test_a_configmap_whose_entry_differs_is_refused_before_any_write(server: K8sApiServer) -> None:
    server.edit(CONFIGMAPS, "monitoring", "prom", lambda obj: obj["data"].update(
        {"prometheus.yml": add_remote_write(obj["data"]["prometheus.yml"], {**gpu(), "url": "http://other"})}))
    before = server.get(CONFIGMAPS, "monitoring", "prom")
    deployer = cm_deployer(server)
    with pytest.raises(DeployError, match="configmap monitoring/prom: .*promshift-gpu"):
        deployer.deploy(deployer.snapshot(), T0)
    assert server.get(CONFIGMAPS, "monitoring", "prom") == before


def test_verify_waits_until_the_entry_is_loaded_and_times_out_at_the_deadline(server: K8sApiServer) -> None:
    prom = FakePrometheus()
    deployer = cm_deployer(server, prom, timeout_s=60)
    started = deployer.deploy(deployer.snapshot(), T0)
    waiting = deployer.verify(started, T0 + timedelta(seconds=59))
    assert waiting.state is DeployState.WAITING
    assert deployer.verify(waiting, T0 + timedelta(seconds=60)).state is DeployState.TIMEOUT
    prom.names = ["promshift-gpu"]
    live = deployer.verify(waiting, T0 + timedelta(seconds=30))
    assert live.state is DeployState.DONE and [c.status for c in live.status_history] == [
        "CONFIGMAP_UPDATED", "WAITING_FOR_RELOAD", "LIVE"]
    assert deployer.verify(live, T0 + timedelta(days=1)) is live  # final results are not observed again
    restoring = deployer.restore(deployer.snapshot(), T0)  # our entry is still in the ConfigMap -> written back
    assert deployer.verify(restoring, T0).state is DeployState.WAITING  # still loaded
    prom.names = []
    assert deployer.verify(restoring, T0).status == "RESTORED"


def test_a_restore_that_always_races_gives_up_with_a_clear_error(server: K8sApiServer) -> None:
    deployer = cm_deployer(server)
    snap = deployer.snapshot()
    deployer.deploy(snap, T0)
    writes: list[str] = []

    def always(method: str, kind: str, ns: str, name: str) -> None:
        writes.append(method)
        server.edit(CONFIGMAPS, ns, name, lambda obj: obj["metadata"].setdefault("annotations", {}).update(
            {"n": str(len(writes))}))

    server.before_write = always
    with pytest.raises(DeployError, match=f"kept changing under {RESTORE_ATTEMPTS} restores"):
        deployer.restore(snap, T0)
    assert len(writes) == RESTORE_ATTEMPTS


def test_cr_deploy_refuses_a_different_entry_of_our_name_and_keeps_the_same_one(server: K8sApiServer) -> None:
    before = server.get(PROMETHEUSES, "monitoring", "k8s")
    assert before["spec"]["remoteWrite"][0]["name"] == "promshift-gpu"  # seeded with other settings than ours
    deployer = cr_deployer(server)
    with pytest.raises(DeployError, match="already has a different remoteWrite promshift-gpu; editing a live queue"):
        deployer.deploy(deployer.snapshot(), T0)
    assert server.get(PROMETHEUSES, "monitoring", "k8s") == before

    server.edit(PROMETHEUSES, "monitoring", "k8s", lambda obj: obj["spec"].update({"remoteWrite": []}))
    snap = deployer.snapshot()
    deployer.deploy(snap, T0)
    deployed = server.get(PROMETHEUSES, "monitoring", "k8s")
    again = deployer.deploy(deployer.snapshot(), T0)  # a retry after the deploy: no second write
    assert server.get(PROMETHEUSES, "monitoring", "k8s") == deployed
    assert again.state is DeployState.WAITING and deployed["spec"]["remoteWrite"] == [cr_remote_write_entry(gpu())]
    stale = deployer.deploy(snap, T0)  # the first snapshot again: 409, but the live list is what we wrote
    assert stale.details["resource_version"] == deployed["metadata"]["resourceVersion"]


def test_cr_restore_removes_the_key_it_added_and_writes_nothing_when_nothing_of_ours_is_left(
        server: K8sApiServer) -> None:
    server.edit(PROMETHEUSES, "monitoring", "k8s", lambda obj: obj["spec"].pop("remoteWrite"))
    deployer = cr_deployer(server)
    snap = deployer.snapshot()
    assert snap.content == "" and snap.meta["has_remote_write"] is False
    deployer.deploy(snap, T0)
    assert [e["name"] for e in server.get(PROMETHEUSES, "monitoring", "k8s")["spec"]["remoteWrite"]] == [
        "promshift-gpu"]
    restored = deployer.restore(snap, T0)
    after = server.get(PROMETHEUSES, "monitoring", "k8s")
    assert "remoteWrite" not in after["spec"] and restored.details["restored_identical"] is True
    again = deployer.restore(snap, T0)
    assert server.get(PROMETHEUSES, "monitoring", "k8s") == after  # no write: resourceVersion unchanged
    assert again.details["restored_identical"] is True


def test_an_unreachable_api_is_a_one_line_deploy_error() -> None:
    with K8sApiServer() as srv:
        client = api(srv)
    deployer = ConfigMapDeployment(client, namespace="monitoring", name="prom", entry=gpu(),
                                   prometheus=FakePrometheus())  # type: ignore[arg-type]
    with pytest.raises(DeployError, match="cannot reach the Kubernetes API for configmap monitoring/prom"):
        deployer.snapshot()


def test_an_immutable_configmap_refuses_our_deploy_and_keeps_its_data(server: K8sApiServer) -> None:
    server.edit(CONFIGMAPS, "monitoring", "prom", lambda obj: obj.update({"immutable": True}))
    before = server.get(CONFIGMAPS, "monitoring", "prom")
    deployer = cm_deployer(server)
    with pytest.raises(DeployError, match=r"^writing configmap monitoring/prom failed: HTTP 422 .*field is immutable "
                                          r"when `immutable` is set; nothing deployed$"):
        deployer.deploy(deployer.snapshot(), T0)
    assert server.get(CONFIGMAPS, "monitoring", "prom") == before


# -- retire: PrometheusAgent, create and delete (what the real API refuses) ----------------------------------------

AGENT_PATH = ("monitoring.coreos.com", "v1alpha1", "monitoring", "prometheusagents")


def agent_body(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "monitoring.coreos.com/v1alpha1", "kind": "PrometheusAgent",
            "metadata": {"name": "k8s", "namespace": "monitoring"}, "spec": {"remoteWrite": [RW], **spec}}


@pytest.mark.parametrize("field", ["ruleSelector", "alerting", "retention", "evaluationInterval", "remoteRead",
                                   "thanos", "query"])
def test_a_prometheus_agent_with_a_server_only_field_is_refused_as_unknown(server: K8sApiServer, field: str) -> None:
    custom = CustomObjectsApi(api(server))
    with pytest.raises(ApiException) as exc:
        custom.create_namespaced_custom_object(*AGENT_PATH, agent_body(**{field: {}}))
    assert exc.value.status == 400 and f'unknown field \\"spec.{field}\\"' in exc.value.body
    with pytest.raises(ApiException) as missing:  # nothing was stored
        custom.get_namespaced_custom_object(*AGENT_PATH[:3], "prometheusagents", "k8s")
    assert missing.value.status == 404


def test_creates_and_deletes_answer_as_the_api_does(server: K8sApiServer) -> None:
    custom = CustomObjectsApi(api(server))
    seen: list[tuple[str, bool]] = []
    server.watchers.append(lambda kind, ns, name, obj: seen.append((kind, obj is None)))
    created = custom.create_namespaced_custom_object(*AGENT_PATH, agent_body(mode="StatefulSet",
                                                                            replicas=1))
    assert created["metadata"]["uid"] and created["metadata"]["creationTimestamp"]
    assert created["metadata"]["resourceVersion"]
    for body, status, text in (
            (agent_body(), 409, 'prometheusagents.monitoring.coreos.com \\"k8s\\" already exists'),
            ({**agent_body(), "metadata": {"namespace": "monitoring"}}, 422, "name or generateName is required"),
            (agent_body(mode="Deployment"), 422, "spec.mode: Unsupported value"),
            ({**agent_body(), "metadata": {"name": "other", "resourceVersion": "7"}}, 500,
             "resourceVersion should not be set on objects to be created"),
            ({**agent_body(), "metadata": {"name": "other", "namespace": "elsewhere"}}, 400,
             "does not match the namespace")):
        with pytest.raises(ApiException) as exc:
            custom.create_namespaced_custom_object(*AGENT_PATH, body)
        assert exc.value.status == status and text in exc.value.body, (status, exc.value.body)
    custom.delete_namespaced_custom_object("monitoring.coreos.com", "v1", "monitoring", "prometheuses", "k8s")
    with pytest.raises(ApiException) as gone:
        custom.delete_namespaced_custom_object("monitoring.coreos.com", "v1", "monitoring", "prometheuses", "k8s")
    assert gone.value.status == 404
    with pytest.raises(ApiException) as not_allowed:  # only the two the retire switch uses may be deleted
        CoreV1Api(api(server)).delete_namespaced_config_map("prom", "monitoring")
    assert not_allowed.value.status == 405
    assert seen == [("prometheusagents", False), ("prometheuses", True)]
