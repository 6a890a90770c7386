"""An HA pair (and a tenant) against the strict local AMP: two source replicas (``stack up --replicas 2``)
dual-write one group.

With the group declared as replicas, each replica's remote_write carries AMP's dedup labels: the workspace keeps
one replica's samples per cluster (each series once, no replica label stored), parity compares the target with
the replica it kept and is SUCCESSFUL, also after the kept replica stops writing and the workspace fails over to
the other one. Written without the dedup labels, the target holds both replicas' series and parity is FAILED on
coverage naming the replicas.

Each verdict is reached twice over the same data: in one process (``HaParityCheck.run``, the migration's
``parity()``) and through the DAG's three parity operators (``parity_plan -> parity_samples[n] -> parity``, executed
as Airflow would, their XComs through JSON) with the group declared as replicas in a catalog file and each replica
behind its own Airflow connection: the plan elects the replica the target kept, the shards compare with it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from promshift.adapters.amp import AmpTarget
from promshift.adapters.amp_tenants import AmpWorkspaceConfiguration
from promshift.adapters.parity_ha import HaParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.catalog import MetricGroup, ReplicaPolicy, TenantPolicy
from promshift.core.ha import REPLICAS_MEASUREMENT, elected_replica
from promshift.core.ingest_limits import HA_FAILOVER_S, LABEL_SET_LIMIT
from promshift.core.render import remote_write_entry
from promshift.core.tenants import merged_limits, tenant_entry
from promshift.core.verdicts import Verdict
from promshift.local.group_dag import build_group_dag
from promshift.local.stack.amp_ingest import Series
from promshift.local.stack.local import LocalStack, StackConfig
from tests.fakes import FakeTI, fed
from tests.integration.conftest import eventually, running_amp_stack
from tests.integration.test_amp_strict import workspace_client, write

# slow: run by make e2e (.ci/run), which keeps make test inside its 15-minute budget
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    # 2 s scrapes: the fleet's values change every second, so replicas on their own phases hold different samples
    with running_amp_stack(stack_config_factory, replicas=2, scrape_interval="2s") as amp:
        yield amp


# The Airflow connection of each replica's Prometheus (the catalog's replicas.sources), the source's first.
REPLICA_CONNS = ("promshift_source", "promshift_source_1")
PROFILE = "ha"
# The demo profile's, with a short parity window over the lab's 2 s scrapes and two mapped shards (two nodes).
HA_PARITY = {"skip_recent": "3s", "step": "5s", "golden_dashboards": [], "hosts_per_shard": 1}


@pytest.fixture(scope="module")
def catalog(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The shipped catalog with profile ``ha``: the demo's, every group's source declared as the stack's replicas
    (each behind its Airflow connection, set here with the workspace's and the local AWS's pair)."""
    folder = tmp_path_factory.mktemp("ha") / "catalog"
    shipped = REPO_ROOT / "catalog" / "metric_groups.yaml"
    shutil.copytree(shipped.parent, folder)
    data = yaml.safe_load(shipped.read_text())
    demo = data["profiles"]["demo"]
    replicas = dict(zip(stack.source_urls(), REPLICA_CONNS, strict=True))
    data["profiles"][PROFILE] = {**demo, "parity": {**demo["parity"], **HA_PARITY}, "replicas": {
        "replica_label": "prometheus_replica", "cluster_label": "cluster", "sources": replicas}}
    path = folder / shipped.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    home = folder.parent / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as env:
        for name, value in stack.aws_env().items():
            env.setenv(name, value)
        env.setenv("PROMSHIFT_HOME", str(home))
        env.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{home / 'audit.db'}")
        for replica, conn_id in replicas.items():
            env.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
                "conn_type": "prometheus", "host": stack.source_urls()[replica],
                "extra": {"config_path": str(stack.source_config_paths()[replica])}}))
        env.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({"conn_type": "amp",
                                                                "extra": stack.amp_connection_extra()}))
        yield path


