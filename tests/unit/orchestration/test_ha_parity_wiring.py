"""The DAG's parity chain for a group whose source runs as replicas: the wiring builds the HA check from the
replicas' connections, a mapped ``parity_samples`` task compares the replica the plan elected, and ``parity``
reduces with the election (the replica named). A group without replicas keeps the plain check."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.parity_ha import HaParityCheck
from promshift.adapters.query_budget import WorkspaceQueryGate
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.ha import REPLICAS_MEASUREMENT
from promshift.local.group_dag import build_group_dag
from tests.fakes import fed
from tests.unit.adapters.test_parity_ha import SeriesPrometheus, kept, other, plan, servers  # noqa: F401 - fixture
from tests.unit.orchestration.test_operators import CATALOG, GROUP, PROFILE, env, make_context  # noqa: F401 - fixture

REPLICAS = ("    replicas: {replica_label: prometheus_replica, cluster_label: cluster,\n"
            "               sources: {source-0: promshift_source, source-1: promshift_source_1}}\n")


def ha_catalog(tmp_path: Path) -> Path:
    """The shipped catalog with every group's source declared as two replicas (in the demo profile)."""
    folder = tmp_path / "catalog"
    shutil.copytree(CATALOG.parent, folder)
    path = folder / CATALOG.name
    text = path.read_text()
    assert text.count("\n  demo:\n") == 1
    path.write_text(text.replace("\n  demo:\n", "\n  demo:\n" + REPLICAS))
    return path


def connect(monkeypatch: pytest.MonkeyPatch, env: Path, conn_id: str, url: str, **more: Any) -> None:  # noqa: F811
    extra = {"config_path": str(env / "prometheus.yml"), "remote_write_url": f"{url}/api/v1/write", **more}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "prometheus", "host": url,
                                                                      "extra": extra}))


def test_an_ha_groups_parity_chain_compares_the_elected_replica_and_names_it(
        env: Path, servers: Callable[..., SeriesPrometheus], tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    target, r0, r1 = servers(kept), servers(other), servers(kept)
    connect(monkeypatch, env, "promshift_source", r0.url)
    connect(monkeypatch, env, "promshift_source_1", r1.url)
    connect(monkeypatch, env, "promshift_target", target.url, query_budget={"per_run": 1000})
    catalog = ha_catalog(tmp_path)
    dag = build_group_dag(load_catalog(catalog, profile=PROFILE).get(GROUP), catalog_path=catalog, profile=PROFILE)

    check = dag.get_task("parity_plan").parity_check(make_context())
    assert isinstance(check, HaParityCheck)
    assert [(name, c.base_url, c.always_stats) for name, c in check.sources] == [
        ("source-0", r0.url, True), ("source-1", r1.url, True)]
    assert isinstance(check.target.before_query, WorkspaceQueryGate)  # the workspace's query budget, as before

    # the plan elected source-1 (the target matched it, not source-0): its shards compare with it alone
    elected = plan("source-1", others=("source-0",))
    out = fed(dag, "parity_samples", shard=dict(elected.shards[0])).execute(make_context())
    assert out["replica"] == "source-1" and out["mismatches"] == 0 and out["points_compared"] == 13
    assert r1.range_queries() and not r0.queries
    result = fed(dag, "parity", plan=elected.to_dict(), shards=[out]).execute(make_context())
    assert result["verdict"] == "SUCCESSFUL", result["measurements"]
    note = next(m for m in result["measurements"] if m["name"] == REPLICAS_MEASUREMENT)
    assert note["numbers"]["elected"] == "source-1" and "source-0: FAILED" in note["reason"]

    # the same chain where the plan could only compare source-0 (the closest): FAILED, naming both replicas
    wrong = plan("source-0", others=("source-1",))
    out = fed(dag, "parity_samples", shard=dict(wrong.shards[0])).execute(make_context())
    assert out["replica"] == "source-0" and out["mismatches"] > 0
    result = fed(dag, "parity", plan=wrong.to_dict(), shards=[out]).execute(make_context())
    assert result["verdict"] == "FAILED"
    note = next(m for m in result["measurements"] if m["name"] == REPLICAS_MEASUREMENT)
    assert note["reason"].startswith("the target matches none of the replicas source-0, source-1")


def test_a_group_without_replicas_keeps_the_plain_check_of_its_source(env: Path) -> None:  # noqa: F811
    dag = build_group_dag(load_catalog(CATALOG, profile=PROFILE).get(GROUP), catalog_path=CATALOG, profile=PROFILE)
    check = dag.get_task("parity_plan").parity_check(make_context())
    assert type(check) is ParityCheck and check.source.base_url == "http://127.0.0.1:1"
    assert REPO_ROOT in CATALOG.parents


def test_a_replica_connection_that_is_not_prometheus_fails_the_task_naming_it(
        env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE_1", json.dumps({"conn_type": "amp", "extra": {
        "workspace_id": "ws-1", "region_name": "us-east-1"}}))
    catalog = ha_catalog(tmp_path)
    dag = build_group_dag(load_catalog(catalog, profile=PROFILE).get(GROUP), catalog_path=catalog, profile=PROFILE)
    with pytest.raises(AirflowFailException, match="replica 'source-1': connection 'promshift_source_1' must be a "
                                                   "prometheus one"):
        dag.get_task("parity_plan").parity_check(make_context())
