"""Per-group access at the dependency level: Airflow's ``requires_access_dag`` and DAG filter decide, per group.

A group's DAG is its target workspace's migration DAG (``MetricGroup.dag_id``), shared by every group with that
target: access is per target DAG. A user denied it is denied every group migrating to that workspace; groups of
other targets stay readable. One group alone can be denied only if it is alone on its target.

The Simple auth manager's roles read every DAG or none, and ``airflow standalone`` insists on it, so
the real-server test (test_board_airflow.py) covers anonymous (401) and a user with no DAG access
(403). Here the board's routes run with Airflow's auth dependencies against an auth manager that
denies one user one migration DAG (tests/board/auth_manager.py), over a catalog where gpu-memory is
alone on its target (``scoped_catalog``). What needs Airflow's database is
replaced, and only that: who the caller is (``get_user``: JWT plus the revoked-token table), the
DAG's team (``DagModel.get_team_name``: none, as without multi-team mode) and the runs' states
(Airflow knows none of them here).
"""

from __future__ import annotations

import pytest

from promshift.adapters.settings import load_catalog
from tests.board.auth_manager import DENIED_DAG, SCOPED_USER, GroupScopedAuthManager


def test_a_user_denied_one_group_gets_403_for_it_and_an_overview_without_it(client_as) -> None:  # type: ignore[no-untyped-def]
    """gpu-memory is alone on its target: denying that target's migration DAG denies gpu-memory only."""
    vic = client_as(SCOPED_USER, "viewer")
    catalog = load_catalog()
    assert DENIED_DAG == catalog.get("gpu-memory").dag_id == "promshift__migrate__amp_c"
    assert {g.dag_id for g in catalog.groups if g.name != "gpu-memory"} == {"promshift__migrate__promshift_target"}
    names = [g["name"] for g in vic.get("/api/groups").json()["groups"]]
    assert names == ["gpu-utilization", "gpu-power-thermal", "gpu-clocks"]
    for path in ("/api/groups/gpu-memory", "/groups/gpu-memory", "/groups/gpu-memory/latency.png"):
        resp = vic.get(path)
        assert resp.status_code == 403, path
        assert "oncall-alice" not in resp.text and "SUCCESSFUL" not in resp.text
    assert vic.get("/api/groups/gpu-utilization").status_code == 200
    page = vic.get("/")
    assert page.status_code == 200 and 'data-group="gpu-memory"' not in page.text
    assert 'id="pending-approvals"' not in page.text  # the only pending approval is in the denied group


def test_access_is_per_target_dag_so_a_denied_shared_dag_denies_all_its_groups(
        client_as, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Denied the migration DAG of connection promshift_target, which three groups share, the user reads none of
    the three (there is no finer grant than a DAG) and still reads gpu-memory, whose target's DAG is another."""
    monkeypatch.setattr(GroupScopedAuthManager, "denied_dag", "promshift__migrate__promshift_target")
    vic = client_as(SCOPED_USER, "viewer")
    shared = [g.name for g in load_catalog().groups if g.dag_id == "promshift__migrate__promshift_target"]
    assert shared == ["gpu-utilization", "gpu-power-thermal", "gpu-clocks"]
    assert [g["name"] for g in vic.get("/api/groups").json()["groups"]] == ["gpu-memory"]
    for name in shared:
        for path in (f"/api/groups/{name}", f"/groups/{name}"):
            resp = vic.get(path)
            assert resp.status_code == 403, path
            assert "oncall-alice" not in resp.text and "SUCCESSFUL" not in resp.text
    memory = vic.get("/api/groups/gpu-memory")
    assert memory.status_code == 200 and memory.json()["dag_id"] == DENIED_DAG
    assert 'group="gpu-memory"' in vic.get("/metrics").text
    assert 'group="gpu-utilization"' not in vic.get("/metrics").text


def test_the_same_role_without_the_scope_reads_every_group(client_as) -> None:  # type: ignore[no-untyped-def]
    other = client_as("viewer-victor", "viewer")
    assert len(other.get("/api/groups").json()["groups"]) == 4
    assert other.get("/api/groups/gpu-memory").json()["pending_approval"]["waiting_for"] == [
        "oncall-alice", "oncall-bob"]
    assert other.get("/groups/gpu-memory/latency.png").headers["content-type"] == "image/png"


def test_no_role_reads_nothing(client_as) -> None:  # type: ignore[no-untyped-def]
    nobody = client_as("nobody-nina", "")
    assert nobody.get("/api/groups").json()["groups"] == []
    assert nobody.get("/api/groups/gpu-utilization").status_code == 403
    assert nobody.get("/api/groups/no-such-group").status_code == 403  # no DAG reader: unknown is not revealed
