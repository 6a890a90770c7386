"""End to end, ``make demo SCENARIO=fleet``: three groups from two clusters onto two workspaces, in two waves.

Joins ``fleet_session`` (tests/e2e/conftest.py): the stack with its second cluster (its own fleet and source
Prometheus) and second target, one Airflow reading the fleet catalog (per-group connections). Each group's
report names its source and target; each target holds only what was moved to it, from the cluster it came from;
the routes and the board say which cluster and workspace each group is on.
"""

from __future__ import annotations

import pytest
import requests

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.local.airflow_lab import TRIGGER_USER, LocalAirflow
from promshift.local.demo_fleet import FLEET_PLAN, SOURCE_A, SOURCE_B, TARGET_A, TARGET_B
from promshift.local.stack.local import EXTERNAL_LABELS, EXTERNAL_LABELS_B
from tests.e2e.conftest import SharedSession

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]


def test_each_group_cut_over_from_its_cluster_to_its_workspace(fleet_session: SharedSession) -> None:
    stack = fleet_session.stack
    urls = {SOURCE_A: stack.source_url, SOURCE_B: stack.source_b_url,
            TARGET_A: stack.target_url, TARGET_B: stack.target_b_url}
    for group, (wave, source, target) in FLEET_PLAN.items():
        report = fleet_session.run(f"fleet:{group}").report
        assert report["final_stage"] == "cut_over", (group, report["summary"])
        assert report["wave"] == wave
        assert report["connections"] == {"source": source, "target": target}
        assert report["source"] == {"connection": source, "url": urls[source]}
        assert report["target"] == {"kind": "prometheus", "url": urls[target]}
        assert report["parity"]["verdict"] == "SUCCESSFUL" and report["parity"]["series_compared"] > 0
        assert report["approval"]["by"] == "oncall-alice"
        # The group's entry went into its own cluster's source config only.
        assert report["source_config"]["identical"] is False
    a_config, b_config = stack.source_config_path.read_text(), stack.source_b_config_path.read_text()
    assert "promshift-gpu-utilization" in a_config and "promshift-gpu-memory" not in a_config
    assert "promshift-gpu-memory" in b_config and "promshift-gpu-power-thermal" in b_config
    assert stack.target_b_remote_write_url in b_config and stack.target_remote_write_url in b_config


def test_each_workspace_holds_only_what_was_moved_to_it_from_its_cluster(fleet_session: SharedSession) -> None:
    for group in FLEET_PLAN:
        fleet_session.run(f"fleet:{group}")
    stack = fleet_session.stack
    ws_a, ws_b = PrometheusClient(stack.target_url), PrometheusClient(stack.target_b_url)

    def clusters(client: PrometheusClient, metric: str) -> set[str]:
        return {s.labels.get("cluster", "") for s in client.query(f"count by (cluster) ({metric})").series}

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
    assert rows["gpu-memory"]["target"]["workspace"] == fleet_session.stack.target_b_url
    page = requests.get(f"{airflow.base_url}/promshift/", headers=auth, timeout=30)
    page.raise_for_status()
    assert page.text.count('class="source-conn"') == 3 and ">promshift_target_b</span>" in page.text
