"""Rules read from and written back to a ``PrometheusRule`` (issue 37 item 6), on the Kubernetes contract server.

The contract server (``local/stack/k8s_api.py``) checks every ``PrometheusRule`` body against prometheus-operator's
field names and honours ``resourceVersion``; its rule-file stand-in writes each object's spec as the rule file a real
Prometheus reads (as the operator and its reloader would) and reloads it, so the move's proof is the real
``/api/v1/rules``. ``deploy/alerts`` ships its rules as a ``PrometheusRule`` that this server accepts. The last test
drives the migration's own rules move, chosen by the source connection's ``extra.kubernetes.prometheus_rules``, onto a
real target Prometheus and back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient, Configuration, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from promshift.adapters.k8s_rules import CR_GROUP, CR_VERSION, RULES_PLURAL, PrometheusRuleSource, spec_text
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.rules_deploy import loaded_rules
from promshift.core.deploy import DeployError
from promshift.local.stack.k8s_api import PROMETHEUSRULES, K8sApiServer, RuleFilesStandIn
from promshift.local.stack.local import PROMETHEUS_BIN, find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess
from promshift.orchestration.wiring import GroupWiring

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NS, NAME = "monitoring", "gpu-rules"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
# A fleet team's rules: the group's (DCGM_FI_DEV_FB_*) among others, with labels and annotations that must survive.
SPEC = {"groups": [
    {"name": "gpu-memory", "interval": "30s", "rules": [
        {"record": "gpu:fb_used:sum", "expr": "sum by (Hostname) (DCGM_FI_DEV_FB_USED)", "labels": {"team": "gpu"}},
        {"alert": "GpuMemoryFull", "expr": "DCGM_FI_DEV_FB_FREE < 512", "for": "5m",
         "labels": {"severity": "page"}, "annotations": {"summary": "{{ $labels.Hostname }}: GPU memory 'full'"}},
        {"record": "node:up:sum", "expr": "sum(up)"},
    ]},
    {"name": "fleet", "rules": [{"alert": "FleetDown", "expr": "up == 0", "labels": {"severity": "ticket"}}]},
]}


def claims(metric: str) -> bool:
    return metric.startswith("DCGM_FI_DEV_FB_")


@dataclass
class Env:
    server: K8sApiServer
    api: ApiClient
    prometheus: PrometheusClient


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    if not Path(PROMETHEUS_BIN).exists():
        pytest.skip("Prometheus is not installed (apt-get install -y prometheus)")
    rules = tmp_path / "rules"
    rules.mkdir()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 5s, evaluation_interval: 5s}\nrule_files: ['rules/*.yaml']\n")
    with PrometheusProcess("prometheus", tmp_path, port=find_free_ports(1)[0], config=cfg,
                           data_dir=tmp_path / "data", flags=("--web.enable-lifecycle",)) as prometheus:
        client = PrometheusClient(prometheus.url, timeout_s=30)
        server = K8sApiServer().start()
        stand_in = RuleFilesStandIn(server, namespace=NS, name=NAME, rules_dir=rules, prometheus_url=prometheus.url,
                                    delay_s=0.2)
        try:
            server.create(PROMETHEUSRULES, NS, NAME, {"metadata": {"labels": {"release": "kps"}}, "spec": SPEC})
            wait_loaded(client, 4)
            yield Env(server, ApiClient(Configuration(host=server.base_url)), client)
        finally:
            stand_in.stop()
            server.stop()


def wait_loaded(client: PrometheusClient, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(loaded_rules(client)) != count:
        assert time.monotonic() < deadline, f"the source never loaded {count} rules: {loaded_rules(client)}"
        time.sleep(0.2)


def stored(env: Env) -> dict[str, Any]:
    return env.server.get(PROMETHEUSRULES, NS, NAME)


def test_the_groups_rules_move_out_of_the_prometheusrule_and_back(env: Env) -> None:
    source = PrometheusRuleSource(env.api, [(NS, NAME)], env.prometheus, timeout_s=60, poll_s=0.2)
    snapshot = source.snapshot(claims)
    selection = source.selection_of(snapshot, claims)
    assert sorted(r.name for r in selection.rules) == ["GpuMemoryFull", "gpu:fb_used:sum"]
    edits = source.edits(snapshot, selection)  # promtool check rules on the edit
    result = source.remove(snapshot, selection, edits, NOW)
    assert result.status == "RULES_REMOVED"
    after = stored(env)
    # Written back as a PrometheusRule: only the moved rules gone, every other field as it was.
    assert after["metadata"]["labels"] == {"release": "kps"}
    assert after["spec"] == {"groups": [
        {"name": "gpu-memory", "interval": "30s", "rules": [{"record": "node:up:sum", "expr": "sum(up)"}]},
        SPEC["groups"][1]]}
    assert spec_text(after["spec"]) == edits[f"prometheusrule/{NS}/{NAME}"].decode()
    assert sorted(r.name for r in loaded_rules(env.prometheus)) == ["FleetDown", "node:up:sum"]  # the real server
    # Rollback: the snapshot's spec again, and its rules loaded again.
    restored = source.restore(snapshot, NOW)
    assert restored.status == "RESTORED"
    assert stored(env)["spec"] == SPEC
    assert len(loaded_rules(env.prometheus)) == 4


def test_another_writers_change_is_refused_never_overwritten(env: Env) -> None:
    source = PrometheusRuleSource(env.api, [(NS, NAME)], env.prometheus, timeout_s=30, poll_s=0.2)
    snapshot = source.snapshot(claims)
    selection = source.selection_of(snapshot, claims)
    edits = source.edits(snapshot, selection)
    env.server.edit(PROMETHEUSRULES, NS, NAME,
                    lambda obj: obj["spec"]["groups"][1]["rules"].append({"alert": "New", "expr": "vector(1)"}))
    with pytest.raises(DeployError, match=f"PrometheusRule {NS}/{NAME} changed since the snapshot was taken"):
        source.remove(snapshot, selection, edits, NOW)
    assert stored(env)["spec"]["groups"][1]["rules"][-1] == {"alert": "New", "expr": "vector(1)"}


def test_the_contract_server_refuses_what_the_crd_refuses(env: Env) -> None:
    custom = CustomObjectsApi(env.api)

    def patch(groups: list[Any]) -> tuple[int, str]:
        with pytest.raises(ApiException) as excinfo:
            custom.patch_namespaced_custom_object(CR_GROUP, CR_VERSION, NS, RULES_PLURAL, NAME,
                                                  {"spec": {"groups": groups}},
                                                  _content_type="application/merge-patch+json")
        return excinfo.value.status, json.loads(excinfo.value.body)["message"]

    code, message = patch([{"name": "g", "rules": [{"record": "r", "expr": "1", "lables": {}}]}])
    assert code == 400 and 'unknown field "spec.groups[0].rules[0].lables"' in message
    code, message = patch([{"name": "g", "rules": [{"record": "r", "alert": "a", "expr": "1"}]}])
    assert code == 422 and "exactly one of record or alert" in message
    code, message = patch([{"name": "g", "rules": []}, {"name": "g", "rules": []}])
    assert code == 422 and "Duplicate value: 'g'" in message
    assert stored(env)["spec"] == SPEC  # nothing stored


def test_deploy_alerts_ship_as_a_prometheusrule_the_server_accepts(env: Env) -> None:
    shipped = yaml.safe_load((REPO / "deploy" / "alerts" / "promshift-rules.prometheusrule.yaml").read_text())
    bare = yaml.safe_load((REPO / "deploy" / "alerts" / "promshift-rules.yaml").read_text())
    assert (shipped["apiVersion"], shipped["kind"]) == (f"{CR_GROUP}/{CR_VERSION}", "PrometheusRule")
    assert shipped["spec"] == bare  # the same rules, whichever way they are installed
    name = shipped["metadata"]["name"]
    created = env.server.create(PROMETHEUSRULES, NS, name, shipped)
    assert created["spec"] == bare


class _Wiring(GroupWiring):
    """The production operators' wiring, without an operator around it."""


