"""Without credentials the board's routes answer 401 and show no data (Airflow mounts plugin apps unauthenticated)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fastapi.testclient import TestClient

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import default_catalog_path, load_catalog
from promshift.board.app import BoardSource, create_app
from tests.board.history import write_history

RUNS = {"gpu-utilization": "r1", "gpu-power-thermal": "r2", "gpu-memory": "r3"}


def test_anonymous_requests_get_401_and_no_data(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    write_history(AuditStore(url), load_catalog(), datetime(2026, 12, 1, tzinfo=UTC), RUNS)
    client = TestClient(create_app(BoardSource(catalog_path=default_catalog_path(), audit_url=url, profile=None)))
    for path in ("/api/groups", "/api/groups/gpu-memory", "/api/groups/no-such-group"):
        resp = client.get(path)
        assert resp.status_code == 401, path
        assert resp.json() == {"detail": "Not authenticated"}
    for path in ("/", "/groups/gpu-memory", "/groups/gpu-memory/latency.png"):
        resp = client.get(path)
        assert resp.status_code == 401, path
        assert resp.headers["content-type"].startswith("text/html")
        assert "Sign in" in resp.text
        for secret in ("gpu-memory", "oncall-alice", "SUCCESSFUL", "r3"):
            assert secret not in resp.text.replace("/groups/gpu-memory", ""), (path, secret)