def dag_parity(catalog: Path, name: str, since: float) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The DAG's parity chain for group ``name`` since ``since``: (the plan's XCom, each shard's, the verdict's)."""
    dag = build_group_dag(load_catalog(catalog, profile=PROFILE).get(name), catalog_path=catalog, profile=PROFILE)

    def context() -> dict[str, Any]:
        return {"run_id": "manual__ha", "ti": FakeTI(), "dag_run": None, "params": {}}

    plan_context = context()
    shards = fed(dag, "parity_plan", deployed={"dual_write_since": since}).execute(plan_context)
    plan = json.loads(json.dumps(plan_context["ti"].pushed["plan"]))
    outs = [json.loads(json.dumps(fed(dag, "parity_samples", shard=json.loads(json.dumps(shard))).execute(context())))
            for shard in shards]
    result = fed(dag, "parity", plan=plan, shards=outs).execute(context())
    note = next(m for m in result["measurements"] if m["name"] == REPLICAS_MEASUREMENT)
    print(f"DAG parity {result['verdict']}: {plan['replicas']['reason']} | {note['reason']}")
    return plan, outs, result


def passes_on_the_dag_path(catalog: Path, name: str, since: float, kept: str) -> None:
    """The DAG's chain is SUCCESSFUL against the replica the workspace kept: its plan elected it (or could not
    tell the replicas apart and compared both), every shard compared it first or beside the other."""
    plan, outs, result = dag_parity(catalog, name, since)
    assert result["verdict"] == Verdict.SUCCESSFUL.value, [m["reason"] for m in result["measurements"]
                                                           if m["verdict"] != "SUCCESSFUL"]
    election = plan["replicas"]
    assert kept in election["compared"] and election["elected"] in (kept, None)
    assert len(outs) == 2 and all(out["replica"] == election["compared"][0] for out in outs)  # two hosts, two shards
    assert all(out["points_compared"] > 0 for out in outs)
    note = next(m for m in result["measurements"] if m["name"] == REPLICAS_MEASUREMENT)
    assert note["numbers"]["replicas"][kept] == Verdict.SUCCESSFUL.value
    assert note["numbers"]["elected"] in (kept, None)


def http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


def replicated(stack: LocalStack, name: str) -> MetricGroup:
    demo = load_catalog(profile="demo").get(name)
    sources = tuple((replica, f"conn_{i}") for i, replica in enumerate(stack.source_urls()))
    return dataclasses.replace(
        demo, parity=dataclasses.replace(demo.parity, skip_recent_s=3, step_s=5, golden_dashboards=()),
        replicas=ReplicaPolicy(replica_label="prometheus_replica", cluster_label="cluster", sources=sources))


def write_from(stack: LocalStack, replica: str, group: MetricGroup, *, dedup: bool) -> Callable[[], None]:
    """The group's remote_write on one replica (through the signing relay); returns the undo."""
    path = stack.source_config_paths()[replica]
    url = stack.source_urls()[replica]
    before = path.read_text()
    config = yaml.safe_load(before)
    config.setdefault("remote_write", []).append(remote_write_entry(
        group_name=group.name, name_regex=group.name_regex(), drop_labels=group.drop_labels,
        url=stack.relay_remote_write_url, replicas=group.replicas if dedup else None))
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert http().post(f"{url}/-/reload", timeout=60).status_code == 200

    def undo() -> None:
        Path(path).write_text(before)
        http().post(f"{url}/-/reload", timeout=60)
    return undo


def leader(stack: LocalStack) -> str | None:
    answer = http().get(f"{stack.frontdoor_url}/-/discarded-samples", timeout=10).json()
    return (answer.get(stack.workspace_id) or {}).get("ha_leaders", {}).get("local-gpu-fleet")


def ha_parity(stack: LocalStack, group: MetricGroup, since: float) -> Any:
    sources = [(replica, PrometheusClient(url, timeout_s=30)) for replica, url in stack.source_urls().items()]
    result = HaParityCheck(group, sources, workspace_client(stack)).run(dual_write_since=since, now=time.time())
    note = next(m for m in result.measurements if m.name == REPLICAS_MEASUREMENT)
    print(f"parity {result.verdict.value}: {note.reason}")
    return result, note


def test_an_ha_pair_with_dedup_labels_is_held_once_and_passes_parity_whichever_replica_is_kept(
        stack: LocalStack, catalog: Path) -> None:
    group = replicated(stack, "gpu-utilization")
    target = workspace_client(stack)
    undo = [write_from(stack, replica, group, dedup=True) for replica in stack.source_urls()]
    try:
        started = time.time()
        source = PrometheusClient(stack.source_url, timeout_s=30)
        expected = source.scalar(f"count({group.selector()})")
        assert expected
        eventually(lambda: target.scalar(f"count({group.selector()})") == expected, timeout=60,
                   message="the pair's series never landed in the workspace")
        kept = eventually(lambda: leader(stack), timeout=30, message="the workspace elected no replica")
        time.sleep(20)
        # each series once: the pair's two copies are one series, no replica label stored
        assert target.scalar(f"count({group.selector()})") == expected
        by_replica = target.query(f"count by (prometheus_replica, __replica__) ({group.selector()})").series
        assert [s.labels for s in by_replica] == [{}]
        result, note = ha_parity(stack, group, started)
        assert result.verdict == Verdict.SUCCESSFUL, [m.reason for m in result.not_passed()]
        # the kept replica matches (the other may too, when both scraped the same second)
        assert note.numbers["replicas"][kept] == Verdict.SUCCESSFUL.value
        assert elected_replica(result) in (kept, None)  # None: both replicas agree over the window
        passes_on_the_dag_path(catalog, group.name, started, kept)

        # the kept replica stops writing: after the HA timeout the workspace takes the other one
        other = next(r for r in stack.source_urls() if r != kept)
        undo[list(stack.source_urls()).index(kept)]()
        eventually(lambda: leader(stack) == other, timeout=HA_FAILOVER_S + 40,
                   message=f"the workspace never failed over from {kept} to {other}")
        took_over = time.time()
        time.sleep(35)  # the window starts two steps and a scrape after the takeover, ends skip_recent ago
        after, note_after = ha_parity(stack, group, took_over)
        assert after.verdict == Verdict.SUCCESSFUL, [m.reason for m in after.not_passed()]
        assert note_after.numbers["replicas"][other] == Verdict.SUCCESSFUL.value
        passes_on_the_dag_path(catalog, group.name, took_over, other)  # the other replica kept: the other case
        assert target.scalar(f"count({group.selector()})") == expected
    finally:
        for one in undo:
            one()


