"""End to end, ``make demo SCENARIO=fleet``: three groups from two clusters onto two AMP workspaces, in two waves.

Joins ``fleet_session`` (tests/e2e/conftest.py): the stack with its second cluster (its own fleet and source
Prometheus) and two workspaces of the local AWS (``stack up --target amp --clusters 2``: one SigV4-checking front
door, each workspace backed by its own Prometheus and written through its own signing relay), one Airflow reading
the fleet catalog (per-group connections, two ``amp`` connections). Each group's report names its source and its
workspace; each workspace holds only what was moved to it, from the cluster it came from; the routes and the board
say which cluster and workspace each group is on. Wave 2 is started by ``promshift__waves`` on wave 1's cut-over.
"""

from __future__ import annotations

import pytest
import requests
from botocore.credentials import Credentials

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.sigv4 import AwsSigV4Auth
from promshift.core.catalog import migration_dag_id
from promshift.local.airflow_lab import TRIGGER_USER, LocalAirflow
from promshift.local.demo_fleet import FLEET_PLAN, SOURCE_A, SOURCE_B, TARGET_A, TARGET_B
from promshift.local.stack.local import EXTERNAL_LABELS, EXTERNAL_LABELS_B, LocalStack
from promshift.orchestration.dag_factory import WAVES_DAG_ID
from tests.e2e.conftest import SharedSession

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]


def workspaces(stack: LocalStack) -> dict[str, str]:
    """Target connection -> the AMP workspace id it names."""
    ws_a, ws_b = stack.workspace_id, stack.workspace_b_id
    assert ws_a and ws_b and ws_a != ws_b
    return {TARGET_A: ws_a, TARGET_B: ws_b}


def test_each_group_cut_over_from_its_cluster_to_its_workspace(fleet_session: SharedSession) -> None:
    stack = fleet_session.stack
    assert stack.config.target_kind == "amp"
    urls = {SOURCE_A: stack.source_url, SOURCE_B: stack.source_b_url}
    ws = workspaces(stack)
    for group, (wave, source, target) in FLEET_PLAN.items():
        report = fleet_session.run(f"fleet:{group}").report
        assert report["final_stage"] == "cut_over", (group, report["summary"])
        assert report["wave"] == wave
        assert report["connections"] == {"source": source, "target": target}
        assert report["source"] == {"connection": source, "url": urls[source]}
        assert report["target"] == {"kind": "amp", "workspace_id": ws[target], "region": stack.config.region}
        assert report["parity"]["verdict"] == "SUCCESSFUL" and report["parity"]["series_compared"] > 0
        assert report["approval"]["by"] == "oncall-alice"
        # The group's entry went into its own cluster's source config only.
        assert report["source_config"]["identical"] is False
    a_config, b_config = stack.source_config_path.read_text(), stack.source_b_config_path.read_text()
    assert "promshift-gpu-utilization" in a_config and "promshift-gpu-memory" not in a_config
    assert "promshift-gpu-memory" in b_config and "promshift-gpu-power-thermal" in b_config
    # Each entry writes through its workspace's signing relay: the second cluster into both workspaces.
    assert stack.relay_b_remote_write_url in b_config and stack.relay_remote_write_url in b_config
    assert stack.relay_b_remote_write_url not in a_config
    # Every write and query reached the workspaces through the front door, signed.
    counters = stack.sigv4_stats()
    assert counters["verified_by_kind"].get("remote_write", 0) > 0 and counters["verified_by_kind"].get("query", 0) > 0


def test_each_workspace_holds_only_what_was_moved_to_it_from_its_cluster(fleet_session: SharedSession) -> None:
    for group in FLEET_PLAN:
        fleet_session.run(f"fleet:{group}")
    stack = fleet_session.stack
    pair = stack.aws_credentials()
    auth = AwsSigV4Auth(Credentials(pair.access_key, pair.secret_key, pair.session_token), stack.config.region)
    ids = workspaces(stack)
    # Through the front door, signed, by workspace id; and the Prometheus behind each workspace, directly.
    through_front_door = (PrometheusClient(stack.prometheus_endpoint(ids[TARGET_A]), auth=auth),
                          PrometheusClient(stack.prometheus_endpoint(ids[TARGET_B]), auth=auth))
    backing = (PrometheusClient(stack.target_url), PrometheusClient(stack.target_b_url))

    def clusters(client: PrometheusClient, metric: str) -> set[str]:
        return {s.labels.get("cluster", "") for s in client.query(f"count by (cluster) ({metric})").series}

    for ws_a, ws_b in (through_front_door, backing):
        assert clusters(ws_a, "DCGM_FI_DEV_GPU_UTIL") == {EXTERNAL_LABELS["cluster"]}
        assert clusters(ws_a, "DCGM_FI_DEV_POWER_USAGE") == {EXTERNAL_LABELS_B["cluster"]}
        assert clusters(ws_a, "DCGM_FI_DEV_FB_USED") == set()
        assert clusters(ws_b, "DCGM_FI_DEV_FB_USED") == {EXTERNAL_LABELS_B["cluster"]}
        assert clusters(ws_b, "DCGM_FI_DEV_GPU_UTIL") == clusters(ws_b, "DCGM_FI_DEV_POWER_USAGE") == set()
    # The second cluster is its own fleet: half the nodes.
    assert PrometheusClient(stack.source_b_url).scalar('count(up{job="dcgm"} == 1)') == stack.fleet_b.nodes


