"""Per-group access at the dependency level: Airflow's ``requires_access_dag`` and DAG filter decide, per group.

The Simple auth manager's roles read every DAG or none, and ``airflow standalone`` insists on it, so
the real-server test (test_board_airflow.py) covers anonymous (401) and a user with no DAG access
(403). Here the board's routes run with Airflow's auth dependencies against an auth manager that
denies one user one group's DAG (tests/board/auth_manager.py). What needs Airflow's database is
replaced, and only that: who the caller is (``get_user``: JWT plus the revoked-token table), the
DAG's team (``DagModel.get_team_name``: none, as without multi-team mode) and the runs' states
(Airflow knows none of them here).
"""

from __future__ import annotations

from promshift.adapters.settings import load_catalog
from tests.board.auth_manager import DENIED_DAG, SCOPED_USER


def test_a_user_denied_one_group_gets_403_for_it_and_an_overview_without_it(client_as) -> None:  # type: ignore[no-untyped-def]
    vic = client_as(SCOPED_USER, "viewer")
    assert DENIED_DAG == load_catalog().get("gpu-memory").dag_id
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