def test_an_ha_pair_written_without_dedup_labels_fails_on_coverage_naming_the_replicas(
        stack: LocalStack, catalog: Path) -> None:
    group = replicated(stack, "gpu-clocks")
    target = workspace_client(stack)
    undo = [write_from(stack, replica, group, dedup=False) for replica in stack.source_urls()]
    try:
        started = time.time()
        expected = PrometheusClient(stack.source_url, timeout_s=30).scalar(f"count({group.selector()})")
        assert expected
        eventually(lambda: target.scalar(f"count({group.selector()})") == 2 * expected, timeout=60,
                   message="both replicas' series never landed in the workspace")
        time.sleep(30)  # a window of several steps (settled 10 s, older than skip_recent): every layer compares
        result, _ = ha_parity(stack, group, started)
        assert result.verdict == Verdict.FAILED
        doubled = [m for m in result.not_passed() if m.name == REPLICAS_MEASUREMENT and "doubled" in m.reason]
        assert doubled, [m.reason for m in result.not_passed()]
        assert "source-0" in doubled[-1].reason and "source-1" in doubled[-1].reason
        assert doubled[-1].numbers["replicas"] == {"source-0": expected, "source-1": expected}
        # the DAG's chain: the plan measured the doubled target once, the reduce fails on it naming both replicas
        plan, _, dag_result = dag_parity(catalog, group.name, started)
        assert dag_result["verdict"] == Verdict.FAILED.value and plan["window"] is not None
        assert plan["replicas"]["doubled"]["verdict"] == Verdict.FAILED.value
        doubled_on_dag = [m for m in dag_result["measurements"] if m["name"] == REPLICAS_MEASUREMENT
                          and "series count doubled" in m["reason"]]
        assert doubled_on_dag and doubled_on_dag[0]["verdict"] == Verdict.FAILED.value
        assert "source-0, source-1" in doubled_on_dag[0]["reason"]
        assert doubled_on_dag[0]["numbers"]["replicas"] == {"source-0": expected, "source-1": expected}
    finally:
        for one in undo:
            one()


def test_a_tenants_limit_set_through_the_control_plane_throttles_only_that_tenant(stack: LocalStack) -> None:
    """The migration's adapter writes the group's limitsPerLabelSet entry (keeping the workspace's others); the
    strict workspace then refuses that label set's series past the limit, and only those."""
    assert stack.workspace_id
    configuration = AmpWorkspaceConfiguration(stack.amp_client(), AmpTarget(region=stack.config.region,
                                                                            workspace_id=stack.workspace_id),
                                              stack.workspace_id)
    other = {"labelSet": {"team": "infra"}, "limits": {"maxSeries": 1000}}
    configuration.set_label_set_limits([other])
    tenant = TenantPolicy((("team", "ml"),), 3)
    configuration.set_label_set_limits(merged_limits(configuration.label_set_limits(), tenant))
    assert configuration.label_set_limits() == [other, tenant_entry(tenant)]
    time.sleep(1.5)  # the front door re-reads the workspace's limits at most once a second
    t = int(time.time() * 1000)
    spike = [Series((("__name__", "tenant_spike"), ("gpu", str(i)), ("team", "ml")), [(t, 1.0)]) for i in range(6)]
    calm = [Series((("__name__", "tenant_spike"), ("gpu", str(i)), ("team", "infra")), [(t, 1.0)]) for i in range(6)]
    answer = write(stack, spike + calm)
    print(f"write answered {answer.status_code}: {answer.text.strip()}")
    assert answer.status_code == 429 and "per-labelset series limit of 3 exceeded" in answer.text
    target = workspace_client(stack)
    eventually(lambda: target.scalar('count(tenant_spike{team="infra"})') == 6, timeout=20)
    assert target.scalar('count(tenant_spike{team="ml"})') == 3
    discards = http().get(f"{stack.frontdoor_url}/-/discarded-samples", timeout=10).json()[stack.workspace_id]
    assert discards["discarded"].get(LABEL_SET_LIMIT) == 3