def test_routes_and_the_board_name_each_groups_cluster_and_workspace(fleet_session: SharedSession) -> None:
    for group in FLEET_PLAN:
        fleet_session.run(f"fleet:{group}")
    routes = RoutingStore(fleet_session.session.audit_url).load()["groups"]
    assert {g: (r["read_from"], r["source"], r["target"]) for g, r in routes.items()} == {
        g: ("target", source, target) for g, (_, source, target) in FLEET_PLAN.items()}
    airflow = LocalAirflow(home=fleet_session.home / "airflow", port=fleet_session.session.airflow.port,
                           extra_env={})
    airflow.load_passwords()
    auth = {"Authorization": f"Bearer {airflow.token(TRIGGER_USER)}"}
    body = requests.get(f"{airflow.base_url}/promshift/api/groups", headers=auth, timeout=30)
    body.raise_for_status()
    rows = {row["name"]: row for row in body.json()["groups"]}
    assert {g: (r["source"]["connection"], r["target"]["connection"], r["wave"]) for g, r in rows.items()} == {
        g: (source, target, wave) for g, (wave, source, target) in FLEET_PLAN.items()}
    stack = fleet_session.stack
    assert rows["gpu-memory"]["target"]["workspace"] == f"{stack.workspace_b_id} ({stack.config.region})"
    assert rows["gpu-utilization"]["target"]["workspace"] == f"{stack.workspace_id} ({stack.config.region})"
    page = requests.get(f"{airflow.base_url}/promshift/", headers=auth, timeout=30)
    page.raise_for_status()
    assert page.text.count('class="source-conn"') == 3 and ">promshift_target_b</span>" in page.text


def test_the_waves_dag_starts_wave_2_when_its_dependency_cuts_over(fleet_session: SharedSession) -> None:
    """gpu-power-thermal (depends_on gpu-utilization) was never triggered by hand: gpu-utilization's cutover task
    emitted its ``cut_over`` asset through the alias, that event created a ``promshift__waves`` run, whose mapped
    ``start`` (named by the group) triggered gpu-power-thermal in the shared migration DAG of its target."""
    util, thermal = (fleet_session.run(f"fleet:{g}").report for g in ("gpu-utilization", "gpu-power-thermal"))
    shared_dag = migration_dag_id(TARGET_A)
    assert util["started"] == {"by": "hand", "dag_id": shared_dag, "run_id": util["run_id"]}
    started = thermal["started"]
    assert started["by"] == WAVES_DAG_ID and started["dag_id"] == shared_dag, started
    assert started["run_id"] == thermal["run_id"] and thermal["run_id"].startswith("wave__gpu-power-thermal__")
    assert (started["waves_run_type"], started["start_state"], started["start_map_index"]) == (
        "asset_triggered", "success", "gpu-power-thermal"), started
    airflow = LocalAirflow(home=fleet_session.home / "airflow", port=fleet_session.session.airflow.port,
                           extra_env={})
    airflow.load_passwords()
    # The one cut_over event of gpu-utilization: from its run's shared cutover task, through the alias; it created
    # the waves run that started gpu-power-thermal.
    events = airflow.asset_events("promshift://group/gpu-utilization/cut_over")
    assert [(e["source_dag_id"], e["source_task_id"], e["source_run_id"]) for e in events] == [
        (shared_dag, "cutover", util["run_id"])], events
    assert events[0]["extra"]["group"] == "gpu-utilization"
    assert started["waves_run_id"] in {r["run_id"] for r in events[0]["created_dagruns"]}, events[0]
    upstream = airflow.api(TRIGGER_USER, "GET", f"/dags/{WAVES_DAG_ID}/dagRuns/{started['waves_run_id']}"
                                                "/upstreamAssetEvents")["asset_events"]
    assert [e["id"] for e in upstream] == [events[0]["id"]], upstream
    # The started run chose its group in the form; it began after its dependency was cut over.
    run = airflow.api(TRIGGER_USER, "GET", f"/dags/{shared_dag}/dagRuns/{thermal['run_id']}")
    assert run["conf"] == {"group": "gpu-power-thermal", "reason": "wave: gpu-utilization cut over"}, run["conf"]
    assert (run["run_type"], run["triggered_by"]) == ("operator_triggered", "operator"), run
    cut_over_at = next(s["at"] for s in util["stages"] if s["stage"] == "cut_over")
    assert thermal["stages"][0]["at"] > cut_over_at
    # gpu-utilization and gpu-power-thermal migrated in one DAG (their target's); gpu-memory in the other's.
    assert {r["dag_run_id"] for r in airflow.dag_runs(shared_dag)} == {util["run_id"], thermal["run_id"]}
    assert fleet_session.run("fleet:gpu-memory").report["started"]["dag_id"] == migration_dag_id(TARGET_B)