def test_the_migration_moves_the_groups_rules_from_a_prometheusrule_to_the_target_and_back(
        env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source connection's ``extra.kubernetes.prometheus_rules`` makes the migration's rules move read the
    PrometheusRule (KubernetesHook on a kubeconfig, as production): the snapshot step, the records, the handoff
    onto a real target Prometheus, the audit events, then the rollback to the object's spec as it was."""
    from promshift.adapters.audit_store import AuditStore
    from promshift.adapters.routing import RoutingStore
    from promshift.adapters.settings import load_catalog
    from promshift.core.events import EventKind
    from promshift.orchestration.compose import compose_migration
    from promshift.steps.migration import Backends

    target_dir = tmp_path / "target"
    target_dir.mkdir()
    target_config = target_dir / "prometheus.yml"
    target_config.write_text("# the target\nglobal: {evaluation_interval: 5s}\nscrape_configs: []\n")
    kubeconfig = tmp_path / "kubeconfig.json"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": env.server.base_url}}],
        "users": [{"name": "promshift", "user": {"token": "local-only"}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "promshift"}}]}))
    with PrometheusProcess("target", target_dir, port=find_free_ports(1)[0], config=target_config,
                           data_dir=target_dir / "data", flags=("--web.enable-lifecycle",)) as target:
        monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
            "conn_type": "prometheus", "host": env.prometheus.base_url,
            "extra": {"rules": True, "deploy": "k8s-cr",
                      "kubernetes": {"namespace": NS, "name": "k8s", "config_file": str(kubeconfig), "timeout_s": 60,
                                     "prometheus_rules": [f"{NS}/{NAME}"]}}}))
        monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
            "conn_type": "prometheus", "host": target.url, "extra": {"config_path": str(target_config)}}))
        monkeypatch.setenv("PROMSHIFT_SNAPSHOTS_URL", f"file://{tmp_path / 'snapshots'}")
        wiring = _Wiring()
        wiring._init_group(group_name="gpu-memory", catalog_path=str(REPO / "catalog" / "metric_groups.yaml"),
                           profile="demo", source_conn_id="promshift_source", target_conn_id="promshift_target")
        group = load_catalog(REPO / "catalog" / "metric_groups.yaml", profile="demo").get("gpu-memory")
        audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
        try:
            backends = Backends(source=env.prometheus, target=PrometheusClient(target.url),
                                source_config_path="", target_remote_write_url="")
            migration = compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url),
                                          snapshots_dir=tmp_path / "blobs", run_id="manual__prometheusrule")
            step = wiring.rules_step(migration)
            assert type(step.move.source).__name__ == "PrometheusRuleSource"  # chosen by the connection's extra
            now = datetime.now(UTC)
            taken = step.snapshot(now)
            assert sorted(taken["names"]) == ["GpuMemoryFull", "gpu:fb_used:sum"]
            assert taken["files"] == [f"prometheusrule/{NS}/{NAME}"]
            step.add_records(now)
            moved = step.handoff(now)
            assert moved["moved"] is True and moved["alerts"] == 1 and moved["records"] == 1
            # The PrometheusRule lost exactly the group's rules (the operator's stand-in reloaded the source);
            # the target loads them, in its own file.
            after = stored(env)
            assert after["metadata"]["labels"] == {"release": "kps"}
            assert after["spec"] == {"groups": [
                {"name": "gpu-memory", "interval": "30s", "rules": [{"record": "node:up:sum", "expr": "sum(up)"}]},
                SPEC["groups"][1]]}
            wait_loaded(env.prometheus, 2)
            assert sorted(r.name for r in loaded_rules(env.prometheus)) == ["FleetDown", "node:up:sum"]
            assert sorted(r.name for r in loaded_rules(PrometheusClient(target.url))) == [
                "GpuMemoryFull", "gpu:fb_used:sum"]
            # Rollback: the object's spec as it was, the target without the group's rules.
            restored = step.restore(reason="test: the gate failed", now=datetime.now(UTC))
            assert restored["changed"] is True and restored["restored_identical"] is True
            assert stored(env)["spec"] == SPEC
            wait_loaded(env.prometheus, 4)
            assert loaded_rules(PrometheusClient(target.url)) == []
            kinds = [e.kind for e in audit.events(group="gpu-memory")]
            assert kinds == [EventKind.RULES_SNAPSHOT, EventKind.RULES_RECORDS_ADDED, EventKind.RULES_MOVED,
                             EventKind.RULES_RESTORED]
            assert audit.verify().ok
        finally:
            audit.engine.dispose()
